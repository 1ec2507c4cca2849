"""Build the packed virtualenv that Spark ships to executors which have never seen Rewind.

    python scripts/executor_env.py [--out build/rewind-executor-env.tar.gz] [--with REQ ...]
                                   [--compress-level 0-9]

(``make executor-env``). The archive holds Rewind (installed from this checkout, not
editable) and its pinned runtime dependencies (``constraints.txt``), plus whatever ``--with``
names (your translate package, a wheel, a requirement), in a virtualenv built for this
Python. PySpark itself is left out: an executor runs the PySpark of its own Spark
installation (``$SPARK_HOME/python/lib/pyspark.zip``), which must be the same version. So are
pip, setuptools, the test suites inside packages and C headers (:data:`NOT_PACKED`).

Ship it with Spark's own settings (docs/real-clusters.md)::

    spark.archives: /path/rewind-executor-env.tar.gz#environment
    spark.pyspark.python: ./environment/bin/python

The environment's ``python`` links to the interpreter it was built with (for example
``/usr/bin/python3.11``): the executors need a bare Python of the same version at that path,
or pass ``--python-prefix`` (venv-pack's) for where it is on the executors.

``--compress-level`` is gzip's (venv-pack's default 4: ~150 MB). 0 stores the files unpacked
inside the gzip container (~490 MB, packed in 3.5 s instead of 12 s on a 2-core machine, and
each executor unpacks it in about half the time): for executors on the same machine or a fast
network. Keep the ``.tar.gz`` name either way: Spark unpacks a plain ``.tar`` without the
files' modes, and the environment's ``bin/python`` would not run.

The virtualenv stays in ``--work`` (``build/executor-env``): the next build with the same Python,
pins and runtime requirements reinstalls only Rewind into it and packs it again. It is made
without pip: the pip of the Python that runs this script (22.3 or later) installs into it.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = ("pyspark",)
"""Runtime dependencies the executors take from their Spark installation instead."""

NOT_PACKED = (
    "lib/python*/site-packages/pip/*",
    "lib/python*/site-packages/pip-*",
    "lib/python*/site-packages/setuptools/*",
    "lib/python*/site-packages/setuptools-*",
    "lib/python*/site-packages/_distutils_hack/*",
    "lib/python*/site-packages/distutils-precedence.pth",
    "lib/python*/site-packages/*/tests/*",
    "lib/python*/site-packages/*/include/*",
)
"""What stays in the virtualenv but not in the archive (venv-pack's ``--exclude``, fnmatch on
the path inside the environment, where ``*`` spans folders): the installers (the executors
install nothing), the test suites packages carry (a ``tests`` folder inside a package: pandas',
numpy's, pyarrow's) and C headers: a third of the files and 15% of the bytes, which every
executor would otherwise unpack at every application's start (measured stored, on a 2-core
machine: an unpack's tar and gzip 6.6 s of CPU before, 3.6 s after)."""


def runtime_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [
        r for r in project["dependencies"] if r.split("[")[0].split("=")[0].strip().lower() not in LEFT_OUT
    ]


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def dependencies_key(extra: list[str]) -> str:
    """What the virtualenv's dependencies are made of: this Python, the pins and the runtime
    requirements. A virtualenv built for the same key is reused (only Rewind is reinstalled)."""
    digest = hashlib.sha256(f"{sys.version}\0{getattr(sys, '_base_executable', sys.executable)}".encode())
    digest.update((REPO / "constraints.txt").read_bytes())
    digest.update("\0".join(runtime_requirements() + extra).encode())
    return digest.hexdigest()


def build(
    out: Path, extra: list[str], python_prefix: str | None, work: Path, compress_level: int | None = None
) -> Path:
    """The steps, in order: (1) the virtualenv with the pinned runtime dependencies, reused
    from ``work`` when its stamp names the same :func:`dependencies_key` and nothing was given
    with ``--with`` (a local folder given there may have changed); (2) Rewind from this checkout,
    always reinstalled; (3) the pack."""
    venv = work / "executor-env"
    stamp = venv / ".rewind-dependencies"
    key = dependencies_key(extra)
    # the pip of this Python installs into the virtualenv, which has none of its own: the archive
    # leaves pip out anyway, and installing it (venv's ensurepip) cost 7 s of CPU per build
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    pip += ["--disable-pip-version-check"]
    if extra or not stamp.is_file() or stamp.read_text() != key:
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        run([base, "-m", "venv", "--without-pip", str(venv)])
        run([*pip, "-c", str(REPO / "constraints.txt"), *runtime_requirements(), *extra])
        stamp.write_text(key)
    # Rewind itself, built as a wheel (venv-pack refuses editable installs)
    run([*pip, "--no-deps", "--force-reinstall", str(REPO)])
    out.parent.mkdir(parents=True, exist_ok=True)
    pack = [str(Path(sys.executable).parent / "venv-pack"), "-p", str(venv), "-o", str(out), "--force", "-q"]
    for pattern in NOT_PACKED:
        pack += ["--exclude", pattern]
    if python_prefix:
        pack += ["--python-prefix", python_prefix]
    if compress_level is not None:
        pack += ["--compress-level", str(compress_level)]
    run(pack)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "build" / "rewind-executor-env.tar.gz")
    parser.add_argument(
        "--with", dest="extra", action="append", default=[], help="another requirement to add"
    )
    parser.add_argument("--python-prefix", help="where the executors' Python prefix is (venv-pack's option)")
    parser.add_argument("--work", type=Path, default=REPO / "build", help="where the virtualenv is built")
    parser.add_argument(
        "--compress-level", type=int, choices=range(10), help="gzip's level (default 4; 0: stored)"
    )
    args = parser.parse_args()
    out = build(args.out, args.extra, args.python_prefix, args.work, args.compress_level)
    print(f"{out} ({out.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()

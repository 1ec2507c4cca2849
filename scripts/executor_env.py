"""Build the packed virtualenv that Spark ships to executors which have never seen Rewind.

    python scripts/executor_env.py [--out build/rewind-executor-env.tar.gz] [--with REQ ...]

(``make executor-env``). The archive holds Rewind (installed from this checkout, not
editable) and its pinned runtime dependencies (``constraints.txt``), plus whatever ``--with``
names (your translate package, a wheel, a requirement), in a virtualenv built for this
Python. PySpark itself is left out: an executor runs the PySpark of its own Spark
installation (``$SPARK_HOME/python/lib/pyspark.zip``), which must be the same version.

Ship it with Spark's own settings (docs/real-clusters.md)::

    spark.archives: /path/rewind-executor-env.tar.gz#environment
    spark.pyspark.python: ./environment/bin/python

The environment's ``python`` links to the interpreter it was built with (for example
``/usr/bin/python3.11``): the executors need a bare Python of the same version at that path,
or pass ``--python-prefix`` (venv-pack's) for where it is on the executors.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = ("pyspark",)
"""Runtime dependencies the executors take from their Spark installation instead."""


def runtime_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [
        r for r in project["dependencies"] if r.split("[")[0].split("=")[0].strip().lower() not in LEFT_OUT
    ]


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build(out: Path, extra: list[str], python_prefix: str | None, work: Path) -> Path:
    venv = work / "executor-env"
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    constraints = ["-c", str(REPO / "constraints.txt")]
    run(
        [*pip, "--no-deps", str(REPO)]
    )  # Rewind itself, built as a wheel: venv-pack refuses editable installs
    run([*pip, *constraints, *runtime_requirements(), *extra])
    out.parent.mkdir(parents=True, exist_ok=True)
    pack = [str(Path(sys.executable).parent / "venv-pack"), "-p", str(venv), "-o", str(out), "--force", "-q"]
    if python_prefix:
        pack += ["--python-prefix", python_prefix]
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
    args = parser.parse_args()
    out = build(args.out, args.extra, args.python_prefix, args.work)
    print(f"{out} ({out.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()

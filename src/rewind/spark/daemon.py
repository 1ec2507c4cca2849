"""The Python daemon of a local Spark session: PySpark's own, started with Rewind's task modules
already imported (``spark.python.daemon.module``, set by :mod:`rewind.spark.session`).

Spark forks every Python worker from this daemon. PySpark's daemon imports only PySpark, so each
worker imported pandas, pyarrow, confluent-kafka, the spec models and Rewind's task code again on
its first task: ~2-4 s of CPU per worker (measured here, 2 cores under load), paid by every run's
first wave and again by every worker Spark starts later (an idle worker is stopped after a
minute). Imported once here, the forked workers share them, copy on write.

It also takes archives no import needs (PySpark's zip when the same PySpark is installed, Spark's
core jar) off the workers' ``sys.path`` (:func:`drop_needless_archives`), which spares every task
a cost, not only the first.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import zipfile

PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.parquet",
    "confluent_kafka",
    "pyspark.sql.pandas.serializers",
    "rewind.spec",
    "rewind.translate.process",
    "rewind.translate.factory",
    "rewind.spark.job_stage",
    "rewind.spark.pace_server",
    "rewind.spark.progress_channel",
)
"""Modules every Rewind task imports (the layers above :mod:`rewind.spark` import little more)."""


_VERSION = re.compile(r"""__version__(?:\s*:\s*str)?\s*=\s*['"]([^'"]+)['"]""")


def _version(text: str) -> str | None:
    found = _VERSION.search(text)
    return found.group(1) if found else None


def _zip_version(archive: str) -> str | None:
    try:
        with zipfile.ZipFile(archive) as z:
            return _version(z.read("pyspark/version.py").decode())
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _installed_version(path: list[str]) -> str | None:
    """The version of the first PySpark found in a folder (not a zip) of ``path``."""
    for entry in path:
        version_file = os.path.join(entry or ".", "pyspark", "version.py")
        if os.path.isdir(entry or ".") and os.path.isfile(version_file):
            with open(version_file, encoding="utf-8") as f:
                return _version(f.read())
    return None


def _holds_python(archive: str) -> bool:
    try:
        with zipfile.ZipFile(archive) as z:
            return any(name.endswith((".py", ".pyc")) for name in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return True  # unreadable here: leave it to Python's import as before


def needless_archives(path: list[str]) -> list[str]:
    """The archives of ``path`` that imports never need: a ``pyspark.zip`` of the very PySpark
    version installed in a folder of ``path`` (a pip-installed PySpark ships its zip for the
    workers), and jars that hold no Python module (Spark adds the jar of its core classes, for
    distributions that pack PySpark into it)."""
    archives = [e for e in path if e.endswith((".zip", ".jar")) and os.path.isfile(e)]
    if not archives:
        return []
    installed = _installed_version([e for e in path if e not in archives])
    needless = []
    for archive in archives:
        if os.path.basename(archive) == "pyspark.zip":
            if installed is not None and _zip_version(archive) == installed:
                needless.append(archive)
        elif archive.endswith(".jar") and not _holds_python(archive):
            needless.append(archive)
    return needless


def drop_needless_archives() -> None:
    """Take the archives of :func:`needless_archives` off ``sys.path``: PySpark is then imported
    from its installed folder, and no import searches a jar.

    Why: PySpark's worker calls ``importlib.invalidate_caches()`` at the start of every task,
    and on Python 3.11 each zipimporter in ``sys.path_importer_cache`` then reads its archive's
    whole directory again. Spark puts ``pyspark.zip`` and its core jar (5,358 entries) first on
    every worker's PYTHONPATH; imported from the zip, each PySpark package leaves a zipimporter,
    and every other import passes through the jar: 16 of them took 85 ms per task, and 200
    trivial Python tasks ran in 17.5-19.7 s with them, 7.2-8.7 s without (bench/RESULTS.md).
    A cluster whose Spark distribution differs from the installed PySpark keeps its zip. Run
    before anything imports PySpark.
    """
    needless = needless_archives(sys.path)
    for entry in needless:
        sys.path.remove(entry)
    # and what imports made of them already: the jar's ``org`` became a namespace package when
    # the daemon's own imports probed for Jython (Python 3.11's ``copy`` tries ``org.python.core``),
    # and each later probe would search the jar again through it
    inside = tuple(entry + os.sep for entry in needless)
    for key in [k for k in sys.path_importer_cache if k in needless or k.startswith(inside)]:
        del sys.path_importer_cache[key]
    for name, module in list(sys.modules.items()):
        where = list(getattr(module, "__path__", None) or [])
        if getattr(module, "__file__", None) is None and where and all(p.startswith(inside) for p in where):
            del sys.modules[name]


def preload() -> None:
    """Import :data:`PRELOAD`, best effort: a module that fails here fails in the task, as before."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the task reports it with its own traceback
            continue


if __name__ == "__main__":  # `python -m rewind.spark.daemon pyspark.worker`, run by Spark
    drop_needless_archives()
    # Spark starts one daemon per worker module: only the tasks' (pyspark.worker) gains from the
    # preload; a data source's planning workers (pyspark.sql.worker.*) import what they need
    if sys.argv[1:2] in ([], ["pyspark.worker"]):
        preload()  # nothing on stdout: the daemon tells the JVM its port there
    from pyspark.daemon import manager

    manager()

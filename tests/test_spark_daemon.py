"""Rewind's Python daemon: which archives it takes off the workers' ``sys.path``, and a real
Spark task's ``sys.path`` and import caches under it."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from rewind.spark.daemon import needless_archives


def installed(root: Path, version: str) -> str:
    """A folder holding a PySpark of ``version`` (what pip installs into site-packages)."""
    (root / "pyspark").mkdir(parents=True)
    (root / "pyspark" / "version.py").write_text(f"__version__: str = '{version}'\n")
    return str(root)


def archive(path: Path, files: dict[str, str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return str(path)


def test_the_zip_of_the_installed_version_and_jars_without_python_are_needless(tmp_path: Path) -> None:
    site = installed(tmp_path / "site", "4.1.1")
    same = archive(tmp_path / "lib" / "pyspark.zip", {"pyspark/version.py": "__version__ = '4.1.1'\n"})
    py4j = archive(tmp_path / "lib" / "py4j-src.zip", {"py4j/__init__.py": ""})
    core = archive(tmp_path / "jars" / "core.jar", {"org/apache/X.class": "", "META-INF/MANIFEST.MF": ""})
    packed = archive(tmp_path / "jars" / "assembly.jar", {"pyspark/__init__.py": "", "org/Y.class": ""})

    assert needless_archives([str(tmp_path), same, py4j, core, packed, site]) == [same, core]


def test_a_zip_of_another_version_or_with_no_installed_pyspark_stays(tmp_path: Path) -> None:
    other = archive(tmp_path / "lib" / "pyspark.zip", {"pyspark/version.py": "__version__ = '4.0.0'\n"})
    assert needless_archives([other, installed(tmp_path / "site", "4.1.1")]) == []
    assert needless_archives([other, str(tmp_path / "empty")]) == []
    broken = tmp_path / "bad" / "pyspark.zip"
    broken.parent.mkdir()
    broken.write_text("not a zip")
    assert needless_archives([str(broken), installed(tmp_path / "site2", "4.1.1")]) == []


def test_a_task_imports_pyspark_from_its_folder_and_searches_no_archive_but_py4j(spark: Any) -> None:
    def probe(_: Any) -> Any:
        import importlib
        import os
        import sys
        import zipimport

        import pyspark

        importlib.invalidate_caches()  # what PySpark's worker does before every task
        archives = [k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)]
        on_path = [p for p in sys.path if p.endswith((".zip", ".jar")) and os.path.isfile(p)]
        yield (pyspark.__file__, archives, on_path)

    ((pyspark_file, importers, path),) = spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
    assert ".zip" not in pyspark_file, pyspark_file
    assert all("py4j" in p for p in path), path
    assert all("py4j" in i for i in importers), importers

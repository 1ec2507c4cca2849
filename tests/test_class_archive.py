"""Spark's class archive (``rewind.spark.class_archive``): made by the install, mapped by a
Rewind session's JVM, and never trusted when it is cut short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rewind.javacheck import java_version
from rewind.spark import class_archive

SESSION = """
import sys
from rewind.config import load_settings
from rewind.spark import session
spark = session(load_settings())
spark.range(0, 100).selectExpr("sum(id)").collect()
spark.stop()
"""


def _classes_loaded(tmp_path: Path) -> list[str]:
    """The class-load lines of a Rewind session's JVM (its own log, not the terminal's)."""
    log = tmp_path / "classes.log"
    conf = {"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={log}"}
    child = {**os.environ, "REWIND_STATE_DIR": str(tmp_path / "state"), "REWIND_SPARK_CONF": json.dumps(conf)}
    out = subprocess.run(
        [sys.executable, "-c", SESSION], env=child, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "cds" not in out.stdout.lower() and "sharedarchive" not in out.stderr.lower()
    return [line for line in log.read_text().splitlines() if "org.apache.spark." in line]


def test_a_session_maps_sparks_classes_from_the_archive_made_at_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert class_archive.java_options(), "make install makes the archive: none is usable here"
    # Spark's own classes come from the archive, not from the jars: the JDK's own archive holds
    # none of them, so no other shared file can give these lines
    shared = [line for line in _classes_loaded(tmp_path) if "shared objects file (top)" in line]
    assert len(shared) > 1000
    monkeypatch.setenv("REWIND_CLASS_ARCHIVE", "off")  # a session's JVM is then given no archive
    assert class_archive.java_options() == ""


def test_an_archive_cut_short_or_made_by_another_java_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JVM that maps a cut archive dies of SIGBUS: the recorded size must match first."""
    monkeypatch.setattr(class_archive, "FOLDER", tmp_path)
    path = class_archive.archive_path()
    path.write_bytes(b"x" * 1000)
    java = java_version()[1]
    record = path.with_suffix(".json")
    record.write_text(json.dumps({"size": 1000, "java": java}))
    assert class_archive.java_options() == f"-XX:SharedArchiveFile={path} {class_archive.QUIET}"
    record.write_text(json.dumps({"size": 4000, "java": java}))  # the file is shorter than made
    assert class_archive.java_options() == ""
    record.write_text(json.dumps({"size": 1000, "java": 'openjdk version "11.0.2"'}))
    assert class_archive.java_options() == ""
    record.write_text("{")
    assert class_archive.java_options() == ""

"""Finding Java's version, as a session does before it starts Spark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rewind.errors import RewindError
from rewind.javacheck import MIN_JAVA, _version_of, require_java


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    _version_of.cache_clear()  # each case asks a JVM under its own environment
    yield
    _version_of.cache_clear()


@pytest.mark.parametrize("variable", ["JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"])
def test_the_version_is_read_past_the_launchers_picked_up_note(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # users set these for proxies and trust stores; the launcher then prints "Picked up ..." first
    monkeypatch.setenv(variable, "-Dfile.encoding=UTF-8")
    major, line = require_java()
    assert major >= MIN_JAVA
    assert "version" in line and "Picked up" not in line


def test_a_java_that_prints_no_version_is_one_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'NOTE: Picked up JAVA_TOOL_OPTIONS: -Xmx1g' >&2\necho 'no JVM' >&2\n")
    fake.chmod(0o755)
    with pytest.raises(RewindError, match=r"cannot read the Java version from 'NOTE: Picked up.*JAVA_HOME"):
        _version_of(str(fake))

"""Java is Spark's runtime: find it and check that it is 17 or newer."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from rewind.errors import RewindError

MIN_JAVA = 17
VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
INSTALL_HINT = "install Java 17+ (Debian: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME"


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def java_version() -> tuple[int, str]:
    """(major version, version line) of the Java Spark will use; raises when there is none."""
    java = java_executable()
    if java is None:
        raise RewindError(f"Java not found; {INSTALL_HINT}")
    return _version_of(java)


@functools.lru_cache(maxsize=8)
def _version_of(java: str) -> tuple[int, str]:
    """Once per executable and process: ``java -version`` starts a JVM (~0.1 s, more under load),
    and :func:`rewind.spark.session` checks on every call, a few times per run."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    lines = (out.stderr or out.stdout).splitlines()
    # the launcher first prints a note per option variable it honours (JAVA_TOOL_OPTIONS,
    # JDK_JAVA_OPTIONS: "Picked up ..."), which users set for proxies and trust stores
    line = next((x for x in lines if VERSION.search(x)), lines[0] if lines else "")
    match = VERSION.search(line)
    if not match:
        raise RewindError(f"cannot read the Java version from {line!r}; {INSTALL_HINT}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0" style
        major = int(match.group(2))
    return major, line


def require_java() -> tuple[int, str]:
    major, line = java_version()
    if major < MIN_JAVA:
        raise RewindError(f"Java {major} found, Spark 4 needs {MIN_JAVA}+; {INSTALL_HINT}")
    return major, line

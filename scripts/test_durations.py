"""Write tests/durations.json (seconds per test file) from pytest JUnit XML reports: the mean
over the reports given (runs of the same suite), which evens out one run's noise.

The suite runs with ``--dist loadfile``: one file is one unit of work for a worker. The
conftest hands files out longest first (tests/file_order.py), which keeps one long file from
starting last and running alone at the end. Refresh after tests were added or changed much:

    make test PYTEST_ARGS="... --junitxml=/tmp/suite.xml"
    .venv/bin/python scripts/test_durations.py /tmp/suite.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def file_seconds(reports: list[Path]) -> dict[str, float]:
    """Seconds per test file, the mean over ``reports``."""
    seconds: dict[str, float] = defaultdict(float)
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            # classname is the dotted module path (tests.test_x[.Class]); the file is its
            # first two parts
            module = ".".join(case.get("classname", "").split(".")[:2])
            seconds[module.replace(".", "/") + ".py"] += float(case.get("time", 0.0))
    return {f: s / len(reports) for f, s in seconds.items()}


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: test_durations.py JUNIT.xml...", file=sys.stderr)
        return 2
    seconds = file_seconds([Path(a) for a in argv])
    ordered = {f: round(s, 1) for f, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{OUT}: {len(ordered)} files, {sum(ordered.values()) / 60:.1f} worker-minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A unit whose transaction the broker interrupted is written again (rewind.kafka.unit_redo);
the broker's side of it, a producer that lost its broker mid-transaction, is in
tests/test_broker_restart.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.kafka.unit_redo import REDOS, UnitInterrupted, redo_interrupted


@given(interruptions=st.integers(min_value=0, max_value=REDOS), first=st.booleans())
def test_an_interrupted_unit_is_written_again_and_never_as_a_first_attempt(
    interruptions: int, first: bool
) -> None:
    seen: list[bool] = []

    def write(first_attempt: bool) -> str:
        seen.append(first_attempt)
        if len(seen) <= interruptions:
            raise UnitInterrupted("the broker went away")
        return "committed"

    assert redo_interrupted(write, first) == "committed"
    assert seen == [first] + [False] * interruptions


def test_a_unit_interrupted_on_every_attempt_fails_with_the_interruption() -> None:
    calls = []

    def write(first_attempt: bool) -> None:
        calls.append(first_attempt)
        raise UnitInterrupted(f"attempt {len(calls)} interrupted")

    with pytest.raises(UnitInterrupted, match=f"attempt {REDOS + 1} interrupted"):
        redo_interrupted(write, True)
    assert len(calls) == REDOS + 1


def test_any_other_failure_is_not_written_again() -> None:
    calls = []

    def write(first_attempt: bool) -> None:
        calls.append(first_attempt)
        raise ValueError("a record the sink refused")

    with pytest.raises(ValueError, match="refused"):
        redo_interrupted(write, True)
    assert calls == [True]


def test_a_redo_is_said_on_stderr_where_nothing_set_up_logging() -> None:
    """As in a Spark task's Python worker (whose stderr goes to spark.log): the library's
    NullHandler alone would swallow the warning."""
    code = (
        "from rewind.kafka.unit_redo import UnitInterrupted, redo_interrupted\n"
        "tries = []\n"
        "def write(first):\n"
        "    tries.append(first)\n"
        "    if len(tries) == 1:\n"
        "        raise UnitInterrupted('unit u-7: its transaction did not commit')\n"
        "    return 'done'\n"
        "print(redo_interrupted(write, True))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert proc.stderr.splitlines() == [
        "rewind: unit u-7: its transaction did not commit; writing the unit again"
    ]

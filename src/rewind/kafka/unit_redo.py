"""A unit whose transaction the broker interrupted is written again, in the same task.

A task that writes its units in transactions of its own (the Kafka sink's
:mod:`rewind.sinks.kafka.unit_writer`) does not commit a transaction during which its client
lost every broker at once: it aborts it and raises :class:`UnitInterrupted`, as it does when
the commit itself fails. The task writes the unit again from its start
(:func:`redo_interrupted`), in a new transaction that fences the old one; that attempt first
looks for the unit's marker, so a commit that failed on the client but landed on the broker is
not written twice.

Why: noida-db, killed while a unit's transaction was open and started again, committed the
unit's marker and not its records. The records stayed in the log as aborted ones, so the
topic's offsets still counted them and the run's check of what the topic holds
(:mod:`rewind.sinks.kafka.held`) could not see that they were gone. A broker that keeps its
transactions' state durably (Kafka) needs no second write; it costs one unit's records again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from rewind.errors import RewindError
from rewind.logs import to_stderr_unless_configured

log = logging.getLogger(__name__)

T = TypeVar("T")

REDOS = 3
"""How many more times a task writes a unit whose transaction was interrupted, before it fails."""


class UnitInterrupted(RewindError):
    """The broker went away while a unit's transaction was open, or its commit failed: nothing
    of the unit is visible, or (a failed commit that landed) all of it with its marker. The unit
    can be written again by an attempt that looks for its marker first."""


def redo_interrupted(write: Callable[[bool], T], first_attempt: bool) -> T:
    """``write(first_attempt)``; while it raises :class:`UnitInterrupted`, ``write(False)``
    again (an attempt after an interrupted one is never a first attempt), at most :data:`REDOS`
    more times."""
    first = first_attempt
    for redo in range(REDOS + 1):
        try:
            return write(first)
        except UnitInterrupted as exc:
            if redo == REDOS:
                raise
            # a task's worker has no logging set up: this reaches spark.log as the outage lines do
            to_stderr_unless_configured(log).warning("%s; writing the unit again", exc)
            first = False
    raise AssertionError("unreachable: the last attempt returned or raised")

"""Reconsume a live consumer group's topics with a temporary group, beside the live one.

For services (light: no Spark, no Arrow; confluent-kafka and the ledger only):

* :class:`ExistingSide` wraps the live group's consumer loop and handler;
* :class:`TemporarySide` runs a second handler from the planned start offsets until every
  partition is handed over to the existing side.

Two modes (chosen by ``rewind reconsume plan --mode``): ``parallel`` — the existing side
keeps handling everything and records how far it got, the temporary side stops there;
``handover`` — the existing side skips what the temporary side owns, and every message is
handled exactly once, by exactly one side. docs/reconsume.md has a worked example.
"""

from rewind.reconsume.base import Handler, Side
from rewind.reconsume.exceptions import (
    ReconsumeError,
    ReconsumeInputError,
    ReconsumeNotStarted,
    TemporaryGroupTaken,
    TemporarySideRunning,
)
from rewind.reconsume.existing import ExistingSide
from rewind.reconsume.temporary import DEFAULT_IDLE_HANDOVER_S, TemporarySide, lease_target

__all__ = [
    "DEFAULT_IDLE_HANDOVER_S",
    "ExistingSide",
    "Handler",
    "ReconsumeError",
    "ReconsumeInputError",
    "ReconsumeNotStarted",
    "Side",
    "TemporaryGroupTaken",
    "TemporarySide",
    "TemporarySideRunning",
    "lease_target",
]

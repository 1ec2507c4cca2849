"""Consumer groups' offsets for people: plan, execute and undo a reset; describe a group.

``plan_reset(settings, group, topics=[...], to_datetime=...)`` returns a frozen
:class:`ResetPlan` and changes nothing; ``execute_reset(settings, plan)`` applies it to an
inactive group and records it in the ledger; ``undo_reset(settings, reset_id)`` puts the
offsets back; ``describe(settings, group)`` shows offsets, lag, members and state. The
protocol-level calls are in :mod:`rewind.kafka.groups`.
"""

from rewind.groups.csvplan import from_csv, to_csv
from rewind.groups.exceptions import (
    LogStartMoved,
    OffsetsMoved,
    ResetError,
    ResetInputError,
    TimeAfterNewestRecord,
    TimeBeforeLogStart,
    TopicNotConsumed,
)
from rewind.groups.plan import PartitionReset, ResetPlan, target_offset
from rewind.groups.service import (
    GroupDescription,
    ResetOutcome,
    UndoOutcome,
    describe,
    execute_reset,
    list_resets,
    plan_reset,
    undo_reset,
)

__all__ = [
    "GroupDescription",
    "LogStartMoved",
    "OffsetsMoved",
    "PartitionReset",
    "ResetError",
    "ResetInputError",
    "ResetOutcome",
    "ResetPlan",
    "TimeAfterNewestRecord",
    "TimeBeforeLogStart",
    "TopicNotConsumed",
    "UndoOutcome",
    "describe",
    "execute_reset",
    "from_csv",
    "list_resets",
    "plan_reset",
    "target_offset",
    "to_csv",
    "undo_reset",
]

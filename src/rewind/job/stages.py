"""A run as ordered stages, derived from its plan without side effects.

:func:`plan_stages` is a pure function of the plan (and of which units are done already): it
reads nothing and writes nothing. ``rewind plan`` prints its stages; the runner
(:func:`rewind.job.runner.execute`) walks the very same list and reports each stage to its
console as it starts, so what the plan shows is what a run does, in that order (SQLMesh's
plan → stages → evaluator, explained by the same stages).

A run's stages, in order:

1. :class:`TakeLease` on the staging target (held, heartbeated, for the whole run);
2. :class:`PrepareStaging`: the target's staging and the quarantine table (and, for a fold
   into a sink that keeps one row per key, the scratch table of partial rows);
3. :class:`Reconcile`: units the sink already holds become done in the ledger;
4. one :class:`RunWave` per wave of units not done yet (a unit the reconcile found done is
   skipped when its wave comes);
5. :class:`MergeRows`, only with a ``merge:`` policy (:mod:`rewind.job.merge`);
5. :class:`Finalize`, only for read models (a fold, or a replace-window on a column);
6. :class:`Conclude`: the conservation law over the whole run, then ``succeeded``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rewind.job.components import quarantine_table
from rewind.job.finalize import needs_finalize, parts_in_scratch

if TYPE_CHECKING:
    from rewind.job.plan import JobPlan


@dataclass(frozen=True)
class Stage:
    name: ClassVar[str]

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class TakeLease(Stage):
    name: ClassVar[str] = "take-lease"
    target: str

    def describe(self) -> str:
        return f"take the lease on {self.target}"


@dataclass(frozen=True)
class PrepareStaging(Stage):
    name: ClassVar[str] = "prepare-staging"
    target: str
    quarantine_table: str
    parts_in_scratch: bool

    def describe(self) -> str:
        scratch = ", and a scratch table for the fold's partial rows" if self.parts_in_scratch else ""
        return f"prepare the staging of {self.target} and quarantine {self.quarantine_table}{scratch}"


@dataclass(frozen=True)
class Reconcile(Stage):
    name: ClassVar[str] = "reconcile"

    def describe(self) -> str:
        return "mark done the units the sink already holds"


@dataclass(frozen=True)
class RunWave(Stage):
    name: ClassVar[str] = "run-wave"
    index: int
    unit_ids: tuple[str, ...]
    offsets: int

    def describe(self) -> str:
        return f"wave {self.index + 1}: {len(self.unit_ids)} units, {self.offsets:,} offsets"


@dataclass(frozen=True)
class Finalize(Stage):
    name: ClassVar[str] = "finalize"
    fold: bool

    def describe(self) -> str:
        if self.fold:
            return "fold the run's rows per key and keep the replaced window"
        return "drop the rows outside the replaced window"


@dataclass(frozen=True)
class MergeRows(Stage):
    name: ClassVar[str] = "merge"
    on_collision: str

    def describe(self) -> str:
        return f"merge the run's rows with live's per key ({self.on_collision}), counting each decision"


@dataclass(frozen=True)
class Conclude(Stage):
    name: ClassVar[str] = "conclude"

    def describe(self) -> str:
        return "check the conservation law over the run, mark it succeeded"


def default_wave_size() -> int:
    """Units per wave when the caller does not say: enough tasks to keep every core busy."""
    return max(8, 4 * (os.cpu_count() or 2))


def plan_stages(
    plan: JobPlan, *, target: str, wave_size: int, done: Iterable[str] = ()
) -> list[Stage]:
    """The stages of a run of ``plan`` into ``target``; units in ``done`` get no wave."""
    if wave_size < 1:
        raise ValueError(f"wave_size must be at least 1, got {wave_size}")
    spec = plan.job_spec()
    finished = set(done)
    todo = [u for u in plan.units if u.id not in finished]
    stages: list[Stage] = [
        TakeLease(target),
        PrepareStaging(target, quarantine_table(spec), parts_in_scratch(spec)),
        Reconcile(),
    ]
    for index, start in enumerate(range(0, len(todo), wave_size)):
        wave = todo[start : start + wave_size]
        stages.append(RunWave(index, tuple(u.id for u in wave), sum(u.end - u.start for u in wave)))
    if spec.merge is not None:
        stages.append(MergeRows(spec.merge.on_collision))
    if needs_finalize(spec):
        stages.append(Finalize(spec.translate.fold is not None))
    stages.append(Conclude())
    return stages

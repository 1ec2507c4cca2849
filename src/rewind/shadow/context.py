"""A recorded shadow with what its commands need: its plan, spec, sink and v2 staging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.job.components import make_sink
from rewind.shadow.exceptions import ShadowError

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.ledger.shadows import ShadowRecord, ShadowStore
    from rewind.sinks.base import Staging, StagingSink
    from rewind.spec import JobSpec
    from rewind.spec.shadow import Shadow


@dataclass
class ShadowContext:
    record: ShadowRecord
    store: ShadowStore
    plan: JobPlan
    sink: StagingSink[Any]
    staging: Staging | None

    @property
    def spec(self) -> JobSpec:
        return self.plan.job_spec()

    @property
    def config(self) -> Shadow:
        config = self.spec.shadow
        assert config is not None, "a shadow's run has a shadow: section"
        return config

    def committed_units(self) -> list[str]:
        """The unit ranges in v2 (history units and tail batches), from the sink."""
        if self.staging is None:
            return []
        return sorted(self.sink.committed_units(self.staging, self.record.run_id))


def load_shadow(settings: Settings, ledger: Ledger, name: str) -> ShadowContext:
    """The shadow ``name`` (one line when there is none) with its run's plan and staging."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import usable_plan
    from rewind.ledger import NotFound
    from rewind.ledger.shadows import ShadowStore

    store = ShadowStore(ledger.engine)
    record = store.get(name)
    try:
        run = ledger.get_run(record.run_id)
    except NotFound:
        raise ShadowError(
            f"shadow {name}'s history run {record.run_id} has not started yet; run `rewind shadow start SPEC`"
        ) from None
    plan = usable_plan(settings, ledger, run.plan_id, how="the original spec (rewind shadow start SPEC)")
    sink = make_sink(settings, plan.job_spec())
    staging = sink.staging_from_dict(run.staging) if run.staging else None
    return ShadowContext(record, store, plan, sink, staging)

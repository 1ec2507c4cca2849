"""The plan's cost estimate: its units and sample, the settings' prices, a rehearsal's rates.

The arithmetic is :func:`rewind.core.cost.estimate`; this module only gathers the inputs:
records per source from the units, the record size from the sample, the cores from
``cost.cores`` or the Spark master, and the processing rate and commit time from the last
passed rehearsal of the same spec fingerprint (``rewind rehearse``) when there is one.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from rewind.core.cost import CostInputs, estimate
from rewind.errors import RewindError
from rewind.job.stages import default_wave_size

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.core.units import WorkUnit

_LOCAL = re.compile(r"^local\[(\d+|\*)(?:,\s*\d+)?\]$")


def cores_of(settings: Settings) -> int:
    """``cost.cores``, else N of ``local[N]``, else this host's cores (``local[*]``, a cluster)."""
    if settings.cost.cores:
        return settings.cost.cores
    match = _LOCAL.match(settings.spark.master.strip())
    if match and match.group(1) != "*":
        return int(match.group(1))
    return os.cpu_count() or 1


def cost_estimate(
    settings: Settings,
    units: tuple[WorkUnit, ...],
    facts: dict[str, Any],
    rates: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The estimate of a plan; ``rates`` are a rehearsal's measured ``records_per_core_second``
    and ``commit_s_per_unit`` (with its ``rehearsal_id``), else the calibrated defaults; its
    ``bytes_per_record`` per source replace the sample's average record size."""
    archive = sum(u.end - u.start for u in units if u.source == "archive")
    kafka = sum(u.end - u.start for u in units if u.source == "kafka")
    other = sum(u.end - u.start for u in units) - archive - kafka  # a table source's key ranges
    extra: dict[str, Any] = {}
    if rates and rates.get("records_per_core_second"):
        extra["records_per_core_second"] = float(rates["records_per_core_second"])
        extra["rate_source"] = f"rehearsal {rates.get('rehearsal_id', '?')}"
        if rates.get("commit_s_per_unit") is not None:
            extra["commit_s_per_unit"] = float(rates["commit_s_per_unit"])
        if rates.get("wave_fixed_s"):
            extra["wave_fixed_s"] = float(rates["wave_fixed_s"])
            extra["waves"] = -(-len(units) // default_wave_size())
    avg = facts.get("avg_record_bytes")
    measured = (rates or {}).get("bytes_per_record") or {}
    if measured.get("kafka") or measured.get("archive"):  # what the rehearsal's tasks really read
        avg = measured.get("kafka") or measured.get("archive")
        extra["archive_record_bytes"] = measured.get("archive") or avg
        extra["bytes_source"] = f"rehearsal {(rates or {}).get('rehearsal_id', '?')}"
    inputs = CostInputs(
        kafka_records=kafka,
        archive_records=archive,
        other_records=other,
        avg_record_bytes=avg,
        units=len(units),
        cores=cores_of(settings),
        broker_remote=settings.kafka.remote,
        prices=settings.cost.prices() or None,
        **extra,
    )
    return estimate(inputs)


def rehearsed_rates(settings: Settings, fingerprint: str) -> dict[str, Any] | None:
    """The measured rates (and bytes per record) of the last passed rehearsal of this
    fingerprint, if any."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger
    from rewind.ledger.evidence import EvidenceStore

    try:
        with Ledger.open(settings.ledger) as ledger:
            found = EvidenceStore(ledger.engine).latest_passed(fingerprint)
    except RewindError:  # a plan's estimate must not fail for want of a ledger: the default rate
        return None
    rates = found.details.get("rates") or {} if found is not None else {}
    if found is None or not (rates.get("records_per_core_second") or rates.get("bytes_per_record")):
        return None
    return {**found.details["rates"], "rehearsal_id": found.id}

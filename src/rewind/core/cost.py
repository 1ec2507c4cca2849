"""The cost model of a run: bytes, core-seconds, egress, money and an ETA, before it runs.

Pure arithmetic over known inputs, so that the plan, ``rewind rehearse`` and the tests agree
to the byte and the cent. Where the inputs come from:

* records per source: the plan's units; bytes per record: measured by the last passed
  rehearsal of the same spec fingerprint (record bytes its tasks read, per source:
  ``bytes_source: rehearsal rh-…``) when there is one, else the plan's sample (``sample``);
* the processing rate: a rehearsal of the same spec fingerprint when one passed (its
  measured records per core-second and commit seconds per unit), else the calibrated
  defaults below;
* prices: the settings' ``cost:`` section, each a number *with its currency*
  (``"0.048 USD"``); a bare number is refused, since a price in an unknown currency would
  make every total meaningless.

GB here is 10^9 bytes, as cloud bills count it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

DEFAULT_RECORDS_PER_CORE_SECOND = 47_110.0
"""``rewind run`` end to end (read, JSON decode, translate, lineage, quarantine, unit commits to
Iceberg) measured at 94,221 records/s on a quiet 2-core machine (bench/RESULTS.md, "Backfill job
end to end", quiet re-run): 94,221 / 2 cores. A rehearsal of the spec replaces it."""

DEFAULT_SPARK_STARTUP_S = 12.0
"""Spark session start-up (JVM, local[*], first job) measured at 12.3 s on the same machine under a
load average of ~3 (``session(settings)`` then ``range(10).count()``), 2026-11-25."""

DEFAULT_COMMIT_S_PER_UNIT = 0.01
"""Seconds of commit per unit (quarantine and sink commits, ledger rows) when no rehearsal
measured it: ``rewind rehearse`` measured 0.064 s for a wave of 8 units into Iceberg (local SQL
catalog) on tansu, 2026-11-25 (tests/test_rehearse.py with ``-s``). A wave commits its units
together, so this is a per-unit share of wave commits, not one commit per unit."""

GB = 1_000_000_000

PRICE_UNITS = {"core_hour": "core-hour", "gb_egress": "GB", "gb_object_read": "GB"}
"""The priced quantities and the unit each price is per."""

_PRICE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]{3})\s*(?:/\s*([A-Za-z-]+))?\s*$")


class PriceError(ValueError):
    """A price the cost model cannot use: its message is one line naming the field."""


@dataclass(frozen=True)
class Price:
    amount: float
    currency: str

    def __str__(self) -> str:
        return f"{self.amount:g} {self.currency}"


def parse_price(field: str, value: Any) -> Price:
    """``"0.048 USD"`` or ``"0.048 USD/core-hour"`` → a :class:`Price`; anything else one line."""
    unit = PRICE_UNITS.get(field)
    if unit is None:
        raise PriceError(f"cost.{field}: unknown price; allowed: {', '.join(PRICE_UNITS)}")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PriceError(f"cost.{field}: expected a price like '0.05 USD', got {value!r}")
    if isinstance(value, int | float):
        raise PriceError(f"cost.{field}: {value!r} has no currency; write it like '{value} USD' (per {unit})")
    match = _PRICE.match(value)
    if match is None:
        raise PriceError(
            f"cost.{field}: {value!r} is not a price; write an amount and a currency like '0.05 USD' "
            f"(per {unit})"
        )
    amount, currency, per = match.groups()
    if per is not None and per.lower() != unit.lower():
        raise PriceError(f"cost.{field}: {value!r} is priced per {per}; this price is per {unit}")
    return Price(float(amount), currency.upper())


def check_prices(prices: dict[str, Price]) -> None:
    """One currency across the prices: a total of USD and EUR would be no amount at all."""
    currencies = sorted({p.currency for p in prices.values()})
    if len(currencies) > 1:
        raise PriceError(f"cost: prices in {' and '.join(currencies)}; give every price in one currency")


@dataclass(frozen=True)
class CostInputs:
    """What the model needs; every field is a measured or configured number."""

    kafka_records: int
    archive_records: int
    avg_record_bytes: float | None
    units: int
    cores: int
    records_per_core_second: float = DEFAULT_RECORDS_PER_CORE_SECOND
    commit_s_per_unit: float = DEFAULT_COMMIT_S_PER_UNIT
    spark_startup_s: float = DEFAULT_SPARK_STARTUP_S
    rate_source: str = "default"
    other_records: int = 0
    """Records from neither broker nor archive (a table source's rows): compute, no read price."""
    broker_remote: bool = False
    prices: dict[str, Price] | None = None
    archive_record_bytes: float | None = None
    """Bytes per archived record when measured apart from the broker's (else ``avg_record_bytes``)."""
    bytes_source: str = "sample"
    """Where the bytes per record come from: ``sample`` (the plan's) or ``rehearsal <id>``."""
    waves: int = 0
    wave_fixed_s: float = 0.0
    """A wave's fixed seconds beyond its records' work (a rehearsal measures it:
    :func:`rewind.ops.stage_rates.wave_costs`)."""


def estimate(inputs: CostInputs) -> dict[str, Any]:
    """Raw numbers (bytes, seconds, money rounded to 1/10,000 of the currency)."""
    avg = inputs.avg_record_bytes
    archived = inputs.archive_record_bytes or avg
    broker_bytes = round(avg * inputs.kafka_records) if avg else None
    archive_bytes = round(archived * inputs.archive_records) if archived else None
    records = inputs.kafka_records + inputs.archive_records + inputs.other_records
    core_seconds = records / inputs.records_per_core_second
    cores = max(1, inputs.cores)
    # a unit is never split across tasks: fewer units than cores leave cores idle
    compute_s = core_seconds / (min(cores, inputs.units) if inputs.units > 0 else cores)
    commit_s = inputs.units * inputs.commit_s_per_unit
    waves_s = inputs.waves * inputs.wave_fixed_s
    out: dict[str, Any] = {
        "records": records,
        "bytes_from_broker": broker_bytes,
        "bytes_from_archive": archive_bytes,
        "bytes_source": inputs.bytes_source,
        "records_per_core_second": inputs.records_per_core_second,
        "rate_source": inputs.rate_source,
        "cores": cores,
        "core_seconds": round(core_seconds, 3),
        "compute_seconds": round(compute_s, 3),
        "commit_seconds": round(commit_s, 3),
        "spark_startup_seconds": inputs.spark_startup_s,
        "wave_overhead_seconds": round(waves_s, 3),
        "eta_seconds": round(inputs.spark_startup_s + waves_s + compute_s + commit_s, 3),
        "broker_remote": inputs.broker_remote,
        "egress_bytes": (broker_bytes or 0) if inputs.broker_remote else 0,
    }
    if inputs.prices:
        out["money"] = _money(inputs.prices, core_seconds, out["egress_bytes"], archive_bytes or 0)
    return out


def _money(prices: dict[str, Price], core_seconds: float, egress: int, object_read: int) -> dict[str, Any]:
    check_prices(prices)
    parts: dict[str, float] = {}
    if "core_hour" in prices:
        parts["compute"] = prices["core_hour"].amount * core_seconds / 3600
    if "gb_egress" in prices:
        parts["egress"] = prices["gb_egress"].amount * egress / GB
    if "gb_object_read" in prices:
        parts["object_read"] = prices["gb_object_read"].amount * object_read / GB
    currency = next(iter(prices.values())).currency
    return {
        "currency": currency,
        **{k: round(v, 4) for k, v in parts.items()},
        "total": round(sum(parts.values()), 4),
    }


def human_bytes(n: float | None) -> str:
    """1,234,567 → '1.2 MB' (decimal units, as the prices count)."""
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def human_seconds(s: float | None) -> str:
    """75.2 → '1m 15s'; 4000 → '1h 6m'."""
    if s is None:
        return "?"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"


def describe(est: dict[str, Any]) -> list[str]:
    """The estimate in human units, one line per quantity (for ``rewind plan`` and rehearse)."""
    lines = [
        f"read: {human_bytes(est.get('bytes_from_broker'))} from the broker"
        + (" (remote: egress)" if est.get("broker_remote") else "")
        + f", {human_bytes(est.get('bytes_from_archive'))} from the archive"
        + f" (bytes per record: {est.get('bytes_source', 'sample')})",
        f"compute: {est['core_seconds'] / 3600:.3f} core-hours at {est['records_per_core_second']:,.0f} "
        f"records/core-s ({est['rate_source']}) on {est['cores']} core(s)",
        f"ETA: {human_seconds(est['eta_seconds'])} = Spark start-up "
        f"{human_seconds(est['spark_startup_seconds'])}"
        + (f" + waves {human_seconds(waves)}" if (waves := est.get("wave_overhead_seconds")) else "")
        + f" + processing {human_seconds(est['compute_seconds'])}"
        f" + commits {human_seconds(est['commit_seconds'])}"
        + (f"; {live['summary']}" if (live := est.get("live")) and live.get("summary") else ""),
    ]
    money = est.get("money")
    if money:
        cur = money["currency"]
        parts = ", ".join(f"{k} {money[k]:.4f}" for k in ("compute", "egress", "object_read") if k in money)
        lines.append(f"cost: {money['total']:.4f} {cur} ({parts})")
    return lines

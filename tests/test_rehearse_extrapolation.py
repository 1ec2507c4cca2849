"""A rehearsal's extrapolation separates each wave's fixed cost from the per-record work
(:func:`rewind.ops.stage_rates.wave_costs`): a small slice, whose waves are mostly fixed cost,
must not extrapolate the full run at several times its real length (it did: a 10% slice of a
3,000-record topic gave 243-346 s for a run of 58-82 s).

The waves below are what a run's timings hold (records, the Spark job's seconds, the tasks' own
stage seconds); they follow a known law, fixed seconds per wave plus seconds per record per core,
so the full run's real time is known and the slice's extrapolation is checked against it.
"""

from __future__ import annotations

import math

from hypothesis import assume, given
from hypothesis import strategies as st

from rewind.core.cost import CostInputs, estimate
from rewind.ops.stage_rates import wave_costs


def wave(records: int, units: int, cores: int, fixed_s: float, per_record_s: float) -> dict[str, object]:
    """A wave's timing under the law: its tasks work ``per_record_s`` a record, spread over the
    cores its units can use, after ``fixed_s`` of start."""
    work = records * per_record_s
    return {
        "units": units,
        "records": records,
        "spark_s": fixed_s + work / min(cores, units),
        "commit_s": 0.0,
        "stages": {"read": work * 0.3, "decode": work * 0.2, "translate": work * 0.4, "write": work * 0.1},
    }


def extrapolated(
    slice_waves: list[dict[str, object]], cores: int, full_records: int, full_units: int, full_waves: int
) -> float:
    rate, fixed = wave_costs(slice_waves, cores)
    assert rate is not None
    est = estimate(
        CostInputs(
            kafka_records=full_records,
            archive_records=0,
            avg_record_bytes=200.0,
            units=full_units,
            cores=cores,
            records_per_core_second=rate,
            commit_s_per_unit=0.0,
            spark_startup_s=0.0,
            waves=full_waves,
            wave_fixed_s=fixed,
        )
    )
    return float(est["eta_seconds"])


def test_a_small_slice_mostly_fixed_cost_extrapolates_near_the_full_run() -> None:
    # the bug's numbers: 3,000 records, a 10% slice in one wave of 2 units; a wave costs ~8 s fixed
    cores, fixed, per = 2, 8.0, 0.004
    full = [wave(1500, 8, cores, fixed, per), wave(1500, 8, cores, fixed, per)]
    real = sum(float(w["spark_s"]) for w in full)  # type: ignore[arg-type]
    slice_waves = [wave(300, 2, cores, fixed, per)]
    got = extrapolated(slice_waves, cores, 3000, 16, 2)
    assert real / 1.5 <= got <= real * 1.5, (got, real)
    # what dividing the records by the whole time gave: several times too long
    naive = 3000 / (300 / (float(slice_waves[0]["spark_s"]) * cores)) / cores  # type: ignore[arg-type]
    assert naive > 1.5 * real


@given(
    cores=st.integers(1, 8),
    fixed=st.floats(0.0, 30.0),
    per=st.floats(1e-6, 1e-3),
    full_records=st.integers(1_000, 5_000_000),
    fraction=st.sampled_from([0.01, 0.1]),
    unit_records=st.integers(250, 250_000),
)
def test_any_slice_extrapolates_within_1_5x_of_the_law(
    cores: int, fixed: float, per: float, full_records: int, fraction: float, unit_records: int
) -> None:
    wave_size = max(8, 4 * cores)
    full_units = max(1, math.ceil(full_records / unit_records))
    full_waves = math.ceil(full_units / wave_size)
    full = []
    left = full_records
    for _ in range(full_waves):
        units = min(wave_size, math.ceil(left / unit_records))
        records = min(left, units * unit_records)
        full.append(wave(records, units, cores, fixed, per))
        left -= records
    real = sum(float(w["spark_s"]) for w in full)  # type: ignore[arg-type]
    assume(real >= 1.0)  # a run of a second or more: the model's figures are rounded to milliseconds
    slice_records = max(1, round(full_records * fraction))
    slice_units = min(full_units, max(1, math.ceil(slice_records / max(1, unit_records // 10))))
    slice_waves = [wave(slice_records, min(slice_units, wave_size), cores, fixed, per)]
    got = extrapolated(slice_waves, cores, full_records, full_units, full_waves)
    assert real / 1.5 <= got <= real * 1.5, (got, real)

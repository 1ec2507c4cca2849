"""`rewind rehearse`: the slice (exact, spread over the window: hypothesis), and a real rehearsal
on tansu into a throw-away Iceberg target next to a real promoted target that stays untouched.

The real test runs the job twice on Spark (the real run it guards, then the rehearsal: run,
verify, promote, rollback, cleanup) on 2 x 300 order events.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from rewind.config import Settings, load_settings
from rewind.core.slices import SliceError, positions, shares, slice_units
from rewind.core.units import WorkUnit
from tests import job_fixtures as jf
from tests.kafka_util import create_topic


@hsettings(max_examples=300, deadline=None)
@given(size=st.integers(1, 5000), n=st.integers(1, 5000), pieces=st.integers(1, 8))
def test_pieces_are_exact_disjoint_and_span_the_window(size: int, n: int, pieces: int) -> None:
    got = positions(size, n, pieces)
    share = min(n, size)
    assert sum(b - a for a, b in got) == share
    assert all(0 <= a < b <= size for a, b in got)
    assert all(got[i][1] <= got[i + 1][0] for i in range(len(got) - 1))  # disjoint, in order
    assert got[0][0] == 0
    if len(got) > 1:  # from the first offset to the last
        assert got[-1][1] == size
    assert len(got) == (1 if share == size else min(pieces, share))


@hsettings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6),
    records=st.integers(1, 20_000),
)
def test_a_record_count_is_split_exactly_in_proportion(sizes: list[int], records: int) -> None:
    got = shares(sizes, records=records)
    total = sum(sizes)
    assert sum(got) == min(records, total)
    assert all(0 <= g <= s for g, s in zip(got, sizes, strict=True))
    if records < total:  # largest remainder: each within 1 of its exact share
        assert all(abs(g - records * s / total) < 1 for g, s in zip(got, sizes, strict=True))


def test_slices_follow_units_across_gaps_and_sources() -> None:
    units = (
        WorkUnit("t", 0, 0, 100, "archive"),
        WorkUnit("t", 0, 150, 250, "archive"),  # a skipped gap [100, 150) between two units
        WorkUnit("t", 0, 250, 450),
    )
    got = slice_units(units, fraction=0.1)
    archive = [(u.start, u.end) for u in got if u.source == "archive"]
    kafka = [(u.start, u.end) for u in got if u.source == "kafka"]
    # archive: 200 offsets end to end, 20 in 4 pieces of 5 at positions 0, 65, 130, 195
    assert archive == [(0, 5), (65, 70), (180, 185), (245, 250)]
    assert kafka == [(250, 255), (315, 320), (380, 385), (445, 450)]


@pytest.mark.parametrize(
    ("fraction", "records", "says"),
    [
        (0.0, None, "outside (0, 1]"),
        (1.5, None, "outside (0, 1]"),
        (None, 0, "must be positive"),
        (0.1, 10, "not both"),
    ],
)
def test_bad_slices_are_one_line(fraction: float | None, records: int | None, says: str) -> None:
    with pytest.raises(SliceError) as caught:
        shares([10], fraction=fraction, records=records)
    assert says in str(caught.value) and len(str(caught.value).splitlines()) == 1


def _snapshot(settings: Settings, table: str) -> int | None:
    from rewind.catalog import load_catalog

    snap = load_catalog(settings).load_table(table).current_snapshot()
    return None if snap is None else snap.snapshot_id


def test_rehearsal_on_tansu_touches_nothing_real_and_cleans_up(
    tmp_path: Path, bootstrap: str, topic_name: str
) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.publish import promote_run
    from rewind.job.service import open_ledger, plan_job, run_job
    from rewind.ledger.evidence import EvidenceStore
    from rewind.ops.rehearse import rehearse
    from rewind.spec import parse_spec

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    conf = settings.kafka_config()
    create_topic(conf, topic_name, 2)
    orders = jf.order_events(600, 2)
    coords = jf.produce_orders(conf, topic_name, orders)
    fate = {coords[o.index]: o.fate for o in orders}
    spec = parse_spec(jf.order_spec("rehearsed", topic_name, "rh.orders", unit_records=100, key=[]))
    real = run_job(settings, spec)
    promote_run(settings, real.run_id, force=True, reason="the real target before the rehearsal")
    before = {t: _snapshot(settings, t) for t in ("rh.orders", real.quarantine_table)}
    catalog = load_catalog(settings)
    tables_before = sorted(catalog.list_tables("rh"))

    result = rehearse(settings, spec, fraction=0.05)

    assert result["passed"], result["steps"]
    assert [k for k in result["steps"]] == ["run", "verify", "promote", "rollback", "cleanup"]
    # the slice: ceil(5% of 300) = 15 offsets per partition, in 4 evenly spaced pieces of
    # 4, 4, 4, 3 spreading the 285 others: starts 0, 95 + 4, 190 + 8, 285 + 12 (one range
    # each, though the plan's units of 100 are cut at 100 and 200)
    pieces = [WorkUnit.from_dict(u) for u in result["slice"]["units"]]
    for p in (0, 1):
        mine = [(u.start, u.end) for u in pieces if u.partition == p]
        assert mine == [(0, 4), (99, 103), (198, 202), (297, 300)], mine
    assert result["slice"]["offsets"] == 30 == result["counts"]["records_read"]
    assert result["slice"]["of_offsets"] == 600
    in_slice = [fate[(u.partition, o)] for u in pieces for o in range(u.start, u.end)]
    # no key (append-only, event ids): a null order id is a row, not a key-null rejection
    quarantined = sum(f in ("decode", "translate-reject", "translate-error") for f in in_slice)
    assert result["counts"]["quarantined"] == quarantined > 0
    assert sum(result["quarantine_rates"].values()) == pytest.approx(quarantined / 30, abs=1e-5)
    # stages measured, a bottleneck named, the full run extrapolated on the measured rate
    assert set(result["stages"]) == {"read", "decode", "translate", "write", "commit"}
    assert result["bottleneck"] in result["stages"]
    assert result["extrapolated"]["records"] == 600
    assert result["extrapolated"]["rate_source"] == f"rehearsal {result['rehearsal_id']}"
    # the real target and quarantine untouched, every throw-away table gone (files too)
    assert {t: _snapshot(settings, t) for t in before} == before
    assert sorted(catalog.list_tables("rh")) == tables_before
    assert result["steps"]["cleanup"]["dropped"]
    for location in result["steps"]["cleanup"]["files"]:
        assert not Path(location.removeprefix("file://")).exists()
    # stored under the real spec's fingerprint; the plan now estimates on its rates
    with open_ledger(settings) as ledger:
        stored = EvidenceStore(ledger.engine).latest_passed(spec.fingerprint())
    assert stored is not None and stored.id == result["rehearsal_id"]
    # the bytes the slice's tasks read, exactly the slice's keys and values; the plan uses them
    by_coord = {coords[o.index]: o for o in orders}
    wire = [by_coord[(u.partition, o)] for u in pieces for o in range(u.start, u.end)]
    exact = sum(len(o.key or b"") + len(o.value or b"") for o in wire)
    assert result["bytes_read"] == {"kafka": exact}
    assert result["rates"]["bytes_per_record"] == {"kafka": round(exact / 30, 1)}
    cost = plan_job(settings, spec).estimates["cost"]
    assert cost["bytes_source"] == f"rehearsal {result['rehearsal_id']}"
    assert cost["bytes_from_broker"] == round(round(exact / 30, 1) * 600)
    assert cost["rate_source"] == f"rehearsal {result['rehearsal_id']}"
    assert cost["records_per_core_second"] == result["rates"]["records_per_core_second"]
    assert math.isclose(cost["core_seconds"], round(600 / cost["records_per_core_second"], 3))
    print(  # the measured figures (docs/operations.md quotes them): pytest -s shows them
        "rehearsal:",
        {k: v["rate"] for k, v in result["stages"].items()},
        "bottleneck",
        result["bottleneck"],
        "spark",
        result["spark"],
        "rates",
        result["rates"],
        "timings",
        result["timings"],
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--fraction", "1.5"], "--fraction 1.5 is outside (0, 1]"),
        (["--records", "-3"], "--records -3 must be positive"),
        (["--fraction", "0"], "--fraction 0.0 is outside (0, 1]"),
        (["--fraction", "-0.5"], "--fraction -0.5 is outside (0, 1]"),
        (["--fraction", "0.1", "--records", "10"], "not both"),
    ],
)
def test_rewind_rehearse_refuses_a_bad_slice_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    """Refused before any broker is asked (none listens on the port given)."""
    from typer.testing import CliRunner

    from rewind.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REWIND_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    spec = jf.write_spec(tmp_path / "spec.yaml", jf.order_spec("bad-slice", "t", "rh.orders"))
    result = CliRunner().invoke(app, ["rehearse", str(spec), *args])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.output

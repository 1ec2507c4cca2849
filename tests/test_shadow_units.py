"""The parts of ``rewind shadow`` that need no broker: the spec section, the coverage proof
over committed unit ranges (hypothesis: any tiling, in any order, merges to one run; any
overlap or gap is found), the caught-up verdict over lag samples, and the CLI's refusals."""

from __future__ import annotations

import itertools
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.errors import SpecError
from rewind.ledger.shadows import ShadowEvent
from rewind.shadow.lag import caught_up
from rewind.shadow.positions import coverage
from rewind.spec import parse_spec
from rewind.spec.shadow import Shadow

ROOT = Path(__file__).resolve().parent.parent


def spec(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "orders-v2",
        "source": {"history": {"topics": ["orders"], "archive": "lake.orders_archive"}},
        "decode": "json",
        "translate": {"function": "tests.job_fixtures:order_amounts", "version": "1"},
        "key": ["order_id"],
        "sink": {"postgres": {"table": "orders", "url": "sqlite:///app.db"}},
        "shadow": {"live_group": "orders-service"},
    }
    data.update(changes)
    return data


def error(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data, "spec.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_shadow_spec_is_accepted_with_its_defaults() -> None:
    parsed = parse_spec(spec())
    assert parsed.shadow == Shadow(live_group="orders-service")
    assert parse_spec(spec(shadow={"live_group": "g", "rewind_by": "30s"})).shadow.overlap_ms() == 30_000
    assert parse_spec(spec(shadow={"live_group": "g", "rewind_by": 7})).shadow.overlap_offsets() == 7
    assert parse_spec(spec(sink={"iceberg": {"table": "an.orders"}})).sink.iceberg is not None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"source": {"kafka": {"topics": ["orders"]}}}, "shadow: needs a history source"),
        ({"sink": {"kafka": {"topic": "orders.v2"}}}, "shadow: needs a table sink, not sink.kafka"),
        (
            {"sink": {"iceberg": {"table": "an.orders", "mode": "replace-window"}}},
            "sink.iceberg.mode: needs sink.iceberg.mode append",
        ),
        (
            {"sink": {"postgres": {"table": "orders", "mode": "append"}}},
            "sink.postgres.mode: needs sink.postgres.mode upsert",
        ),
        ({"key": []}, "key: needs a key"),
        ({"shadow": {"live_group": "g", "rewind_by": "soon"}}, "shadow.rewind_by: not a duration"),
        ({"shadow": {"live_group": "g", "rewind_by": -1}}, "shadow.rewind_by: negative"),
        ({"shadow": {"live_group": " "}}, "shadow.live_group: empty group id"),
        (
            {
                "source": {
                    "history": {"topics": ["orders"], "archive": "lake.a", "to": "2026-11-01T00:00:00Z"}
                }
            },
            "source.history.to: a shadow's history ends at latest",
        ),
    ],
)
def test_a_shadow_spec_that_cannot_work_is_one_line(changes: dict[str, Any], words: str) -> None:
    assert words in error(spec(**changes))


@st.composite
def tilings(draw: Any) -> tuple[int, int, list[tuple[int, int]]]:
    start = draw(st.integers(0, 1_000))
    cuts = sorted(set(draw(st.lists(st.integers(1, 5_000), min_size=0, max_size=12))))
    points = [start] + [start + c for c in cuts]
    end = points[-1] + draw(st.integers(1, 100))
    points.append(end)
    return start, end, [(a, b) for a, b in itertools.pairwise(points) if b > a]


@given(tilings(), st.randoms())
def test_any_tiling_in_any_order_is_one_run_with_nothing_twice(tiling: Any, rnd: Any) -> None:
    start, end, spans = tiling
    ids = [f"orders/3/{a}-{b}" for a, b in spans]
    rnd.shuffle(ids)
    cov = coverage(ids)[("orders", 3)]
    assert cov.ranges == ((start, end),) and cov.overlaps == ()
    assert (cov.start, cov.end) == (start, end)


@given(tilings(), st.data())
def test_a_gap_ends_the_first_run_and_an_overlap_is_named(tiling: Any, data: Any) -> None:
    start, end, spans = tiling
    if len(spans) < 2:
        return
    i = data.draw(st.integers(0, len(spans) - 1))
    gone = spans[i]
    rest = spans[:i] + spans[i + 1 :]
    cov = coverage(f"t.x/0/{a}-{b}" for a, b in rest)[("t.x", 0)]
    # the first contiguous run stops where the missing range starts (or starts after it)
    assert cov.end == gone[0] if i > 0 else cov.start == gone[1]
    again = data.draw(st.sampled_from(spans))
    twice = coverage(f"t.x/0/{a}-{b}" for a, b in [*spans, again])[("t.x", 0)]
    assert twice.overlaps == (again,) and twice.ranges == ((start, end),)


def sample(at: datetime, lag: int) -> ShadowEvent:
    return ShadowEvent(0, at, "lag", {"partitions": [{"lag": 0}, {"lag": lag}]})


def test_caught_up_needs_every_sample_of_the_window_under_the_threshold() -> None:
    config = Shadow(live_group="g", lag_threshold=10, caught_up_for_s=30)
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    steady = [sample(now - timedelta(seconds=s), 3) for s in (40, 30, 20, 10, 0)]
    assert caught_up(steady, config, now) == (True, "every partition's lag <= 10 for 30 s")
    spike = [*steady[:3], sample(now - timedelta(seconds=5), 11), steady[-1]]
    ok, why = caught_up(spike, config, now)
    assert not ok and why.startswith("lag 11 > threshold 10 at 2026-11-25T11:59:55")
    young = steady[2:]  # nothing older than the window: not long enough
    assert caught_up(young, config, now) == (False, "lag measured for less than 30 s")
    assert caught_up([], config, now) == (False, "no lag sample yet")


def test_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    env = {"REWIND_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    rewind = str(ROOT / ".venv/bin/rewind")
    unknown = subprocess.run(
        [rewind, "shadow", "cutover", "nope", "--hard"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert unknown.returncode == 1 and "no shadow 'nope' in the ledger" in unknown.stderr
    how = subprocess.run(
        [rewind, "shadow", "cutover", "nope"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert how.returncode == 1 and "--hard (swap v2 in now) or --dual-write" in how.stderr

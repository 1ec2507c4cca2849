"""`rewind rehearse` beyond Iceberg: a PostgreSQL sink (a throw-away table), a Kafka sink (a
throw-away topic, deleted after) and a table source (a slice of the selected keys spread over
the key range, re-produced to a throw-away topic with the live topic's partition count).

Each rehearsal runs on tansu, on a small slice: run, verify, promote, rollback, cleanup; the
real target is never touched and nothing carrying the rehearsal's tag is left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from rewind.config import Settings, load_settings
from rewind.ops.throwaway import key_pieces
from tests import job_fixtures as jf
from tests import reproduce_fixtures as rf
from tests.kafka_util import create_topic

STEPS = ["run", "verify", "promote", "rollback", "cleanup"]


@hsettings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.integers(0, 40), min_size=1, max_size=300).map(sorted),
    n=st.integers(1, 300),
)
def test_key_pieces_are_disjoint_spread_and_never_split_equal_keys(keys: list[int], n: int) -> None:
    got = key_pieces(keys, n)
    assert got and got[0][0] == 0
    assert all(0 <= a < b <= len(keys) for a, b in got)
    assert all(got[i][1] <= got[i + 1][0] for i in range(len(got) - 1))
    for a, b in got:  # bounds are key values: a range [keys[a], keys[b]) holds exactly [a, b)
        assert a == 0 or keys[a] != keys[a - 1]
        assert b == len(keys) or keys[b] != keys[b - 1]
    if len(set(keys)) == len(keys):  # distinct keys: exactly the share, the last piece at the end
        assert sum(b - a for a, b in got) == min(n, len(keys))
        assert len(got) == 1 or got[-1][1] == len(keys)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str) -> tuple[Settings, str]:
    tmp = tmp_path_factory.mktemp("rehearse-sinks")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"rh-{tmp.name[-8:]}".replace("_", "-")
    create_topic(settings.kafka_config(), topic, 2)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(400, 2))
    return settings, topic


def _topics(settings: Settings) -> set[str]:
    from rewind.kafka.clients import cluster_metadata

    return set(cluster_metadata(settings.kafka_config()).topics)


def _check(result: dict[str, Any], records: int) -> None:
    print(result["throwaway"], result["seconds"], result["timings"], result["steps"]["run"])
    assert result["passed"], result["steps"]
    assert list(result["steps"]) == STEPS
    assert result["counts"]["records_read"] == result["slice"]["offsets"] == records
    assert result["steps"]["cleanup"]["ok"] and not result["steps"]["cleanup"].get("left")
    assert result["bottleneck"] in result["stages"]
    assert {"read", "decode", "translate", "write", "commit"} <= set(result["stages"])
    assert result["extrapolated"]["rate_source"] == f"rehearsal {result['rehearsal_id']}"


def test_postgres_sink_rehearses_into_a_throwaway_table(world: tuple[Settings, str], pg_url: str) -> None:
    import psycopg

    from rewind.ops.rehearse import rehearse
    from rewind.spec import parse_spec

    settings, topic = world
    data = jf.order_spec("rh-sql", topic, "x.y", unit_records=100, key=[])
    data["sink"] = {"postgres": {"table": "real_orders", "url": pg_url, "mode": "append"}}

    result = rehearse(settings, parse_spec(data), records=40)

    _check(result, 40)
    tag = result["tag"]
    assert result["throwaway"]["sink"] == "postgres" and result["throwaway"]["target"] == f"real_orders_{tag}"
    assert result["steps"]["promote"]["swap"]["after"] and result["steps"]["rollback"]["ok"]
    with psycopg.connect(pg_url) as db:
        tables = [r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        assert not [t for t in tables if tag in t], tables
        assert "real_orders" not in tables  # the real target (a new read model) is still not made


def test_kafka_sink_rehearses_into_a_throwaway_topic_deleted_after(world: tuple[Settings, str]) -> None:
    from rewind.ops.rehearse import rehearse
    from rewind.spec import parse_spec

    settings, topic = world
    data = jf.order_spec("rh-kafka", topic, "x.y", unit_records=100, key=[])
    data["sink"] = {"kafka": {}}
    before = _topics(settings)

    result = rehearse(settings, parse_spec(data), fraction=0.05)

    _check(result, 20)  # ceil(5% of 200) per partition
    assert result["throwaway"]["target"] == f"{topic}.backfill.{result['tag']}"
    assert result["steps"]["cleanup"]["staging"]["deleted"] is True
    assert _topics(settings) - before <= {"rewind.commits"}  # the throw-away topic is gone


def test_table_source_rehearses_a_spread_slice_of_the_keys(
    world: tuple[Settings, str], tmp_path: Path
) -> None:
    from rewind.ops.rehearse import rehearse
    from rewind.sinks.kafka.topics import high_watermarks
    from rewind.spec import parse_spec

    settings, _ = world
    accounts = rf.accounts(300)
    url = rf.sqlite_accounts(tmp_path / "accounts.db", accounts)
    live = f"live-{tmp_path.name[-8:]}".replace("_", "-")
    create_topic(settings.kafka_config(), live, 3)
    source = {"sqlite": {"url": url, "table": "accounts"}, "key": "id", "where": "id > 0", "key_ranges": 2}
    spec = parse_spec(rf.spec("rh-table", source, live))
    before = _topics(settings)

    result = rehearse(settings, spec, fraction=0.1)

    _check(result, 30)  # 15 of each range of 150 keys, in 4 pieces spread over it
    units = result["slice"]["units"]
    assert len(units) == 8 and {u["source"] for u in units} == {"table"}
    pieces = result["slice"]["key_ranges"]
    sliced = []
    for i, piece in enumerate(pieces):
        lo, hi = piece["lo"], piece["hi"]
        mine = [a for a in accounts if a.id >= lo and (hi is None or a.id < hi)]
        assert len(mine) == piece["entities"] == (4 if i % 4 < 3 else 3)
        sliced += mine
    # per range of 150 keys: pieces of 4, 4, 4, 3 at positions 0, 45 + 4, 90 + 8, 135 + 12
    first = [1, 2, 3, 4, 50, 51, 52, 53, 99, 100, 101, 102, 148, 149, 150]
    assert [a.id for a in sliced] == [k + r for r in (0, 150) for k in first]
    assert result["counts"]["quarantined"] == sum(a.rejected for a in sliced)
    assert _topics(settings) - before <= {"rewind.commits"}
    assert sum(high_watermarks(settings.kafka_config(), live).values()) == 0  # the live topic untouched

"""A shadow of a folded read model (``translate.fold``), killed with -9 and restarted, on SQLite.

A producer keeps writing keyed order events. The shadow's history folds the partial rows of
archive + log into v2 (one row per order); it is killed right after that fold's commit (v2
holds the folded rows, the ledger has not heard of it) and resumed: the fold is not applied
twice. The tail folds each micro-batch with v2's rows of the batch's orders; it is killed after
a batch's commit, before Spark marked it done, so Spark replays that batch on restart and the
sink skips it. Finally v2 must equal a clean recomputation of the fold over every event (sum of
amounts, count of events, last status, lineage of the last event) and the committed ranges must
tile each partition from 0 to the log end. A fold that cannot take its own rows is refused at
start in one line, nothing written, and a folded shadow with an overlap at its cut line
(``shadow.rewind_by``) is refused by the spec. The Iceberg v2 is
``tests/test_shadow_fold_iceberg.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from rewind.shadow.positions import coverage
from rewind.shadow.start import start_shadow
from rewind.spec import load_spec
from tests import shadow_fixtures as sf
from tests.brokers import TestBroker
from tests.shadow_fixtures import prepared, refused, shadow_env
from tests.shadow_fold_fixtures import expected_totals, folded_spec


def folded(noida_broker: TestBroker, spark: Any, tmp_path: Path, name: str, fold: str | None = None) -> Any:
    settings, conf, topic, db, spec = prepared(noida_broker, spark, tmp_path, name)
    import yaml

    data = folded_spec(yaml.safe_load(spec.read_text()), *([fold] if fold else []))
    sf.write_spec(spec, data)
    return settings, conf, topic, db, spec


def test_a_folded_shadow_killed_in_history_and_tail_equals_a_clean_fold(
    noida_broker: TestBroker, spark: Any, tmp_path: Path
) -> None:
    settings, conf, topic, db, spec = folded(noida_broker, spark, tmp_path, "fold-kill")
    env = shadow_env(tmp_path, noida_broker.bootstrap)
    done = tmp_path / "producer-done"
    producer = sf.LiveProducer(conf, topic, 600, rate=40)
    producer.start()
    try:
        first = sf.run_child(env, spec, done, tmp_path, fault="after-fold-commit")  # in the history
        assert first.returncode == -9, first.stderr[-3000:]
        resumed = start_shadow(settings, load_spec(spec), stop=lambda _: True, sample_s=0.5)
        assert resumed["state"] == "tailing" and resumed["replayed"] == 0, resumed
        second = sf.run_child(env, spec, done, tmp_path, fault="shadow-after-batch-commit:2", limit=300)
        assert second.returncode == -9, second.stderr[-3000:]
    finally:
        last = producer.stop()
    result = start_shadow(settings, load_spec(spec), stop=lambda p: p.caught_up, sample_s=0.5)
    assert result["replayed"] == 1, "the batch committed before the kill is replayed by Spark and skipped"
    assert result["max_lag"] == 0 and result["caught_up"] is True

    run_id, table = _v2(settings, "fold-kill")
    expected = expected_totals(conf, topic)
    assert len(expected) == sf.ORDERS and last > 600
    with sqlite3.connect(db) as conn:
        columns = "order_id, status, amount, events, _rewind_source_partition, _rewind_source_offset"
        rows = conn.execute(f'SELECT {columns} FROM "{table}"').fetchall()
    assert len(rows) == len({r[0] for r in rows}), "no order twice"
    assert {r[0]: tuple(r[1:]) for r in rows} == expected, "v2 is the fold of every event, once"
    tiles = coverage([u for u in sf.committed_units(db, run_id) if "/" in u])
    ends = {p: last // 2 + (1 if last % 2 > p else 0) for p in (0, 1)}
    for p in (0, 1):
        assert tiles[(topic, p)].ranges == ((0, ends[p]),) and tiles[(topic, p)].overlaps == ()


def test_a_fold_that_cannot_take_its_own_rows_is_refused_at_start(
    noida_broker: TestBroker, spark: Any, tmp_path: Path
) -> None:
    settings, _, _, db, spec = folded(
        noida_broker, spark, tmp_path, "fold-bad", fold="tests.shadow_fold_fixtures:fold_to_average"
    )
    refused(
        lambda: start_shadow(settings, load_spec(spec), stop=lambda _: True),
        "translate.fold tests.shadow_fold_fixtures:fold_to_average",
        "cannot take its own rows",
    )
    from rewind.ledger import Ledger, NotFound
    from rewind.ledger.shadows import ShadowStore

    ledger = Ledger.open(settings.ledger)
    try:
        try:
            ShadowStore(ledger.engine).get("fold-bad")
            raise AssertionError("the refused shadow was recorded")
        except NotFound:
            pass
        assert ledger.list_runs(name="fold-bad") == []
    finally:
        ledger.close()
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert not [t for t in tables if "__rewind_" in t], "no v2 written"


def _v2(settings: Any, name: str) -> tuple[str, str]:
    from rewind.ledger import Ledger
    from rewind.ledger.shadows import ShadowStore

    ledger = Ledger.open(settings.ledger)
    try:
        record = ShadowStore(ledger.engine).get(name)
        return record.run_id, ledger.get_run(record.run_id).staging["table"]
    finally:
        ledger.close()


def test_a_folded_shadow_takes_no_overlap_at_its_cut_line(tmp_path: Path) -> None:
    from rewind.spec import parse_spec

    data = folded_spec(sf.spec_data("f", "orders", "lake.a", 0, tmp_path / "db", "orders", "live"))
    assert parse_spec(data).translate.fold is not None  # a fold is no longer refused by a shadow
    data["shadow"]["rewind_by"] = 5
    refused(lambda: parse_spec(data), "shadow.rewind_by", "must be 0 with translate.fold")

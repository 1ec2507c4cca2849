"""The outcome of a reconstruction: its events, replayed with the user's fold, give the source's
latest state of every entity (``rewind verify RUN`` of a ``source.table.reconstruct`` run with
``reconstruct.fold``).

Steps, in order (nothing is written but the report and the ledger's audit):

1. read the run's events from its topic, ``read_committed``, keeping the records whose
   ``rewind.run-id`` is the run's, in partition and offset order (an entity's events are on one
   partition, in business order); or from its table's staging, ordered by their lineage
   (:mod:`rewind.verify.table_events`);
2. fold them: ``reconstruct.fold`` gets every event (the JSON values, sorted by entity key,
   stable, so each entity's events stay in business order) and returns one row per entity;
3. the source's latest state per entity: its states read again (the plan's selection), ordered
   as the tasks order them (:mod:`rewind.translate.states`); the last state of each entity (a
   history table), or the states of the last snapshot (snapshots: an entity that disappeared is
   not expected);
4. compare each expected entity's columns the fold returns (a float within 1e-9 relative, null
   equal to null); entities with a quarantined state are left out (their history has a hole)
   and counted; an entity the fold has no row for is ``missing``;
5. report per event type: events, entities having it, and how many of those match, so a wrong
   ``PremiumChanged`` shows as that type's mismatches.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.kafka.clients import cluster_metadata, ready_messages
from rewind.tables.selection import choose
from rewind.translate.functions import load_callable
from rewind.verify.exceptions import VerifyError
from rewind.verify.table_events import table_events

if TYPE_CHECKING:
    import pandas as pd

    from rewind.config import Settings
    from rewind.spec import JobSpec

SHOWN = 5


def run_events(conf: dict[str, Any], topic: str, run_id: str) -> pd.DataFrame:
    """Step 1: the run's events as a frame of their JSON values, in partition and offset order,
    with ``_key``, ``_partition`` and ``_offset``."""
    # lazy: avoids confluent_kafka, pandas at import
    import pandas as pd
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    meta = cluster_metadata(conf).topics.get(topic)
    if meta is None:
        raise VerifyError(f"topic {topic} of the run is gone; nothing to verify")
    consumer = Consumer(
        {
            **conf,
            "group.id": f"rewind-verify-{run_id}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    wanted = run_id.encode()
    rows: list[dict[str, Any]] = []
    try:
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        left = set(parts)
        while left:
            for msg in ready_messages(consumer, 2.0, 1000):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(msg.partition())
                    continue
                headers = dict(msg.headers() or [])
                if headers.get("rewind.run-id") != wanted:
                    continue
                value = json.loads(msg.value() or b"null")
                rows.append(
                    {
                        **value,
                        "_key": (msg.key() or b"").decode(),
                        "_partition": msg.partition(),
                        "_offset": msg.offset(),
                    }
                )
    finally:
        consumer.close()
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["_partition", "_offset"], kind="stable").reset_index(drop=True)


def latest_states(settings: Settings, spec: JobSpec, snapshots: list[int]) -> pd.DataFrame:
    """Step 3: the source's latest state of each entity, as the tasks order the states."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    # lazy: avoids numpy, pandas, pyarrow at import
    from rewind.tables.plan import reader_of
    from rewind.tables.reconstruct_stage import _concat, rows_table, state_order
    from rewind.translate.states import business_micros, business_order

    table = spec.source.table
    assert table is not None and table.reconstruct is not None
    reader = reader_of(settings, spec)
    try:
        chosen = choose(table, reader.key_type())
        parts = [rows_table(rows) for rows in reader.read(chosen.selection, None, None, 100_000)]
    finally:
        reader.close()
    if not parts:
        return pa.table({}).to_pandas()
    states = _concat(parts).combine_chunks()
    order = state_order(spec, tuple(snapshots))
    micros, valid = business_micros(states.column(order.time), order.time)
    rows = business_order(states, order, micros, valid)
    ordered = states.take(pa.array(rows, pa.int64()))
    keys = ordered.column(order.key).to_numpy(zero_copy_only=False)
    last = np.ones(len(rows), dtype=bool)
    if len(rows) > 1:
        last[:-1] = keys[1:] != keys[:-1]
    if order.mode == "snapshots" and snapshots:
        last &= micros[rows] == snapshots[-1]
    return ordered.filter(pa.array(last)).to_pandas()


def quarantined_keys(settings: Settings, spec: JobSpec, run_id: str) -> set[str]:
    """Entities with a quarantined state in the run (their key's text)."""
    # lazy: avoids pyiceberg at import
    from pyiceberg import expressions

    assert spec.quarantine.table is not None
    try:
        table = load_catalog(settings).load_table(spec.quarantine.table)
    except Exception:  # no quarantine table: nothing was quarantined
        return set()
    eq: Any = expressions.EqualTo  # pyiceberg's pydantic signatures hide the positional form from mypy
    rows = table.scan(row_filter=eq("run_id", run_id), selected_fields=("key",)).to_arrow()
    return {k.decode() for k in rows.column("key").to_pylist() if k is not None}


def compare(
    folded: pd.DataFrame, expected: pd.DataFrame, key: str, skip: set[str]
) -> tuple[dict[str, bool], list[dict[str, Any]], list[str]]:
    """Step 4: per expected entity (by key text), whether the fold matches; the first mismatches;
    the columns compared."""
    # lazy: avoids numpy, pandas at import
    import numpy as np
    import pandas as pd

    columns = [c for c in folded.columns if c != key and c in expected.columns]
    left = folded.assign(_k=folded[key].astype(str)).set_index("_k")
    right = expected.assign(_k=expected[key].astype(str)).set_index("_k")
    right = right[~right.index.isin(skip)]
    verdict: dict[str, bool] = {k: False for k in right.index}
    shown: list[dict[str, Any]] = []
    both = right.index.intersection(left.index)
    ok = np.ones(len(both), dtype=bool)
    for column in columns:
        a, b = left.loc[both, column], right.loc[both, column]
        same = (a.isna() & b.isna()).to_numpy()
        if pd.api.types.is_float_dtype(a) or pd.api.types.is_float_dtype(b):
            x = pd.to_numeric(a, errors="coerce").to_numpy(dtype=float)
            y = pd.to_numeric(b, errors="coerce").to_numpy(dtype=float)
            same |= np.isclose(x, y, rtol=1e-9, atol=0.0)
        else:
            same |= (a.astype(str).to_numpy() == b.astype(str).to_numpy()) & ~(a.isna() | b.isna()).to_numpy()
        ok &= same
    for k, good in zip(both.tolist(), ok.tolist(), strict=True):
        verdict[k] = good
        if not good and len(shown) < SHOWN:
            shown.append(
                {
                    "entity": k,
                    "replayed": {c: _plain(left.at[k, c]) for c in columns},
                    "source": {c: _plain(right.at[k, c]) for c in columns},
                }
            )
    for k in right.index.difference(left.index).tolist()[: max(0, SHOWN - len(shown))]:
        shown.append({"entity": k, "replayed": None, "source": {c: _plain(right.at[k, c]) for c in columns}})
    return verdict, shown, columns


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if value != value:  # NaN
        return None
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def verify_outcome(
    settings: Settings, spec: JobSpec, run_id: str, staging: dict[str, Any], plan_facts: dict[str, Any]
) -> dict[str, Any]:
    """Steps 1-5; the report (``passed``, per-type counts, the first mismatches)."""
    # lazy: avoids pandas at import
    import pandas as pd

    table = spec.source.table
    assert table is not None and table.reconstruct is not None
    rec = table.reconstruct
    if rec.fold is None:
        raise VerifyError(
            f"run {run_id} reconstructs events without source.table.reconstruct.fold: name the fold that "
            "replays an entity's events into its state to verify the outcome"
        )
    key = spec.key[0]
    if spec.sink.kafka is not None:  # 1.
        events = run_events(settings.kafka_config(), str(staging["topic"]), run_id)
    else:  # a table of events: its rows in business order, from their lineage
        events = table_events(settings, spec, staging, run_id)
    fold = load_callable(rec.fold, "source.table.reconstruct.fold")
    if events.empty:
        folded = pd.DataFrame({key: []})
    else:
        ordered = events.sort_values("_key", kind="stable")  # each entity's events stay in order
        user = ordered.drop(columns=["_key", "_partition", "_offset"]).reset_index(drop=True)
        folded = fold(user)  # 2.
        if not isinstance(folded, pd.DataFrame) or key not in folded.columns:
            raise VerifyError(
                f"source.table.reconstruct.fold {rec.fold} must return a frame with the key {key!r}"
            )
    expected = latest_states(settings, spec, list(plan_facts.get("snapshots") or []))  # 3.
    if table.key != key and key not in expected.columns:
        expected = expected.rename(columns={table.key: key})
    skip = quarantined_keys(settings, spec, run_id)
    verdict, shown, columns = compare(folded, expected, key, skip)  # 4.
    by_type: dict[str, dict[str, int]] = {}  # 5.
    if not events.empty:
        kind = events[rec.type_column].astype(str)
        for name, group in events.groupby(kind, sort=True):
            entities = set(group["_key"])
            judged = [verdict[e] for e in entities if e in verdict]
            by_type[str(name)] = {
                "events": len(group),
                "entities": len(entities),
                "matched": sum(judged),
                "mismatched": len(judged) - sum(judged),
            }
    missing = sum(1 for k in verdict if k not in set(folded[key].astype(str)))
    mismatched = sum(1 for v in verdict.values() if not v)
    return {
        "run_id": run_id,
        "mode": "outcome",
        "passed": mismatched == 0,
        "failed": [] if mismatched == 0 else ["outcome"],
        "entities": len(verdict),
        "matched": len(verdict) - mismatched,
        "mismatched": mismatched - missing,
        "missing": missing,
        "skipped_quarantined": len(skip),
        "events": len(events),
        "columns": columns,
        "by_type": by_type,
        "examples": shown,
    }

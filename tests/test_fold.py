"""The fold of read models without Spark: ``fold_frame``'s contract and each ``FoldError``, the
window trim, one fold task end to end on Arrow batches, and the spec fields that ask for it
(``translate.fold``, ``sink.iceberg.window_from``/``window_to``) with their one-line errors.

Pure Python and pandas (pyarrow for the task): no broker, no Spark, no catalog.
"""

from __future__ import annotations

import copy
import json
import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.core.arrow import schema_to_b64
from rewind.core.columns import LINEAGE_COLUMNS
from rewind.errors import RewindError, SpecError
from rewind.job.finalize import needs_finalize
from rewind.spark.fold_stage import FoldContext, FoldError, FoldPartitions, _outside, fold_frame
from rewind.spec import parse_spec
from tests.fold_fixtures import sum_fold

T0 = datetime(2026, 10, 1, tzinfo=UTC)
OCT_2 = "2026-10-02T00:00:00Z"


def records(rows: list[tuple[Any, ...]], run: str = "r-1") -> list[dict[str, Any]]:
    """Partial rows ``(k, v, seconds after T0 or None, partition, offset)`` with full lineage."""
    return [
        {
            "k": k,
            "v": v,
            "_rewind_event_id": f"e-{partition}-{offset}",
            "_rewind_source_topic": "orders",
            "_rewind_source_partition": partition,
            "_rewind_source_offset": offset,
            "_rewind_source_timestamp": None if sec is None else T0 + timedelta(seconds=sec),
            "_rewind_extracted_at": T0,
            "_rewind_transform": "t",
            "_rewind_transform_version": "1",
            "_rewind_run_id": run,
            "_rewind_synthetic": True,
        }
        for k, v, sec, partition, offset in rows
    ]


def partials(rows: list[tuple[Any, ...]], run: str = "r-1") -> pd.DataFrame:
    frame = pd.DataFrame(records(rows, run))
    frame["_rewind_source_timestamp"] = pd.to_datetime(frame["_rewind_source_timestamp"], utc=True)
    return frame


def by_key(frame: pd.DataFrame, key: str = "k") -> list[dict[str, Any]]:
    return sorted(frame.to_dict("records"), key=lambda r: r[key])


# -- fold_frame: what the fold gets and what comes out ----------------------------------------------


def test_without_a_fold_the_rows_pass_unchanged() -> None:
    rows = partials([(1, 5, 3, 0, 9), (1, 6, 1, 0, 2)])
    assert fold_frame(rows, ["k"], None) is rows


def test_one_row_per_key_with_the_lineage_of_its_last_row() -> None:
    rows = partials(
        [
            (1, 10, 5, 0, 7),
            (2, 1, 9, 1, 3),
            (1, 20, 5, 0, 8),  # same time as offset 7: the offset decides, 8 is last
            (1, 30, 2, 1, 90),  # a higher offset of another partition, but earlier
            (2, 2, None, 1, 99),  # no timestamp sorts first, whatever its offset
            (3, 7, 1, 0, 1),
        ]
    )
    out = fold_frame(rows, ["k"], sum_fold)
    assert list(out.columns) == ["k", "v", *LINEAGE_COLUMNS]
    got = by_key(out)
    assert [(r["k"], r["v"]) for r in got] == [(1, 60), (2, 3), (3, 7)]
    assert [r["_rewind_event_id"] for r in got] == ["e-0-8", "e-1-3", "e-0-1"]
    assert [r["_rewind_source_offset"] for r in got] == [8, 3, 1]
    assert got[0]["_rewind_source_timestamp"] == pd.Timestamp(T0 + timedelta(seconds=5))


def test_the_fold_sees_the_user_columns_sorted_by_key_then_source_order() -> None:
    seen: list[pd.DataFrame] = []

    def spy(frame: pd.DataFrame) -> pd.DataFrame:
        seen.append(frame.copy())
        frame["v"] = -1  # its own copy: the caller's rows do not change
        return sum_fold(frame)

    rows = partials([(2, 1, 9, 0, 4), (1, 2, 3, 1, 1), (2, 3, 1, 1, 2), (1, 4, 3, 0, 6), (1, 5, None, 0, 9)])
    before = rows.copy()
    fold_frame(rows, ["k"], spy)
    assert len(seen) == 1  # once for all the keys, not once per key
    frame = seen[0]
    assert list(frame.columns) == ["k", "v"]
    assert list(frame.index) == list(range(5))
    # k=1: no time first, then t=3 on partition 0 before partition 1; k=2: t=1 before t=9
    assert frame.to_dict("list") == {"k": [1, 1, 1, 2, 2], "v": [5, 4, 2, 3, 1]}
    pd.testing.assert_frame_equal(rows, before)


def test_the_output_keeps_the_translate_columns_in_order_and_drops_others() -> None:
    def shuffled(frame: pd.DataFrame) -> pd.DataFrame:
        out = sum_fold(frame)
        return out.assign(debug="x")[["debug", "v", "k"]].iloc[::-1]

    out = fold_frame(partials([(1, 1, 0, 0, 0), (2, 2, 0, 0, 1), (1, 3, 1, 0, 2)]), ["k"], shuffled)
    assert list(out.columns) == ["k", "v", *LINEAGE_COLUMNS]
    assert [(r["k"], r["v"], r["_rewind_source_offset"]) for r in by_key(out)] == [(1, 4, 2), (2, 2, 1)]


def test_a_composite_key() -> None:
    rows = partials([(1, 1, 0, 0, 0), (1, 2, 1, 0, 1), (2, 4, 2, 0, 2)])
    rows.insert(1, "day", ["a", "b", "a"])

    def per_day(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.groupby(["k", "day"], as_index=False)["v"].sum()

    out = fold_frame(rows, ["k", "day"], per_day)
    got = sorted((r["k"], r["day"], r["v"], r["_rewind_source_offset"]) for r in out.to_dict("records"))
    assert got == [(1, "a", 1, 0), (1, "b", 2, 1), (2, "a", 4, 2)]


def test_the_demo_fold_sums_cents_whatever_the_row_order() -> None:
    """The demo's fold of order_totals: the latest status, the placed time, totals to the cent."""
    from rewind.demo.orders import fold_order_totals

    at = [T0 + timedelta(minutes=m) for m in range(4)]
    rows = pd.DataFrame(
        {
            "order_id": ["o-1"] * 4,
            "customer_id": ["c-1", None, None, None],
            "status": ["placed", None, "paid", "shipped"],
            "total": [0.0, 0.1, 0.2, -0.05],
            "item_count": [0, 1, 0, 0],
            "placed_at": [at[0], pd.NaT, pd.NaT, pd.NaT],
            "last_event_time": at,
        }
    )
    rows["placed_at"] = pd.to_datetime(rows["placed_at"], utc=True)
    for i, column in enumerate(LINEAGE_COLUMNS):
        rows[column] = [i] * 4
    rows["_rewind_source_timestamp"] = pd.to_datetime(at, utc=True)
    rows["_rewind_source_offset"] = [0, 1, 2, 3]
    rows["_rewind_run_id"] = "r-1"
    out = fold_frame(rows.sample(frac=1, random_state=3), ["order_id"], fold_order_totals).iloc[0]
    assert (out["customer_id"], out["status"], out["item_count"]) == ("c-1", "shipped", 1)
    assert out["total"] == 0.25 and out["placed_at"] == at[0] and out["last_event_time"] == at[3]
    assert out["_rewind_source_offset"] == 3


# -- fold_frame: each broken contract ---------------------------------------------------------------


BROKEN: list[tuple[Any, str]] = [
    (lambda f: None, "translate.fold returned NoneType, expected a pandas DataFrame"),
    (lambda f: f["v"], "translate.fold returned Series, expected a pandas DataFrame"),
    (lambda f: f.to_dict("list"), "translate.fold returned dict, expected a pandas DataFrame"),
    (
        lambda f: f.groupby("k")["v"].sum().to_frame(),  # the key left in the index
        "translate.fold output lacks columns ['k']; return every translate column",
    ),
    (
        lambda f: f.groupby("k", as_index=False).size(),
        "translate.fold output lacks columns ['v']; return every translate column",
    ),
    (lambda f: f, "translate.fold returned several rows for one k; return one per key"),
    (
        lambda f: f[f["k"] == 1].groupby("k", as_index=False)["v"].sum(),  # key 2 dropped
        "translate.fold returned 1 rows for 2 keys; return one row per key "
        "(filter in the translate to leave an entity out)",
    ),
    (
        lambda f: pd.DataFrame({"k": [1, 7], "v": [0, 0]}),
        "translate.fold returned a key that is not in its input; fold only the keys given",
    ),
]


@pytest.mark.parametrize(("fold", "message"), BROKEN, ids=[m.split(" ", 2)[2][:24] for _, m in BROKEN])
def test_each_broken_contract_is_a_one_line_fold_error(fold: Any, message: str) -> None:
    rows = partials([(1, 1, 0, 0, 0), (1, 2, 1, 0, 1), (2, 3, 2, 0, 2)])
    with pytest.raises(FoldError) as caught:
        fold_frame(rows, ["k"], fold)
    assert str(caught.value) == message
    assert isinstance(caught.value, RewindError)


def test_several_rows_for_one_composite_key_names_every_key_column() -> None:
    rows = partials([(1, 1, 0, 0, 0), (1, 2, 1, 0, 1)])
    rows.insert(1, "day", ["a", "a"])
    with pytest.raises(FoldError, match=r"several rows for one k, day; return one per key"):
        fold_frame(rows, ["k", "day"], lambda f: f)


def test_an_error_of_the_fold_itself_propagates_unchanged() -> None:
    def boom(frame: pd.DataFrame) -> pd.DataFrame:
        raise ZeroDivisionError("no orders")

    with pytest.raises(ZeroDivisionError, match="no orders"):
        fold_frame(partials([(1, 1, 0, 0, 0)]), ["k"], boom)


# -- fold_frame: properties --------------------------------------------------------------------------


@st.composite
def partial_rows(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Rows of a few keys over three partitions; offsets unique per partition, times may tie
    or be missing."""
    n = draw(st.integers(1, 40))
    rows = []
    next_offset = [0, 0, 0]
    for _ in range(n):
        partition = draw(st.integers(0, 2))
        next_offset[partition] += draw(st.integers(1, 3))
        rows.append(
            (
                draw(st.integers(0, 6)),
                draw(st.integers(-1000, 1000)),
                draw(st.none() | st.integers(0, 5)),
                partition,
                next_offset[partition],
            )
        )
    return rows


def _oracle(rows: list[tuple[Any, ...]]) -> list[tuple[int, int, int, int]]:
    """(key, sum, partition, offset of the last row) per key, computed without pandas."""
    sums: dict[int, int] = {}
    last: dict[int, tuple[Any, ...]] = {}
    for k, v, sec, partition, offset in rows:
        sums[k] = sums.get(k, 0) + v
        order = (-1 if sec is None else sec, partition, offset)  # no time sorts first
        if k not in last or order > last[k]:
            last[k] = order
    return sorted((k, sums[k], last[k][1], last[k][2]) for k in sums)


def _summary(out: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    return sorted(
        (int(r["k"]), int(r["v"]), int(r["_rewind_source_partition"]), int(r["_rewind_source_offset"]))
        for r in out.to_dict("records")
    )


@settings(max_examples=80, deadline=None)
@given(rows=partial_rows(), seed=st.integers(0, 2**32 - 1))
def test_a_sum_fold_does_not_depend_on_the_row_order(rows: list[tuple[Any, ...]], seed: int) -> None:
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    assert _summary(fold_frame(partials(shuffled), ["k"], sum_fold)) == _oracle(rows)


@settings(max_examples=80, deadline=None)
@given(rows=partial_rows(), tasks=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_folding_the_keys_in_any_split_across_tasks_gives_the_whole_fold(
    rows: list[tuple[Any, ...]], tasks: int, seed: int
) -> None:
    """What a repartition by key does: every key in one task, tasks in any order."""
    rng = random.Random(seed)
    task_of = {k: rng.randrange(tasks) for k in {r[0] for r in rows}}
    parts = [[r for r in rows if task_of[r[0]] == t] for t in range(tasks)]
    rng.shuffle(parts)
    folded = [fold_frame(partials(p), ["k"], sum_fold) for p in parts if p]
    assert _summary(pd.concat(folded)) == _oracle(rows)


# -- the window trim -----------------------------------------------------------------------------------


def test_rows_outside_the_half_open_window_or_without_a_time_are_outside() -> None:
    lo, hi = T0, T0 + timedelta(days=1)
    frame = pd.DataFrame(
        {
            "placed_at": pd.to_datetime(
                [
                    lo - timedelta(microseconds=1),
                    lo,
                    hi - timedelta(microseconds=1),
                    hi,
                    None,
                    # the same instants in another zone
                    datetime(2026, 10, 1, 2, 0, tzinfo=timezone(timedelta(hours=2))),
                    datetime(2026, 10, 2, 1, 59, tzinfo=timezone(timedelta(hours=2))),
                ],
                utc=True,
            )
        }
    )
    assert _outside(frame, "placed_at", (lo, hi)).tolist() == [True, False, False, True, True, False, False]


# -- one fold task on Arrow batches ---------------------------------------------------------------------


def _task_schema() -> pa.Schema:
    """The output schema: user columns then lineage (as :meth:`JobPlan.output_schema` gives)."""
    from rewind.translate.lineage import LINEAGE_SCHEMA

    return pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.int64()), *LINEAGE_SCHEMA])


def _context(tmp_path: Path, fold: str | None, window: tuple[datetime, datetime] | None) -> FoldContext:
    return FoldContext(
        run_id="r-1",
        key=("k",),
        fold=fold,
        schema_b64=schema_to_b64(_task_schema()),
        data_folder=(tmp_path / "data").as_uri(),
        window_column="_rewind_source_timestamp" if window else None,
        window=window,
    )


def _batches(rows: list[tuple[Any, ...]]) -> list[pa.RecordBatch]:
    """The rows as a task gets them: Arrow batches of the staged schema, a few rows each."""
    return pa.Table.from_pylist(records(rows), schema=_task_schema()).to_batches(max_chunksize=2)


def test_a_fold_task_writes_one_file_of_the_folded_rows_inside_the_window(tmp_path: Path) -> None:
    rows = [(1, 1, 10, 0, 0), (1, 2, 20, 0, 1), (2, 5, 30, 1, 0), (3, 7, 99, 1, 1), (4, 1, None, 0, 2)]
    window = (T0, T0 + timedelta(seconds=50))
    task = FoldPartitions(_context(tmp_path, "tests.fold_fixtures:sum_fold", window))
    (result,) = list(
        task(iter([pa.RecordBatch.from_pylist([], schema=_batches(rows)[0].schema), *_batches(rows)]))
    )
    out = result.to_pylist()
    assert len(out) == 1
    # key 3's last row is at 99 s, key 4's has no time: both outside [0 s, 50 s)
    assert json.loads(out[0]["counts"]) == {"rows_in": 5, "rows_out": 2, "outside_window": 2}
    path = out[0]["data_file"]
    assert path.startswith((tmp_path / "data").as_uri()) and path.endswith(".parquet")
    written = pq.read_table(path.removeprefix("file://"))
    assert written.schema == _task_schema()
    got = sorted(written.to_pylist(), key=lambda r: r["k"])
    assert [(r["k"], r["v"], r["_rewind_source_offset"]) for r in got] == [(1, 3, 1), (2, 5, 0)]


def test_a_task_whose_rows_all_fall_outside_writes_no_file(tmp_path: Path) -> None:
    window = (T0, T0 + timedelta(seconds=5))
    task = FoldPartitions(_context(tmp_path, None, window))
    (result,) = list(task(iter(_batches([(1, 1, 10, 0, 0), (2, 2, 20, 0, 1)]))))
    row = result.to_pylist()[0]
    assert row["data_file"] == ""
    assert json.loads(row["counts"]) == {"rows_in": 2, "rows_out": 0, "outside_window": 2}
    assert not (tmp_path / "data").exists()


def test_a_task_without_rows_yields_nothing(tmp_path: Path) -> None:
    task = FoldPartitions(_context(tmp_path, "tests.fold_fixtures:sum_fold", None))
    empty = pa.RecordBatch.from_pylist([], schema=_task_schema())
    assert list(task(iter([empty]))) == []
    assert list(task(iter([]))) == []


def test_a_fold_task_without_a_window_keeps_every_folded_row(tmp_path: Path) -> None:
    task = FoldPartitions(_context(tmp_path, "tests.fold_fixtures:sum_fold", None))
    (result,) = list(task(iter(_batches([(1, 1, 10, 0, 0), (1, 2, None, 0, 1), (2, 2, 999, 0, 2)]))))
    row = result.to_pylist()[0]
    assert json.loads(row["counts"]) == {"rows_in": 3, "rows_out": 2, "outside_window": 0}
    got = sorted(pq.read_table(row["data_file"].removeprefix("file://")).to_pylist(), key=lambda r: r["k"])
    assert [(r["k"], r["v"], r["_rewind_source_offset"]) for r in got] == [(1, 3, 0), (2, 2, 2)]


def test_a_fold_task_hands_the_fold_integers_as_integers_even_beside_nulls(tmp_path: Path) -> None:
    """A null among a task's integers must not make them floats: 2**53 + 1 stays exact, and the
    fold sees the same dtype whatever the task's other rows hold."""
    big = 2**53 + 1
    task = FoldPartitions(_context(tmp_path, "tests.fold_fixtures:integer_sum", None))
    (result,) = list(task(iter(_batches([(1, big, 1, 0, 0), (2, None, 2, 0, 1), (1, 0, 3, 0, 2)]))))
    row = result.to_pylist()[0]
    got = pq.read_table(row["data_file"].removeprefix("file://")).to_pylist()
    assert sorted((r["k"], r["v"]) for r in got) == [(1, big), (2, 0)]


# -- the spec ----------------------------------------------------------------------------------------

SPEC_YAML = """\
name: repair-order-totals
source:
  kafka: {topics: [orders], from: "2026-10-01T00:00:00Z", to: "2026-10-08T00:00:00Z"}
decode: json
translate:
  function: my_pkg.orders:order_deltas
  fold: my_pkg.orders:fold_totals
  version: "2"
key: [order_id]
sink:
  iceberg:
    table: analytics.order_totals
    mode: replace-window
    window_column: placed_at
    window_from: "2026-10-02T00:00:00Z"
    window_to: "2026-10-05T00:00:00Z"
"""


def spec_data(**changes: Any) -> dict[str, Any]:
    """The example with dotted paths set (None removes)."""
    data: dict[str, Any] = yaml.safe_load(SPEC_YAML)
    for path, value in changes.items():
        target = data
        *parents, last = path.split("__")
        for part in parents:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return data


def error_of(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "spec.yaml")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("spec.yaml: "), message
    return caught.value


def test_the_read_model_spec_parses_and_round_trips() -> None:
    spec = parse_spec(spec_data())
    ice = spec.sink.iceberg
    assert ice is not None
    assert spec.translate.fold == "my_pkg.orders:fold_totals"
    assert ice.window_from == datetime(2026, 10, 2, tzinfo=UTC)
    assert ice.window_to == datetime(2026, 10, 5, tzinfo=UTC)
    again = parse_spec(yaml.safe_load(spec.to_yaml()))
    assert again == spec and again.fingerprint() == spec.fingerprint()
    assert "window_from: '2026-10-02T00:00:00Z'" in spec.to_yaml()


def test_the_replaced_window_may_be_the_whole_source_window_given_in_any_form() -> None:
    spec = parse_spec(
        spec_data(
            sink__iceberg__window_from=1_790_812_800_000,  # 2026-10-01T00:00:00Z, epoch ms
            sink__iceberg__window_to="2026-10-08T02:00:00+02:00",
        )
    )
    assert spec.replaced_window() == (datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 8, tzinfo=UTC))


@pytest.mark.parametrize(
    ("changes", "fingerprint_changes"),
    [
        ({"translate__fold": "my_pkg.orders:fold_totals_v2"}, True),
        ({"translate__fold": None}, True),
        ({"sink__iceberg__window_from": "2026-10-03T00:00:00Z"}, True),
        ({"sink__iceberg__window_to": None}, True),
        ({"sink__iceberg__window_from": "2026-10-02T02:00:00+02:00"}, False),  # the same instant
    ],
)
def test_the_fingerprint_follows_the_fold_and_the_replaced_window(
    changes: dict[str, Any], fingerprint_changes: bool
) -> None:
    base = parse_spec(spec_data()).fingerprint()
    assert (parse_spec(spec_data(**changes)).fingerprint() != base) is fingerprint_changes


SPEC_ERRORS: list[tuple[dict[str, Any], str]] = [
    (
        {"translate__fold": "my_pkg.orders.fold_totals"},
        "spec.yaml: translate.fold: not a function reference (got 'my_pkg.orders.fold_totals'); "
        "expected package.module:callable, like my_pkg.orders:to_total",
    ),
    (
        {"translate__fold": 3},
        "spec.yaml: translate.fold: not a string (got 3); expected text (quote it in YAML)",
    ),
    (
        {
            "sink__iceberg__mode": "append",
            "sink__iceberg__window_column": None,
            "sink__iceberg__window_to": None,
        },
        "spec.yaml: sink.iceberg.window_from: used only by mode replace-window (got 2026-10-02T00:00:00",
    ),
    (
        {
            "sink__iceberg__mode": "append",
            "sink__iceberg__window_column": None,
            "sink__iceberg__window_from": None,
        },
        "spec.yaml: sink.iceberg.window_to: used only by mode replace-window (got 2026-10-05T00:00:00",
    ),
    (
        {"sink__iceberg__window_to": "2026-10-02T00:00:00Z"},
        "spec.yaml: sink.iceberg: window_from is not before window_to (got 2026-10-02T00:00:00Z .. "
        "2026-10-02T00:00:00Z); the replaced window is [window_from, window_to)",
    ),
    (
        {"sink__iceberg__window_from": "2026-10-06T00:00:00Z"},
        "spec.yaml: sink.iceberg: window_from is not before window_to (got 2026-10-06T00:00:00Z .. "
        "2026-10-05T00:00:00Z); the replaced window is [window_from, window_to)",
    ),
    (
        {"sink__iceberg__window_from": "2026-09-30T23:59:59.999Z"},
        "spec.yaml: sink.iceberg.window_from: outside the source window (got 2026-09-30T23:59:59.999Z); "
        "the replaced window must lie within the source window 2026-10-01T00:00:00Z .. 2026-10-08T00:00:00Z",
    ),
    (
        {"sink__iceberg__window_to": "2026-10-08T00:00:00.001Z"},
        "spec.yaml: sink.iceberg.window_to: outside the source window (got 2026-10-08T00:00:00.001Z); "
        "the replaced window must lie within the source window 2026-10-01T00:00:00Z .. 2026-10-08T00:00:00Z",
    ),
    (
        {"source__kafka__to": None},
        "spec.yaml: sink.iceberg.window_from: needs a source window given as times; give source from/to as "
        "ISO times, or drop window_from/window_to",
    ),
    (
        {
            "source__kafka__from": {"orders": {"0": 0}},
            "source__kafka__to": {"orders": {"0": 10}},
            "sink__iceberg__window_from": None,
        },
        "spec.yaml: sink.iceberg.window_to: needs a source window given as times; give source from/to as "
        "ISO times, or drop window_from/window_to",
    ),
    (
        {"sink__iceberg__window_from": "yesterday"},
        "spec.yaml: sink.iceberg.window_from: not a time for window_from (got 'yesterday'); expected an "
        "ISO-8601 time with a zone (2026-10-01T00:00:00Z) or epoch milliseconds",
    ),
    (
        {"sink__iceberg__window_to": "2026-10-05T00:00:00"},
        "spec.yaml: sink.iceberg.window_to: not a time for window_to (got '2026-10-05T00:00:00'); expected "
        "an ISO-8601 time with a zone (2026-10-01T00:00:00Z) or epoch milliseconds",
    ),
]


@pytest.mark.parametrize(("changes", "message"), SPEC_ERRORS, ids=[m.split(": ")[1] for _, m in SPEC_ERRORS])
def test_each_bad_fold_or_window_is_a_one_line_spec_error(changes: dict[str, Any], message: str) -> None:
    error = error_of(spec_data(**changes))
    assert str(error).startswith(message), str(error)
    assert error.field == message.split(": ")[1]


@pytest.mark.parametrize(
    "sink",
    [{"kafka": {"topic": "order-totals"}}, {"postgres": {"table": "public.order_totals", "mode": "append"}}],
    ids=["kafka", "postgres-append"],
)
def test_a_fold_needs_a_sink_that_can_hold_one_row_per_key(sink: dict[str, Any]) -> None:
    error = error_of({**spec_data(), "sink": sink})
    assert error.field == "translate.fold"
    assert str(error).startswith("spec.yaml: translate.fold: needs an Iceberg sink"), str(error)
    assert "(got 'my_pkg.orders:fold_totals')" in str(error)


# -- which runs finalize, over which window ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "needed"),
    [
        ({}, True),  # a fold
        ({"translate__fold": None}, True),  # replace-window on an output column: rows may fall outside
        ({"sink__iceberg": {"table": "analytics.order_totals"}}, True),  # a fold, appended
        ({"translate__fold": None, "sink__iceberg": {"table": "analytics.order_totals"}}, False),
        (
            {"translate__fold": None, "sink__iceberg": {"table": "a.t", "mode": "replace-window"}},
            False,  # the source window on the source time: every row read is inside
        ),
        (
            {
                "translate__fold": None,
                "sink__iceberg": {"table": "a.t", "mode": "replace-window", "window_from": OCT_2},
            },
            True,  # rows read before window_from would duplicate the target's rows kept there
        ),
        (
            {
                "translate__fold": None,
                "sink__iceberg": {"table": "a.t", "mode": "replace-window", "window_to": OCT_2},
            },
            True,
        ),
    ],
)
def test_which_runs_finalize(changes: dict[str, Any], needed: bool) -> None:
    assert needs_finalize(parse_spec(spec_data(**changes))) is needed


def test_the_replaced_window_defaults_to_the_source_window_end_by_end() -> None:
    oct_ = [datetime(2026, 10, d, tzinfo=UTC) for d in range(1, 9)]
    assert parse_spec(spec_data()).replaced_window() == (oct_[1], oct_[4])
    assert parse_spec(spec_data(sink__iceberg__window_from=None)).replaced_window() == (oct_[0], oct_[4])
    assert parse_spec(spec_data(sink__iceberg__window_to=None)).replaced_window() == (oct_[1], oct_[7])
    whole = spec_data(sink__iceberg__window_to=None, sink__iceberg__window_from=None)
    assert parse_spec(whole).replaced_window() == (oct_[0], oct_[7])
    offsets = copy.deepcopy(whole)
    offsets["source"]["kafka"]["to"] = "latest"
    assert parse_spec(offsets).replaced_window() is None

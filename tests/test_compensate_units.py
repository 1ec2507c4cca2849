"""How ``rewind compensate`` cuts changes into units, against Spark itself: the labels that give
each unit a Spark partition of its own, and the ``join`` cut, which makes the join's own
partitions the units (:mod:`rewind.spark.compensate_stage`)."""

from __future__ import annotations

from typing import Any

import pytest


def test_the_units_labels_are_where_sparks_hash_partitioning_sends_them(spark: Any) -> None:
    """The labels that give each unit a Spark partition of its own are computed in Python
    (Spark's murmur3 of an int): Spark's own ``hash`` and a ``repartition`` agree with them."""
    from pyspark.sql import functions as F

    from rewind.spark.compensate_stage import _labels, spark_hash_int

    values = [*range(-50, 2000), 2**31 - 1, -(2**31)]
    got = spark.createDataFrame([(v,) for v in values], "v int").select("v", F.hash("v").alias("h")).collect()
    assert {r["v"]: r["h"] for r in got} == {v: spark_hash_int(v) for v in values}
    for count in (1, 3, 16, 37):
        labels = _labels(count)
        assert len(set(labels)) == count
        placed = (
            spark.createDataFrame([(v,) for v in labels], "v int")
            .repartition(count, "v")
            .select("v", F.spark_partition_id().alias("p"))
            .collect()
        )
        assert {r["v"]: r["p"] for r in placed} == {v: i for i, v in enumerate(labels)}


# the key types the join cut knows (Spark's Literal.default of each): three rows a side, one key
# on both, one only in production, one only in staging, a null key on both sides
JOIN_CUT_KEYS: list[tuple[str, list[Any]]] = [
    ("tinyint", [1, -7, 100]),
    ("smallint", [300, -2, 9]),
    ("int", [0, -(2**31), 2**31 - 1]),
    ("bigint", [2**40, -1, 77]),
    ("decimal(12,2)", ["10.50", "-3.25", "0.00"]),
    ("string", ["a", "", "sku-ü"]),
    ("binary", [b"\x00", b"", b"\xff\x01"]),
    ("boolean", [True, False, True]),
    ("date", ["1970-01-01", "2026-11-28", "1969-12-31"]),
    ("timestamp", ["2026-11-28 10:00:00", "1970-01-01 00:00:00", "1999-12-31 23:59:59.5"]),
]


@pytest.mark.parametrize("kind,values", JOIN_CUT_KEYS, ids=[k for k, _ in JOIN_CUT_KEYS])
def test_the_join_cut_is_the_partition_sparks_null_safe_join_gives_a_key(
    spark: Any, kind: str, values: list[Any]
) -> None:
    """A ``join`` cut unit is the partition Spark's own null-safe full outer join puts the key
    in, for every key type it takes (and a two-column key, and null keys): the units are the
    join's partitions, so no second shuffle. Floating point keys take the ``key-hash`` cut."""
    import decimal
    from datetime import datetime

    from pyspark.sql import functions as F

    from rewind.spark.compensate_stage import (
        JOIN_CONF,
        changes,
        join_defaults,
        unit_of,
        units_are_join_partitions,
    )

    def cell(v: Any) -> Any:
        if kind.startswith("decimal"):
            return decimal.Decimal(v)
        if kind == "date":
            return datetime.strptime(v, "%Y-%m-%d").date()
        if kind == "timestamp":
            return datetime.fromisoformat(v)
        return v

    a, b, c = (cell(v) for v in values)
    schema = f"k {kind}, j int, v int"
    old = spark.createDataFrame([(a, 1, 1), (b, 2, 2), (None, 3, 3)], schema)
    new = spark.createDataFrame([(a, 1, 5), (c, 4, 4), (None, 3, 4)], schema)
    units = 7
    for key in (["k"], ["k", "j"]):
        diff = changes(old, new, key)
        defaults = join_defaults(diff.schema, key)
        assert defaults is not None
        saved = {name: spark.conf.get(name) for name in [*JOIN_CONF, "spark.sql.shuffle.partitions"]}
        try:
            for name, value in {**JOIN_CONF, "spark.sql.shuffle.partitions": str(units)}.items():
                spark.conf.set(name, value)
            placed = diff.select(
                unit_of(key, units, defaults).alias("unit"), F.spark_partition_id().alias("p")
            )
            assert units_are_join_partitions(placed, units)
            rows = placed.collect()
        finally:
            for name, value in saved.items():
                spark.conf.set(name, value)
        assert len(rows) == 4  # a changed, b only old, c only new, the null key changed
        assert all(r["unit"] == r["p"] for r in rows), rows
    floats = spark.createDataFrame([(1.5, 1)], "k double, v int")
    assert join_defaults(changes(floats, floats, ["k"]).schema, ["k"]) is None

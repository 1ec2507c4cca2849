"""Reading a DataFrame's physical plan (the JVM's ``executedPlan``) through py4j.

Two stages choose their shape from the plan Spark made: a SQL wave runs a row-by-row query in
the tasks that decoded its records (:func:`rewind.spark.sql_wave.runs_in_place`), and a
compensate writes its units from the join's own partitions when nothing reshuffles them
(:func:`rewind.spark.compensate_stage.units_are_join_partitions`). A Spark Connect DataFrame
shows no plan (:func:`plan_nodes` gives ``None``): both then take their general path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def plan_nodes(df: DataFrame) -> list[Any] | None:
    """The nodes of ``df``'s physical plan (JVM objects), the root first; None over Spark
    Connect. Planning happens here, under the session's configuration of this moment, and the
    DataFrame keeps that plan for its execution."""
    if getattr(df, "_jdf", None) is None:
        return None
    nodes, todo = [], [df._jdf.queryExecution().executedPlan()]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo += scala_seq(node.children())
    return nodes


def scala_seq(seq: Any) -> list[Any]:
    """A Scala ``Seq`` seen through py4j, as a list."""
    return [seq.apply(i) for i in range(seq.size())]

"""Which Spark stage runs a wave: the tasks' (:func:`rewind.spark.job_stage.run_wave`), or the
query of a SQL translate with its tasks (:func:`rewind.spark.sql_wave.run_sql_wave`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rewind.spark.job_stage import ArchiveReader, StageContext, UnitOutput
from rewind.spark.job_stage import run_wave as run_task_wave
from rewind.spark.sql_wave import run_sql_wave

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_wave(
    spark: SparkSession, ctx: StageContext, read_archive: ArchiveReader | None = None
) -> dict[str, UnitOutput]:
    query = json.loads(ctx.spec_json).get("translate", {}).get("sql")
    if query:
        return run_sql_wave(spark, ctx, query, read_archive)
    return run_task_wave(spark, ctx, read_archive)

"""``rewind.spark.session``: a working local session with Rewind's defaults.

One process can hold one SparkSession, so the defaults are checked on the shared ``spark``
fixture and a user's ``spark.conf`` in a child process that builds its own session.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings


def test_the_session_runs_jobs(spark: Any) -> None:
    assert spark.version.startswith("4.1")
    assert spark.range(1000).selectExpr("sum(id) AS s").first().s == 499500
    assert spark.sparkContext.master == "local[*]"


def test_pyspark_query_context_capture_is_off(spark: Any) -> None:
    """PySpark's capture costs 4-5 py4j round trips per ``functions`` call (70% of those of
    a verify's plan building) for a context Rewind's one-line errors do not show."""
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()


def test_aggregations_keep_more_groups_in_their_fast_map(spark: Any) -> None:
    """Verify's first level groups ~45k cells per task: the first-level hash map holds 2**18
    groups, and an aggregation past the old 2**16 (into one task) still sums every group."""
    assert spark.conf.get("spark.sql.codegen.aggregate.fastHashMap.capacityBit") == "18"
    groups = 100_000
    rows = spark.range(0, 3 * groups, numPartitions=1).selectExpr(f"id % {groups} AS g", "id")
    out = rows.groupBy("g").agg({"id": "sum", "*": "count"}).toArrow()
    assert out.num_rows == groups
    assert set(out.column("count(1)").to_pylist()) == {3}
    assert sum(out.column("sum(id)").to_pylist()) == sum(range(3 * groups))


def test_tasks_run_this_interpreter_and_this_rewind(spark: Any) -> None:
    import rewind

    def where(_: int) -> tuple[str, str]:
        import sys

        import rewind

        return sys.executable, rewind.__file__

    seen = set(spark.sparkContext.parallelize(range(4), 2).map(where).collect())
    assert seen == {(sys.executable, rewind.__file__)}


def test_timezone_is_utc(spark: Any) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    row = spark.sql(
        "SELECT CAST(from_unixtime(0) AS STRING) AS t, CAST(TIMESTAMP '2024-03-31 01:30:00' AS LONG) AS s"
    ).first()
    assert row.t == "1970-01-01 00:00:00"
    assert row.s == 1711848600  # the wall time read as UTC, no DST shift


def test_rewind_defaults_are_applied(spark: Any, settings: Settings) -> None:
    # the suite's only Spark conf is the quick-JVM options; the rest are Rewind's defaults.
    # (Whichever test of this process started Spark first chose its Java options, so only
    # Rewind's own logging option is certain here.)
    assert set(settings.spark.conf) == {"spark.driver.extraJavaOptions"}
    assert "-Dlog4j2.configurationFile=" in spark.conf.get("spark.driver.extraJavaOptions")
    assert spark.conf.get("spark.sql.shuffle.partitions") == "8"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"
    assert spark.conf.get("spark.pyspark.python") == os.environ["PYSPARK_PYTHON"]


def test_register_returns_the_source_names(spark: Any) -> None:
    from rewind.spark import register
    from rewind.spark.sources import DATA_SOURCES

    names = register(spark)
    assert isinstance(names, list)
    assert all(isinstance(n, str) and n for n in names)
    assert names == [source.name() for source in DATA_SOURCES]
    assert register(spark) == names  # registering again is harmless


def test_registering_rewinds_sources_skips_sparks_lookup_of_installed_ones(spark: Any) -> None:
    """Spark looks up ``pyspark_*`` packages in a Python process of its own when a session
    first registers a Python source, unless the driver's PYSPARK_DRIVER_PYTHON names no
    command; Rewind's session names none, so the lookup never ran (its result stays unset),
    and Rewind's own sources still read."""
    from rewind.spark import register

    names = register(spark)
    manager = getattr(spark._jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$")
    assert not getattr(manager, "MODULE$").dataSourceBuilders().isDefined()
    registered = spark._jsparkSession.sessionState().dataSourceManager()
    assert names and all(registered.dataSourceExists(name) for name in names)


def test_a_source_name_spark_keeps_taken_is_tried_again_then_named(
    spark: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A registration Spark refuses as already existing is tried again (a Connect server
    refused Rewind's once in a suite run, a transient refusal); a name that stays taken, here
    a JVM source's, ends in an error that names it, and Rewind's own source registers again."""
    from pyspark.sql.datasource import DataSource

    from rewind.errors import RewindError

    # the module, not the package's session() function of the same name
    spark_session = importlib.import_module("rewind.spark.session")

    class TakenName(DataSource):
        @classmethod
        def name(cls) -> str:
            return "csv"

    monkeypatch.setattr(spark_session, "_REGISTER_RETRIES_S", (0.01, 0.01))
    caplog.set_level(logging.DEBUG, logger=spark_session.__name__)
    with pytest.raises(RewindError, match=r"'csv'.*already exists"):
        spark_session.register_source(spark, TakenName)
    tries = [r.getMessage().split(" (")[0] for r in caplog.records]
    assert tries == ["Spark refused the data source csv"] * 2
    spark_session.register_source(spark, spark_session._data_sources()[0])  # no error


def test_session_returns_the_active_session(spark: Any, settings: Settings) -> None:
    from rewind.spark import session

    assert session(settings) is spark


CHILD = """
import json, time
t0 = time.monotonic()
from rewind.config import load_settings
from rewind.spark import session
spark = session(load_settings())
up = time.monotonic() - t0
conf = {k: spark.conf.get(k) for k in (
    "spark.sql.shuffle.partitions", "spark.sql.session.timeZone", "spark.sql.ansi.enabled",
    "spark.sql.execution.arrow.pyspark.enabled")}
shown = spark.sql("SELECT CAST(from_unixtime(0) AS STRING) AS t").first().t
assert session(load_settings(), app_name="another") is spark  # Spark: "Using an existing..."
import pandas as pd  # a task carrying ~7 MB of driver data: Spark's "task of very large size"
big = spark.createDataFrame(pd.DataFrame({"a": range(60000), "b": ["x" * 200] * 60000}))
assert big.mapInPandas(lambda it: (p[["a"]].head(1) for p in it), "a long").count() >= 1
print(json.dumps({"conf": conf, "master": spark.sparkContext.master, "app": spark.sparkContext.appName,
                  "epoch_shown": shown, "seconds": up}))
spark.stop()
"""


@pytest.fixture(scope="session", autouse=True)
def custom_conf_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A child process that builds its own session from a user's settings.

    Session-scoped and autouse so that it starts before the shared ``spark`` fixture when
    this module runs first: the two JVMs then boot side by side instead of one after the other.
    """
    cwd = tmp_path_factory.mktemp("spark-conf")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REWIND_", "PYSPARK_"))}
    env |= {
        "REWIND_STATE_DIR": str(cwd / "state"),
        "REWIND_SPARK_MASTER": "local[1]",
        "REWIND_SPARK_CONF": json.dumps(
            {
                "spark.sql.shuffle.partitions": 3,
                "spark.sql.session.timeZone": "Asia/Tokyo",
                "spark.sql.ansi.enabled": "false",
            }
        ),
    }
    (cwd / "rewind.yaml").write_text(
        "spark:\n  app_name: from-file\n  conf:\n    spark.sql.shuffle.partitions: '5'\n"
    )
    out, err = cwd / "stdout", cwd / "stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=cwd, stdout=stdout, stderr=stderr)
    try:
        yield {"proc": proc, "stdout": out, "stderr": err}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_spark_conf_from_settings_reaches_the_session(
    custom_conf_child: dict[str, Any], record_property: Any
) -> None:
    returncode = custom_conf_child["proc"].wait(timeout=180)
    assert returncode == 0, custom_conf_child["stderr"].read_text()[-3000:]
    got = json.loads(custom_conf_child["stdout"].read_text().strip().splitlines()[-1])
    record_property("spark_session_seconds", round(got["seconds"], 1))

    assert got["conf"] == {
        "spark.sql.shuffle.partitions": "3",  # env wins over the file and over Rewind's default 8
        "spark.sql.session.timeZone": "Asia/Tokyo",  # a user may override Rewind's UTC
        "spark.sql.ansi.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",  # untouched defaults stay
    }
    assert got["master"] == "local[1]"
    assert got["app"] == "from-file"
    assert got["epoch_shown"] == "1970-01-01 09:00:00"
    # Spark's warnings about Rewind's expected use of it are dropped (log4j2.properties); others stay
    err = custom_conf_child["stderr"].read_text()
    assert "Using an existing Spark session" not in err
    assert "task of very large size" not in err, err


QUIET_JVM = """
import json, sys
from rewind.config import load_settings
from rewind.spark.session import session, start_early
settings = load_settings()
start_early(settings).join(300)  # started in a thread, as `rewind run` starts it
spark = session(settings)
print(json.dumps({"sum": spark.range(0, 100).selectExpr("sum(id) AS s").first().s}))
spark.stop()
"""


def _child(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith(("REWIND_", "PYSPARK_"))}
    child |= {"REWIND_STATE_DIR": str(tmp_path / "state"), "REWIND_SPARK_MASTER": "local[1]", **env}
    return subprocess.run(
        [sys.executable, "-c", QUIET_JVM],
        env=child,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_jvms_output_goes_to_its_file_and_a_jvm_that_cannot_start_names_it(tmp_path: Path) -> None:
    """With ``spark.jvm_output`` the driver JVM's own lines (the JVM's warning about its
    incubator modules, which Spark's launcher always adds) go to that file, not to stderr, also
    when the session starts in another thread; a JVM that exits at once is one error naming
    the file that holds why."""
    output = tmp_path / "spark.log"
    ran = _child(tmp_path, REWIND_SPARK_JVM_OUTPUT=str(output))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == {"sum": 4950}
    assert "Using incubator modules" in output.read_text()
    assert "Using incubator modules" not in ran.stderr and "WARN" not in ran.stderr, ran.stderr

    conf = json.dumps({"spark.driver.memory": "1k"})  # no JVM starts with a 1 kB heap
    # the default: the JVM's lines reach this process's own output, as before (a JVM that stops
    # at once shows it as well as one that runs a job, without a session's start; HotSpot prints
    # why it stopped on stdout)
    inherited = _child(tmp_path, REWIND_SPARK_CONF=conf)
    said = inherited.stdout + inherited.stderr
    assert inherited.returncode != 0 and "heap" in said.lower(), said[-3000:]
    assert "its output is in" not in said

    broken = tmp_path / "broken.log"
    failed = _child(tmp_path, REWIND_SPARK_JVM_OUTPUT=str(broken), REWIND_SPARK_CONF=conf)
    assert failed.returncode != 0
    assert "Spark's JVM did not start" in failed.stderr and f"its output is in {broken}" in failed.stderr
    assert "heap" in broken.read_text().lower(), broken.read_text()

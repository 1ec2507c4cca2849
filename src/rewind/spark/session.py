"""``rewind.spark.session()``: a SparkSession configured for Rewind, with its data sources.

Local (``local[*]``) by default; a configured ``spark.master`` or a Spark Connect
``spark.remote`` takes over. Python workers are pointed at this interpreter so that tasks
import the same environment (the same Rewind, the same confluent-kafka).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rewind.config import Settings, load_settings
from rewind.errors import RewindError
from rewind.javacheck import require_java
from rewind.spark.class_archive import java_options
from rewind.spark.topology import default_parallelism as asked

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource

log = logging.getLogger(__name__)

# Spark settings Rewind relies on; a user's spark.conf overrides any of them.
_DEFAULT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "8",
    # the first, in-cache hash map of an aggregation: 2**18 groups instead of 2**16 before it
    # spills to the slower map. Verify's first level groups ~45k cells per task; with the
    # larger map its pass took ~7% less JVM CPU at 10M rows a side (bench/RESULTS.md)
    "spark.sql.codegen.aggregate.fastHashMap.capacityBit": "18",
    "spark.python.worker.reuse": "true",
    # PySpark's query-context capture: 4-5 py4j round trips on every `functions` call (the
    # active session, the conf, the call site set and cleared), 70% of the round trips of
    # a verify's plan building. What it captures is printed by loggers Rewind silences
    # anyway (errors are reported on one line: see _quiet_query_context_loggers).
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}
# When a session first registers a Python data source (register() below), Spark's JVM starts
# a Python process that imports PySpark to find data sources installed as ``pyspark_*``
# packages: ~0.9 s of CPU and ~0.8 s of a cold run's wall, on every session. No Spark setting
# skips it (SPARK-50426 spares only sessions that register none); the JVM skips it when the
# command in its PYSPARK_DRIVER_PYTHON does not exist, and in a session whose driver is this
# process Spark uses that variable for nothing else. Rewind registers its sources by name and
# reads no installed ones, so its driver's JVM gets a name that is no command.
NO_INSTALLED_SOURCE_LOOKUP = "rewind-reads-no-installed-python-data-sources"
_LOCAL_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    # workers forked with Rewind's task modules imported (rewind.spark.daemon)
    "spark.python.daemon.module": "rewind.spark.daemon",
}


def _quiet_query_context_loggers() -> None:
    """PySpark logs every failed query's whole Java stack as one JSON line on stderr, through
    loggers that must be ``PySparkLogger``s (they pass ``errorClass=``; a plain logger of the
    same name turns the query's error into a ``TypeError``). Create them as such, disabled:
    the error itself still reaches the caller, which reports it on one line."""
    try:
        from pyspark.logger import PySparkLogger  # lazy: avoids pyspark at import
    except ImportError:  # an older PySpark: nothing to quiet
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def session(settings: Settings | None = None, app_name: str | None = None) -> SparkSession:
    """Return the active Rewind SparkSession, creating it on first call."""
    settings = settings or load_settings()
    # lazy: avoids pyspark at import
    from pyspark.sql import SparkSession

    _quiet_query_context_loggers()
    app = app_name or settings.spark.app_name
    builder = SparkSession.builder.appName(app)
    conf = dict(_DEFAULT_CONF)
    if settings.spark.remote:
        builder = builder.remote(settings.spark.remote)
    else:
        require_java()
        builder = builder.master(settings.spark.master)
        if settings.spark.master.startswith("local"):
            conf.update(_LOCAL_CONF)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        log4j = Path(__file__).with_name("log4j2.properties")
        options = f"-Dlog4j2.configurationFile={log4j.as_uri()} {java_options()}"
        conf["spark.driver.extraJavaOptions"] = options.strip()
        # executors run this interpreter, where rewind and its clients are installed, unless
        # spark.conf names theirs (a packed virtualenv shipped by spark.archives): PySpark
        # takes the executors' interpreter from PYSPARK_PYTHON, not from the conf
        executors = settings.spark.conf.get("spark.pyspark.python")
        if executors:
            os.environ["PYSPARK_PYTHON"] = executors
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ["PYSPARK_DRIVER_PYTHON"] = NO_INSTALLED_SOURCE_LOOKUP
        conf["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
        conf.setdefault("spark.pyspark.driver.python", sys.executable)
    for key, value in settings.spark.conf.items():
        if key == "spark.driver.extraJavaOptions" and key in conf:
            conf[key] = f"{conf[key]} {value}"  # keep Rewind's quiet logging, add the user's
        else:
            conf[key] = value
    if settings.spark.remote:
        # a Connect server's session takes runtime SQL settings only; the rest is the server's
        conf = {k: v for k, v in conf.items() if k.startswith("spark.sql.") or k in settings.spark.conf}
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not settings.spark.remote and settings.spark.jvm_output is not None:
        # the builder's app name and master, then its conf: what it would hand spark-submit
        _start_jvm(
            {"spark.app.name": app, "spark.master": settings.spark.master, **conf}, settings.spark.jvm_output
        )
    spark = builder.getOrCreate()
    if not settings.spark.remote:
        spark.sparkContext.setLogLevel(settings.spark.log_level)
    register(spark)
    log.debug("spark session ready: %s", settings.spark.remote or settings.spark.master)
    return spark


def _start_jvm(options: dict[str, str], output: Path) -> None:
    """Launch the driver's JVM (PySpark's gateway, through spark-submit with ``options``, as the
    builder would) with its stdout and stderr appended to ``output``; the builder then finds it
    running and takes it. Nothing when this process has one already."""
    # lazy: avoids pyspark at import
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        output.parent.mkdir(parents=True, exist_ok=True)
        conf = SparkConf(loadDefaults=False).setAll(list(options.items()))
        with output.open("ab") as sink:  # the child holds its own descriptors
            try:
                gateway = launch_gateway(conf, popen_kwargs={"stdout": sink, "stderr": sink})
            except Exception as exc:
                raise SparkStartError(
                    f"Spark's JVM did not start ({exc}); its output is in {output}"
                ) from None
        SparkContext._ensure_initialized(gateway=gateway)


class SparkStartError(RewindError):
    """The driver's JVM exited before it answered (what it printed is in its output file)."""


def start_early(settings: Settings) -> threading.Thread:
    """Start the session in a daemon thread, so that the JVM starts while the caller plans (a
    cold `rewind run` spends ~2 s planning, ~5 s starting Spark). :func:`session` then returns
    it, waiting for it if it is still starting (PySpark's builder holds a lock). A failure here
    is left for that call to raise again, in the caller's thread.

    PySpark installs its Ctrl-C handler (cancel the running jobs, then KeyboardInterrupt) only
    when the session starts in the main thread: a caller that handles Ctrl-C cancels the jobs
    itself (:class:`rewind.job.runner._Interrupts`)."""

    def start() -> None:
        try:
            session(settings)
        except Exception as exc:  # raised again where the session is needed
            log.debug("the early Spark start failed: %s", exc)

    thread = threading.Thread(target=start, name="rewind-spark-start", daemon=True)
    thread.start()
    return thread


def register(spark: SparkSession) -> list[str]:
    """Register Rewind's Python data sources on any session (a cluster's, a notebook's).

    Returns the short names registered, usable in ``spark.read.format(name)``.
    """
    sources = _data_sources()
    names = [source.name() for source in sources]
    if getattr(spark, "_rewind_sources", None) == names:
        return names  # registering again would only log a "replaced" warning
    for source in sources:
        register_source(spark, source)
    # a Connect session may not take attributes; registering twice is harmless there
    with contextlib.suppress(AttributeError):
        spark._rewind_sources = names  # type: ignore[attr-defined]
    return names


# the pauses before each new try when Spark calls a data source's name taken
_REGISTER_RETRIES_S = (0.5, 1.0, 2.0)


def register_source(spark: SparkSession, source: type[DataSource]) -> None:
    """Register one Python data source, trying again when Spark calls its name taken.

    Spark refuses a registration with ``DATA_SOURCE_ALREADY_EXISTS`` when its lookup of the name
    finds a JVM source of that name, but also when that lookup throws anything at all, and the
    lookup asks the registry of whichever session is active on the thread. A Spark Connect
    server that served several sessions refused a session's first registration of
    ``rewind-kafka`` once in a suite run: a transient refusal, which a later try need not meet.
    A name still taken after the last try is a clear error."""
    for pause in (*_REGISTER_RETRIES_S, None):
        try:
            spark.dataSource.register(source)
            return
        except Exception as exc:
            if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
                raise
            if pause is None:
                raise RewindError(
                    f"Spark refused to register Rewind's data source {source.name()!r}: it says a "
                    f"data source of that name already exists ({exc}). Remove the package that "
                    "provides a source of that name from Spark's classpath (its administrator can "
                    "say which one)"
                ) from None
            log.debug("Spark refused the data source %s (%s); trying again", source.name(), exc)
            time.sleep(pause)


def _data_sources() -> list[type[DataSource]]:
    # lazy: pyspark's datasource module is heavy and the CLI mostly does not need it
    from rewind.spark.sources import DATA_SOURCES

    return list(DATA_SOURCES)


def default_parallelism(spark: SparkSession) -> int:
    """How many tasks keep the cluster busy (:func:`rewind.spark.topology.default_parallelism`)."""
    return asked(spark)

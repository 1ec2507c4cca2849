"""Where a session's tasks run, asked without a SparkContext where there is none.

A classic session answers from its SparkContext. A Spark Connect client has none (the
server's driver holds it), so it asks the server's conf (``spark.master``,
``spark.default.parallelism``) or, for the default parallelism, a small job, and tells from the
server's address whether that driver is on this host. The progress channel, the rate guard's
budget server, verify's reference files and every stage sizing its tasks ask here.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no SparkContext, no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def master(spark: SparkSession) -> str:
    """The master the session's tasks run under; a Connect client asks the server's conf."""
    if not is_connect(spark):
        return str(spark.sparkContext.master or "")
    try:
        return str(spark.conf.get("spark.master", "") or "")
    except Exception:  # a server that does not say: assume a cluster
        return ""


def server_on_this_host(spark: SparkSession) -> bool:
    """Whether the session's driver runs on this host: always for a classic session; for a
    Connect client, when the server's address is a loopback one (``sc://127.0.0.1``,
    ``sc://localhost``, ``sc://[::1]``)."""
    if not is_connect(spark):
        return True

    host = getattr(getattr(getattr(spark, "client", None), "_builder", None), "host", None)
    if not host:
        return False
    if str(host).lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host).strip("[]")).is_loopback
    except ValueError:
        return False


def tasks_on_this_host(spark: SparkSession) -> bool:
    """Whether every task of ``spark`` runs on this host, seeing its files and its loopback: a
    ``local`` master whose driver is here."""
    return master(spark).startswith("local") and server_on_this_host(spark)


_CONNECT_PARALLELISM: dict[str, int] = {}


def default_parallelism(spark: SparkSession) -> int:
    """How many tasks keep the cluster busy: Spark's default parallelism.

    A Connect client has no SparkContext to ask. It takes the server's
    ``spark.default.parallelism`` when set, else the number of splits the server gives a range
    without a partitioning (Spark gives a leaf its default parallelism): one small JVM-only
    job, asked once per session.
    """
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    key = str(getattr(spark, "session_id", id(spark)))
    if key not in _CONNECT_PARALLELISM:
        try:
            configured = spark.conf.get("spark.default.parallelism", None)
            if configured:
                count = int(configured)
            else:
                # lazy: avoids pyspark at import
                from pyspark.sql import functions as F

                last = spark.range(0, 1 << 16).select(F.max(F.spark_partition_id())).first()
                count = int(last[0]) + 1 if last is not None and last[0] is not None else 0
        except Exception as exc:  # never fail a run over a sizing hint
            log.warning("the Connect server's default parallelism is unknown (%s): this host's cores", exc)
            count = os.cpu_count() or 2
        _CONNECT_PARALLELISM[key] = max(1, count)
    return _CONNECT_PARALLELISM[key]

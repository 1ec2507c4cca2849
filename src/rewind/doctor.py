"""``rewind doctor``: is this machine and this broker fit for Rewind, and what are the gaps."""

from __future__ import annotations

import time
from typing import Any

from rewind.config import Settings
from rewind.errors import RewindError
from rewind.javacheck import require_java
from rewind.kafka.apiversions import API_NAMES, api_versions
from rewind.kafka.capabilities import probe_capabilities
from rewind.kafka.clients import cluster_metadata
from rewind.spark import session


def _check(name: str, status: str, detail: str, seconds: float, **facts: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail, "seconds": round(seconds, 3),
            "facts": facts}


def run_doctor(settings: Settings, with_spark: bool = True,
               join_timeout_s: float = 45.0) -> dict[str, Any]:
    """Run every check; ``ok`` is False when Java, Spark or the broker itself fails.

    Broker capability gaps (``missing``/``wrong-answer``) do not fail doctor: Rewind
    works around them, and the report says how.
    """
    checks: list[dict[str, Any]] = []
    failure = ""

    t0 = time.monotonic()
    try:
        major, line = require_java()
        checks.append(_check("java", "ok", line, time.monotonic() - t0, major=major))
    except RewindError as exc:
        checks.append(_check("java", "failed", str(exc), time.monotonic() - t0))
        failure = failure or str(exc)

    bootstrap = settings.bootstrap_servers
    conf = settings.kafka_config()
    t0 = time.monotonic()
    broker_ok = False
    try:
        md = cluster_metadata(conf, timeout_s=5.0)
        checks.append(_check("broker", "ok",
                             f"{bootstrap}: {len(md.brokers)} broker(s), {len(md.topics)} topic(s)",
                             time.monotonic() - t0, brokers=len(md.brokers)))
        broker_ok = True
    except RewindError as exc:
        checks.append(_check("broker", "failed", str(exc), time.monotonic() - t0))
        failure = failure or str(exc)

    if broker_ok:
        checks.append(_api_versions_check(settings))

        for cap in probe_capabilities(conf, join_timeout_s=join_timeout_s):
            checks.append(_check(cap.name, cap.status, cap.detail, cap.seconds, **cap.facts))

    if with_spark and not any(c["name"] == "java" and c["status"] == "failed" for c in checks):
        t0 = time.monotonic()
        try:
            spark = session(settings, app_name="rewind-doctor")
            version = spark.version
            spark.range(10).count()
            checks.append(_check("spark", "ok", f"Spark {version} on "
                                 f"{settings.spark.remote or settings.spark.master}",
                                 time.monotonic() - t0))
        except Exception as exc:  # a Spark start-up failure is a finding, not a crash
            msg = f"Spark did not start: {str(exc).splitlines()[0] if str(exc) else exc!r}"
            checks.append(_check("spark", "failed", msg, time.monotonic() - t0))
            failure = failure or msg

    return {"ok": not failure, "failure": failure, "bootstrap_servers": bootstrap,
            "checks": checks}


def _api_versions_check(settings: Settings) -> dict[str, Any]:
    t0 = time.monotonic()
    protocol = settings.kafka.properties.get("security.protocol", "plaintext").lower()
    if protocol != "plaintext":
        return _check("api_versions", "missing", f"not probed over {protocol}", 0.0)
    host, _, port = settings.bootstrap_servers.split(",")[0].rpartition(":")
    try:
        versions = api_versions(host, int(port))
    except (OSError, ValueError) as exc:
        return _check("api_versions", "missing", f"ApiVersions failed: {exc}", time.monotonic() - t0)
    shown = ", ".join(f"{API_NAMES[k]} v{lo}-{hi}" for k, (lo, hi) in sorted(versions.items())
                      if k in API_NAMES)
    return _check("api_versions", "supported", f"{len(versions)} APIs: {shown}",
                  time.monotonic() - t0, apis={API_NAMES.get(k, str(k)): [lo, hi]
                                               for k, (lo, hi) in versions.items()})


__all__ = ["run_doctor"]

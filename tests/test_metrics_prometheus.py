"""A run's metrics with Debian's real Prometheus and Pushgateway, on tansu.

`rewind run SPEC --metrics-port P --pushgateway URL` with `live_groups:` naming a consumer group
that committed known offsets. Prometheus (on loopback, 1 s scrapes) scrapes the run's
`/metrics` and the Pushgateway; the test asserts, through Prometheus' query API and the
Pushgateway's page, the per-partition counts the ledger holds, quarantine by reason, the
stage histogram and the live group's lag. Both binaries are started here and stopped by pid.
They come from `make install` (apt-get as root); without them the test is skipped, saying so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rewind.config import load_settings
from tests import job_fixtures as jf
from tests.conftest import free_port
from tests.kafka_util import create_topic

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PUSHGATEWAY = shutil.which("prometheus-pushgateway") or "/usr/bin/prometheus-pushgateway"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()  # type: ignore[no-any-return]


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{what} did not answer on {url}")


@pytest.fixture
def monitoring(tmp_path: Path) -> Iterator[dict[str, Any]]:
    if not (Path(PROMETHEUS).exists() and Path(PUSHGATEWAY).exists()):
        pytest.skip(
            "Debian's prometheus and prometheus-pushgateway are not installed: "
            "`make install` as root installs them"
        )
    push_port, prom_port, metrics_port = free_port(), free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: pushgateway\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{push_port}']}}]\n"
        f"  - job_name: rewind-run\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    procs = []
    try:
        push = subprocess.Popen(
            [
                PUSHGATEWAY,
                f"--web.listen-address=127.0.0.1:{push_port}",
                f"--persistence.file={tmp_path / 'push.data'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(push)
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(prom)
        _wait_http(f"http://127.0.0.1:{push_port}/metrics", push, "prometheus-pushgateway")
        _wait_http(f"http://127.0.0.1:{prom_port}/-/ready", prom, "prometheus")
        yield {
            "push": f"http://127.0.0.1:{push_port}",
            "prom": f"http://127.0.0.1:{prom_port}",
            "metrics_port": metrics_port,
        }
    finally:
        for proc in procs:  # by pid, ours only
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    data = json.loads(_get(f"{prom}/api/v1/query?query={urllib.parse.quote(expr)}"))
    assert data["status"] == "success", data
    return data["data"]["result"]  # type: ignore[no-any-return]


def _until(prom: str, expr: str, want: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = _query(prom, expr)
        if len(found) >= want:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{expr}: {found}")


def _topic_bytes(conf: dict[str, Any], topic: str, records: dict[int, int]) -> int:
    """Key + value + header bytes of the first ``records[p]`` records of each partition, read by
    a plain consumer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": "bytes-check", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in records])
        total, seen = 0, dict.fromkeys(records, 0)
        deadline = time.monotonic() + 30
        while any(seen[p] < records[p] for p in seen) and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None or msg.error() or seen[msg.partition()] >= records[msg.partition()]:
                continue
            seen[msg.partition()] += 1
            total += len(msg.key() or b"") + len(msg.value() or b"")
            total += sum(len(k.encode()) + len(v or b"") for k, v in msg.headers() or [])
        assert seen == records, seen
        return total
    finally:
        consumer.close()


def _commit_group(conf: dict[str, Any], group: str, topic: str, offsets: dict[int, int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def test_prometheus_scrapes_the_run_and_the_pushgateway_holds_it(
    tmp_path: Path,
    bootstrap: str,
    topic_name: str,
    monkeypatch: pytest.MonkeyPatch,
    monitoring: dict[str, Any],
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from rewind.cli import app
    from rewind.job.service import open_ledger

    monkeypatch.setenv("REWIND_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("REWIND_STATE_DIR", str(tmp_path / "state"))
    settings = load_settings()
    conf = settings.kafka_config()
    create_topic(conf, topic_name, 2)
    jf.produce_orders(conf, topic_name, jf.order_events(600, 2))
    group = f"live-{topic_name}"
    _commit_group(conf, group, topic_name, {0: 250, 1: 280})  # lag 50 + 20 of 300 each
    spec = jf.write_spec(
        tmp_path / "spec.yaml",
        # paced to ~4 s of reading, so Prometheus (1 s scrapes) reaches the run's own /metrics
        # while it runs even when a warm session would finish the job in under a second
        jf.order_spec(
            "metered",
            topic_name,
            "metrics.orders",
            unit_records=100,
            key=[],
            live_groups=[group],
            guards={"max_records_per_second": 150},
        ),
    )
    result = CliRunner().invoke(
        app,
        [
            "run",
            str(spec),
            "--json",
            "--metrics-port",
            str(monitoring["metrics_port"]),
            "--pushgateway",
            monitoring["push"],
        ],
    )
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    run_id = outcome["run_id"]
    with open_ledger(settings) as ledger:
        units = ledger.units(run_id)
        totals = ledger.unit_counts(run_id)
    by_partition = {p: sum(u.records_read for u in units if u.partition == p) for p in (0, 1)}
    assert by_partition == {0: 300, 1: 300}

    # the Pushgateway holds the run, Prometheus scraped it from there
    pushed = {f.name: f for f in text_string_to_metric_families(_get(f"{monitoring['push']}/metrics"))}
    read = {
        s.labels["partition"]: s.value
        for s in pushed["rewind_records_read"].samples
        if s.labels.get("run") == run_id and s.name == "rewind_records_read_total"
    }
    assert read == {"0": 300.0, "1": 300.0}
    reasons = {
        s.labels["reason"]: s.value
        for s in pushed["rewind_records_quarantined"].samples
        if s.name == "rewind_records_quarantined_total"
    }
    assert sum(reasons.values()) == totals.counts.quarantined > 0
    assert reasons == {k: float(v) for k, v in totals.counts.reasons.items()}
    # one observation per wave and stage, buckets cumulative up to +Inf = _count, the tasks'
    # stages timed (every record was read, decoded and translated: their seconds are > 0)
    hist = pushed["rewind_stage_duration_seconds"].samples
    count = {s.labels["stage"]: s.value for s in hist if s.name.endswith("_count")}
    total = {s.labels["stage"]: s.value for s in hist if s.name.endswith("_sum")}
    waves = count["commit"]
    assert waves >= 1 and count == dict.fromkeys(("read", "decode", "translate", "write", "commit"), waves)
    assert all(total[stage] > 0 for stage in ("read", "decode", "translate", "commit"))
    for stage in count:
        buckets = [s for s in hist if s.name.endswith("_bucket") and s.labels["stage"] == stage]
        values = [s.value for s in sorted(buckets, key=lambda s: float(s.labels["le"]))]
        assert values == sorted(values) and values[-1] == waves and buckets[-1].labels["le"] == "+Inf"
    measured = {s.labels["source"]: s.value for s in pushed["rewind_bytes_read"].samples}
    assert measured == {"kafka": float(_topic_bytes(conf, topic_name, {0: 300, 1: 300}))}
    lag = {s.labels["group"]: s.value for s in pushed["rewind_live_group_lag_sum"].samples}
    assert lag == {group: 70.0}
    # nothing was written to the topic while the run read: a live rate of 0, no multiple
    assert outcome["live"]["live_records_per_second"] == 0 and outcome["live"]["multiple"] is None
    assert "no live writes" in outcome["live"]["summary"]
    pushed_live = [(s.labels["run"], s.value) for s in pushed["rewind_run_live_records_per_second"].samples]
    assert pushed_live == [(run_id, 0.0)]
    no_multiple = pushed.get("rewind_run_realtime_multiple")  # an empty family may not be kept
    assert no_multiple is None or no_multiple.samples == []

    prom = monitoring["prom"]
    series = _until(prom, f'rewind_records_read_total{{run="{run_id}",job="metered"}}', 2)
    assert {s["metric"]["partition"]: float(s["value"][1]) for s in series} == {"0": 300.0, "1": 300.0}
    assert {s["metric"]["source"] for s in series} == {"kafka"}
    stages = _until(prom, f'rewind_stage_duration_seconds_count{{run="{run_id}",job="metered"}}', 5)
    assert {s["metric"]["stage"]: float(s["value"][1]) for s in stages} == count
    live = _until(prom, f'rewind_live_group_lag{{group="{group}"}}', 2)
    assert {s["metric"]["partition"]: float(s["value"][1]) for s in live} == {"0": 50.0, "1": 20.0}
    # the run's own /metrics answered while it ran: Prometheus scraped the planned offsets there
    direct = _query(
        prom,
        f'max_over_time(rewind_offsets_planned{{run="{run_id}",'
        f'instance=~".*:{monitoring["metrics_port"]}"}}[10m])',
    )
    assert [float(s["value"][1]) for s in direct] == [600.0]


def test_the_grafana_dashboard_queries_only_metrics_rewind_exports() -> None:
    """Every metric a panel of docs/grafana-rewind.json queries is a family RunCollector emits
    (as Prometheus names it: counters with _total, histograms with _bucket)."""
    import inspect
    import re

    from rewind.ops import metrics

    dashboard = json.loads((Path(__file__).resolve().parents[1] / "docs" / "grafana-rewind.json").read_text())
    source = inspect.getsource(metrics)
    counters = set(re.findall(r'CounterMetricFamily\(\s*"(rewind_\w+)"', source))
    others = set(re.findall(r'(?:Gauge|Histogram)MetricFamily\(\s*"(rewind_\w+)"', source))
    exported = {f"{c}_total" for c in counters} | others | {f"{h}_bucket" for h in others}
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(rewind_\w+)", target["expr"])
    }
    assert used and used <= exported, used - exported
    assert {"rewind_records_read_total", "rewind_live_group_lag_sum"} <= used


class _Staging:
    def to_dict(self) -> dict[str, Any]:
        return {"table": "pushed.orders"}


def test_a_pushgateway_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    """No broker, no Spark: a run recorded in the ledger, pushed to a port nobody listens on."""
    from rewind.ops.metrics import MetricsPushError, push_run

    settings = load_settings(env={"REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path)
    jf.record_finished_run(
        settings, jf.order_spec("pushed", "t", "pushed.orders"), "pushed.orders", "r-1", _Staging()
    )
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(MetricsPushError) as caught:
        push_run(settings, "r-1", url)
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"--pushgateway {url}: ") and "rewind show r-1" in message

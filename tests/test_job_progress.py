"""`rewind run` as a user watches it: the run id first, progress while the one wave runs, and
/metrics from the start, bound where told. A real broker (the `bootstrap` one: tansu unless
REWIND_TEST_BOOTSTRAP), real Spark in a child process.

The run's single wave is held to about 15 s by `guards.max_records_per_second`, so its lines
and metrics during the wave can be told apart from what the wave's commit brings: before the
commit no unit is done and fewer records than the total are read.

A producer writes to the topic at a known rate (after the window's end) from before the plan to
the run's end: the plan, the lines and the metrics show the run's speed as a multiple of it.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from rewind.config import load_settings
from rewind.job.realtime import recorded_speed
from rewind.job.service import open_ledger
from rewind.ops.metrics import RunCollector
from tests import job_fixtures as jf
from tests.conftest import free_port
from tests.kafka_util import create_topic, writing

RECORDS = 6000
RATE = 400  # records per second: the wave reads for about 15 s
UNIT_RECORDS = 1000  # 2 partitions of 3,000: 6 units, one wave (a wave holds at least 8)
ADDRESS = "127.0.0.2"  # a loopback address other than the default one

LINE = re.compile(
    r"(?P<run>r-\S+): (?P<done>\d+)/(?P<total>\d+) units, (?P<read>[\d,]+) records read, "
    r"(?P<rate>\S+) rec/s, [\d,]+ quarantined, eta (?P<eta>\S+?)"
    r"(?:, (?P<multiple>[\d.,]+)x real-time \(live (?P<live>[\d.,]+) rec/s\))?"
)
LIVE_RATE = 40  # records per second written live while the run reads at RATE: 10x real-time
REPORTED = re.compile(r"^  [\d.,]+x real-time \(live [\d.,]+ rec/s\) over \d+s$", re.MULTILINE)


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://{ADDRESS}:{port}/metrics", timeout=1) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""


def gauges(body: str, run_id: str) -> dict[str, float]:
    label = f'{{run_id="{run_id}"}}'
    return {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("rewind_") and label in line
    }


@pytest.mark.slow
def test_a_run_shows_its_id_then_live_progress_and_metrics_during_its_wave(
    tmp_path: Path, bootstrap: str
) -> None:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(RECORDS, 2, raise_every=1200))
    spec = jf.write_spec(
        tmp_path / "orders.yaml",
        jf.order_spec(
            "orders-live",
            topic,
            "live.orders",
            unit_records=UNIT_RECORDS,
            guards={"max_records_per_second": RATE},
            # the window ends where the produced orders do: the live writer appends after it
            source={"kafka": {"topics": [topic], "to": {topic: {"0": RECORDS // 2, "1": RECORDS // 2}}}},
        ),
    )
    port = free_port()
    writer = writing(settings.kafka_config(), topic, LIVE_RATE)
    writer.__enter__()
    proc = subprocess.Popen(
        [jf.REWIND_BIN, "run", str(spec), "--metrics-port", str(port), "--metrics-address", ADDRESS],
        cwd=tmp_path,
        env=jf.child_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []  # stderr lines with the time they came

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    scrapes: list[str] = []  # every /metrics answer, in order
    refused_on_default = None
    while proc.poll() is None:
        body = scrape(port)
        if body:
            scrapes.append(body)
            if refused_on_default is None:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)
                    refused_on_default = False
                except OSError:
                    refused_on_default = True
        time.sleep(0.25)
    writer.__exit__(None, None, None)
    stdout = proc.stdout.read() if proc.stdout else ""
    reader.join(timeout=10)
    assert proc.returncode == 0, "\n".join(text for _t, text in lines[-30:])
    texts = [text for _t, text in lines]

    # the run id first: the first line printed but the plan's log lines, before Spark's own
    ours = [(t, text) for t, text in lines if text.startswith(("run r-", "r-"))]
    first = re.fullmatch(r"run (r-\S+): 6 units, 6,000 offsets planned", ours[0][1])
    assert first, texts
    assert all(" WARNING rewind." in text for text in texts[: texts.index(ours[0][1])]), texts
    run_id = first.group(1)
    assert stdout.startswith(f"{run_id} succeeded: read 6,000"), stdout

    # progress lines while the wave ran: no unit done yet, records growing, below the total
    progress = [(t, LINE.fullmatch(text)) for t, text in ours[1:]]
    assert all(m is not None and m["run"] == run_id for _t, m in progress), texts
    during = [(t, int(m["read"].replace(",", ""))) for t, m in progress if m and m["done"] == "0"]
    reading = [(t, n) for t, n in during if 0 < n < RECORDS]
    assert len(reading) >= 2, texts
    counts = [n for _t, n in reading]
    assert counts == sorted(counts) and counts[0] < counts[-1], texts
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(during)]
    assert max(gaps) < 6.0, gaps  # a line at least every 5 s (plus scheduling slack)
    committed = [m for _t, m in progress if m and m["done"] == "6"]
    assert committed and committed[-1]["read"] == "6,000", texts
    # the wave lasted over 10 s: its first line came more than 10 s before the commit's
    commit_at = next(t for t, m in progress if m and m["done"] == "6")
    assert commit_at - during[0][0] > 10.0, (during, commit_at)

    # /metrics answered from the start (before the run was known), bound where told only
    assert refused_on_default is True
    known = [gauges(body, run_id) for body in scrapes if gauges(body, run_id)]
    assert known[0]["rewind_units_done"] == 0 and known[0]["rewind_records_read"] == 0, known[0]
    assert known[0]["rewind_offsets_to_planned_end"] == RECORDS
    live = [g for g in known if g["rewind_units_done"] == 0 and 0 < g["rewind_records_read"] < RECORDS]
    assert len(live) >= 2, known  # updated while the wave ran, before it committed
    for g in live:
        assert g["rewind_offsets_to_planned_end"] == RECORDS - g["rewind_records_read"]
    assert live[-1]["rewind_records_read"] > live[0]["rewind_records_read"]
    assert 0 < live[-1]["rewind_records_per_second"] <= RATE * 1.5, live[-1]

    # the speed against the live stream: the live rate is the writer's, the multiple the run's
    # rate over it (the RateMeter's 20 s window and Spark's start make the early ones lower)
    speeds = [(m, m["multiple"]) for _t, m in progress if m and m["multiple"]]
    assert len(speeds) >= 2, texts
    for m, _multiple in speeds:
        assert LIVE_RATE * 0.6 <= float(m["live"].replace(",", "")) <= LIVE_RATE * 1.4, m.string
        assert float(m["multiple"].replace(",", "")) == pytest.approx(
            float(m["rate"].replace(",", "")) / float(m["live"].replace(",", "")), rel=0.1
        ), m.string
    assert 5 <= float(speeds[-1][1].replace(",", "")) <= 15, speeds[-1][0].string
    measured = [g for g in live if "rewind_realtime_multiple" in g]
    assert measured, live
    assert LIVE_RATE * 0.6 <= measured[-1]["rewind_live_records_per_second"] <= LIVE_RATE * 1.4, measured[-1]
    assert measured[-1]["rewind_realtime_multiple"] == pytest.approx(
        measured[-1]["rewind_records_per_second"] / measured[-1]["rewind_live_records_per_second"]
    )

    # the report's speed is the whole run's, measured over it: the records it read over the
    # seconds from its start to its end (Spark's start-up included), against the writer's rate;
    # the ledger keeps it, and the run's metrics (what --pushgateway pushes) carry it
    report = REPORTED.search(stdout)
    assert report, stdout
    with open_ledger(settings) as ledger:
        speed = recorded_speed(ledger, run_id)
    assert speed is not None and speed["summary"] == report.group(0).strip(), (speed, stdout)
    assert LIVE_RATE * 0.6 <= speed["live_records_per_second"] <= LIVE_RATE * 1.4, speed
    assert speed["records_per_second"] == pytest.approx(RECORDS / speed["over_s"], rel=0.01), speed
    assert speed["multiple"] == pytest.approx(
        speed["records_per_second"] / speed["live_records_per_second"], rel=0.01
    )
    assert speed["records_per_second"] < RATE  # the guard held the reading, and the start adds seconds
    collector = RunCollector(settings, run_id)
    try:
        families = {f.name: f for f in collector.collect()}
    finally:
        collector.close()
    assert [s.value for s in families["rewind_run_realtime_multiple"].samples] == [speed["multiple"]]
    assert [s.value for s in families["rewind_run_live_records_per_second"].samples] == [
        speed["live_records_per_second"]
    ]

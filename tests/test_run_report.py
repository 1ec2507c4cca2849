"""`rewind report RUN` on tansu: a run started by `rewind run SPEC` with a live group, verified,
then its one-page report: the data (--json) equal to the ledger's, and what Chromium draws of
the page (both charts' colours on screen), as the verify report's rendering test does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rewind.config import load_settings
from rewind.ops.run_report import LAG_COLOUR
from rewind.verify.report_svg import COLOURS
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.test_verify_report import CHROMIUM, rgb, screenshot


def test_report_of_a_run(
    tmp_path: Path, bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from rewind.cli import app
    from rewind.verify.service import verify_run

    monkeypatch.setenv("REWIND_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("REWIND_STATE_DIR", str(tmp_path / "state"))
    settings = load_settings()
    conf = settings.kafka_config()
    create_topic(conf, topic_name, 2)
    jf.produce_orders(conf, topic_name, jf.order_events(600, 2))
    group = f"live-{topic_name}"
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    consumer.commit(
        offsets=[TopicPartition(topic_name, 0, 290), TopicPartition(topic_name, 1, 300)], asynchronous=False
    )
    consumer.close()
    spec = jf.write_spec(
        tmp_path / "spec.yaml",
        jf.order_spec("reported", topic_name, "report.orders", unit_records=50, key=[], live_groups=[group]),
    )
    runner = CliRunner()
    ran = runner.invoke(app, ["run", str(spec), "--json"])
    assert ran.exit_code == 0, ran.output
    run_id = json.loads(ran.stdout)["run_id"]
    assert verify_run(settings, run_id)["passed"]

    page = tmp_path / "report.html"
    made = runner.invoke(app, ["report", run_id, "--out", str(page), "--json"])
    assert made.exit_code == 0, made.output
    data: dict[str, Any] = json.loads(made.stdout)
    assert data["report"] == str(page) and page.exists()
    assert sum(p["records"] for p in data["progress"]) == 600 == data["run"]["records_read"]
    assert len(data["progress"]) == 12  # every unit of 50, with its commit time
    samples = data["live_lag"][group]
    assert samples and all(s["lag"] == 10 for s in samples)  # 300 - 290 on partition 0, 0 on 1
    assert data["readiness"]["areas"][0]["area"] == "offset-control"
    assert data["verification"]["passed"] is True
    actions = [h["action"] for h in data["audit"]]
    assert "run-succeeded" in actions and "verify" in actions
    html = page.read_text()
    for heading in (
        "Plan",
        "Readiness",
        "Progress over time",
        "Quarantine by reason",
        "Verification",
        "Audit trail",
    ):
        assert f"<h2>{heading}</h2>" in html
    assert "<script" not in html and "http" not in html.split("<main>")[1]  # self-contained

    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (make install adds it when run as root): the page was not drawn")
    pixels = screenshot(page, tmp_path / "report.png", tmp_path / "profile")
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
    colours = {tuple(int(v) for v in p) for p in pixels.reshape(-1, 3)}
    assert len(colours) > 50
    white = np.all(pixels > 240, axis=2).mean()
    assert 0.2 < white < 0.98, f"{white:.0%} of the page is blank"
    assert rgb(COLOURS["staging"]) in colours  # the records/s chart
    assert rgb(LAG_COLOUR) in colours  # the live lag chart (and the state badge's red is not used: it passed)

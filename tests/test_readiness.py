"""`rewind readiness` and the gate of `rewind run`, on tansu, with real evidence.

One story (Spark runs twice for rehearsals, once for the accepted run): a fresh spec is yellow
but for governance; `rewind doctor`'s probe and a passed rehearsal turn offset control, storage,
rollback and compatibility green; a spec whose rehearsal fails its verification (order_lines
keyed by order id writes 'double' orders twice) is red on the storage path, `rewind run`
refuses it in one line with nothing run, and runs it with `--accept-risk "reason"`, recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rewind.config import load_settings
from tests import job_fixtures as jf
from tests.kafka_util import create_topic


def _status(card: dict[str, object]) -> dict[str, str]:
    return {a["area"]: a["status"] for a in card["areas"]}  # type: ignore[attr-defined, index]


def test_readiness_scores_on_evidence_and_gates_rewind_run(
    tmp_path: Path, bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.cli import app
    from rewind.doctor import run_doctor
    from rewind.job.service import list_runs, open_ledger
    from rewind.ops.readiness import readiness, record_doctor
    from rewind.ops.rehearse import rehearse
    from rewind.spec import parse_spec

    # not chdir: Spark's Python workers import the translate (tests.job_fixtures) from here
    monkeypatch.setenv("REWIND_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("REWIND_STATE_DIR", str(tmp_path / "state"))
    settings = load_settings()
    create_topic(settings.kafka_config(), topic_name, 2)
    jf.produce_orders(settings.kafka_config(), topic_name, jf.order_events(400, 2))
    good = jf.order_spec("ready", topic_name, "ready.orders", unit_records=100, key=[])
    bad = jf.order_spec("unready", topic_name, "ready.dupes", unit_records=100)

    fresh = readiness(settings, parse_spec(good))
    assert _status(fresh) == {
        "offset-control": "yellow",
        "storage-path": "yellow",
        "cost-boundary": "yellow",
        "rollback": "yellow",
        "observability": "yellow",
        "compatibility": "yellow",
        "governance": "green",
    }
    assert fresh["ready"]

    # readiness takes the probe's verdict (ok), not the join's latency: a group join on tansu
    # takes ~20 s, whose outcome (supported or missing) leaves the verdict as it is
    report = run_doctor(settings, with_spark=False, join_timeout_s=1)
    assert report["ok"], report["failure"]
    probe = record_doctor(settings, report)
    passed = rehearse(settings, parse_spec(good), fraction=0.1)
    assert passed["passed"], passed["steps"]
    card = readiness(settings, parse_spec(good))
    status = _status(card)
    evidence = {a["area"]: a["evidence"] for a in card["areas"]}
    green = {"offset-control", "storage-path", "rollback", "compatibility", "governance"}
    assert {a for a, s in status.items() if s == "green"} == green
    assert f"rehearsal {passed['rehearsal_id']}" in evidence["rollback"]
    assert f"doctor probe {probe}" in evidence["offset-control"]
    assert status["cost-boundary"] == "yellow"  # measured, but no guard bounds the run
    # a guard makes a new fingerprint, whose rates nobody measured: still yellow until rehearsed
    guarded = parse_spec({**good, "guards": {"max_records": 1000}})
    assert _status(readiness(settings, guarded))["cost-boundary"] == "yellow"

    failed = rehearse(settings, parse_spec(bad), fraction=0.25)
    assert not failed["passed"] and not failed["steps"]["verify"]["ok"]
    assert failed["steps"]["cleanup"]["ok"]  # a failed rehearsal still cleans up
    red = readiness(settings, parse_spec(bad))
    assert _status(red)["storage-path"] == "red" and not red["ready"]

    spec_path = jf.write_spec(tmp_path / "unready.yaml", bad)
    runner = CliRunner()
    runs_before = list_runs(settings, 100)
    refused = runner.invoke(app, ["run", str(spec_path)])
    assert refused.exit_code == 1
    # the plan's sample logs the translate's unlucky record as a warning, into the log file:
    # the refusal is one line
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert len(lines) == 1, refused.output
    assert "storage-path" in lines[0] and "failed at verify" in lines[0] and "--accept-risk" in lines[0]
    assert list_runs(settings, 100) == runs_before  # nothing ran
    blank = runner.invoke(app, ["run", str(spec_path), "--accept-risk", " "])
    assert blank.exit_code == 1 and "needs a reason" in blank.output
    scored = runner.invoke(app, ["readiness", str(spec_path), "--json"])
    assert scored.exit_code == 1 and json.loads(scored.stdout)["ready"] is False

    accepted = runner.invoke(
        app, ["run", str(spec_path), "--json", "--accept-risk", "duplicates are expected here"]
    )
    assert accepted.exit_code == 0, accepted.output
    run_id = json.loads(accepted.stdout)["run_id"]
    assert json.loads(accepted.stdout)["state"] == "succeeded"
    with open_ledger(settings) as ledger:
        risks = [e for e in ledger.audit_log() if e.action == "accept-risk"]
    assert len(risks) == 1 and risks[0].run_id == run_id
    assert risks[0].details["reason"] == "duplicates are expected here"
    assert risks[0].details["red"] == ["storage-path"]

    # the reason is shown with the run, as in its report
    shown = runner.invoke(app, ["show", run_id, "--json"])
    assert shown.exit_code == 0, shown.output
    risk = json.loads(shown.stdout)["accepted_risk"]
    assert risk["reason"] == "duplicates are expected here" and risk["red"] == ["storage-path"]
    assert risk["user"] == risks[0].user
    human = runner.invoke(app, ["show", run_id])
    assert "risk accepted by" in human.output and "duplicates are expected here" in human.output
    report = runner.invoke(app, ["report", run_id, "--json", "--out", str(tmp_path / "r.html")])
    assert json.loads(report.stdout)["accepted_risk"]["reason"] == "duplicates are expected here"


def test_observability_is_green_only_with_metrics_and_measured_live_lag(
    tmp_path: Path, bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lag probes of live groups (what a rehearsal records after its slice); a group that does
    not exist is recorded as not found and keeps observability yellow, saying so."""
    from confluent_kafka import Consumer, TopicPartition

    from rewind.ops.readiness import readiness
    from rewind.ops.rehearse import _sample_live_lag
    from rewind.spec import parse_spec

    monkeypatch.setenv("REWIND_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("REWIND_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("REWIND_METRICS_PORT", "9464")
    settings = load_settings()
    conf = settings.kafka_config()
    create_topic(conf, topic_name, 2)
    jf.produce_orders(conf, topic_name, jf.order_events(100, 2))
    group = f"live-{topic_name}"
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    consumer.commit(
        offsets=[TopicPartition(topic_name, 0, 40), TopicPartition(topic_name, 1, 50)], asynchronous=False
    )
    consumer.close()

    spec = parse_spec(jf.order_spec("watched", topic_name, "obs.orders", key=[], live_groups=[group]))
    before = {a["area"]: a for a in readiness(settings, spec)["areas"]}["observability"]
    assert before["status"] == "yellow" and f"lag of {group} not measured" in before["detail"]
    assert _sample_live_lag(settings, spec) == {group: {"lag": 10, "partitions": 2, "note": ""}}
    after = {a["area"]: a for a in readiness(settings, spec)["areas"]}["observability"]
    assert after["status"] == "green" and after["evidence"].startswith("lag probes ")

    ghost = parse_spec(
        jf.order_spec("watched", topic_name, "obs.orders", key=[], live_groups=["no-such-group"])
    )
    assert _sample_live_lag(settings, ghost)["no-such-group"]["lag"] is None
    scored = {a["area"]: a for a in readiness(settings, ghost)["areas"]}["observability"]
    assert scored["status"] == "yellow" and "no-such-group not found" in scored["detail"]

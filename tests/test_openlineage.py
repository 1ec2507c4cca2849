"""OpenLineage run events (docs/lineage.md): a small job planned, run, verified, promoted and
rolled back on the embedded broker with the client's file transport configured the standard
way (``OPENLINEAGE__TRANSPORT__*``); every event loads back through the client's own classes.
Also: the Kafka transport writes to a topic of the broker, a failed run sends FAIL with its one
line, nothing is sent when nothing is configured, and no secret reaches an event.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.openlineage import configured, get_emitter, track
from rewind.openlineage.datasets import iceberg_namespace, kafka, sql
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.openlineage_events import file_transport_env, load_event, read_events

PARTITIONS = 2
RECORDS = 600
UNIT_RECORDS = 150  # 4 units, 2 per wave: two RUNNING events


@dataclass
class Lineage:
    settings: Settings
    topic: str
    run_id: str
    events: list[dict[str, Any]]


def _settings(tmp: Path, bootstrap: str) -> Settings:
    return load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )


@pytest.fixture(scope="module")
def lineage(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> Iterator[Lineage]:
    from rewind.job.publish import promote_run, rollback_run
    from rewind.job.service import plan_job, run_job
    from rewind.verify.service import verify_run

    tmp = tmp_path_factory.mktemp("openlineage")
    settings = _settings(tmp, bootstrap)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, PARTITIONS)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(RECORDS, PARTITIONS))
    spec = parse_spec(jf.order_spec("ol-orders", topic, "ol.orders", unit_records=UNIT_RECORDS, version="2"))
    events = tmp / "events.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in file_transport_env(events).items():
            mp.setenv(key, value)
        plan_job(settings, spec)
        outcome = run_job(settings, spec, units_per_wave=2)
        verify_run(settings, outcome.run_id, tmp / "verify.json")
        promote_run(settings, outcome.run_id, force=True, reason="lineage test")
        rollback_run(settings, outcome.run_id)
        yield Lineage(settings, topic, outcome.run_id, read_events(events))


def by_job(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        out[e["job"]["name"]].append(e)
    return out


def test_every_event_loads_back_through_the_clients_classes(lineage: Lineage) -> None:
    assert lineage.events
    for data in lineage.events:
        event = load_event(data)
        assert event.job.namespace == "rewind"
        assert data["producer"].startswith("https://")


def test_each_command_is_one_run_with_one_start_and_one_end(lineage: Lineage) -> None:
    jobs = by_job(lineage.events)
    assert set(jobs) >= {f"ol-orders.{c}" for c in ("plan", "run", "verify", "promote", "rollback")}
    for name, events in jobs.items():
        runs: dict[str, list[str]] = defaultdict(list)
        for e in events:
            runs[e["run"]["runId"]].append(e["eventType"])
        for kinds in runs.values():
            assert kinds[0] == "START" and kinds[-1] == "COMPLETE", (name, kinds)
            assert Counter(kinds)["START"] == 1 and Counter(kinds)["COMPLETE"] == 1
    plans = {e["run"]["runId"] for e in jobs["ol-orders.plan"]}
    assert len(plans) == 2  # `rewind plan`, then the plan of `rewind run SPEC`
    run_kinds = [e["eventType"] for e in jobs["ol-orders.run"]]
    assert run_kinds == ["START", "RUNNING", "RUNNING", "COMPLETE"]


def test_the_run_names_its_datasets_and_carries_counts_plan_and_transform(lineage: Lineage) -> None:
    complete = next(
        e for e in lineage.events if e["job"]["name"] == "ol-orders.run" and e["eventType"] == "COMPLETE"
    )
    bootstrap = lineage.settings.bootstrap_servers.split(",")[0]
    (source,) = complete["inputs"]
    assert (source["namespace"], source["name"]) == (f"kafka://{bootstrap}", lineage.topic)
    assert source["inputFacets"]["inputStatistics"]["rowCount"] == RECORDS
    assert source["inputFacets"]["inputStatistics"]["size"] > 0
    warehouse = iceberg_namespace(lineage.settings.catalog_properties())
    outputs = {o["name"]: o for o in complete["outputs"]}
    assert all(o["namespace"] == warehouse for o in outputs.values())
    target = outputs["ol.orders"]["outputFacets"]
    counts = target["rewind_counts"]
    assert counts["recordsRead"] == RECORDS
    assert counts["recordsRead"] == counts["emitted"] + counts["quarantined"] + counts["filtered"]
    assert target["outputStatistics"]["rowCount"] == counts["rowsOut"] > 0
    assert sum(counts["quarantineReasons"].values()) == counts["quarantined"] > 0
    quarantine = next(o for name, o in outputs.items() if name != "ol.orders")
    assert quarantine["outputFacets"]["outputStatistics"]["rowCount"] == counts["quarantined"]
    run = complete["run"]["facets"]["rewind_run"]
    assert run["rewindRunId"] == lineage.run_id and run["state"] == "succeeded"
    assert len(run["specFingerprint"]) == 64 and run["planId"]
    transform = complete["job"]["facets"]["rewind_transform"]
    assert (transform["name"], transform["version"]) == ("order_lines", "2")
    assert complete["job"]["facets"]["jobType"]["jobType"] == "RUN"
    running = [
        e for e in lineage.events if e["job"]["name"] == "ol-orders.run" and e["eventType"] == "RUNNING"
    ]
    read_so_far = [e["outputs"][0]["outputFacets"]["rewind_counts"]["recordsRead"] for e in running]
    assert read_so_far == sorted(read_so_far) and read_so_far[-1] == RECORDS


def test_verify_sends_its_checks_as_data_quality_assertions(lineage: Lineage) -> None:
    done = next(
        e for e in lineage.events if e["job"]["name"] == "ol-orders.verify" and e["eventType"] == "COMPLETE"
    )
    (staging,) = done["inputs"]
    assert staging["name"] == "ol.orders"
    checks = staging["inputFacets"]["dataQualityAssertions"]["assertions"]
    names = {c["assertion"] for c in checks}
    assert {"no-missing-records", "no-extra-records", "no-duplicates-records"} <= names
    assert all(isinstance(c["success"], bool) for c in checks)
    assert done["run"]["facets"]["rewind_run"]["rewindRunId"] == lineage.run_id


def test_promote_and_rollback_read_the_staging_and_write_the_target(lineage: Lineage) -> None:
    for command in ("promote", "rollback"):
        done = next(
            e
            for e in lineage.events
            if e["job"]["name"] == f"ol-orders.{command}" and e["eventType"] == "COMPLETE"
        )
        assert [d["name"] for d in done["inputs"]] == [d["name"] for d in done["outputs"]] == ["ol.orders"]
        assert done["run"]["facets"]["rewind_run"]["details"]["swap"]


def test_a_failed_run_sends_fail_with_its_one_line(
    tmp_path: Path, bootstrap: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's sample passes; a later unit breaks the translate's contract: RUNNING for the
    committed wave, then FAIL whose errorMessage is the line the ledger keeps."""
    from rewind.job.service import run_job, show_run
    from rewind.spark.job_stage import StageError

    settings = _settings(tmp_path, bootstrap)
    topic = f"late-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 1)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(1200, 1))  # ids 1000..2199
    spec = parse_spec(
        jf.order_spec(
            "ol-late",
            topic,
            "ol.late",
            unit_records=400,
            translate={
                "function": "tests.job_fixtures:breaks_contract_late",
                "version": "1",
                "output_schema": {"order_id": "long", "amount": "double"},
            },
        )
    )
    path = tmp_path / "events.jsonl"
    for key, value in file_transport_env(path).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StageError) as caught:
        run_job(settings, spec, units_per_wave=1)
    events = [e for e in read_events(path) if e["job"]["name"] == "ol-late.run"]
    for e in events:
        load_event(e)
    assert [e["eventType"] for e in events] == ["START", "RUNNING", "RUNNING", "FAIL"]
    error = events[-1]["run"]["facets"]["errorMessage"]
    assert error["message"] == f"StageError: {caught.value}"
    assert "\n" not in error["message"] and error["programmingLanguage"] == "python"
    run_id = events[-1]["run"]["facets"]["rewind_run"]["rewindRunId"]
    assert show_run(settings, run_id)["error"] == error["message"]
    assert events[-1]["run"]["facets"]["rewind_run"]["state"] == "failed"


def test_the_kafka_transport_writes_the_events_to_a_topic(
    tmp_path: Path, bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from rewind.job.service import plan_job

    settings = _settings(tmp_path, bootstrap)
    source = f"src-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), source, 1)
    jf.produce_orders(settings.kafka_config(), source, jf.order_events(50, 1))
    lineage_topic = f"openlineage-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), lineage_topic, 1)
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "kafka")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TOPIC", lineage_topic)
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__CONFIG", json.dumps({"bootstrap.servers": bootstrap}))
    plan = plan_job(settings, parse_spec(jf.order_spec("ol-kafka", source, "ol.kafka")))
    getattr(get_emitter(), "close", lambda: None)()  # flushes; the broker outlives no producer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}"})
    try:
        consumer.assign([TopicPartition(lineage_topic, 0, 0)])
        messages = []
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                messages.append(msg)
            if len(messages) == 2:
                break
    finally:
        consumer.close()
    events = [json.loads(m.value()) for m in messages]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    assert {m.key() for m in messages} == {b"run:rewind/ol-kafka.plan"}
    for e in events:
        load_event(e)
    assert events[1]["run"]["facets"]["rewind_run"]["planId"] == plan.plan_id
    assert events[0]["inputs"][0]["namespace"] == f"kafka://{bootstrap.split(',')[0]}"


def test_nothing_is_sent_unless_a_transport_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("OPENLINEAGE"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not configured()
    assert get_emitter().enabled is False
    with track(None, "x.plan", "plan") as run:  # builds nothing, sends nothing
        assert not run.enabled
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "openlineage.yml").write_text("facets:\n  environment_variables: [HOME]\n")
    assert not configured()  # a file without a transport: still off (never the console fallback)
    (tmp_path / "openlineage.yml").write_text(f"transport:\n  type: file\n  log_file_path: {tmp_path}/ev\n")
    assert configured()
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert not configured()
    monkeypatch.delenv("OPENLINEAGE_DISABLED")
    (tmp_path / "openlineage.yml").unlink()
    monkeypatch.setenv("OPENLINEAGE_URL", "http://127.0.0.1:1")
    assert configured()


def test_no_secret_reaches_an_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    password = "s3cr3t-pw-9"
    url = f"postgresql+psycopg://rewind:{password}@db.example:6543/shop"
    settings = load_settings(env={"REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path)
    spec = parse_spec(
        {
            **jf.order_spec("ol-secret", "orders", "ol.secret"),
            "sink": {"postgres": {"table": "read.totals", "url": url}},
        }
    )
    path = tmp_path / "events.jsonl"
    for key, value in file_transport_env(path).items():
        monkeypatch.setenv(key, value)
    with (
        pytest.raises(RuntimeError),
        track(settings, "ol-secret.run", "run", spec=spec, staging={"url": url}),
    ):
        raise RuntimeError(f"could not reach {url}\nsecond line")
    text = path.read_text()
    assert password not in text
    events = read_events(path)
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    for e in events:
        load_event(e)
    (target,) = events[0]["outputs"]
    assert (target["namespace"], target["name"]) == ("postgres://db.example:6543", "shop.read.totals")
    assert events[1]["run"]["facets"]["errorMessage"]["message"] == (
        "RuntimeError: could not reach postgresql+psycopg://rewind:***@db.example:6543/shop"
    )


def test_dataset_names_follow_the_naming_rules() -> None:
    assert kafka("SASL_SSL://b1.example:9093,b2.example:9093", "orders").key == (
        "kafka://b1.example:9093",
        "orders",
    )
    assert sql("postgresql://u:pw@pg:5432/app", "accounts").key == (
        "postgres://pg:5432",
        "app.public.accounts",
    )
    assert sql("postgresql://pg/app", "s.accounts").key == ("postgres://pg:5432", "app.s.accounts")
    assert sql("sqlite:////tmp/x.db", "t").key == ("sqlite:///tmp/x.db", "t")
    assert iceberg_namespace({"warehouse": "s3://lake/wh/", "uri": "sqlite:///c.db"}) == "s3://lake/wh"
    rest = {"uri": "https://user:pw@catalog.example:8181/api", "warehouse": "prod"}
    assert iceberg_namespace(rest) == "https://catalog.example:8181/api/prod"


def test_the_custom_facets_schemas_are_in_the_docs() -> None:
    from rewind.openlineage import facets

    schema = json.loads((jf.REPO / "docs/openlineage-facets.json").read_text())
    for cls in (*facets.CUSTOM_FACETS.values(), facets.RewindCountsInputDatasetFacet):
        url = cls._get_schema()
        assert url.startswith(facets.FACETS_SCHEMA + "#/$defs/")
        assert url.rsplit("/", 1)[-1] in schema["$defs"]

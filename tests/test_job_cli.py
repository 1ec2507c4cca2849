"""The job commands as a user runs them: ``rewind plan|run|resume|show|runs``.

The run that moves data is a child process, as a user starts it: it starts Spark and serves
Prometheus metrics, scraped once its first wave committed, for as long as it lives. The
other commands (plans, refusals, what a run shows) run in the test's own process through the
same CLI (tests/cli_in_process.py). Progress while a wave runs is in tests/test_job_progress.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from tests import cli_in_process
from tests import job_fixtures as jf
from tests.conftest import free_port
from tests.kafka_util import create_topic

REWIND = jf.REWIND_BIN
PARTITIONS = 2
RECORDS = 2400
UNIT_RECORDS = 200  # 12 units: `rewind run` does 8 per wave, so two waves


@dataclass
class Cli:
    tmp: Path
    settings: Settings
    topic: str
    orders: list[jf.Order]
    spec: Path

    def env(self) -> dict[str, str]:
        return jf.child_env(self.settings)

    def rewind(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``rewind ARGS`` in this process, with ``env`` on top of :meth:`env`."""
        return cli_in_process.rewind(list(args), cwd=self.tmp, env={**self.env(), **env})

    def spec_file(self, name: str, **changes: Any) -> Path:
        data = jf.order_spec(
            "orders-cli",
            self.topic,
            "cli.orders",
            unit_records=UNIT_RECORDS,
            guards={"max_records_per_second": 800},
        )
        for key, value in changes.items():
            data[key] = value
        return jf.write_spec(self.tmp / name, data)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> Cli:
    """The topic and spec of the module; ``spark``: a refused ``rewind run`` in this process
    takes the tests' session, which it starts early (before its checks), as a child does."""
    tmp = tmp_path_factory.mktemp("job-cli")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, PARTITIONS)
    orders = jf.order_events(RECORDS, PARTITIONS, raise_every=1200)
    jf.produce_orders(settings.kafka_config(), topic, orders)
    c = Cli(tmp, settings, topic, orders, tmp / "orders.yaml")
    c.spec = c.spec_file("orders.yaml")
    return c


def one_json(proc: subprocess.CompletedProcess[str]) -> Any:
    """stdout is exactly one JSON object."""
    text = proc.stdout.strip()
    assert text.startswith("{") and text.endswith("}"), proc.stdout
    return json.loads(text)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [
        line
        for line in proc.stderr.splitlines()
        if not line.startswith("WARNING: Using incubator")  # the JVM's, when Spark starts
    ]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines
    return lines[0]


def test_plan_prints_one_json_object_with_ranges_and_gates(cli: Cli) -> None:
    proc = cli.rewind("plan", str(cli.spec), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr
    plan = one_json(proc)
    assert plan["ok"] is True and plan["name"] == "orders-cli"
    assert plan["offsets"] == RECORDS and plan["units"] == RECORDS // UNIT_RECORDS
    assert set(plan["partitions"]) == {f"{cli.topic}/{p}" for p in range(PARTITIONS)}
    for part in plan["partitions"].values():
        assert (part["start"], part["end"], part["offsets"]) == (
            0,
            RECORDS // PARTITIONS,
            RECORDS // PARTITIONS,
        )
        assert not part["missing_below_low"]
    gates = {g["name"]: g for g in plan["gates"]}
    assert {"log-start", "max-records", "translate", "output-schema", "key", "sink"} <= set(gates)
    assert all(g["ok"] for g in gates.values())
    # the sample is one second of the 800 rec/s guard over the first unit of each partition
    assert plan["estimates"]["sample_records"] == PARTITIONS * min(UNIT_RECORDS, 800 // PARTITIONS)
    assert ["order_id", "int64"] in plan["output_columns"]
    assert ["_rewind_event_id", "string"] in plan["output_columns"]
    # planning runs nothing
    assert one_json(cli.rewind("runs", "--json")) == {"runs": []}


def test_plan_with_an_unimportable_translate_exits_1_with_one_line(cli: Cli) -> None:
    spec = cli.spec_file(
        "broken.yaml",
        translate={"function": "tests.nowhere:order_lines", "version": "1", "output_schema": jf.ORDER_SCHEMA},
    )
    proc = cli.rewind("plan", str(spec))
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "refused by gate translate" in line and "module tests.nowhere not found" in line
    with_json = cli.rewind("plan", str(spec), "--json")
    assert with_json.returncode == 1
    plan = one_json(with_json)  # the plan is the one JSON object; the error goes to stderr
    assert plan["ok"] is False
    assert next(g["name"] for g in plan["gates"] if not g["ok"]) == "translate"
    one_error_line(with_json)
    refused = cli.rewind("run", str(spec), "--json")
    assert refused.returncode == 1
    assert "refused by gate translate" in one_json(refused)["error"]


def test_a_translate_raising_on_every_sampled_record_is_named(cli: Cli) -> None:
    """No output schema declared and the function fails on every record: the refusal says the
    translate raised, with its first error and that record's coordinates, and names
    translate.output_schema (it said "the output schema is unknown")."""
    broken = {"function": "tests.job_fixtures:always_raises", "version": "1"}
    spec = cli.spec_file("raises.yaml", translate=broken)
    proc = cli.rewind("plan", str(spec))
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "refused by gate output-schema" in line
    assert "the translate raised on every sampled record" in line
    assert f"first, at {cli.topic}/" in line and " offset " in line and "KeyError" in line
    assert "amount_cents" in line and "translate.output_schema" in line
    # the sample's warning (the translate raised on the records it was given) is in the log
    # file, which the line names; --debug shows them on stderr as well
    log_file = cli.settings.state_path / "rewind.log"
    assert re.search(rf"\(\d+ warnings? in {re.escape(str(log_file))}\)$", line), line
    logged = [x for x in log_file.read_text().splitlines() if " WARNING rewind." in x]
    assert any("always_raises raised on" in x for x in logged), logged
    debug = cli.rewind("--debug", "plan", str(spec))
    assert debug.returncode == 1
    assert "always_raises raised on" in debug.stderr and "the translate raised on every" in debug.stderr


def test_a_window_ending_before_it_starts_exits_1_before_anything_runs(cli: Cli) -> None:
    source = {"kafka": {"topics": [cli.topic], "from": "2026-10-08T00:00:00Z", "to": "2026-10-01T00:00:00Z"}}
    spec = cli.spec_file("backwards.yaml", source=source)
    for command in ("plan", "run"):
        proc = cli.rewind(command, str(spec))
        assert proc.returncode == 1, proc.stderr
        line = one_error_line(proc)
        assert f"{spec}: source.kafka.to" in line and "before from" in line
        assert proc.stdout == ""


@pytest.mark.slow
def test_run_show_runs_resume_and_metrics(cli: Cli) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [REWIND, "run", str(cli.spec), "--json", "--metrics-port", str(port)],
        cwd=cli.tmp,
        env=cli.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    scraped = ""
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                body = resp.read().decode()
        except OSError:
            body = ""
        if re.search(r"^rewind_units_done\{.*\} ([1-9]\d*)\.0$", body, re.M):  # a wave committed
            scraped = body
            break
        time.sleep(0.1)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    out = json.loads(stdout)

    seen = Counter(o.fate for o in cli.orders)
    assert out["state"] == "succeeded" and out["run_id"].startswith("r-")
    assert out["records_read"] == RECORDS
    assert out["rows_out"] == seen["row"] + 2 * seen["double"]
    assert out["filtered"] == seen["filtered"]
    assert out["quarantined"] == RECORDS - seen["row"] - seen["double"] - seen["filtered"]
    assert out["emitted"] + out["quarantined"] + out["filtered"] == RECORDS
    assert out["units"] == 12 and out["waves"] == 2
    assert out["staging"]["table"] == f"cli.orders__rewind_{out['run_id'].replace('-', '_')}"
    assert out["staging"]["target"] == "iceberg:cli.orders"
    assert out["quarantine_table"] == "cli.rewind_quarantine"
    rows = jf.staging_table(cli.settings, out["staging"])
    assert rows.num_rows == out["rows_out"]

    # metrics while the run was going (the server lives and dies with the process): scraped
    # once the first wave's 8 units committed (or, at the latest, all 12); records read also
    # count what the second wave's tasks have read so far
    run_label = f'run_id="{out["run_id"]}"'
    metrics = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in scraped.splitlines()
        if line.startswith("rewind_") and run_label in line
    }
    assert metrics["rewind_units_done"] in (8, 12), scraped
    units_done = int(metrics["rewind_units_done"])
    assert units_done * UNIT_RECORDS <= metrics["rewind_records_read"] <= RECORDS, scraped
    assert metrics["rewind_offsets_to_planned_end"] == RECORDS - metrics["rewind_records_read"]
    assert {"rewind_rows_written", "rewind_records_quarantined", "rewind_records_filtered"} <= set(metrics)

    shown_proc = cli.rewind("show", out["run_id"], "--json")
    assert shown_proc.returncode == 0
    shown = one_json(shown_proc)
    for key in ("state", "records_read", "emitted", "rows_out", "quarantined", "filtered", "staging"):
        assert shown[key] == out[key], key
    assert shown["units_by_state"] == {"done": 12} and len(shown["units"]) == 12

    runs = one_json(cli.rewind("runs", "--json"))["runs"]
    assert [(r["run_id"], r["state"], r["name"]) for r in runs] == [
        (out["run_id"], "succeeded", "orders-cli")
    ]

    again = cli.rewind("resume", out["run_id"], "--json")
    assert again.returncode == 1
    assert one_json(again)["error"] == f"run {out['run_id']} is succeeded; there is nothing to resume"
    missing = cli.rewind("show", "r-nope", "--json")
    assert missing.returncode == 1
    assert "r-nope" in one_json(missing)["error"]
    assert "r-nope" in one_error_line(missing)


def test_show_and_runs_read_as_text_on_a_narrow_terminal(cli: Cli) -> None:
    """For people: staging as fields (no Python dict, no encoded schema), the state, and the
    run id whole even at 60 columns (users copy it into the next command)."""
    run = next(r for r in one_json(cli.rewind("runs", "--json"))["runs"] if r["state"] == "succeeded")
    listed = cli.rewind("runs", COLUMNS="60")
    assert listed.returncode == 0, listed.stderr
    assert any(run["run_id"] in line for line in listed.stdout.splitlines()), listed.stdout
    shown = cli.rewind("show", run["run_id"], COLUMNS="60")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # soft-wrapped lines joined
    assert f"{run['run_id']} (orders-cli) succeeded" in text
    assert "staging (present): kind iceberg; target iceberg:cli.orders; table cli.orders__rewind_" in text
    assert "{'" not in shown.stdout and "12 units done" in text


def test_a_stored_plan_run_against_a_dead_broker_fails_fast_and_creates_nothing(cli: Cli) -> None:
    """`rewind run PLAN` checks the broker (~10 s at most) before it records a run, takes a
    lease or prepares staging, and says it in the one line `rewind plan` gives."""
    plan_id = one_json(cli.rewind("plan", str(cli.spec), "--json"))["plan_id"]
    runs_before = one_json(cli.rewind("runs", "--json"))["runs"]
    dead = f"127.0.0.1:{free_port()}"

    def rewind_dead(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        began = time.monotonic()
        proc = cli.rewind(*args, REWIND_BOOTSTRAP_SERVERS=dead)
        return proc, time.monotonic() - began

    planned, _ = rewind_dead("plan", str(cli.spec))
    ran, seconds = rewind_dead("run", plan_id)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr
    assert one_error_line(ran) == one_error_line(planned)  # the same message as plan's
    assert "127.0.0.1:" in one_error_line(ran)
    assert seconds < 60, f"took {seconds:.0f}s"
    assert one_json(cli.rewind("runs", "--json"))["runs"] == runs_before  # no run recorded

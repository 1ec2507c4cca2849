"""The command line's error contract: one masked ``error:`` line on stderr, a non-zero exit,
no traceback unless ``--debug``; with ``--json`` stdout stays one parseable JSON object.

The doctors against a dead address are ``rewind`` child processes; the other commands run in
the test's own process through the same CLI (tests/cli_in_process.py), which reports the exit
code, stdout and stderr a child would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import cli_in_process
from tests.conftest import free_port

REWIND = str(Path(sys.executable).with_name("rewind"))
PASSWORD = "cli-Secret-Pw-771"


def cli_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_") or k == "REWIND_TANSU_BIN"}
    return {**base, "COLUMNS": "200", **env}


def run_cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return cli_in_process.rewind(args, cwd=cwd, env=cli_env(**env))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def assert_one_error_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


# -- doctor against an address where no broker listens -----------------------------------------


@pytest.fixture(scope="module")
def bad_address_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Three doctors at once (plain, --json, --debug), with a SASL password configured.

    Each waits out the metadata timeout (~5 s), so they run side by side.
    """
    cwd = tmp_path_factory.mktemp("bad-address")
    address = f"127.0.0.1:{free_port()}"
    env = cli_env(
        REWIND_BOOTSTRAP_SERVERS=address,
        REWIND_STATE_DIR=str(cwd / "state"),
        REWIND_KAFKA__SASL_USERNAME="svc",
        REWIND_KAFKA__SASL_PASSWORD=PASSWORD,
    )
    variants = {
        "plain": ["doctor", "--no-spark"],
        "json": ["doctor", "--no-spark", "--json"],
        "debug": ["--debug", "doctor", "--no-spark"],
    }
    t0 = time.monotonic()
    procs = {
        name: subprocess.Popen(
            [REWIND, *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, args in variants.items()
    }
    results: dict[str, object] = {"address": address}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    results["seconds"] = time.monotonic() - t0
    return results


def test_doctor_with_a_wrong_address_fails_with_one_line(bad_address_runs: dict[str, object]) -> None:
    result = bad_address_runs["plain"]
    assert isinstance(result, subprocess.CompletedProcess)
    line = assert_one_error_line(result, str(bad_address_runs["address"]))
    assert "no Kafka broker answered" in line
    assert "REWIND_BOOTSTRAP_SERVERS" in line  # says what to do
    assert "broker" in result.stdout and "failed" in result.stdout  # the checks table is still shown


def test_doctor_json_with_a_wrong_address_prints_one_json_object(bad_address_runs: dict[str, object]) -> None:
    result = bad_address_runs["json"]
    assert isinstance(result, subprocess.CompletedProcess)
    assert_one_error_line(result, str(bad_address_runs["address"]))
    report = json.loads(result.stdout)  # exactly one object: a second one would not parse
    assert report["ok"] is False
    assert str(bad_address_runs["address"]) in report["failure"]
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["java"] == "ok"
    assert statuses["broker"] == "failed"
    assert "spark" not in statuses  # --no-spark


def test_doctor_debug_still_reports_and_exits_non_zero(bad_address_runs: dict[str, object]) -> None:
    result = bad_address_runs["debug"]
    assert isinstance(result, subprocess.CompletedProcess)
    assert result.returncode == 1
    # doctor reports a failure rather than raising it, so --debug adds logs, not a traceback
    assert any(
        line.startswith("error: ") and str(bad_address_runs["address"]) in line
        for line in result.stderr.splitlines()
    )


def test_no_output_of_a_failing_doctor_shows_the_password(bad_address_runs: dict[str, object]) -> None:
    for name in ("plain", "json", "debug"):
        result = bad_address_runs[name]
        assert isinstance(result, subprocess.CompletedProcess)
        assert PASSWORD not in result.stdout + result.stderr, name


def test_a_wrong_address_fails_within_the_metadata_timeout(bad_address_runs: dict[str, object]) -> None:
    assert float(bad_address_runs["seconds"]) < 30  # type: ignore[arg-type]


# -- bad settings ----------------------------------------------------------------------------

BAD_YAML = [
    ("kafka: [unclosed\n", "not valid YAML"),
    ("dev:\n  broker_port: abc\n", "setting dev.broker_port"),
    ("dev: 7\n", "setting dev"),
    ("kafka:\n  bootstrapservers: x\n", "setting kafka.bootstrapservers"),
    ("- just\n- a list\n", "expected a mapping"),
]


@pytest.mark.parametrize(("content", "named"), BAD_YAML, ids=[b[1] for b in BAD_YAML])
def test_dev_status_with_a_bad_settings_file(tmp_path: Path, content: str, named: str) -> None:
    (tmp_path / "rewind.yaml").write_text(content)
    result = run_cli(["dev", "status"], tmp_path)
    assert result.returncode == 1
    assert_one_error_line(result, named)


def test_json_mode_errors_are_json_on_stdout_too(tmp_path: Path) -> None:
    (tmp_path / "rewind.yaml").write_text("dev:\n  broker_port: abc\n")
    result = run_cli(["dev", "status", "--json"], tmp_path)
    assert_one_error_line(result, "dev.broker_port")
    assert "dev.broker_port" in json.loads(result.stdout)["error"]


def test_a_bad_env_value_names_the_setting(tmp_path: Path) -> None:
    result = run_cli(["config"], tmp_path, REWIND_DEV_BROKER_PORT="many")
    assert_one_error_line(result, "dev.broker_port", "'many'")


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    result = run_cli(["config"], tmp_path, REWIND_CONFIG="elsewhere.yaml")
    assert_one_error_line(result, "elsewhere.yaml", "does not exist")
    result = run_cli(["--config", "missing.yaml", "config"], tmp_path)
    assert_one_error_line(result, "missing.yaml", "does not exist")


def test_bad_spark_conf_json_is_one_line(tmp_path: Path) -> None:
    result = run_cli(["config"], tmp_path, REWIND_SPARK_CONF="{not json")
    assert_one_error_line(result, "REWIND_SPARK_CONF")


def test_debug_shows_the_traceback_of_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "rewind.yaml").write_text("dev:\n  broker_port: abc\n")
    result = run_cli(["--debug", "config"], tmp_path)
    assert result.returncode != 0
    assert "ConfigError" in result.stderr


def test_an_unknown_kafka_property_is_one_line(tmp_path: Path) -> None:
    result = run_cli(
        ["doctor", "--no-spark"],
        tmp_path,
        REWIND_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
        REWIND_KAFKA__NO_SUCH_PROPERTY="1",
        REWIND_KAFKA__SASL_PASSWORD=PASSWORD,
    )
    assert_one_error_line(result, "no.such.property")
    assert PASSWORD not in result.stdout + result.stderr


# -- text the user typed is printed as typed, never read as Rich markup ---------------------------


@pytest.mark.parametrize(
    ("args", "literal"),
    [
        (["plan", "no[/such]-spec.yaml"], "no[/such]-spec.yaml"),
        (["show", "r-[bold]x"], "r-[bold]x"),
        (["show", "r-[/x]"], "r-[/x]"),
    ],
)
def test_brackets_in_user_text_are_printed_literally(tmp_path: Path, args: list[str], literal: str) -> None:
    result = run_cli(args, tmp_path, REWIND_STATE_DIR=str(tmp_path / "state"))
    assert_one_error_line(result, literal)


def test_values_of_a_result_are_printed_literally(capsys: pytest.CaptureFixture[str]) -> None:
    """A render function puts markup around values; the values themselves (run ids, topics,
    translate references, partition names) are escaped once by the output, never by it."""
    from rich.table import Table

    from rewind.output import output

    data = {"run_id": "r-[bold]x", "topic": "t[/x]", "ref": "mod:fn[red]", "parts": {"p[1]": ["[/]"]}}

    def render(console: Any, d: dict[str, Any]) -> None:
        console.print(f"[bold]{d['run_id']}[/] {d['topic']} {d['ref']}")
        table = Table("partition", "range")
        for name, ranges in d["parts"].items():
            table.add_row(name, ranges[0])
        console.print(table)

    output(False).result(data, render)
    printed = capsys.readouterr().out
    assert "r-[bold]x t[/x] mod:fn[red]" in printed
    assert "p[1]" in printed and "[/]" in printed


# Topic names and translate references reach the output through error lines (the spec refuses
# brackets in them, and the refusal names what was typed), and through what the ledger and a
# plan hold (unit ids, errors, quarantine reasons, gate details name them). ``:smile:`` is a
# Rich emoji code: it must not turn into a face either.


@pytest.mark.parametrize(
    ("change", "literal"),
    [
        ({"source": {"kafka": {"topics": ["t[/x]"]}}}, "(got 't[/x]')"),
        (
            {"source": {"kafka": {"topics": ["orders", "t[bold]x"]}}},
            "topics.1: not a topic name (got 't[bold]x')",
        ),
        ({"translate": {"function": "my[bold]mod:fn", "version": "1"}}, "(got 'my[bold]mod:fn')"),
        ({"translate": {"function": "orders:smile:fn", "version": "1"}}, "(got 'orders:smile:fn')"),
    ],
    ids=["topic-closing-tag", "topic-style", "translate-style", "translate-emoji"],
)
def test_brackets_in_topics_and_translate_references_of_a_spec_are_printed_literally(
    tmp_path: Path, change: dict[str, Any], literal: str
) -> None:
    from tests import job_fixtures as jf

    spec = jf.order_spec("literal", "orders", "cli.orders")
    spec.update(change)
    path = jf.write_spec(tmp_path / "spec[bold].yaml", spec)
    result = run_cli(["plan", str(path)], tmp_path, REWIND_STATE_DIR=str(tmp_path / "state"))
    line = assert_one_error_line(result, f"{path}: ", literal)
    assert "😄" not in line and result.stdout == ""


TOPIC = "t[/x]"
RUN = "r-[bold]x:smile:"
PLAN = "p-[red]1"
NAME = "orders[/x]"
TARGET = "iceberg:cli.orders[/x]"
STAGING = "cli.orders__rewind_[bold]r"
REASON = "translate tests.fx:explode[red] raised ValueError: order [bold]7[/] is cursed"
ERROR = f"translate tests.fx:explode[red] raised at {TOPIC}/0 offset 12: KeyError('[/amount]')"
RESUMED = "retry after [red]fixing[/] tests.fx:explode[red]"


@pytest.fixture(scope="module")
def bracketed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger holding one failed run whose every user-typed value has brackets in it."""
    from rewind.config import load_settings
    from rewind.core.ranges import OffsetRange
    from rewind.ledger import Ledger
    from rewind.ledger.models import UnitResult, unit_id

    tmp = tmp_path_factory.mktemp("brackets")
    settings = load_settings(env={"REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp)
    with Ledger.open(settings.ledger) as ledger:
        ledger.save_plan(PLAN, NAME, {"name": NAME}, {"plan_id": PLAN})
        ledger.create_run(PLAN, NAME, TARGET, run_id=RUN, staging={"kind": "iceberg", "table": STAGING})
        ledger.add_units(RUN, [OffsetRange(TOPIC, 0, 0, 10), OffsetRange(TOPIC, 0, 10, 20)])
        ledger.set_state(RUN, "running")
        done = UnitResult(unit_id(TOPIC, 0, 0, 10), 10, 7, 7, quarantined=3, reasons={REASON: 3})
        ledger.complete_units(RUN, [done])
        ledger.set_state(RUN, "failed", error=ERROR)
        ledger.audit(RUN, "resume-refused", {"reason": RESUMED})
    return tmp


def test_show_prints_bracketed_ids_topics_and_translate_references_literally(bracketed_run: Path) -> None:
    state = str(bracketed_run / "state")
    result = run_cli(["show", RUN], bracketed_run, REWIND_STATE_DIR=state, COLUMNS="250")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{RUN} ({NAME}) failed, plan {PLAN}, by " in out
    assert f"error: {ERROR}" in out
    assert f"quarantined 3: {REASON}" in out
    assert f"staging (present): kind iceberg; table {STAGING}" in out
    assert f"{TOPIC}/0/0-10" in out and f"{TOPIC}/0/10-20" in out  # the units table
    assert "😄" not in out
    shown = json.loads(run_cli(["show", RUN, "--json"], bracketed_run, REWIND_STATE_DIR=state).stdout)
    assert (shown["run_id"], shown["error"], shown["quarantine_reasons"]) == (RUN, ERROR, {REASON: 3})
    assert f"resume-refused by {shown['history'][0]['user']}: {RESUMED}" in out


def test_runs_prints_bracketed_ids_names_and_targets_literally(bracketed_run: Path) -> None:
    result = run_cli(["runs"], bracketed_run, REWIND_STATE_DIR=str(bracketed_run / "state"), COLUMNS="250")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if RUN in line)
    assert NAME in row and TARGET in row and "failed" in row


def test_plan_tables_and_refusal_print_bracketed_topics_and_references_literally(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partitions table (topic/partition), the gates table (a detail naming the translate)
    and the refusal line of ``rewind plan``, drawn from a plan as the planner makes it."""
    from rewind.cli.run_commands import _plan_summary, _render_plan
    from rewind.job.plan import Gate, JobPlan
    from rewind.output import output

    monkeypatch.setenv("COLUMNS", "250")
    part = {"topic": TOPIC, "partition": 0, "start": 0, "end": 10, "low": 0, "high": 10,
            "start_method": "earliest", "end_method": "latest", "missing_below_low": False}
    detail = f"{REASON}, first at {TOPIC}/0 offset 0"
    job_plan = JobPlan(
        plan_id=PLAN, name=NAME, spec={}, read_plan={"partitions": [part]}, units=(), offsets=10,
        output_schema_b64="", output_columns=(("order_id", "int64"),),
        gates=(Gate("log-start", True, f"{TOPIC}/0 is in the log"), Gate("output-schema", False, detail)),
        notes=(f"sampled {TOPIC}/0 with tests.fx:explode[red]",),
    )
    data = _plan_summary(job_plan)
    wave = f"run wave 1: 1 unit of {TOPIC} through tests.fx:explode[red]"
    data["stages"] = [{"stage": "run-wave", "does": wave}]
    out = output(False)
    out.result(data, _render_plan)
    out.failure(f"plan {PLAN} refused by gate output-schema: {detail}")
    printed = capsys.readouterr()
    assert f"plan {PLAN} for {NAME}: 10 offsets in 0 units" in printed.out
    row = next(line for line in printed.out.splitlines() if f"{TOPIC}/0 " in line)
    assert "[0, 10)" in row and "earliest → latest" in row
    assert f"{TOPIC}/0 is in the log" in printed.out and detail in printed.out
    assert f"1. {wave}" in printed.out
    assert f"note: sampled {TOPIC}/0 with tests.fx:explode[red]" in printed.out
    assert printed.err == f"error: plan {PLAN} refused by gate output-schema: {detail}\n"


def test_config_prints_a_bracketed_path_as_typed(tmp_path: Path) -> None:
    """``rewind config`` prints JSON, which is not markup: nothing escaped, nothing read as a tag."""
    state = str(tmp_path / "st[bold]ate")
    result = run_cli(["config"], tmp_path, REWIND_STATE_DIR=state)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state_dir"] == state

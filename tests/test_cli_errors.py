"""The command line's error contract: one masked ``error:`` line on stderr, a non-zero exit,
no traceback unless ``--debug``; with ``--json`` stdout stays one parseable JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

try:
    from tests.conftest import free_port
except ImportError:  # tests/ run as a plain folder, not a package
    from conftest import free_port  # type: ignore[no-redef]

REWIND = str(Path(sys.executable).with_name("rewind"))
PASSWORD = "cli-Secret-Pw-771"


def cli_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_") or k == "REWIND_TANSU_BIN"}
    return {**base, "COLUMNS": "200", **env}


def run_cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [REWIND, *args], env=cli_env(**env), cwd=cwd, capture_output=True, text=True, timeout=120
    )


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

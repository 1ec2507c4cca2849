"""Secrets never leave Rewind in clear: settings dumps, reprs, the CLI, logs and error lines."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rewind import logs
from rewind.config import Settings, load_settings
from rewind.secrets import MASK, is_secret_key, mask, mask_text, mask_url
from tests import cli_in_process

SASL_PASSWORD = "kafka-Pa55word!"
S3_SECRET = "s3-SecretKey-0123"
LEDGER_PASSWORD = "ledger-pw-9876"
SPARK_SECRET = "spark-s3a-secret-42"
SECRETS = [SASL_PASSWORD, S3_SECRET, LEDGER_PASSWORD, SPARK_SECRET]

SECRET_ENV = {
    "REWIND_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
    "REWIND_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
    "REWIND_KAFKA__SASL_MECHANISM": "PLAIN",
    "REWIND_KAFKA__SASL_USERNAME": "svc-rewind",
    "REWIND_KAFKA__SASL_PASSWORD": SASL_PASSWORD,
    "REWIND_CATALOG__TYPE": "sql",
    "REWIND_CATALOG__URI": "sqlite:////tmp/never-opened.db",
    "REWIND_CATALOG__S3__SECRET_ACCESS_KEY": S3_SECRET,
    "REWIND_LEDGER_URL": f"postgresql://rewind:{LEDGER_PASSWORD}@db.example:5432/rewind",
    "REWIND_SPARK_CONF": json.dumps({"spark.hadoop.fs.s3a.secret.key": SPARK_SECRET}),
}


@pytest.fixture
def secret_settings(tmp_path: Path) -> Settings:
    return load_settings(env=SECRET_ENV, cwd=tmp_path)


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``rewind ARGS`` in this process (tests/cli_in_process.py), with only ``env``'s settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_") or k == "REWIND_TANSU_BIN"}
    return cli_in_process.rewind(args, cwd=cwd, env={**base, "COLUMNS": "200", **env})


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


# -- settings --------------------------------------------------------------------------------


def test_clients_still_get_the_real_secrets(secret_settings: Settings) -> None:
    assert secret_settings.kafka_config()["sasl.password"] == SASL_PASSWORD
    assert secret_settings.catalog_properties()["s3.secret-access-key"] == S3_SECRET
    assert LEDGER_PASSWORD in secret_settings.ledger
    assert sorted(secret_settings.secret_values()) == sorted([SASL_PASSWORD, S3_SECRET, SPARK_SECRET])


def test_public_masks_every_secret_and_keeps_the_rest(secret_settings: Settings) -> None:
    public = secret_settings.public()
    assert_no_secret(json.dumps(public))
    assert public["kafka"]["properties"]["sasl.password"] == MASK
    assert public["kafka"]["properties"]["sasl.username"] == "svc-rewind"
    assert public["kafka"]["properties"]["security.protocol"] == "SASL_SSL"
    assert public["catalog"]["properties"]["s3.secret-access-key"] == MASK
    assert public["catalog"]["properties"]["uri"] == "sqlite:////tmp/never-opened.db"
    assert public["ledger_url"] == f"postgresql://rewind:{MASK}@db.example:5432/rewind"
    assert public["spark"]["conf"]["spark.hadoop.fs.s3a.secret.key"] == MASK


def test_repr_and_str_are_masked(secret_settings: Settings) -> None:
    for text in (repr(secret_settings), str(secret_settings), f"{secret_settings}", repr([secret_settings])):
        assert_no_secret(text)
        assert MASK in text


def test_a_secret_from_the_file_is_masked_too(tmp_path: Path) -> None:
    (tmp_path / "rewind.yaml").write_text(
        f"kafka:\n  properties:\n    sasl.password: {SASL_PASSWORD}\n"
        f"ledger_url: postgresql+psycopg://rewind:{LEDGER_PASSWORD}@db/rewind\n"
    )
    settings = load_settings(env={}, cwd=tmp_path)
    assert_no_secret(repr(settings))
    assert_no_secret(json.dumps(settings.public()))


# -- the masking helpers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.jaas.config",
        "sasl.oauthbearer.client.secret",
        "s3.secret-access-key",
        "s3.access-key-id",
        "token",
        "adls.account-key",
        "gcs.oauth2.token",
        "spark.hadoop.fs.s3a.secret.key",
        "ssl.key.pem",
        "SASL_PASSWORD",
        "rest.credential",
        "api_key",
        "s3.session-token",
        "adls.connection-string",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "sasl.username",
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanism",
        "uri",
        "warehouse",
        "s3.endpoint",
        "spark.sql.shuffle.partitions",
        "linger.ms",
    ],
)
def test_plain_keys(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://rewind:pw@db/rewind", "postgresql://rewind:***@db/rewind"),
        ("postgresql+psycopg://rewind:pw@db:5432/rewind", "postgresql+psycopg://rewind:***@db:5432/rewind"),
        ("postgres://u:p%40ss@h/d", "postgres://u:***@h/d"),
        ("postgresql://u:pa/ss@h:5432/d", "postgresql://u:***@h:5432/d"),  # SQLAlchemy accepts a raw '/'
        ("postgresql://:onlypw@h/d", "postgresql://:***@h/d"),
        ("postgresql://rewind@db/rewind", "postgresql://rewind@db/rewind"),  # no password: unchanged
        ("sqlite:////tmp/ledger.db", "sqlite:////tmp/ledger.db"),
        ("http://catalog:8181/v1", "http://catalog:8181/v1"),
        (
            "ledger postgresql://a:b@h/d and https://x:y@z/w",
            "ledger postgresql://a:***@h/d and https://x:***@z/w",
        ),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_the_masked_url_still_works_for_sqlalchemy_and_hides_the_password() -> None:
    from sqlalchemy.engine import make_url

    url = "postgresql://u:pa/ss@h:5432/d"
    assert make_url(url).password == "pa/ss"
    assert "pa/ss" not in mask_url(url)


def test_mask_is_recursive_and_leaves_input_alone() -> None:
    data = {"a": {"sasl.password": "x1", "list": ["postgresql://u:p@h/d"], "n": 3}, "token": ""}
    assert mask(data) == {
        "a": {"sasl.password": MASK, "list": ["postgresql://u:***@h/d"], "n": 3},
        "token": "",
    }
    assert data["a"]["sasl.password"] == "x1"


def test_mask_text_removes_known_values() -> None:
    text = f"auth failed for svc with {SASL_PASSWORD} at postgresql://u:{LEDGER_PASSWORD}@h/d"
    cleaned = mask_text(text, [SASL_PASSWORD])
    assert cleaned == "auth failed for svc with *** at postgresql://u:***@h/d"


# -- logging ---------------------------------------------------------------------------------


def test_secret_filter_scrubs_a_log_record() -> None:
    record = logging.LogRecord(
        "rewind.x",
        logging.WARNING,
        __file__,
        1,
        "connecting with %s to %s",
        (SASL_PASSWORD, "postgresql://u:p@h/d"),
        None,
    )
    assert logs.SecretFilter([SASL_PASSWORD]).filter(record) is True
    assert record.getMessage() == "connecting with *** to postgresql://u:***@h/d"


@pytest.fixture
def rewind_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger("rewind")
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_configured_logging_scrubs_secrets(
    rewind_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    logs.configure(logging.DEBUG, [SASL_PASSWORD])
    logging.getLogger("rewind.kafka.test").info("sasl.password=%s rejected", SASL_PASSWORD)
    logging.getLogger("rewind.ledger").debug("ledger at postgresql://r:%s@db/r", LEDGER_PASSWORD)

    out = stream.getvalue()
    assert "sasl.password=*** rejected" in out
    assert "postgresql://r:***@db/r" in out
    assert_no_secret(out)


def test_configure_twice_keeps_one_handler(rewind_logger: logging.Logger) -> None:
    logs.configure(logging.INFO, [])
    logs.configure(logging.INFO, [SASL_PASSWORD])
    assert sum(getattr(h, "_rewind", False) for h in rewind_logger.handlers) == 1


def test_a_logged_exception_is_scrubbed_too(
    rewind_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    logs.configure(logging.INFO, [SASL_PASSWORD])
    try:
        raise RuntimeError(f"login failed with password {SASL_PASSWORD}")
    except RuntimeError:
        logging.getLogger("rewind.x").exception("could not connect")
    out = stream.getvalue()
    assert "could not connect" in out
    assert "RuntimeError: login failed with password ***" in out
    assert_no_secret(out)


# -- the command line ------------------------------------------------------------------------


def test_rewind_config_json_is_masked(tmp_path: Path) -> None:
    result = run_cli(["config", "--json"], SECRET_ENV, tmp_path)
    assert result.returncode == 0, result.stderr
    assert_no_secret(result.stdout + result.stderr)
    shown = json.loads(result.stdout)
    assert shown["kafka"]["properties"]["sasl.password"] == MASK
    assert shown["kafka"]["properties"]["sasl.username"] == "svc-rewind"
    assert shown["catalog"]["properties"]["s3.secret-access-key"] == MASK
    assert shown["ledger_url"] == f"postgresql://rewind:{MASK}@db.example:5432/rewind"
    assert shown["state_dir"] == str(tmp_path / ".rewind")


def test_rewind_config_human_form_is_masked(tmp_path: Path) -> None:
    result = run_cli(["config"], SECRET_ENV, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "svc-rewind" in result.stdout
    assert_no_secret(result.stdout + result.stderr)


def test_a_config_error_does_not_print_the_secret(tmp_path: Path) -> None:
    (tmp_path / "rewind.yaml").write_text(f"kafka:\n  properties:\n    sasl.password: [{SASL_PASSWORD}]\n")
    result = run_cli(["config", "--json"], {}, tmp_path)
    assert result.returncode == 1
    assert "kafka.properties.sasl.password" in result.stderr
    assert_no_secret(result.stdout + result.stderr)


def test_columns_named_like_secrets_survive_the_ledger(tmp_path: Path) -> None:
    """A column called ``api_token`` is data, not a secret: its type and tolerance are stored
    as given, so the plan read back still validates; a real secret beside them is masked."""
    from rewind.ledger import Ledger
    from rewind.spec import parse_spec
    from tests.test_spec import with_

    spec = parse_spec(with_({
        "decode": {"format": "json", "schema": {"order_id": "bigint", "api_token": "string"}},
        "verify": {
            "reference": {"postgres": {"url": "postgresql://svc:hunter2@127.0.0.1/prod", "table": "t"}},
            "compare": {"api_token": "exact", "access_key": {"abs": 0.5}},
        },
    }))
    with Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        stored = ledger.save_plan("p-1", spec.name, spec.canonical(), {"units": []}).spec
    assert stored["decode"]["schema"] == spec.canonical()["decode"]["schema"]
    assert stored["decode"]["schema"]["api_token"] == "string"
    assert stored["verify"]["compare"] == spec.canonical()["verify"]["compare"]
    assert stored["verify"]["compare"]["access_key"]["abs"] == 0.5
    assert stored["verify"]["reference"]["postgres"]["url"] == "postgresql://svc:***@127.0.0.1/prod"
    assert "hunter2" not in (tmp_path / "ledger.db").read_bytes().decode("latin-1")
    back = parse_spec(stored)  # validates: nothing but the password was touched
    assert back.decode.schema_ == spec.decode.schema_

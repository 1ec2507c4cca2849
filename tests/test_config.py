"""Settings precedence: defaults, then ``rewind.yaml``, then ``REWIND_*`` variables.

Every documented variable of ``rewind.config`` is checked against a file that sets the same
setting to something else, so a variable that is read but loses to the file shows up here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rewind.config import DEFAULT_BROKER_PORT, Settings, load_settings
from rewind.errors import ConfigError, RewindError

FILE_SETTINGS: dict[str, Any] = {
    "state_dir": "from-file-state",
    "spool_dir": "s3://file-bucket/spool",
    "kafka": {
        "bootstrap_servers": "file-host:9092",
        "properties": {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc",
            "sasl.password": "file-password",
        },
    },
    "catalog": {
        "name": "file-catalog",
        "properties": {"type": "rest", "uri": "http://catalog.example:8181", "s3.access-key-id": "FILEKEY"},
    },
    "ledger_url": "postgresql://rewind:file-pw@ledger.example/rewind",
    "spark": {
        "master": "spark://file-master:7077",
        "remote": "sc://file-connect:15002",
        "conf": {"spark.sql.shuffle.partitions": "16", "spark.executor.memory": "2g"},
    },
    "dev": {"broker_port": 29092},
    "metrics": {"address": "0.0.0.0", "port": 9100},
}


def write_yaml(folder: Path, data: Any, name: str = "rewind.yaml") -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def load(cwd: Path, env: dict[str, str] | None = None, path: Path | str | None = None) -> Settings:
    return load_settings(path, env=env or {}, cwd=cwd)


# -- defaults --------------------------------------------------------------------------------


def test_defaults_point_at_the_embedded_stack_under_cwd(tmp_path: Path) -> None:
    s = load(tmp_path)

    assert s.state_path == tmp_path / ".rewind"
    assert s.bootstrap_servers == f"127.0.0.1:{DEFAULT_BROKER_PORT}"
    assert s.kafka_config() == {"bootstrap.servers": f"127.0.0.1:{DEFAULT_BROKER_PORT}"}
    assert s.catalog.name == "rewind"
    assert s.catalog_properties() == {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / '.rewind' / 'catalog.db'}",
        "warehouse": (tmp_path / ".rewind" / "warehouse").as_uri(),
    }
    assert s.ledger == f"sqlite:///{tmp_path / '.rewind' / 'ledger.db'}"
    assert (s.spark.master, s.spark.remote, s.spark.conf) == ("local[*]", None, {})
    assert (s.dev.host, s.dev.broker_port) == ("127.0.0.1", DEFAULT_BROKER_PORT)
    assert (s.metrics.address, s.metrics.port) == ("127.0.0.1", None)  # loopback, no server
    assert s.secret_values() == []


def test_an_empty_settings_file_means_defaults(tmp_path: Path) -> None:
    write_yaml(tmp_path, "")
    assert load(tmp_path).model_dump() == Settings(state_dir=tmp_path / ".rewind").model_dump()


# -- the file --------------------------------------------------------------------------------


def test_file_values_are_used(tmp_path: Path) -> None:
    write_yaml(tmp_path, FILE_SETTINGS)
    s = load(tmp_path)

    assert s.state_path == tmp_path / "from-file-state"
    assert s.bootstrap_servers == "file-host:9092"
    conf = s.kafka_config()
    assert conf["bootstrap.servers"] == "file-host:9092"
    assert conf["sasl.password"] == "file-password"  # clients get the real value
    assert conf["security.protocol"] == "SASL_SSL"
    assert s.catalog.name == "file-catalog"
    assert s.catalog_properties()["uri"] == "http://catalog.example:8181"
    assert s.ledger == "postgresql://rewind:file-pw@ledger.example/rewind"
    assert s.spark.master == "spark://file-master:7077"
    assert s.spark.remote == "sc://file-connect:15002"
    assert s.spark.conf["spark.executor.memory"] == "2g"
    assert s.dev.broker_port == 29092
    assert sorted(s.secret_values()) == ["FILEKEY", "file-password"]


def test_broker_port_alone_moves_the_default_bootstrap(tmp_path: Path) -> None:
    write_yaml(tmp_path, {"dev": {"broker_port": 29999}})
    assert load(tmp_path).bootstrap_servers == "127.0.0.1:29999"


def test_call_overrides_win_over_kafka_properties(tmp_path: Path) -> None:
    write_yaml(tmp_path, {"kafka": {"properties": {"group.id": "from-file", "linger.ms": "5"}}})
    conf = load(tmp_path).kafka_config(**{"group.id": "from-call"})
    assert conf["group.id"] == "from-call"
    assert conf["linger.ms"] == "5"


# -- environment wins over the file ------------------------------------------------------------


ENV_CASES = [
    ("REWIND_STATE_DIR", "/srv/rewind-state", lambda s: s.state_path, Path("/srv/rewind-state")),
    (
        "REWIND_BOOTSTRAP_SERVERS",
        "env-host:19093",
        lambda s: s.kafka_config()["bootstrap.servers"],
        "env-host:19093",
    ),
    (
        "REWIND_KAFKA__SASL_PASSWORD",
        "env-password",
        lambda s: s.kafka_config()["sasl.password"],
        "env-password",
    ),
    (
        "REWIND_KAFKA__SSL_KEY_PASSWORD",
        "env-keypw",
        lambda s: s.kafka.properties.get("ssl.key.password"),
        "env-keypw",
    ),
    ("REWIND_CATALOG_NAME", "env-catalog", lambda s: s.catalog.name, "env-catalog"),
    (
        "REWIND_CATALOG__S3__ACCESS_KEY_ID",
        "ENVKEY",
        lambda s: s.catalog_properties()["s3.access-key-id"],
        "ENVKEY",
    ),
    (
        "REWIND_CATALOG__S3__SECRET_ACCESS_KEY",
        "ENVSECRET",
        lambda s: s.catalog_properties().get("s3.secret-access-key"),
        "ENVSECRET",
    ),
    ("REWIND_LEDGER_URL", "sqlite:////srv/ledger.db", lambda s: s.ledger, "sqlite:////srv/ledger.db"),
    ("REWIND_LEDGER_RETRY_S", "5", lambda s: s.ledger_retry_s, 5.0),
    ("REWIND_SPARK_MASTER", "local[2]", lambda s: s.spark.master, "local[2]"),
    ("REWIND_SPARK_REMOTE", "sc://env-connect:15002", lambda s: s.spark.remote, "sc://env-connect:15002"),
    ("REWIND_SPARK_JVM_OUTPUT", "/tmp/jvm.out", lambda s: s.spark.jvm_output, Path("/tmp/jvm.out")),
    (
        "REWIND_SPARK_CONF",
        '{"spark.sql.shuffle.partitions": "3"}',
        lambda s: s.spark.conf["spark.sql.shuffle.partitions"],
        "3",
    ),
    ("REWIND_DEV_BROKER_PORT", "39092", lambda s: s.dev.broker_port, 39092),
    ("REWIND_METRICS_ADDRESS", "127.0.0.2", lambda s: s.metrics.address, "127.0.0.2"),
    ("REWIND_METRICS_PORT", "9464", lambda s: s.metrics.port, 9464),
    ("REWIND_MERGE_SPARK_ROWS", "1000", lambda s: s.merge.spark_rows, 1000),
    ("REWIND_REDRIVE_SPARK_RECORDS", "2000", lambda s: s.redrive.spark_records, 2000),
    ("REWIND_LIVE_INTERVAL_S", "5", lambda s: s.live.interval_s, 5.0),
    ("REWIND_LIVE_MIN_MULTIPLE", "20", lambda s: s.live.min_multiple, 20.0),
    ("REWIND_SPOOL_DIR", "s3://env-bucket/spool", lambda s: s.spool_root(), "s3://env-bucket/spool"),
    (
        "REWIND_SPEC__SINK__POSTGRES__URL",
        "postgresql://svc:pw@db/app",
        lambda s: s.spec_secrets.get("sink.postgres.url"),
        "postgresql://svc:pw@db/app",
    ),
]


@pytest.mark.parametrize(("var", "value", "get", "expected"), ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_each_documented_variable_wins_over_the_file(
    tmp_path: Path, var: str, value: str, get: Any, expected: Any
) -> None:
    write_yaml(tmp_path, FILE_SETTINGS)
    assert get(load(tmp_path)) != expected  # the file says something else
    assert get(load(tmp_path, {var: value})) == expected


def test_every_documented_variable_is_covered() -> None:
    import rewind.config

    documented = set(re.findall(r"``(REWIND_[A-Z_]+?)(?:__<PROP>)?``", rewind.config.__doc__ or ""))
    covered = {case[0] for case in ENV_CASES} | {"REWIND_CONFIG", "REWIND_KAFKA", "REWIND_CATALOG"}
    assert "REWIND_KAFKA" in documented
    assert documented <= covered, documented - covered


def test_the_spool_is_local_unless_executors_may_be_elsewhere_and_the_warehouse_is_an_object_store(
    tmp_path: Path,
) -> None:
    s3 = {"REWIND_CATALOG__TYPE": "sql", "REWIND_CATALOG__WAREHOUSE": "s3://lake/warehouse"}
    local = load(tmp_path, {"REWIND_STATE_DIR": str(tmp_path / "state")})
    assert local.spool_root() == (tmp_path / "state" / "spool").as_uri()
    # local[*] shares the driver's disk: a warehouse on S3 does not move the spool
    on_s3 = load(tmp_path, {"REWIND_STATE_DIR": str(tmp_path), **s3})
    assert on_s3.spool_root() == (tmp_path / "spool").as_uri()
    for master in ({"REWIND_SPARK_MASTER": "spark://h:7077"}, {"REWIND_SPARK_REMOTE": "sc://h:15002"}):
        assert load(tmp_path, {**s3, **master}).spool_root() == "s3://lake/warehouse/_rewind_spool"
        # a warehouse on one host's disk is not shared: the state folder it is
        on_disk = {**s3, "REWIND_CATALOG__WAREHOUSE": "file:///srv/wh", "REWIND_STATE_DIR": str(tmp_path)}
        assert load(tmp_path, {**on_disk, **master}).spool_root() == (tmp_path / "spool").as_uri()
    # spool_dir wins; a path becomes a file URI
    assert load(tmp_path, {**s3, "REWIND_SPOOL_DIR": "/srv/shared/spool"}).spool_root() == "file:///srv/shared/spool"


def test_env_properties_merge_with_file_properties(tmp_path: Path) -> None:
    write_yaml(tmp_path, FILE_SETTINGS)
    s = load(tmp_path, {"REWIND_KAFKA__SASL_PASSWORD": "env-password", "REWIND_KAFKA__LINGER_MS": "50"})
    assert s.kafka.properties == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "svc",
        "sasl.password": "env-password",
        "linger.ms": "50",
    }


def test_catalog_variable_names_follow_pyiceberg(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        {
            "REWIND_CATALOG__TYPE": "sql",
            "REWIND_CATALOG__URI": "sqlite:////tmp/c.db",
            "REWIND_CATALOG__PY_IO_IMPL": "pyiceberg.io.pyarrow.PyArrowFileIO",
            "REWIND_CATALOG__S3__ACCESS_KEY_ID": "AKIA",
        },
    )
    assert s.catalog_properties() == {
        "type": "sql",
        "uri": "sqlite:////tmp/c.db",
        "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
        "s3.access-key-id": "AKIA",
    }


def test_spark_conf_json_merges_into_the_file_conf(tmp_path: Path) -> None:
    write_yaml(tmp_path, FILE_SETTINGS)
    env = {
        "REWIND_SPARK_CONF": json.dumps({"spark.sql.shuffle.partitions": 4, "spark.sql.ansi.enabled": True})
    }
    assert load(tmp_path, env).spark.conf == {
        "spark.sql.shuffle.partitions": "4",  # JSON numbers and booleans become strings
        "spark.executor.memory": "2g",  # kept from the file
        "spark.sql.ansi.enabled": "True",
    }


def test_rewind_config_points_at_another_file(tmp_path: Path) -> None:
    write_yaml(tmp_path, {"catalog": {"name": "from-cwd-file"}})
    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    other = write_yaml(elsewhere, {"catalog": {"name": "from-other-file"}}, "team.yaml")

    assert load(tmp_path, {"REWIND_CONFIG": str(other)}).catalog.name == "from-other-file"
    # a relative REWIND_CONFIG is relative to the working directory
    assert load(tmp_path, {"REWIND_CONFIG": "conf/team.yaml"}).catalog.name == "from-other-file"
    # an explicit path (the --config option) wins over REWIND_CONFIG
    assert load(tmp_path, {"REWIND_CONFIG": str(other)}, path="rewind.yaml").catalog.name == "from-cwd-file"
    # and the variables still win over the file REWIND_CONFIG names
    env = {"REWIND_CONFIG": str(other), "REWIND_CATALOG_NAME": "from-env"}
    assert load(tmp_path, env).catalog.name == "from-env"


def test_rewind_config_naming_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml does not exist.*REWIND_CONFIG"):
        load(tmp_path, {"REWIND_CONFIG": "nope.yaml"})


def test_unrelated_variables_are_ignored(tmp_path: Path) -> None:
    env = {"REWINDER": "x", "REWIND_UNKNOWN_THING": "x", "KAFKA__SASL_PASSWORD": "x"}
    assert load(tmp_path, env).public() == load(tmp_path).public()


# -- state_dir -------------------------------------------------------------------------------


def test_relative_state_dir_in_the_file_is_resolved_against_cwd(tmp_path: Path) -> None:
    write_yaml(tmp_path, {"state_dir": "state/here"})
    s = load(tmp_path)
    assert s.state_path == tmp_path / "state" / "here"
    assert s.ledger == f"sqlite:///{tmp_path / 'state' / 'here' / 'ledger.db'}"


def test_relative_state_dir_from_env_is_resolved_against_cwd(tmp_path: Path) -> None:
    assert load(tmp_path, {"REWIND_STATE_DIR": "envstate"}).state_path == tmp_path / "envstate"


def test_absolute_state_dir_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "abs"
    assert load(tmp_path / "other", {"REWIND_STATE_DIR": str(target)}).state_path == target


def test_home_relative_state_dir_means_home(tmp_path: Path) -> None:
    assert load(tmp_path, {"REWIND_STATE_DIR": "~/rewind-state"}).state_path == (Path.home() / "rewind-state")


# -- bad values ------------------------------------------------------------------------------

BAD_FILES = [
    ("kafka: [unclosed\n", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping of settings at the top level"),
    ("dev:\n  broker_port: abc\n", "setting dev.broker_port"),
    ("dev:\n  broker_port: 70000\n", "setting dev.broker_port"),
    ("dev:\n  broker_port: 0\n", "setting dev.broker_port"),
    ("kafka: 3\n", "setting kafka"),
    ("kafka:\n  bootstrapservers: x\n", "setting kafka.bootstrapservers"),
    ("colour: blue\n", "setting colour"),
    ("spark:\n  master: local[*]\n  cores: 4\n", "setting spark.cores"),
    ("kafka:\n  properties:\n    linger.ms: {a: 1}\n", "setting kafka.properties.linger.ms"),
    ("spark:\n  conf: [a, b]\n", "setting spark.conf"),
    ("dev:\n  broker_start_timeout_s: soon\n", "setting dev.broker_start_timeout_s"),
    ("metrics:\n  port: 0\n", "setting metrics.port"),
]


@pytest.mark.parametrize(("content", "named"), BAD_FILES, ids=[b[1] for b in BAD_FILES])
def test_bad_file_values_give_one_line_naming_the_setting(tmp_path: Path, content: str, named: str) -> None:
    write_yaml(tmp_path, content)
    with pytest.raises(ConfigError) as err:
        load(tmp_path)
    message = str(err.value)
    assert named in message
    assert "\n" not in message
    assert isinstance(err.value, RewindError)


BAD_ENV = [
    ({"REWIND_DEV_BROKER_PORT": "x"}, "setting dev.broker_port"),
    ({"REWIND_DEV_BROKER_PORT": "-1"}, "setting dev.broker_port"),
    ({"REWIND_SPARK_CONF": "{bad"}, "REWIND_SPARK_CONF: not a JSON object"),
    ({"REWIND_SPARK_CONF": "[1, 2]"}, "REWIND_SPARK_CONF: expected a JSON object"),
]


@pytest.mark.parametrize(("env", "named"), BAD_ENV, ids=[b[1] for b in BAD_ENV])
def test_bad_env_values_give_one_line_naming_the_setting(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, env)
    assert named in str(err.value)
    assert "\n" not in str(err.value)


def test_env_property_on_a_scalar_section_is_an_error(tmp_path: Path) -> None:
    write_yaml(tmp_path, "kafka: 3\n")
    with pytest.raises(ConfigError, match="setting kafka: expected a mapping"):
        load(tmp_path, {"REWIND_KAFKA__SASL_PASSWORD": "pw"})


def test_a_bad_secret_value_is_masked_in_the_error(tmp_path: Path) -> None:
    write_yaml(tmp_path, "kafka:\n  properties:\n    sasl.password: [hunter2secret, x]\n")
    with pytest.raises(ConfigError) as err:
        load(tmp_path)
    assert "kafka.properties.sasl.password" in str(err.value)
    assert "hunter2secret" not in str(err.value)

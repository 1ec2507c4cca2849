"""A run whose spec holds a secret: the ledger never keeps it, and resume, verify and promote
put it back (from the original spec, the settings, the ledger URL or PGPASSWORD).

The sink is a private PostgreSQL server started for this module with password (SCRAM)
authentication, so a wrong or masked password fails visibly, as on a production server; the
machine's shared server trusts every password and would prove nothing. A run into it is
SIGKILLed after its first unit; the stored spec then holds ``***`` where the password was,
the stored plan as such fails to log in (what resume did before), and resume with the original
spec finishes the run. The ledger file and the PostgreSQL ledger's rows never hold the password.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rewind.config import Settings, load_settings
from tests import job_fixtures as jf
from tests.conftest import free_port
from tests.kafka_util import create_topic

PASSWORD = "Sink-Pa55-" + uuid.uuid4().hex[:8]
USER = "rewind_svc"
RECORDS = 1200
UNIT_RECORDS = 300  # 4 units; the driver runs one per wave and is killed after the first

DRIVER = """
import json, sys
from rewind.config import load_settings
from rewind.job.service import run_job
from rewind.spec import load_spec

out = run_job(load_settings(), load_spec(sys.argv[1]), units_per_wave=1)
print(json.dumps(out.to_dict()))
"""


@dataclass
class Server:
    port: int

    def url(self, database: str, password: str | None = PASSWORD, scheme: str = "postgresql") -> str:
        auth = f"{USER}:{password}" if password is not None else USER
        return f"{scheme}://{auth}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        name = f"db_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} OWNER {USER}")
        return name


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        pytest.fail(f"PostgreSQL's {name} is not installed; the secret tests need a password-checking server")
    return found[-1]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """A PostgreSQL server of our own on a free port, SCRAM passwords only (initdb as `postgres`
    when the tests run as root: the server refuses to run as root; its folder is outside pytest's
    private temporary folder so that user can reach it)."""
    home = Path(tempfile.mkdtemp(prefix="rewind-scram-pg-"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    pwfile = home / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if as_user:
        shutil.chown(home, "postgres")
        shutil.chown(pwfile, "postgres")
    data, port = home / "data", free_port()
    subprocess.run(
        [*as_user, _pg_bin("initdb"), "-D", str(data), "--auth=scram-sha-256", f"--username={USER}",
         f"--pwfile={pwfile}", "-N"],
        check=True, capture_output=True,
    )
    ctl = [*as_user, _pg_bin("pg_ctl"), "-D", str(data)]
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = [*ctl, "-o", options, "-l", str(home / "log"), "-w", "start"]
    subprocess.run(start, check=True, capture_output=True)
    try:
        yield Server(port)
    finally:
        subprocess.run([*ctl, "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_libpq_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No PGPASSWORD and no passfile unless a test sets one: what resolves a secret is explicit."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


@dataclass
class World:
    tmp: Path
    env: dict[str, str]
    settings: Settings
    topic: str
    orders: list[jf.Order]

    def spec(self, url: str, table: str = "public.order_amounts") -> dict[str, Any]:
        data = jf.order_spec(
            "orders-secret", self.topic, "unused.t", unit_records=UNIT_RECORDS,
            function="tests.job_fixtures:order_amounts",
        )
        data["sink"] = {"postgres": {"table": table, "url": url}}
        return data

    def want(self) -> dict[int, float]:
        return {o.order_id: o.amount for o in self.orders if o.fate in ("row", "double") and o.order_id}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str) -> World:
    tmp = tmp_path_factory.mktemp("job-secrets")
    env = {"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}
    settings = load_settings(env=env, cwd=tmp)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    orders = [
        o for o in jf.order_events(RECORDS, 2)
        if o.fate in ("row", "double", "filtered", "translate-reject")
    ]
    jf.produce_orders(settings.kafka_config(), topic, orders)
    return World(tmp, env, settings, topic, orders)


def cli(world: World, monkeypatch: pytest.MonkeyPatch, *args: str, **env: str) -> Any:
    from typer.testing import CliRunner

    from rewind.cli import app

    monkeypatch.chdir(world.tmp)
    return CliRunner().invoke(app, list(args), env={**world.env, **env})


def one_line(result: Any) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    return str(lines[0])


def rows_in(url: str, table: str) -> dict[int, float]:
    with psycopg.connect(url) as conn:
        return {r[0]: r[1] for r in conn.execute(f"SELECT order_id, amount FROM {table}")}


def test_a_killed_run_resumes_with_the_password_from_its_spec(
    world: World, server: Server, monkeypatch: pytest.MonkeyPatch, spark: Any
) -> None:
    from rewind.job.runner import execute
    from rewind.job.service import load_plan, open_ledger
    from rewind.sinks.sql.exceptions import SqlSinkError

    database = server.create_database()
    url = server.url(database)
    spec_path = jf.write_spec(world.tmp / "secret.yaml", world.spec(url))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(spec_path)], cwd=world.tmp, capture_output=True, text=True,
        env=jf.child_env(world.settings, REWIND_FAULT="after-ledger-update"), timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert PASSWORD not in proc.stdout + proc.stderr  # its tasks loaded units with the URL
    ledger_file = world.settings.state_path / "ledger.db"
    assert PASSWORD.encode() not in ledger_file.read_bytes()

    ledger = open_ledger(world.settings)
    try:
        [run] = ledger.list_runs(5, name="orders-secret")
        stored = load_plan(ledger, run.plan_id)
        masked_url = stored.spec["sink"]["postgres"]["url"]
        assert masked_url == server.url(database, password="***")
        assert {u.state for u in ledger.units(run.id)} == {"done", "pending"}
        # what resume did before: the stored spec as such, whose password is "***"
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(masked_url).close()
    finally:
        ledger.close()

    # nothing given: refused in one line naming the field and the ways, before any lease
    line = one_line(cli(world, monkeypatch, "resume", run.id, "--json"))
    assert "sink.postgres.url" in line and f"rewind resume {run.id} --spec SPEC" in line
    assert "REWIND_SPEC__SINK__POSTGRES__URL" in line and "PGPASSWORD" in line
    assert PASSWORD not in line
    # a spec that is not this run's: refused, naming the first field that differs
    other = jf.write_spec(world.tmp / "other.yaml", world.spec(url, table="public.other_amounts"))
    line = one_line(cli(world, monkeypatch, "resume", run.id, "--spec", str(other), "--json"))
    assert "sink.postgres.table" in line and "'public.other_amounts'" in line
    # the same spec with another password: it is not what the server takes, and it says so
    wrong = jf.write_spec(world.tmp / "wrong.yaml", world.spec(server.url(database, password="nope")))
    ledger = open_ledger(world.settings)
    try:
        assert ledger.get_run(run.id).state == "running"  # the refusals took no lease, wrote nothing
        assert not [e for e in ledger.audit_log(run.id) if e.action == "resume"]
        # and the masked plan, run as resume ran it before the fix, fails at the server
        with pytest.raises(SqlSinkError, match="password authentication failed"):
            execute(world.settings, ledger, stored, run.id)
        assert ledger.get_run(run.id).state == "failed"
    finally:
        ledger.close()
    line = one_line(cli(world, monkeypatch, "resume", run.id, "--spec", str(wrong), "--json"))
    assert "password authentication failed" in line and "nope" not in line

    result = cli(world, monkeypatch, "resume", run.id, "--spec", str(spec_path), "--json")
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert outcome["state"] == "succeeded"
    assert not [k for k, v in spark.sparkContext.getConf().getAll() if PASSWORD in v]  # tasks got it pickled
    staging = outcome["staging"]["table"]
    assert rows_in(url, staging) == world.want()
    assert PASSWORD.encode() not in ledger_file.read_bytes()

    # verify finds the password in PGPASSWORD, promote in REWIND_SPEC__SINK__POSTGRES__URL
    result = cli(world, monkeypatch, "verify", run.id, "--json", PGPASSWORD="wrong")
    assert "password authentication failed" in one_line(result)
    result = cli(world, monkeypatch, "verify", run.id, "--json", PGPASSWORD=PASSWORD)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"] is True
    result = cli(world, monkeypatch, "promote", run.id, "--json", REWIND_SPEC__SINK__POSTGRES__URL=url)
    assert result.exit_code == 0, result.output
    assert rows_in(url, "public.order_amounts") == world.want()
    assert PASSWORD.encode() not in ledger_file.read_bytes()


def test_a_postgresql_ledger_lends_its_password_and_keeps_none(
    world: World, server: Server, spark: Any
) -> None:
    from rewind.job.publish import promote_run
    from rewind.job.service import run_job
    from rewind.spec import parse_spec

    database, ledger_db = server.create_database(), server.create_database()
    url = server.url(database)
    settings = load_settings(
        env={**world.env, "REWIND_LEDGER_URL": server.url(ledger_db, scheme="postgresql+psycopg")},
        cwd=world.tmp,
    )
    outcome = run_job(settings, parse_spec(world.spec(url)), units_per_wave=4)
    assert outcome.state == "succeeded"
    # the sink's URL names the ledger's user, host and port: the ledger's password is the sink's
    promoted = promote_run(settings, outcome.run_id, force=True, reason="the ledger lends the password")
    assert promoted["state"] == "promoted"
    assert rows_in(url, "public.order_amounts") == world.want()

    with psycopg.connect(server.url(ledger_db)) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )]
        dump = {t: conn.execute(f"SELECT t::text FROM {t} t").fetchall() for t in tables}
    assert {"rewind_plans", "rewind_runs", "rewind_audit"} <= set(tables)
    text = json.dumps(dump)
    assert f"{USER}:***@" in text and PASSWORD not in text


# -- where a masked value comes back from, without a run -------------------------------------


def stored_plan(spec: dict[str, Any]) -> Any:
    """A plan whose spec is what the ledger keeps of ``spec``: masked."""
    from rewind.job.plan import JobPlan
    from rewind.job.spec_secrets import spec_data
    from rewind.secrets import mask
    from rewind.spec import parse_spec

    return JobPlan("p-test", spec["name"], mask(spec_data(parse_spec(spec))), {}, (), 0, "", (), ())


def secret_spec(**sink: Any) -> dict[str, Any]:
    spec = jf.order_spec("orders-secret", "orders", "unused.t")
    spec["sink"] = sink or {"postgres": {"table": "public.t", "url": "postgresql://svc:pw-1@db:6432/app"}}
    return spec


def test_secret_query_parameters_are_masked_and_recognised() -> None:
    from rewind.secrets import is_masked, mask_url

    url = "postgresql://svc@db/app?sslmode=require&password=pw-1&sslpassword=k-2#x"
    assert mask_url(url) == "postgresql://svc@db/app?sslmode=require&password=***&sslpassword=***#x"
    assert mask_url("GET https://reg/x?access_token=t-3 done") == "GET https://reg/x?access_token=*** done"
    assert mask_url("a=1&password=plain, not a URL") == "a=1&password=plain, not a URL"
    assert is_masked(mask_url(url)) and not is_masked(url)
    assert is_masked("***") and not is_masked("SELECT '***' AS stars")


def test_the_settings_carry_spec_secrets_masked(tmp_path: Path) -> None:
    settings = load_settings(
        env={"REWIND_SPEC__SINK__POSTGRES__URL": "postgresql://svc:pw-1@db/app"}, cwd=tmp_path
    )
    assert settings.spec_secrets == {"sink.postgres.url": "postgresql://svc:pw-1@db/app"}
    assert settings.public()["spec_secrets"] == {"sink.postgres.url": "postgresql://svc:***@db/app"}
    assert "pw-1" not in repr(settings)


def test_a_private_passfile_entry_resolves_the_url_without_a_password(tmp_path: Path) -> None:
    from rewind.job.spec_secrets import SecretUnresolved, resolve_plan

    plan = stored_plan(secret_spec())
    settings = load_settings(env={}, cwd=tmp_path)
    passfile = Path(os.environ["PGPASSFILE"])
    passfile.write_text("other:*:*:*:x\ndb:6432:*:svc:pw-1\n")
    passfile.chmod(0o600)
    resolved = resolve_plan(plan, settings)
    assert resolved.spec["sink"]["postgres"]["url"] == "postgresql://svc@db:6432/app"  # libpq reads the file
    assert plan.spec["sink"]["postgres"]["url"] == "postgresql://svc:***@db:6432/app"  # stored plan unchanged
    passfile.chmod(0o644)  # libpq ignores a passfile others can read, and so do we
    hint = r"sink\.postgres\.url .*PGPASSWORD or a ~/.pgpass entry for svc@db:6432"
    with pytest.raises(SecretUnresolved, match=hint):
        resolve_plan(plan, settings)


def test_the_ledger_lends_its_password_only_to_the_same_user_host_and_port(tmp_path: Path) -> None:
    from rewind.job.spec_secrets import SecretUnresolved, resolve_plan

    plan = stored_plan(secret_spec())
    ledger_url = "postgresql+psycopg://svc:pw-1@db:6432/ledger"
    same = load_settings(env={"REWIND_LEDGER_URL": ledger_url}, cwd=tmp_path)
    assert resolve_plan(plan, same).spec["sink"]["postgres"]["url"] == "postgresql://svc:pw-1@db:6432/app"
    for ledger in ("postgresql://other:pw-9@db:6432/l", "postgresql://svc:pw-9@db:5432/l", "sqlite:///l.db"):
        with pytest.raises(SecretUnresolved, match=r"sink\.postgres\.url"):
            resolve_plan(plan, load_settings(env={"REWIND_LEDGER_URL": ledger}, cwd=tmp_path))


def test_a_spec_secret_setting_must_be_the_stored_value_with_its_secret(tmp_path: Path) -> None:
    from rewind.job.spec_secrets import SpecMismatch, resolve_plan

    plan = stored_plan(secret_spec())
    good = "postgresql://svc:pw-2@db:6432/app"  # a rotated password is fine
    resolved = resolve_plan(plan, load_settings(env={"REWIND_SPEC__SINK__POSTGRES__URL": good}, cwd=tmp_path))
    assert resolved.spec["sink"]["postgres"]["url"] == good
    elsewhere = "postgresql://svc:pw-2@db2:6432/app"
    moved = load_settings(env={"REWIND_SPEC__SINK__POSTGRES__URL": elsewhere}, cwd=tmp_path)
    stored = r"'postgresql://svc:\*\*\*@db:6432/app'"
    with pytest.raises(SpecMismatch, match=rf"^REWIND_SPEC__SINK__POSTGRES__URL .*{stored}"):
        resolve_plan(plan, moved)


def test_a_masked_registry_url_is_named_and_needed_only_where_used(tmp_path: Path) -> None:
    from rewind.job.spec_secrets import SecretUnresolved, resolve_plan

    spec = secret_spec(iceberg={"table": "lake.t"})
    spec["decode"] = {"format": "avro", "registry_url": "https://reader:reg-pw@registry:8081"}
    spec["translate"].pop("output_schema")
    plan = stored_plan(spec)
    settings = load_settings(env={}, cwd=tmp_path)
    with pytest.raises(SecretUnresolved) as caught:
        resolve_plan(plan, settings, how="the original spec (rewind resume r-1 --spec SPEC)")
    line = str(caught.value)
    assert "decode.registry_url" in line and "REWIND_SPEC__DECODE__REGISTRY_URL" in line
    assert "rewind resume r-1 --spec SPEC" in line and "PGPASSWORD" not in line and "reg-pw" not in line
    # a promotion uses the sink only: the registry stays masked and nothing is refused
    kept = resolve_plan(plan, settings, needed=("sink",))
    assert kept.spec["decode"]["registry_url"] == "https://reader:***@registry:8081"

"""Settings: ``rewind.yaml`` in the working directory, then ``REWIND_*`` variables (env wins).

File shape (every key optional)::

    state_dir: .rewind                 # pid/log files of the embedded stack, default catalog, ledger
    spool_dir: null                    # where tasks leave files for the driver (see spool_root)
    kafka:
      bootstrap_servers: 127.0.0.1:19092
      remote: false                    # true: reading it is billed egress (the plan's cost model)
      properties:                      # any librdkafka property, passed through as is
        security.protocol: SASL_SSL
        sasl.mechanism: PLAIN
        sasl.username: svc
        sasl.password: s3cr3t
    catalog:
      name: rewind
      properties: {type: sql, uri: "sqlite:///.rewind/catalog.db", warehouse: "file:///..."}
    ledger_url: sqlite:///.rewind/ledger.db    # or postgresql+psycopg://user:pw@host/db
    ledger_retry_s: 60                 # how long a lost ledger database is waited for (0: not at all)
    spark:
      master: local[*]                 # or spark://host:7077, yarn, k8s://...
      remote: null                     # Spark Connect, e.g. sc://host:15002 (wins over master)
      conf: {spark.sql.shuffle.partitions: "8"}
    dev:
      broker_port: 19092
    metrics:                           # Prometheus metrics of `rewind run` / `resume`
      address: 127.0.0.1               # where /metrics binds (0.0.0.0: every interface)
      port: null                       # none: no metrics server (--metrics-port wins)
    merge:                             # the merge step (merge policies)
      spark_rows: null                 # contested rows above which Spark decides (null: the default)
    redrive:                           # rewind quarantine redrive
      spark_records: null              # records above which Spark tasks process them (null: the default)
    streams:                           # a failed continuous archive or shadow tail restarts itself
      restart_backoff_s: 1             # first wait, doubled per restart up to restart_max_backoff_s
      restart_max_backoff_s: 30
      max_restarts: 5                  # within restart_window_s; one more failure gives up
      restart_window_s: 600
    cost:                              # prices of the plan's cost model, each with its currency
      core_hour: 0.048 USD             # per core-hour (`0.048 USD/core-hour` also reads)
      gb_egress: 0.09 USD              # per GB (10^9 bytes) read from a remote broker
      gb_object_read: 0.0004 USD       # per GB read from the archive's object store
      cores: null                      # cores of the cluster; default: local[N], else this host's
    live:                              # the run's speed against the topic's live writes
      interval_s: 1                    # the plan watches the log ends grow this long (0: not at all)
      min_multiple: 10                 # readiness' cost area is yellow below this x real-time
    spec_secrets:                      # values of masked spec fields, for resume (see below)
      sink.postgres.url: postgresql://svc:s3cr3t@db:5432/app

Environment variables (each overrides the file):

==========================================  =============================================
``REWIND_CONFIG``                           path of the settings file
``REWIND_STATE_DIR``                        ``state_dir``
``REWIND_SPOOL_DIR``                        ``spool_dir``
``REWIND_BOOTSTRAP_SERVERS``                ``kafka.bootstrap_servers``
``REWIND_KAFKA__<PROP>``                    ``kafka.properties``; ``_`` becomes ``.``
                                            (``REWIND_KAFKA__SASL_PASSWORD`` → ``sasl.password``)
``REWIND_CATALOG_NAME``                     ``catalog.name``
``REWIND_CATALOG__<PROP>``                  ``catalog.properties``; as pyiceberg: ``__`` → ``.``,
                                            ``_`` → ``-`` (``S3__ACCESS_KEY_ID`` → ``s3.access-key-id``)
``REWIND_LEDGER_URL``                       ``ledger_url``
``REWIND_LEDGER_RETRY_S``                   ``ledger_retry_s``
``REWIND_SPARK_MASTER`` / ``_REMOTE``       ``spark.master`` / ``spark.remote``
``REWIND_SPARK_CONF``                       JSON object merged into ``spark.conf``
``REWIND_SPARK_JVM_OUTPUT``                 ``spark.jvm_output`` (the driver JVM's output file)
``REWIND_DEV_BROKER_PORT``                  ``dev.broker_port``
``REWIND_METRICS_ADDRESS`` / ``_PORT``      ``metrics.address`` / ``metrics.port``
``REWIND_MERGE_SPARK_ROWS``                 ``merge.spark_rows``
``REWIND_REDRIVE_SPARK_RECORDS``            ``redrive.spark_records``
``REWIND_LIVE_INTERVAL_S``                  ``live.interval_s``
``REWIND_LIVE_MIN_MULTIPLE``                ``live.min_multiple``
``REWIND_SPEC__<FIELD>``                    ``spec_secrets``: a spec field's whole value;
                                            ``__`` → ``.`` (``REWIND_SPEC__SINK__POSTGRES__URL``
                                            → ``sink.postgres.url``)
==========================================  =============================================

``spec_secrets`` exist because the ledger never holds a secret: a stored plan's spec has ``***``
where a password was, and whatever runs or publishes it again (``rewind resume``, ``verify``,
``promote``...) puts the value back from here, from the original spec, or from libpq's
PGPASSWORD / passfile (:mod:`rewind.job.spec_secrets`).

Secrets are kept as given (clients need them) but :meth:`Settings.public` masks them, and
that is the only form that is ever printed or logged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from rewind.core.cost import PRICE_UNITS, Price, PriceError, check_prices, parse_price
from rewind.errors import ConfigError
from rewind.secrets import is_secret_key, mask

DEFAULT_BROKER_PORT = 19092
SETTINGS_FILE = "rewind.yaml"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KafkaSettings(_Model):
    bootstrap_servers: str | None = None
    remote: bool = False
    """The broker is in another network or cloud region: the plan prices its bytes as egress."""
    properties: dict[str, str] = Field(default_factory=dict)


class CatalogSettings(_Model):
    name: str = "rewind"
    properties: dict[str, str] = Field(default_factory=dict)


class SparkSettings(_Model):
    master: str = "local[*]"
    remote: str | None = None
    app_name: str = "rewind"
    log_level: str = "WARN"
    conf: dict[str, str] = Field(default_factory=dict)
    jvm_output: Path | None = None
    """A file that takes the driver JVM's stdout and stderr (Spark's own log lines, the JVM's
    warnings, its Python workers' output); None: this process's. The CLI names
    ``<state_dir>/spark.log`` unless ``--debug``."""


class DevSettings(_Model):
    host: str = "127.0.0.1"
    broker_port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_BROKER_PORT
    broker_start_timeout_s: float = 30.0


class MetricsSettings(_Model):
    """Prometheus metrics of a run (``--metrics-address`` / ``--metrics-port`` win)."""

    address: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] | None = None


class MergeSettings(_Model):
    """The merge step of runs with a ``merge:`` policy (docs/merge-policies.md)."""

    spark_rows: Annotated[int, Field(ge=0)] | None = None
    """Contested rows (the run's and live's) above which the Iceberg merge decides in Spark
    instead of the driver; None: the measured default (``rewind.job.merge_iceberg.SPARK_ROWS``)."""


class RedriveSettings(_Model):
    """``rewind quarantine redrive`` (docs/quarantine-redrive.md)."""

    spark_records: Annotated[int, Field(ge=0)] | None = None
    """Records above which a re-drive processes them in Spark tasks instead of the driver;
    None: the measured default (``rewind.job.redrive.SPARK_RECORDS``)."""


class StreamSettings(_Model):
    """How Rewind's streaming queries (the continuous archive, a shadow's tail) restart after a
    failure (:mod:`rewind.spark.stream_restarts`)."""

    restart_backoff_s: Annotated[float, Field(ge=0)] = 1.0
    restart_max_backoff_s: Annotated[float, Field(ge=0)] = 30.0
    max_restarts: Annotated[int, Field(ge=0)] = 5
    restart_window_s: Annotated[float, Field(gt=0)] = 600.0


class CostSettings(_Model):
    """Prices of the cost model (:mod:`rewind.core.cost`); unset prices are left out of the total."""

    core_hour: str | None = None
    gb_egress: str | None = None
    gb_object_read: str | None = None
    cores: Annotated[int, Field(ge=1)] | None = None

    @field_validator("core_hour", "gb_egress", "gb_object_read", mode="before")
    @classmethod
    def _price(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        try:
            return str(parse_price(str(info.field_name), value))
        except PriceError as exc:
            raise ValueError(str(exc)) from None

    def prices(self) -> dict[str, Price]:
        found = {k: getattr(self, k) for k in PRICE_UNITS if getattr(self, k) is not None}
        prices = {k: parse_price(k, v) for k, v in found.items()}
        try:
            check_prices(prices)
        except PriceError as exc:
            raise ConfigError(str(exc)) from None
        return prices


class LiveSettings(_Model):
    """How a replay's speed is judged against the live stream (:mod:`rewind.core.live_speed`)."""

    interval_s: Annotated[float, Field(ge=0, le=600, allow_inf_nan=False)] = 1.0
    """Seconds over which the plan measures the topic's live produce rate (two looks at the log
    ends, taken around the plan's own work, which takes about a second itself: only what is left
    is waited); a run looks again this often. Longer for a producer that writes in bursts; 0
    measures nothing."""
    min_multiple: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 10.0
    """The run's expected speed as a multiple of the live rate below which readiness' cost area is
    yellow ("sustain >= 10x real-time throughput")."""


_OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "oss", "hdfs")
"""Warehouse schemes every executor reaches by URI (a ``file:`` warehouse may be one host's)."""


class Settings(_Model):
    """Everything Rewind needs to reach its systems. Build with :func:`load_settings`."""

    state_dir: Path = Path(".rewind")
    spool_dir: str | None = None
    """Where Spark tasks leave files for the driver (a folder or an object-store URI): see
    :meth:`spool_root`."""
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    ledger_url: str | None = None
    ledger_retry_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 60.0
    """Seconds an outage of the ledger's database is ridden out (:mod:`rewind.ledger.outage`)."""
    spark: SparkSettings = Field(default_factory=SparkSettings)
    dev: DevSettings = Field(default_factory=DevSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    merge: MergeSettings = Field(default_factory=MergeSettings)
    redrive: RedriveSettings = Field(default_factory=RedriveSettings)
    streams: StreamSettings = Field(default_factory=StreamSettings)
    cost: CostSettings = Field(default_factory=CostSettings)
    live: LiveSettings = Field(default_factory=LiveSettings)
    spec_secrets: dict[str, str] = Field(default_factory=dict)
    """Values of masked spec fields by dotted field name (``sink.postgres.url``): see above."""

    # -- derived values: defaults point at the embedded stack under state_dir --------------

    @property
    def state_path(self) -> Path:
        return self.state_dir.expanduser().resolve()

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka.bootstrap_servers or f"{self.dev.host}:{self.dev.broker_port}"

    def kafka_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration: bootstrap servers, pass-through properties, overrides."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(self.kafka.properties)
        conf.update(overrides)
        return conf

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg catalog properties; defaults to the embedded SQLite SQL catalog."""
        if self.catalog.properties:
            return dict(self.catalog.properties)
        return {
            "type": "sql",
            "uri": f"sqlite:///{self.state_path / 'catalog.db'}",
            "warehouse": (self.state_path / "warehouse").as_uri(),
        }

    def spool_root(self) -> str:
        """The folder (URI) where Spark tasks leave files the driver reads back: the SQL and
        Kafka sinks' spools.

        ``spool_dir`` when set; else, when the executors may run on other hosts (any master
        but ``local``, or Spark Connect) and the warehouse is an object store, a folder of the
        warehouse (``<warehouse>/_rewind_spool``), which the driver and every task reach with
        the catalog's credentials, so that ``state_dir`` need not be shared; else
        ``<state_dir>/spool``."""
        if self.spool_dir:
            root = self.spool_dir.rstrip("/")
            return root if "://" in root else Path(root).expanduser().resolve().as_uri()
        local = self.spark.master.startswith("local") and not self.spark.remote
        warehouse = str(self.catalog_properties().get("warehouse") or "")
        if not local and urlparse(warehouse).scheme in _OBJECT_STORES:
            return f"{warehouse.rstrip('/')}/_rewind_spool"
        return (self.state_path / "spool").as_uri()

    @property
    def ledger(self) -> str:
        return self.ledger_url or f"sqlite:///{self.state_path / 'ledger.db'}"

    def secret_values(self) -> list[str]:
        """Every secret value in the settings, to scrub from free text such as errors."""
        values = [v for k, v in self.kafka.properties.items() if is_secret_key(k)]
        values += [v for k, v in self.catalog.properties.items() if is_secret_key(k)]
        values += [v for k, v in self.spark.conf.items() if is_secret_key(k)]
        values += [v for k, v in self.spec_secrets.items() if is_secret_key(k)]
        return [v for v in values if v]

    def public(self) -> dict[str, Any]:
        """The effective settings with every secret masked: safe to print, log or store."""
        data = {
            "state_dir": str(self.state_path),
            "spool": self.spool_root(),
            "kafka": {
                "bootstrap_servers": self.bootstrap_servers,
                "properties": dict(self.kafka.properties),
            },
            "catalog": {"name": self.catalog.name, "properties": self.catalog_properties()},
            "ledger_url": self.ledger,
            "ledger_retry_s": self.ledger_retry_s,
            "spark": self.spark.model_dump(),
            "dev": self.dev.model_dump(),
            "metrics": self.metrics.model_dump(),
            "spec_secrets": dict(self.spec_secrets),
        }
        return mask(data)

    def __repr__(self) -> str:  # never let a stray repr leak a password
        return f"Settings({self.public()!r})"

    __str__ = __repr__


def load_settings(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Read the settings file (if any) and apply ``REWIND_*`` variables on top."""
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    explicit = path or env.get("REWIND_CONFIG")
    file = Path(explicit) if explicit else cwd / SETTINGS_FILE
    if not file.is_absolute():
        file = cwd / file
    data: dict[str, Any] = {}
    if file.exists():
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: not valid YAML ({exc.__class__.__name__}); fix the syntax") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{file}: expected a mapping of settings at the top level")
        data = loaded
    elif explicit:
        raise ConfigError(f"settings file {file} does not exist; create it or unset REWIND_CONFIG")
    _apply_env(data, env)
    state_dir = data.get("state_dir")
    if state_dir is not None and not Path(str(state_dir)).expanduser().is_absolute():
        data["state_dir"] = str(cwd / str(state_dir))
    elif state_dir is None:
        data["state_dir"] = str(cwd / ".rewind")
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(
            f"setting {where}: {err['msg']} (got {mask(err.get('input'), where)!r}); see {file.name}"
        ) from None


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    section = data.setdefault(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"setting {name}: expected a mapping, got {type(section).__name__}")
    return section


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> None:
    simple = {
        "REWIND_STATE_DIR": ("state_dir",),
        "REWIND_SPOOL_DIR": ("spool_dir",),
        "REWIND_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
        "REWIND_CATALOG_NAME": ("catalog", "name"),
        "REWIND_LEDGER_URL": ("ledger_url",),
        "REWIND_LEDGER_RETRY_S": ("ledger_retry_s",),
        "REWIND_SPARK_MASTER": ("spark", "master"),
        "REWIND_SPARK_REMOTE": ("spark", "remote"),
        "REWIND_SPARK_JVM_OUTPUT": ("spark", "jvm_output"),
        "REWIND_DEV_BROKER_PORT": ("dev", "broker_port"),
        "REWIND_METRICS_ADDRESS": ("metrics", "address"),
        "REWIND_METRICS_PORT": ("metrics", "port"),
        "REWIND_MERGE_SPARK_ROWS": ("merge", "spark_rows"),
        "REWIND_REDRIVE_SPARK_RECORDS": ("redrive", "spark_records"),
        "REWIND_LIVE_INTERVAL_S": ("live", "interval_s"),
        "REWIND_LIVE_MIN_MULTIPLE": ("live", "min_multiple"),
    }
    for var, where in simple.items():
        if var in env:
            target = data
            for part in where[:-1]:
                target = _section(target, part)
            target[where[-1]] = env[var]
    for var, value in env.items():
        if var.startswith("REWIND_KAFKA__"):
            prop = var.removeprefix("REWIND_KAFKA__").lower().replace("_", ".")
            _section(_section(data, "kafka"), "properties")[prop] = value
        elif var.startswith("REWIND_SPEC__"):
            field = var.removeprefix("REWIND_SPEC__").lower().replace("__", ".")
            _section(data, "spec_secrets")[field] = value
        elif var.startswith("REWIND_CATALOG__"):
            raw = var.removeprefix("REWIND_CATALOG__").lower()
            prop = raw.replace("__", ".").replace("_", "-")
            _section(_section(data, "catalog"), "properties")[prop] = value
    if "REWIND_SPARK_CONF" in env:
        try:
            extra = json.loads(env["REWIND_SPARK_CONF"])
        except json.JSONDecodeError as exc:
            raise ConfigError(f"REWIND_SPARK_CONF: not a JSON object ({exc.msg})") from None
        if not isinstance(extra, dict):
            raise ConfigError("REWIND_SPARK_CONF: expected a JSON object of Spark confs")
        _section(_section(data, "spark"), "conf").update({k: str(v) for k, v in extra.items()})

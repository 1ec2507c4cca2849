"""Dataset names per OpenLineage's naming rules (https://openlineage.io/docs/spec/naming).

* Kafka: namespace ``kafka://{host}:{port}`` of the first bootstrap server, name the topic.
* PostgreSQL: namespace ``postgres://{host}:{port}``, name ``{database}.{schema}.{table}``
  (schema ``public`` when the table names none).
* SQLite (no rule of its own): namespace ``sqlite://{file path}``, name the table.
* Iceberg: namespace the catalog's warehouse URI (its ``uri`` when the warehouse is not one,
  a REST catalog's warehouse name for instance), name ``{namespace}.{table}``.

A namespace never carries a user or password: hosts and ports are parsed out of the URL, and
what is left is masked by :func:`rewind.secrets.mask_url` all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rewind.secrets import mask_url

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.spec import JobSpec


@dataclass(frozen=True)
class Assertion:
    """One check of a verification, as OpenLineage's ``dataQualityAssertions`` holds it."""

    assertion: str
    success: bool
    column: str | None = None
    expected: str | None = None
    actual: str | None = None


@dataclass(frozen=True)
class Dataset:
    """A dataset of an event and what Rewind knows of it; facets are built from these facts.

    ``rows``/``size``: records and bytes read (an input) or written (an output); ``counts``:
    Rewind's counts (quarantined, filtered...) for the ``rewind_counts`` facet; ``assertions``:
    the checks a verification made on it (an input)."""

    namespace: str
    name: str
    rows: int | None = None
    size: int | None = None
    counts: Mapping[str, Any] | None = None
    assertions: tuple[Assertion, ...] = ()
    role: str | None = None
    """What the dataset is to Rewind (``staging``, ``quarantine``, ``reference``, ``archive``)."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def with_stats(self, **facts: Any) -> Dataset:
        return replace(self, **facts)

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def kafka(bootstrap: str, topic: str, **facts: Any) -> Dataset:
    """``kafka://host:port`` of the first bootstrap server (a ``SASL_SSL://`` prefix dropped)."""
    first = bootstrap.split(",")[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    host = first.rsplit("@", 1)[-1]
    return Dataset(f"kafka://{host}", topic, **facts)


def sql(url: str, table: str, **facts: Any) -> Dataset:
    """A PostgreSQL (or SQLite) table by its SQLAlchemy/libpq URL; no credentials kept."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    if scheme == "sqlite":
        path = url.split(":///", 1)[1] if ":///" in url else parts.path
        return Dataset(f"sqlite://{path.split('?')[0]}", table, **facts)
    if scheme in ("postgresql", "postgres"):
        host = parts.hostname or "localhost"
        port = parts.port or 5432
        database = parts.path.lstrip("/") or "postgres"
        name = (
            table if table.count(".") >= 2 else f"{database}.{table if '.' in table else 'public.' + table}"
        )
        return Dataset(f"postgres://{host}:{port}", name, **facts)
    host = parts.hostname or ""
    return Dataset(mask_url(f"{scheme}://{host}" + (f":{parts.port}" if parts.port else "")), table, **facts)


def iceberg_namespace(properties: Mapping[str, str]) -> str:
    """The catalog's warehouse URI, else its ``uri``, else ``iceberg``; never a password."""
    warehouse = str(properties.get("warehouse") or "")
    if "://" in warehouse:
        return mask_url(warehouse.rstrip("/"))
    uri = str(properties.get("uri") or "")
    if uri:
        parts = urlsplit(uri)
        host = parts.hostname or ""
        where = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "") + parts.path
        return mask_url(where.rstrip("/") + (f"/{warehouse}" if warehouse else ""))
    return f"iceberg://{warehouse}" if warehouse else "iceberg"


def iceberg(settings: Settings, table: str, **facts: Any) -> Dataset:
    return Dataset(iceberg_namespace(settings.catalog_properties()), table, **facts)


def spec_datasets(
    settings: Settings, spec: JobSpec, run_id: str | None = None
) -> tuple[list[Dataset], list[Dataset]]:
    """The inputs (topics, archive, snapshot, source table) and outputs (the sink's target) of a
    job spec. A Kafka sink's default topic is ``<source>.backfill.<run id>``: named only once
    ``run_id`` is known."""
    inputs: list[Dataset] = []
    src = spec.source
    boot = settings.bootstrap_servers
    if src.kafka is not None:
        inputs += [kafka(boot, t) for t in src.kafka.topics]
        if src.kafka.snapshot is not None:
            inputs.append(iceberg(settings, src.kafka.snapshot.table, role="snapshot"))
    if src.history is not None:
        inputs += [kafka(boot, t) for t in src.history.topics]
        inputs.append(iceberg(settings, src.history.archive, role="archive"))
    if src.table is not None:
        table = src.table
        if table.iceberg is not None:
            inputs.append(iceberg(settings, table.iceberg.table))
        for db in (table.postgres, table.sqlite):
            if db is not None:
                inputs.append(sql(db.url, db.table or "query"))
    return inputs, sink_datasets(settings, spec, run_id)


def sink_datasets(settings: Settings, spec: JobSpec, run_id: str | None = None) -> list[Dataset]:
    sink = spec.sink
    if sink.iceberg is not None:
        return [iceberg(settings, sink.iceberg.table)]
    if sink.postgres is not None:
        return [sql(sink.postgres.url or settings.ledger, sink.postgres.table)]
    if sink.kafka is not None:
        topics = list(spec.source.window.topics) if spec.source.kafka_window else []
        topic = sink.kafka.topic or (f"{topics[0]}.backfill.{run_id}" if topics and run_id else None)
        return [kafka(settings.bootstrap_servers, topic)] if topic else []
    return []

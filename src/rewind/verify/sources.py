"""The two sides of a verification as Spark DataFrames: a run's staging and its reference.

References (``verify.reference``):

* ``target``: the production target the promotion would replace. Iceberg: the table's
  ``main`` (absent for a new read model: an empty side); PostgreSQL/SQLite: the target table,
  read by the sink; a Kafka topic sink has no target to compare with.
* ``iceberg``: a table of the catalog in the settings, at ``main``.
* ``postgres``: a table or query, streamed with ``COPY ... TO STDOUT`` (CSV) through the
  driver into a temporary Parquet file, read by Spark. Types follow PostgreSQL's: integers,
  floats, booleans, text, timestamps (as UTC), dates, bytea, ``numeric(p,s)`` as decimals
  (unconstrained ``numeric`` as double); anything else as text.
* ``sql``: a Spark SQL query over the views ``staging``, ``target`` and the spec's ``views``.

Every failure to reach a reference is one line naming it: a closed port, a missing table.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.secrets import mask_url
from rewind.sinks.iceberg import IcebergSink, read_iceberg
from rewind.sinks.sql.sink import SqlSink
from rewind.spark.topology import tasks_on_this_host
from rewind.verify.exceptions import ReferenceUnreachable, VerifyError
from rewind.verify.spark_util import quiet_query_errors

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.sinks.base import StagingSink
    from rewind.spec import JobSpec, PostgresReference, Reference

log = logging.getLogger(__name__)


@dataclass
class Side:
    """One side: its DataFrame, a name for people (``iceberg:ns.t@main``) and notes."""

    df: DataFrame
    name: str
    notes: list[str] = field(default_factory=list)


def first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).strip().splitlines()[:1]) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def empty_like(spark: SparkSession, df: DataFrame) -> DataFrame:
    return spark.createDataFrame([], df.schema)


# -- Iceberg ----------------------------------------------------------------------------------


def read_iceberg_table(spark: SparkSession, catalog: Catalog, table: str, what: str) -> DataFrame:
    """``table`` at ``main`` through :func:`rewind.sinks.iceberg.read_iceberg`, or a one-line error."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        loaded = catalog.load_table(table)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise ReferenceUnreachable(
            f"{what}: Iceberg table {table} does not exist in catalog {catalog.name}; check the name"
        ) from None
    except Exception as exc:
        raise ReferenceUnreachable(
            f"{what}: Iceberg catalog {catalog.name} not reachable: {first_line(exc)}"
        ) from exc
    return read_iceberg(spark, loaded, "main")


# -- PostgreSQL -------------------------------------------------------------------------------

_INT = {20: "int64", 21: "int16", 23: "int32", 26: "int64"}
_FLOAT = {700: "float32", 701: "float64"}
_TEXT = {25, 1043, 1042, 19, 18}
_BOOL, _NUMERIC, _TIMESTAMP, _TIMESTAMPTZ, _DATE, _BYTEA = 16, 1700, 1114, 1184, 1082, 17


def _quote(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def _table_sql(table: str) -> str:
    return ".".join(_quote(part) for part in table.split("."))


def _pg_column(
    name: str, oid: int, precision: int | None, scale: int | None
) -> tuple[str, pa.DataType, pa.DataType]:
    """The SELECT expression of one column, the type pyarrow reads it as, and its final type."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    q = _quote(name)
    if oid in _INT:
        t = getattr(pa, _INT[oid])()
        return q, t, t
    if oid in _FLOAT:
        t = getattr(pa, _FLOAT[oid])()
        return q, t, t
    if oid == _BOOL:
        return q, pa.bool_(), pa.bool_()
    if oid == _NUMERIC:
        if precision and 0 < precision <= 38:
            return f"{q}::text", pa.string(), pa.decimal128(precision, scale or 0)
        return f"{q}::float8", pa.float64(), pa.float64()
    if oid in (_TIMESTAMP, _TIMESTAMPTZ):
        expr = f"(extract(epoch FROM {q}) * 1000000)::bigint"
        return expr, pa.int64(), pa.timestamp("us", tz="UTC")
    if oid == _DATE:
        return f"({q} - date '1970-01-01')", pa.int32(), pa.date32()
    if oid == _BYTEA:
        return f"encode({q}, 'hex')", pa.string(), pa.binary()
    return f"{q}::text", pa.string(), pa.string()


def _finish(column: pa.Array | pa.ChunkedArray, read: pa.DataType, final: pa.DataType) -> Any:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if read == final:
        return column
    if pa.types.is_timestamp(final) or pa.types.is_date32(final):
        return column.cast(final)  # micros (days) since the epoch, as PostgreSQL computed them
    if pa.types.is_binary(final):
        return pa.array([None if v is None else bytes.fromhex(v) for v in column.to_pylist()], pa.binary())
    return column.cast(final)


def read_postgres(
    spark: SparkSession, url: str, *, table: str | None, query: str | None, folder: Path, what: str
) -> DataFrame:
    """A PostgreSQL table or query as a DataFrame, through a temporary Parquet file in ``folder``.

    Steps: (1) connect (10 s timeout) in a read-only transaction; (2) learn the columns and
    their types from the query with ``LIMIT 0``; (3) ``COPY (SELECT ...) TO STDOUT`` as CSV into
    a file; (4) parse it with pyarrow in blocks and write Parquet; (5) Spark reads the Parquet.
    """
    # lazy: avoids psycopg, pyarrow at import
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    # one alias for both a table and a query: the query needs it, and a second one is a syntax error
    source = f"({query}) AS rewind_reference" if query else f"{_table_sql(table or '')} AS rewind_reference"
    shown = mask_url(url)
    try:
        conn = psycopg.connect(url, connect_timeout=10, autocommit=False)
    except psycopg.Error as exc:
        raise ReferenceUnreachable(
            f"{what}: PostgreSQL at {shown} is not reachable: {first_line(exc)}"
        ) from None
    csv_path = folder / f"pg-{uuid.uuid4().hex}.csv"
    try:
        with conn:
            conn.read_only = True
            with conn.cursor() as cur:
                cur.execute("SET LOCAL TimeZone = 'UTC'; SET LOCAL extra_float_digits = 3")
                try:
                    cur.execute(f"SELECT * FROM {source} LIMIT 0")
                except psycopg.Error as exc:
                    raise ReferenceUnreachable(f"{what}: {first_line(exc)} (at {shown})") from None
                columns = [
                    (d.name, *_pg_column(d.name, d.type_code, d.precision, d.scale))
                    for d in cur.description or []
                ]
                if not columns:
                    raise VerifyError(f"{what}: the reference has no columns")
                select = ", ".join(expr for _, expr, _, _ in columns)
                with (
                    csv_path.open("wb") as out,
                    cur.copy(f"COPY (SELECT {select} FROM {source}) TO STDOUT (FORMAT csv)") as copy,
                ):
                    for chunk in copy:
                        out.write(chunk)
    except psycopg.Error as exc:
        raise ReferenceUnreachable(f"{what}: reading from {shown} failed: {first_line(exc)}") from None
    finally:
        conn.close()

    names = [name for name, _, _, _ in columns]
    final = pa.schema([pa.field(name, t) for name, _, _, t in columns])
    parquet_path = folder / f"pg-{uuid.uuid4().hex}.parquet"
    with pq.ParquetWriter(parquet_path, final) as writer:
        if csv_path.stat().st_size:
            reader = pcsv.open_csv(
                csv_path,
                read_options=pcsv.ReadOptions(column_names=names, block_size=1 << 24),
                convert_options=pcsv.ConvertOptions(
                    column_types={name: read for name, _, read, _ in columns},
                    true_values=["t"],
                    false_values=["f"],
                    null_values=[""],  # COPY's NULL: not 'null', 'NaN', 'N/A' (text and numbers)
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,  # '' is an empty string
                ),
            )
            for batch in reader:
                arrays = [_finish(batch.column(i), read, t) for i, (_, _, read, t) in enumerate(columns)]
                writer.write_table(pa.Table.from_arrays(arrays, schema=final))
    csv_path.unlink(missing_ok=True)
    # lazy: avoids pyspark at import
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(final)

    if not tasks_on_this_host(spark):  # the tasks cannot see this host's file: send the rows
        return spark.createDataFrame(pq.read_table(parquet_path).to_pandas(), schema)
    return spark.read.schema(schema).parquet(str(parquet_path))


# -- references -------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch(settings: Settings | None = None) -> Iterator[Path]:
    """A temporary folder for reference files, removed afterwards."""
    base = settings.state_path / "tmp" if settings is not None else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="rewind-verify-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def postgres_url(ref: PostgresReference, spec: JobSpec | None, settings: Settings | None) -> str:
    if ref.url:
        return ref.url
    if spec is not None and spec.sink.postgres is not None and spec.sink.postgres.url:
        return spec.sink.postgres.url
    ledger = settings.ledger if settings is not None else ""
    if re.match(r"postgres(ql)?(\+\w+)?://", ledger):
        return re.sub(r"^postgres(ql)?\+\w+://", "postgresql://", ledger)
    raise VerifyError(
        "verify.reference.postgres.url is not set and neither the sink nor the ledger is PostgreSQL; "
        "set verify.reference.postgres.url: postgresql://user@host:5432/db"
    )


def target_side(spark: SparkSession, sink: StagingSink[Any], staging: Any, staging_df: DataFrame) -> Side:
    """The production target the promotion would replace (empty when it does not exist yet)."""
    if isinstance(sink, IcebergSink):
        # lazy: avoids pyiceberg at import
        from pyiceberg.exceptions import NoSuchTableError  # pyiceberg only when it is needed

        name = f"iceberg:{sink.table_name}@main"
        try:
            table = sink.catalog.load_table(sink.table_name)
        except NoSuchTableError:
            return Side(
                empty_like(spark, staging_df),
                name,
                [f"{sink.table_name} does not exist yet: every row is new"],
            )
        except Exception as exc:
            raise ReferenceUnreachable(
                f"verify.reference.target: Iceberg catalog not reachable: {first_line(exc)}"
            ) from exc
        return Side(read_iceberg(spark, table, "main"), name)
    if isinstance(sink, SqlSink):
        name = f"postgres:{staging.target_table}"
        if not staging.target_existed:
            return Side(
                empty_like(spark, staging_df),
                name,
                [f"{staging.target_table} did not exist: every row is new"],
            )
        try:
            return Side(sink.read(spark, replace(staging, table=staging.target_table)), name)
        except Exception as exc:
            raise ReferenceUnreachable(f"verify.reference.target: {name}: {first_line(exc)}") from exc
    raise VerifyError(
        f"verify.reference.target: a {sink.kind} sink has no production target to compare with "
        "(a backfill topic is new); use verify.reference.iceberg, postgres or sql"
    )


def reference_side(
    spark: SparkSession,
    reference: Reference,
    *,
    staging_df: DataFrame,
    catalog: Catalog | None,
    folder: Path,
    sink: Any = None,
    staging: Any = None,
    spec: JobSpec | None = None,
    settings: Settings | None = None,
) -> Side:
    """The reference named in the spec, as a :class:`Side`."""
    kind = reference.kind
    if kind == "target":
        return target_side(spark, sink, staging, staging_df)
    if kind == "iceberg":
        assert reference.iceberg is not None
        if catalog is None:
            raise VerifyError("verify.reference.iceberg needs the catalog of the settings")
        df = read_iceberg_table(spark, catalog, reference.iceberg, "verify.reference.iceberg")
        return Side(df, f"iceberg:{reference.iceberg}@main")
    if kind == "postgres":
        pg = reference.postgres
        assert pg is not None
        url = postgres_url(pg, spec, settings)
        df = read_postgres(
            spark, url, table=pg.table, query=pg.query, folder=folder, what="verify.reference.postgres"
        )
        return Side(df, f"postgres:{pg.table or 'query'}")
    sql = reference.sql
    assert sql is not None
    spark.catalog.dropTempView("target")
    staging_df.createOrReplaceTempView("staging")
    notes = []
    if sink is not None:
        try:
            target_side(spark, sink, staging, staging_df).df.createOrReplaceTempView("target")
        except VerifyError as exc:
            notes.append(f"view target not available: {exc}")
    for view, table in sql.views.items():
        if catalog is None:
            raise VerifyError("verify.reference.sql.views needs the catalog of the settings")
        read_iceberg_table(
            spark, catalog, table, f"verify.reference.sql.views.{view}"
        ).createOrReplaceTempView(view)

    try:
        with quiet_query_errors():
            df = spark.sql(sql.query)
    except Exception as exc:
        raise VerifyError(f"verify.reference.sql: {first_line(exc)}") from None
    return Side(df, "sql", notes)

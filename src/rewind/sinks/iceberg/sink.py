"""Iceberg sink: stage on a branch of the target (or a new staging table), commit per unit batch.

Staging rules:

* the target exists → output is committed to branch ``rewind-<run id>`` cut from the
  target's current ``main`` snapshot (remembered as the base, so promotion can check that
  ``main`` has not moved);
* the target does not exist (a new read model) → output goes to a staging table
  ``<table>__rewind_<run id>`` created with the output schema.

Every commit carries the ids of the work units whose output it holds, in the snapshot
summary (``rewind.run-id``, ``rewind.units``). The sink, not the ledger, is the truth about
which units are done: a driver killed between the commit and the ledger update loses and
duplicates nothing, because resume asks :meth:`IcebergSink.committed_units`.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rewind.core.counts import UNIT_COUNTS_KEY
from rewind.sinks.base import StagingSink, Swap
from rewind.sinks.iceberg.publish import promote, rollback
from rewind.sinks.iceberg.read import read_iceberg
from rewind.sinks.iceberg.staging import (
    RUN_PROPERTY,
    UNITS_PROPERTY,
    IcebergSinkError,
    IcebergStaging,
    load_table,
    split_identifier,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession


log = logging.getLogger(__name__)


class IcebergSink(StagingSink[IcebergStaging]):
    """Writes a run's output into Iceberg staging, one commit per batch of work units."""

    kind = "iceberg"
    SUPPORTS_REBASE = True
    SUPPORTS_CLEANUP = True
    """``promote(staging, rebase=True)`` re-applies the run's output on a ``main`` that moved."""

    def __init__(
        self,
        catalog: Catalog,
        table: str,
        mode: str = "append",
        window_column: str | None = None,
        window: tuple[datetime, datetime] | None = None,
    ) -> None:
        split_identifier(table)
        self.catalog = catalog
        self.table_name = table
        self.mode = mode
        self.window_column = window_column
        self.window = window

    @property
    def target(self) -> str:
        return f"iceberg:{self.table_name}"

    def _load(self, name: str) -> Table | None:
        return load_table(self.catalog, name)

    # -- gates ----------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> str:
        """Raise when the output cannot go to the target; return a one-line description."""
        try:
            target = self._load(self.table_name)
        except Exception as exc:  # the catalog itself is unreachable or misconfigured
            raise IcebergSinkError(f"Iceberg catalog not reachable for {self.table_name}: {exc}") from exc
        if target is None:
            if self.mode == "replace-window":
                raise IcebergSinkError(
                    f"sink.iceberg.table {self.table_name} does not exist; replace-window needs an existing "
                    "target (use mode: append for a new read model)"
                )
            return f"{self.table_name} does not exist: a staging table will be created for a new read model"
        _check_compatible(self.table_name, target, schema)
        if self.mode == "replace-window":
            column = self.window_column or ""
            if self.window is None:
                raise IcebergSinkError(
                    "sink.iceberg.mode replace-window needs a time window: "
                    "give source.kafka.from and .to as times"
                )
            if column not in {f.name for f in target.schema().fields}:
                raise IcebergSinkError(
                    f"sink.iceberg.window_column {column!r} is not a column of {self.table_name}"
                )
            lo, hi = self.window
            return (
                f"{self.table_name} exists: staged on a branch where rows with {column} in "
                f"[{lo.isoformat()}, {hi.isoformat()}) are replaced"
            )
        return f"{self.table_name} exists: output is staged on a branch of it"

    # -- staging --------------------------------------------------------------------------

    def table_staging(self, run_id: str) -> IcebergStaging:
        """The staging table ``run_id`` uses when the target does not exist (a new table)."""
        name = f"{self.table_name}__rewind_{run_id.replace('-', '_')}"
        return IcebergStaging(self.target, name, None, None, True)

    def prepare(self, run_id: str, schema: pa.Schema, *, new_run: bool = False) -> IcebergStaging:
        """Create (or find again, on resume) the staging branch or table of ``run_id``."""
        target = self._load(self.table_name)
        if target is None:
            staging = self.table_staging(run_id)
            if self._load(staging.table) is None:
                namespace, _ = split_identifier(staging.table)
                self.catalog.create_namespace_if_not_exists(namespace)
                self.catalog.create_table(staging.table, schema=schema, properties={RUN_PROPERTY: run_id})
            return staging
        _check_compatible(self.table_name, target, schema)
        branch = f"rewind-{run_id}"
        ref = target.metadata.refs.get(branch)
        main = target.metadata.refs.get("main")
        if ref is None:
            if main is not None:
                target.manage_snapshots().create_branch(main.snapshot_id, branch).commit()
            base = main.snapshot_id if main is not None else None
            if self.mode == "replace-window" and main is not None:
                self._clear_window(branch, run_id)
        else:
            # resume: the base is the main snapshot the branch was cut from (its oldest ancestor
            # not written by this run)
            base = self._base_of(target, branch, run_id)
            head = target.snapshot_by_name(branch)
            if self.mode == "replace-window" and head is not None and head.snapshot_id == base:
                self._clear_window(branch, run_id)  # killed between cutting the branch and clearing
        return IcebergStaging(self.target, self.table_name, branch, base, False)

    def _clear_window(self, branch: str, run_id: str) -> None:
        """Delete the repaired window's rows on the staging branch (copy-on-write), once.

        The delete is its own commit on the branch, marked with the run id and no units, so
        promotion swaps in "target minus the window plus the new rows" in one step. A crash
        right after cutting the branch and before this commit is caught on resume: the
        branch then has no run commit at all and the window is cleared again.
        """
        table = self._load(self.table_name)
        assert table is not None
        marks = {RUN_PROPERTY: run_id, UNITS_PROPERTY: ""}
        table.delete(self.window_filter(), snapshot_properties=marks, branch=branch)

    def window_filter(self) -> str:
        """The rows of the repaired window, ``[lo, hi)`` on the window column, as an Iceberg filter."""
        assert self.window is not None and self.window_column
        lo, hi = self.window
        column = self.window_column
        return f"{column} >= '{lo.isoformat()}' AND {column} < '{hi.isoformat()}'"

    def _base_of(self, table: Table, branch: str, run_id: str) -> int | None:
        for snap in self._ancestors(table, branch):
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get(RUN_PROPERTY) != run_id:
                return snap.snapshot_id
        return None

    def _ancestors(self, table: Table, ref: str) -> list[Any]:
        # lazy: avoids pyiceberg at import
        from pyiceberg.table.snapshots import ancestors_of

        head = table.snapshot_by_name(ref)
        return list(ancestors_of(head, table.metadata)) if head is not None else []

    def committed_units(self, staging: IcebergStaging, run_id: str) -> set[str]:
        table = self._load(staging.table)
        if table is None:
            return set()
        done: set[str] = set()
        for snap in self._ancestors(table, staging.ref):
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get(RUN_PROPERTY) == run_id and props.get(UNITS_PROPERTY):
                done.update(props[UNITS_PROPERTY].split(","))
        return done

    def committed_counts(self, staging: IcebergStaging, run_id: str) -> dict[str, dict[str, Any]]:
        """The per-unit counts recorded with the commits of ``run_id`` (``rewind.unit-counts``)."""

        table = self._load(staging.table)
        if table is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for snap in self._ancestors(table, staging.ref):
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get(RUN_PROPERTY) == run_id and props.get(UNIT_COUNTS_KEY):
                out.update(json.loads(props[UNIT_COUNTS_KEY]))
        return out

    def data_folder(self, staging: IcebergStaging) -> str:
        table = self._load(staging.table)
        if table is None:
            raise IcebergSinkError(f"staging table {staging.table} disappeared; run `rewind resume` again")
        return f"{table.location().rstrip('/')}/data"

    def commit(
        self,
        staging: IcebergStaging,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
    ) -> int | None:
        """Add the files to staging in ONE commit that also names the units it completes.

        Steps: (1) load the staging table fresh; (2) add the files on the staging ref with the
        unit ids in the snapshot summary; (3) the catalog's optimistic concurrency refuses
        the commit if the ref moved meanwhile (another writer), and the error propagates.
        Units with no output rows still get a (file-less) marker commit, so they count as done.
        """
        table = self._load(staging.table)
        if table is None:
            raise IcebergSinkError(f"staging table {staging.table} disappeared before commit")
        props = {RUN_PROPERTY: run_id, UNITS_PROPERTY: ",".join(sorted(unit_ids)), **(extra or {})}
        branch = staging.branch or "main"
        if files:
            table.add_files(files, snapshot_properties=props, branch=branch)
        else:
            # lazy: avoids pyarrow at import
            import pyarrow as pa

            empty = pa.Table.from_batches([], schema=table.schema().as_arrow())
            table.append(empty, snapshot_properties=props, branch=branch)
        table = self._load(staging.table)
        head = table.snapshot_by_name(branch) if table is not None else None
        return head.snapshot_id if head is not None else None

    def staging_from_dict(self, data: dict[str, Any]) -> IcebergStaging:
        return IcebergStaging.from_dict(data)

    # -- publishing -----------------------------------------------------------------------

    def promote(self, staging: IcebergStaging, rebase: bool = False) -> Swap:
        return promote(self, staging, rebase=rebase)

    def rollback(self, staging: IcebergStaging, promoted: dict[str, Any]) -> Swap:
        return rollback(self, staging, promoted)

    def cleanup(self, staging: IcebergStaging) -> dict[str, Any]:
        """Remove the staging: the branch (its data stays in main if it was promoted) or the
        staging table (only while it was not promoted: a promoted staging table IS the target).
        Idempotent."""
        if staging.created_table:
            if self._load(staging.table) is None:
                return {
                    "removed": None,
                    "note": "staging table already gone (or promoted under the target name)",
                }
            self.catalog.drop_table(staging.table)
            return {"removed": f"table {staging.table}"}
        table = self._load(staging.table)
        if table is None or staging.branch not in table.metadata.refs:
            return {"removed": None, "note": f"branch {staging.branch} already gone"}
        table.manage_snapshots().remove_branch(staging.branch).commit()
        return {"removed": f"branch {staging.branch} of {staging.table}"}

    # -- reading --------------------------------------------------------------------------

    def read(self, spark: SparkSession, staging: IcebergStaging) -> DataFrame:
        """Staging as a Spark DataFrame: files planned by pyiceberg, read by Spark."""
        table = self._load(staging.table)
        if table is None:
            raise IcebergSinkError(f"staging table {staging.table} does not exist")
        return read_iceberg(spark, table, staging.ref)


def _check_compatible(name: str, table: Table, schema: pa.Schema) -> None:
    # lazy: avoids pyiceberg at import
    from pyiceberg.io.pyarrow import pyarrow_to_schema

    target_fields = {f.name: f for f in table.schema().fields}
    try:
        incoming = pyarrow_to_schema(schema, name_mapping=table.schema().name_mapping)
    except Exception:
        incoming = None
    missing = [f.name for f in schema if f.name not in target_fields]
    if missing:
        raise IcebergSinkError(
            f"output columns {missing} are not in {name}; "
            "add them to the table or drop them from the translate"
        )
    if incoming is not None:
        for field in incoming.fields:
            target = target_fields[field.name]
            if str(field.field_type) != str(target.field_type) and not _promotable(
                field.field_type, target.field_type
            ):
                raise IcebergSinkError(
                    f"output column {field.name} is {field.field_type}, {name} has {target.field_type}; "
                    "cast it in the translate"
                )


def _promotable(source: Any, target: Any) -> bool:
    # lazy: avoids pyiceberg at import
    from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType

    return (isinstance(source, IntegerType) and isinstance(target, LongType)) or (
        isinstance(source, FloatType) and isinstance(target, DoubleType)
    )

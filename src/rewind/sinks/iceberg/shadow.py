"""A shadow's v2 on Iceberg: a new table beside v1, upserted on the key, swapped in atomically.

Where v2 lives, and why not on a branch of v1: the live service keeps committing to v1 while
the shadow commits to v2 every micro-batch; two writers of one table's metadata race for the
catalog's pointer (pyiceberg refuses a snapshot whose sequence number another commit took), so
the shadow could fail the live service's commits. A table of its own,
``<table>__rewind_<run>``, created empty from the output's schema (so v2 may add fields), is
never touched by the live service.

* **Commit** (:meth:`IcebergShadowSink.commit`, history units and tail micro-batches alike):
  an upsert on the key in ONE Iceberg transaction on v2 that also names the units in its
  snapshot summary, as every Iceberg commit of a run does. The units' rows and v2's current
  rows (key and lineage columns) are decided by :func:`rewind.core.merge.decide` under
  ``latest-event-time`` (ties by topic, partition, offset: the order the SQL sink's upsert
  keeps); one overwrite snapshot replaces the files holding rows of the units' keys by their
  other rows and the winning unit rows. v2 is kept as sorted, non-overlapping ranges of the
  key (:mod:`rewind.sinks.iceberg.keyed`), so only the files whose range holds a unit's key
  are read and written: a tail batch costs its keys, not v2's size. So v2 never holds a
  key twice, re-applying a unit changes nothing, and units may commit in any order.
  A folded read model (``translate.fold``, :meth:`IcebergShadowSink.commit_folded`): v2's
  rows of the units' keys are folded with the units' partial rows instead, and the folded
  rows replace them, in the same one snapshot that names the units.
* **Cut line**: :meth:`IcebergShadowSink.rebase_target` records v1's metadata location at
  the cut (writers stopped) as a property of v2; promotion refuses a v1 that moved since.
* **Promotion** (hard cutover, repoint) swaps the two catalog entries in ONE transaction of
  the SQL catalog's database: v1's row is renamed ``<table>__rewind_prev_<run>`` *where its
  metadata location is still the one recorded at the cut*, and v2's row is renamed to the
  table's name. A catalog lookup is one ``SELECT`` of one row, so a reader sees v1 or v2,
  never neither and never a mix, and a v1 moved after the cut updates no row and nothing is
  swapped. (Two ``rename_table`` calls are two transactions: between them the name resolves
  to nothing.) Only the SQL catalog offers such a transaction, so only it is accepted
  (:meth:`IcebergShadowSink.check`). **Rollback** is the reverse swap, refused when the
  promoted table moved since; both are idempotent after a kill -9 and sit between the fault
  points ``iceberg-<promote|rollback>-before-commit`` and ``-after-commit``.
* **Cleanup**: not promoted (abort), v2 is purged; promoted (decommission), the previous
  table (v1) is purged, after which there is nothing to roll back to.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.columns import SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TIMESTAMP, SOURCE_TOPIC
from rewind.core.merge import MergePolicy, decide, key_array
from rewind.sinks.base import RowFold, Swap
from rewind.sinks.iceberg.keyed import FILE_COLUMN, KeyedFiles, comparable, key_properties
from rewind.sinks.iceberg.sink import IcebergSink
from rewind.sinks.iceberg.staging import (
    RUN_PROPERTY,
    UNITS_PROPERTY,
    IcebergSinkError,
    IcebergStaging,
    split_identifier,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

V1_BASE_PROPERTY = "rewind.v1-base"
"""Property of v2: v1's metadata location at the cut line (the swap requires it unchanged)."""
UPSERT = MergePolicy(on_collision="latest-event-time", ambiguous="latest-offset")
"""A key keeps the row of its latest event: source time, then topic, partition, offset."""


class _Moved(Exception):
    """A row of the swap was not where it was recorded (internal: rolls the transaction back)."""


class IcebergTargetMoved(IcebergSinkError):
    """v1 (or, on rollback, the promoted v2) changed since it was recorded; nothing swapped."""


@dataclass(frozen=True)
class IcebergShadowStaging(IcebergStaging):
    """v2 (``table``), the live table it replaces and the name v1 keeps after the swap."""

    target_table: str
    prev_table: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IcebergShadowStaging:
        fields = {k: v for k, v in data.items() if k != "kind"}
        return cls(**fields)

    def describe(self) -> str:
        return f"{self.table} (a new table, swapped in for {self.target_table})"


def _name(run_id: str) -> str:
    return run_id.replace("-", "_")


class IcebergShadowSink(IcebergSink):
    """The Iceberg sink of a job with a ``shadow:`` section (see the module docstring)."""

    SUPPORTS_REBASE = False
    SUPPORTS_FOLDED_COMMIT = True

    def __init__(self, catalog: Any, table: str, key: list[str]) -> None:
        super().__init__(catalog, table)
        self.key = list(key)

    # -- gates and staging ----------------------------------------------------------------

    def check(self, schema: pa.Schema) -> str:
        # lazy: avoids pyiceberg at import
        from pyiceberg.catalog.sql import SqlCatalog

        if not isinstance(self.catalog, SqlCatalog):
            raise IcebergSinkError(
                f"a shadow of {self.table_name} swaps v1 and v2 in one transaction of a SQL catalog; "
                f"catalog {self.catalog.name} is a {type(self.catalog).__name__}: use a pyiceberg SQL catalog"
            )
        try:
            target = self._load(self.table_name)
        except Exception as exc:  # the catalog itself is unreachable or misconfigured
            raise IcebergSinkError(f"Iceberg catalog not reachable for {self.table_name}: {exc}") from exc
        if target is None:
            raise IcebergSinkError(
                f"sink.iceberg.table {self.table_name} does not exist; a shadow migrates the live table "
                "(v1): create it, or run an ordinary job for a new read model"
            )
        missing = [k for k in self.key if k not in schema.names]
        if missing:
            raise IcebergSinkError(f"key columns {missing} are not output columns; v2 is upserted on the key")
        key = ", ".join(self.key)
        return f"v2: a new table beside {self.table_name}, upserted on {key}, swapped in at cutover"

    def shadow_staging(self, run_id: str) -> IcebergShadowStaging:
        tag = _name(run_id)
        return IcebergShadowStaging(
            self.target,
            f"{self.table_name}__rewind_{tag}",
            None,
            None,
            True,
            self.table_name,
            f"{self.table_name}__rewind_prev_{tag}",
        )

    def prepare(self, run_id: str, schema: pa.Schema, *, new_run: bool = False) -> IcebergShadowStaging:
        """Create v2 empty from the output schema (or find it again on resume)."""
        staging = self.shadow_staging(run_id)
        if self._load(staging.table) is None and self._load(staging.prev_table) is None:
            props = {RUN_PROPERTY: run_id, **key_properties(self.key)}  # exact key bounds
            self.catalog.create_table(staging.table, schema=schema, properties=props)
        return staging

    def staging_from_dict(self, data: dict[str, Any]) -> IcebergShadowStaging:
        return IcebergShadowStaging.from_dict(data)

    def _v2(self, staging: IcebergStaging) -> IcebergStaging:
        """v2 under the name it has now: after the swap it carries the target's name."""
        assert isinstance(staging, IcebergShadowStaging)
        if self._load(staging.table) is None and self._load(staging.prev_table) is not None:
            return replace(staging, table=staging.target_table)
        return staging

    def committed_units(self, staging: IcebergStaging, run_id: str) -> set[str]:
        return super().committed_units(self._v2(staging), run_id)

    def committed_counts(self, staging: IcebergStaging, run_id: str) -> dict[str, dict[str, Any]]:
        return super().committed_counts(self._v2(staging), run_id)

    def read(self, spark: SparkSession, staging: IcebergStaging) -> DataFrame:
        return super().read(spark, self._v2(staging))

    # -- the upsert commit ----------------------------------------------------------------

    def commit(
        self,
        staging: IcebergStaging,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
        fold: RowFold | None = None,
    ) -> int | None:
        """Upsert the units' rows on the key in ONE transaction that names the units.

        Steps: (1) read the units' Parquet files, and v2's files that hold (or will hold) their
        keys, whole (:class:`~rewind.sinks.iceberg.keyed.KeyedFiles`: v2 is kept as sorted key
        ranges, so the other files are not read); (2) decide per key (:data:`UPSERT`), or with
        ``fold``: fold v2's rows of the units' keys with the units' rows, the result replacing
        them; (3) one overwrite snapshot, with the unit ids (and ``extra``) in its summary: the
        files read are replaced by their other rows and the winning (folded) rows of their key
        ranges; the catalog refuses it if v2 moved meanwhile; (4) remove the units' Parquet
        files, whose rows are now in v2's own files.
        """
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq


        table = self._load(staging.table)
        if table is None:
            raise IcebergSinkError(f"v2 {staging.table} disappeared before commit; abort the shadow")
        arrow_schema = table.schema().as_arrow()
        incoming = (
            pa.concat_tables(
                [_conform(pq.read_table(table.io.new_input(f).open()), arrow_schema) for f in files]
            )
            if files
            else arrow_schema.empty_table()
        )
        # 1. v2's files of these keys, read whole
        keyed = KeyedFiles.read(table, self.key)
        values = comparable(incoming.column(self.key[0])) if keyed.tasks else []
        homes = keyed.homes(list(dict.fromkeys(values)))
        touched = keyed.touched(homes)
        existing = keyed.read_rows(touched)
        # 2. the rows to write, and the keys whose rows in v2 they replace
        existing_keys = key_array(existing, self.key)
        if fold is None:
            lineage = [SOURCE_TIMESTAMP, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET]
            result = decide(incoming, existing.select([*self.key, *lineage]), self.key, UPSERT)
            rows, replaced = result.applied, key_array(result.replaced, self.key)
        else:
            current = pc.fill_null(pc.is_in(existing_keys, key_array(incoming, self.key)), False)
            base = existing.filter(current).drop_columns([FILE_COLUMN]).cast(arrow_schema)
            rows = fold(pa.concat_tables([base, incoming])) if incoming.num_rows else incoming
            replaced = key_array(incoming, self.key)
        kept = existing.filter(pc.invert(pc.fill_null(pc.is_in(existing_keys, replaced), False)))
        props = {RUN_PROPERTY: run_id, UNITS_PROPERTY: ",".join(sorted(unit_ids)), **(extra or {})}
        # 3. one snapshot
        with table.transaction() as tx:
            if touched or rows.num_rows:
                keyed.write(tx, touched, kept, rows, homes, props)
            else:  # nothing to write: a file-less marker commit still records the units
                tx.append(arrow_schema.empty_table(), snapshot_properties=props)
        # 4. the units' files
        for f in files:  # best effort: unreferenced once their rows were rewritten into v2
            try:
                table.io.delete(f)
            except Exception:  # a leftover file costs space, never correctness
                log.debug("could not remove %s", f)
        head = self._load(staging.table)
        snap = head.current_snapshot() if head is not None else None
        return snap.snapshot_id if snap is not None else None

    def commit_folded(
        self,
        staging: IcebergStaging,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        fold: RowFold,
        extra: dict[str, str] | None = None,
    ) -> int | None:
        return self.commit(staging, run_id, unit_ids, files, extra, fold=fold)

    # -- cut line, swap, rollback, cleanup ------------------------------------------------

    def rebase_target(self, staging: IcebergStaging) -> dict[str, Any]:
        """Record v1 as it is now (its writers stopped, the cut line taken) on v2: the swap then
        refuses a v1 that moved after this, not before."""
        assert isinstance(staging, IcebergShadowStaging)
        v1, v2 = self._load(staging.target_table), self._load(staging.table)
        if v1 is None or v2 is None:
            raise IcebergSinkError(f"{staging.target_table} or {staging.table} is gone; abort the shadow")
        with v2.transaction() as tx:
            tx.set_properties({V1_BASE_PROPERTY: v1.metadata_location})
        snap = v1.current_snapshot()
        return {
            "table": staging.target_table,
            "metadata_location": v1.metadata_location,
            "snapshot_id": snap.snapshot_id if snap is not None else None,
            "rows": int(snap.summary.additional_properties.get("total-records", 0))
            if snap and snap.summary
            else 0,
        }

    def promote(self, staging: IcebergStaging, rebase: bool = False) -> Swap:
        """Swap v2 in for v1 in one catalog transaction (see the module docstring); idempotent."""
        assert isinstance(staging, IcebergShadowStaging)
        if rebase:
            raise IcebergSinkError("a shadow's v2 is swapped in whole; there is nothing to rebase")
        v2 = self._load(staging.table)
        if v2 is None:
            if self._load(staging.prev_table) is not None:
                promoted = self._load(staging.target_table)
                after = promoted.metadata_location if promoted is not None else None
                return Swap(
                    self.target,
                    "promote",
                    self._named(staging.prev_table),
                    self._named(staging.target_table, after),
                    True,
                )
            raise IcebergSinkError(
                f"neither {staging.table} nor {staging.prev_table} exists; nothing to promote"
            )
        base = v2.properties.get(V1_BASE_PROPERTY)
        if base is None:
            raise IcebergSinkError(
                f"no cut line recorded for {staging.target_table}; run `rewind shadow cut` first"
            )
        self._swap(
            "promote",
            (staging.target_table, base, staging.prev_table),
            (staging.table, v2.metadata_location, staging.target_table),
        )
        return Swap(
            self.target,
            "promote",
            {"table": staging.target_table, "metadata_location": base, "now": staging.prev_table},
            self._named(staging.target_table, v2.metadata_location),
            False,
        )

    def rollback(self, staging: IcebergStaging, promoted: dict[str, Any]) -> Swap:
        """The reverse swap: v2 back to its staging name, v1 back to the table's name, refused
        when the promoted table moved since the promotion (those writes would be lost)."""
        assert isinstance(staging, IcebergShadowStaging)
        if self._load(staging.prev_table) is None:
            if self._load(staging.table) is not None:
                return Swap(self.target, "rollback", promoted.get("after"), promoted.get("before"), True)
            raise IcebergSinkError(
                f"{staging.prev_table} is gone (decommissioned): there is no v1 to roll back to"
            )
        after = (promoted.get("after") or {}).get("metadata_location")
        prev = self._load(staging.prev_table)
        assert prev is not None
        self._swap(
            "rollback",
            (staging.target_table, after, staging.table),
            (staging.prev_table, prev.metadata_location, staging.target_table),
        )
        return Swap(self.target, "rollback", promoted.get("after"), promoted.get("before"), False)

    def _named(self, name: str, location: str | None = None) -> dict[str, Any]:
        return {"table": name, "metadata_location": location}

    def _swap(
        self, action: str, first: tuple[str, str | None, str], second: tuple[str, str | None, str]
    ) -> None:
        """Rename ``first`` then ``second`` (name, metadata location it must still have, new
        name) in one transaction of the catalog's database; nothing when either row moved."""
        # lazy: avoids pyiceberg, sqlalchemy at import
        from pyiceberg.catalog.sql import IcebergTables
        from sqlalchemy import update
        from sqlalchemy.orm import Session

        catalog: Any = self.catalog
        moved: tuple[str, str | None] | None = None
        try:
            with Session(catalog.engine) as session, session.begin():
                for name, location, new in (first, second):
                    namespace, table = split_identifier(name)
                    _, new_table = split_identifier(new)
                    result: Any = session.execute(
                        update(IcebergTables)
                        .where(
                            IcebergTables.catalog_name == catalog.name,
                            IcebergTables.table_namespace == namespace,
                            IcebergTables.table_name == table,
                            IcebergTables.metadata_location == location,
                        )
                        .values(table_name=new_table)
                    )
                    if result.rowcount != 1:
                        moved = (name, location)
                        raise _Moved  # leaves the transaction: rolled back, nothing renamed
                faults.point(f"iceberg-{action}-before-commit")
        except _Moved:
            assert moved is not None
            now = self._load(moved[0])
            raise IcebergTargetMoved(
                f"{moved[0]} moved since it was recorded (was {moved[1]}, now "
                f"{now.metadata_location if now else 'missing'}); nothing was swapped"
            ) from None
        faults.point(f"iceberg-{action}-after-commit")

    def cleanup(self, staging: IcebergStaging) -> dict[str, Any]:
        """Not promoted: purge v2 (abort); promoted: purge v1, kept as the previous table until
        now (decommission; no rollback afterwards). Idempotent."""
        assert isinstance(staging, IcebergShadowStaging)
        for name in (staging.table, staging.prev_table):
            if self._load(name) is not None:
                self.catalog.purge_table(name)
                return {"removed": f"table {name}", "dropped": [name]}
        return {"removed": None, "dropped": [], "note": "already gone"}


def _conform(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    """A unit's rows in v2's Arrow schema (the files carry the output schema, maybe as large types)."""
    return batch.select(schema.names).cast(schema)

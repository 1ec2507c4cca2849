"""A reconstruction's units written to a table sink (Iceberg, PostgreSQL, SQLite) from its tasks.

The Kafka sink's unit writer commits a unit where it is read, in one transaction with its marker.
A table sink commits Parquet files together with their units' ids and counts, in one step that
is its own (:mod:`rewind.sinks.base`), and this writer hands it the files the same way a
Kafka-source wave does (:mod:`rewind.spark.job_stage`):

1. the task streams the unit's events (rows of the output schema, lineage columns included) into
   one Parquet file in the sink's data folder, opened with the first event;
2. at the unit's commit, a sink whose tasks load their units (PostgreSQL: the job layer hands in
   :class:`rewind.sinks.sql.task_load.TaskLoader` as ``loader``) loads the file in the task, in one
   transaction with the unit's row (ids, counts, quarantine files); a unit an earlier attempt
   loaded is not loaded again, and what that attempt recorded is returned as ``recorded``;
3. without a loader (Iceberg, SQLite) the file is returned, and the driver commits the wave's
   files with their units and counts (:func:`rewind.job.wave_commit.commit_wave`). A task killed
   before leaves an orphan file and nothing committed.

There is nothing to look up when a unit opens: an earlier attempt's driver commit is found by
the run's reconcile before the wave (the unit is not in it), a task's load by the load itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.core.arrow import schema_from_b64
from rewind.core.parquet import open_writer
from rewind.core.store import WarehouseStore

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class FileUnitWriter:
    """Plain data pickled to the tasks (the ``UnitWriter`` of :mod:`rewind.tables.stage`)."""

    run_id: str
    data_folder: str
    schema_b64: str
    store: WarehouseStore
    loader: Any = None
    """Loads a finished unit from its task (``load(unit_id, files, quarantine_files, counts) ->
    (recorded counts, loaded)``); None: the driver commits the files."""

    def open(self, unit_id: str, first_attempt: bool = False) -> FileUnitSession:
        return FileUnitSession(self, unit_id)


class FileUnitSession:
    """One unit's events on their way to a Parquet file (steps 1-3 of the module docstring)."""

    done: Any = None

    def __init__(self, writer: FileUnitWriter, unit_id: str) -> None:
        self.writer, self.unit_id = writer, unit_id
        self.schema = schema_from_b64(writer.schema_b64)
        self._file: Any = None
        self.path = ""
        self.rows = 0

    def produce(self, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        if self._file is None:  # 1.
            safe = self.unit_id.replace("/", "_").replace(":", "_")
            w = self.writer
            self._file, self.path = open_writer(
                w.data_folder, f"{w.run_id}-data-{safe}", self.schema, w.store
            )
        self._file.write_table(rows.select(self.schema.names).cast(self.schema))
        self.rows += rows.num_rows

    def commit(self, counts: dict[str, Any], quarantine_files: list[str]) -> dict[str, Any]:
        self._close()
        files = [self.path] if self.path else []
        loader = self.writer.loader
        if loader is None:  # 3.
            return {"rows": self.rows, "data_files": files, "loaded": False}
        recorded, loaded = loader.load(self.unit_id, files, quarantine_files, counts)  # 2.
        out: dict[str, Any] = {
            "rows": int(recorded.get("rows_out", 0) or 0),
            "data_files": [],
            "loaded": True,
        }
        if not loaded:
            out["recorded"] = recorded
        return out

    def abort(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

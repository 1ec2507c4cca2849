"""The one small interface every staging sink implements (Iceberg, PostgreSQL, Kafka).

A run hands a sink Parquet files written by Spark tasks, one batch of work units at a
time; the sink makes them part of its staging in ONE atomic step that also records the
unit ids and their counts (so the sink, not the ledger, knows which units are done). A
verified staging is then promoted in one atomic step and can be rolled back.

Implementations: :class:`rewind.sinks.iceberg.IcebergSink` (the reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


class Staging(Protocol):
    """Where a run's output lives before promotion; JSON-able for the ledger."""

    @property
    def target(self) -> str: ...  # read-only: stagings are frozen dataclasses

    def to_dict(self) -> dict[str, Any]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Swap:
    """What a promotion or rollback changed: recorded in the ledger's audit."""

    target: str
    action: str
    before: Any
    after: Any
    already_done: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "action": self.action,
            "before": self.before,
            "after": self.after,
            "already_done": self.already_done,
        }


S = TypeVar("S", bound=Staging)


class StagingSink(Protocol[S]):
    """A sink whose staging is of type ``S``."""

    kind: str

    @property
    def target(self) -> str:
        """``<kind>:<name>``: the lease key of runs writing to it."""
        ...

    def check(self, schema: pa.Schema) -> str:
        """Raise a one-line RewindError when the output cannot go there; else describe where it goes."""
        ...

    def prepare(self, run_id: str, schema: pa.Schema) -> S:
        """Create (or, on resume, find again) the staging of ``run_id``."""
        ...

    def staging_from_dict(self, data: dict[str, Any]) -> S: ...

    def data_folder(self, staging: S) -> str:
        """URI where tasks write the Parquet files later handed to :meth:`commit`."""
        ...

    def commit(
        self,
        staging: S,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
    ) -> Any:
        """Make ``files`` part of staging together with the unit ids (and ``extra``), atomically."""
        ...

    def committed_units(self, staging: S, run_id: str) -> set[str]: ...

    def committed_counts(self, staging: S, run_id: str) -> dict[str, dict[str, Any]]:
        """Per-unit counts as recorded by :meth:`commit` (``extra["rewind.unit-counts"]``)."""
        ...

    def read(self, spark: SparkSession, staging: S) -> DataFrame: ...

    def promote(self, staging: S) -> Swap: ...

    def rollback(self, staging: S, promoted: dict[str, Any]) -> Swap: ...

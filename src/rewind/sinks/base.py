"""The one small interface every staging sink implements (Iceberg, PostgreSQL, Kafka).

A run hands a sink Parquet files written by Spark tasks, one batch of work units at a
time; the sink makes them part of its staging in ONE atomic step that also records the
unit ids and their counts (so the sink, not the ledger, knows which units are done). A
verified staging is then promoted in one atomic step and can be rolled back.

Implementations: :class:`rewind.sinks.iceberg.IcebergSink` (the reference),
:class:`rewind.sinks.sql.sink.SqlSink` and :class:`rewind.sinks.kafka.sink.KafkaTopicSink`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from rewind.errors import RewindError

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

RowFold = Callable[["pa.Table"], "pa.Table"]
"""Rows of some keys (current rows and partial rows, in the output's columns) → one row per key."""


class StagingSink(ABC, Generic[S]):
    """A sink whose staging is of type ``S``.

    What a sink can do beyond the protocol is said by class constants, read without calling
    anything (as SQLMesh's engine adapters do): :attr:`SUPPORTS_REBASE` (``promote(...,
    rebase=True)`` re-applies staging on a target that moved) and :attr:`SUPPORTS_CLEANUP`
    (``rewind cleanup`` can drop what a run left behind), :attr:`SUPPORTS_FOLDED_COMMIT`
    (:meth:`commit_folded`: a shadow's tail into a folded read model).
    """

    kind: ClassVar[str]
    """Short name in messages and staging records: ``iceberg``, ``postgres``, ``kafka``."""
    SUPPORTS_REBASE: ClassVar[bool] = False
    SUPPORTS_CLEANUP: ClassVar[bool] = False
    SUPPORTS_FOLDED_COMMIT: ClassVar[bool] = False

    @property
    @abstractmethod
    def target(self) -> str:
        """``<kind>:<name>``: the lease key of runs writing to it."""

    @abstractmethod
    def check(self, schema: pa.Schema) -> str:
        """Raise a one-line RewindError when the output cannot go there; else describe where it goes."""

    @abstractmethod
    def prepare(self, run_id: str, schema: pa.Schema, *, new_run: bool = False) -> S:
        """Create (or, on resume, find again) the staging of ``run_id``.

        ``new_run``: no attempt of the run has prepared staging before (the ledger says so), so
        there is nothing to find again; a sink whose search costs a read may skip it.
        """

    @abstractmethod
    def staging_from_dict(self, data: dict[str, Any]) -> S: ...

    @abstractmethod
    def data_folder(self, staging: S) -> str:
        """URI where tasks write the Parquet files later handed to :meth:`commit`."""

    @abstractmethod
    def commit(
        self,
        staging: S,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
    ) -> Any:
        """Make ``files`` part of staging together with the unit ids (and ``extra``), atomically."""

    def commit_folded(
        self,
        staging: S,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        fold: RowFold,
        extra: dict[str, str] | None = None,
    ) -> Any:
        """Like :meth:`commit`, for a one-row-per-key staging whose rows are a fold of partial
        rows (where :attr:`SUPPORTS_FOLDED_COMMIT`): staging's current rows of the files' keys
        and the files' rows go through ``fold`` together, and its result replaces those keys'
        rows, in the same atomic step that records the units."""
        raise RewindError(f"the {self.kind} sink cannot fold rows into its staging")

    @abstractmethod
    def committed_units(self, staging: S, run_id: str) -> set[str]: ...

    @abstractmethod
    def committed_counts(self, staging: S, run_id: str) -> dict[str, dict[str, Any]]:
        """Per-unit counts as recorded by :meth:`commit` (``extra[UNIT_COUNTS_KEY]``): the
        :meth:`RecordCounts.to_dict <rewind.core.counts.RecordCounts.to_dict>` of each unit,
        and a fold's counts under its own unit id."""

    def check_held(self, staging: S, run_id: str, done: set[str] | None = None) -> None:
        """Raise in one line when staging no longer holds output the run committed (``done``:
        the units the ledger says are done): the runner asks before a run concludes. A sink
        whose storage can lose acknowledged writes (a Kafka broker) checks; the default trusts
        its storage's commits."""

    @abstractmethod
    def read(self, spark: SparkSession, staging: S) -> DataFrame: ...

    @abstractmethod
    def promote(self, staging: S, rebase: bool = False) -> Swap:
        """Swap staging in atomically; ``rebase`` only where :attr:`SUPPORTS_REBASE`."""

    @abstractmethod
    def rollback(self, staging: S, promoted: dict[str, Any]) -> Swap: ...

    def cleanup(self, staging: S) -> dict[str, Any]:
        """Drop what the run left that is not the live target (where :attr:`SUPPORTS_CLEANUP`)."""
        raise RewindError(f"the {self.kind} sink has nothing to clean up")

    def close(self) -> None:
        """Release connections (a no-op for sinks that hold none)."""

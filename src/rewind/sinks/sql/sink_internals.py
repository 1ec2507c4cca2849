"""The SQL sink as its own helper modules see it.

:mod:`~rewind.sinks.sql.checks`, :mod:`~rewind.sinks.sql.load`, :mod:`~rewind.sinks.sql.fold` and
:mod:`~rewind.sinks.sql.publish` are the sink's code in files of their own, and the sink calls
them. They name the sink through :class:`SqlSinkInternals` instead of importing
:mod:`rewind.sinks.sql.sink` back, so the imports run one way.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rewind.sinks.base import RowFold
    from rewind.sinks.sql.backend import Backend, Bookkeeping, Mode, Tx
    from rewind.sinks.sql.names import TableName
    from rewind.sinks.sql.staging import SqlStaging


class SqlSinkInternals(Protocol):
    """What the helper modules use of a :class:`~rewind.sinks.sql.sink.SqlSink`, its private
    members included (they are the sink's own code)."""

    is_sqlite: bool
    mode: Mode
    key: list[str]
    copy_target: bool
    table_name: str
    lock_timeout_s: float
    lock_wait_s: float
    _backend: Backend
    _direct: dict[str, bool]

    @property
    def target(self) -> str: ...

    @property
    def conflict_columns(self) -> list[str]: ...

    def _tx(self) -> AbstractContextManager[Tx]: ...

    def _tables(self, tx: Tx) -> Bookkeeping: ...

    def _state(self, tx: Tx, sname: TableName) -> str | None: ...

    def commit(
        self,
        staging: SqlStaging,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
        fold: RowFold | None = None,
    ) -> dict[str, Any]: ...

"""The one small interface over the databases a table source reads, and the selection.

A reader is plain data (pickled to Spark tasks) and opens its connection lazily, in the
process that uses it; :meth:`TableReader.close` releases it. What a reader answers:

* :meth:`~TableReader.key_type`: ``integer`` or ``text`` (the entity id column's type, from a
  row of the table; None for an empty table); refuses a table, a column or a database that is
  not there, each in one line naming the spec field;
* :meth:`~TableReader.count` and :meth:`~TableReader.keys`: the selected entities, the keys
  sorted as the database sorts them (its collation: the ranges are then evaluated by the same
  database, so a key is in exactly one range);
* :meth:`~TableReader.read`: the selected rows of ``[lo, hi)`` in key order, in batches of
  column names and row tuples or Arrow record batches (:class:`Rows`).

Rows whose key is null are never selected: a record needs a key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

KeyType = Literal["integer", "text"]
Key = int | str


@dataclass(frozen=True)
class Selection:
    """Which entities: ``ids`` (of the key's type), a ``where`` predicate, or all rows (the
    table's, or a query's that selects by itself)."""

    ids: tuple[Key, ...] | None = None
    where: str | None = None


@dataclass(frozen=True)
class Rows:
    """A batch of rows in key order: column names and one tuple per row, or (a reader that reads
    columns, like SQLite's through ADBC) an Arrow batch of them, with no Python object per value."""

    columns: tuple[str, ...]
    rows: Sequence[Sequence[Any]] = ()
    batch: Any = None
    """A ``pyarrow.RecordBatch`` of the rows (then ``rows`` is empty)."""

    def __len__(self) -> int:
        return int(self.batch.num_rows) if self.batch is not None else len(self.rows)

    def values(self, column: str) -> list[Any]:
        """One column's values as Python objects."""
        if self.batch is not None:
            return list(self.batch.column(column).to_pylist())
        at = self.columns.index(column)
        return [row[at] for row in self.rows]

    def row(self, position: int) -> Sequence[Any]:
        """One row's values, in column order."""
        if self.batch is not None:
            return tuple(self.batch.slice(position, 1).to_pylist()[0].values())
        return self.rows[position]


class TableReader(ABC):
    """A table or query of one database; see the module docstring."""

    key: str
    label: str

    @abstractmethod
    def key_type(self) -> KeyType | None: ...

    @abstractmethod
    def count(self, selection: Selection) -> int: ...

    @abstractmethod
    def keys(self, selection: Selection) -> list[Key]: ...

    @abstractmethod
    def read(
        self, selection: Selection, lo: Key | None, hi: Key | None, batch_rows: int = 10_000
    ) -> Generator[Rows, None, None]: ...

    def null_keys(self, selection: Selection) -> int:
        """Rows of the selection's ``where`` (ids aside) whose key is null: an event
        reconstruction refuses them, a state must belong to an entity."""
        raise NotImplementedError

    def distinct(self, selection: Selection, column: str) -> list[Any]:
        """The distinct values of ``column`` among the selected rows (a reconstruction's
        snapshot times), in no particular order."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - a no-op for readers that hold no connection
        """Release the connection (a no-op for readers that hold none)."""

"""An Iceberg table of the catalog, scanned with pyiceberg (a row filter per key range).

``where`` is pyiceberg's filter syntax (``status = 'blocked' AND region IN ('eu', 'us')``), and
the ids are kept with Arrow's ``is_in`` after the scan. Keys sort byte-wise (Arrow), the order
the range filters compare in.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from rewind.tables.exceptions import TableSourceError
from rewind.tables.readers import Key, KeyType, Rows, Selection, TableReader

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

_FIELD = "source.table.iceberg.table"


class IcebergReader(TableReader):
    """See the module docstring; plain data until the table is loaded."""

    def __init__(self, catalog: str, properties: dict[str, str], table: str, key: str, label: str) -> None:
        self.catalog = catalog
        self.properties = properties
        self.table = table
        self.key = key
        self.label = label
        self._table: Table | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_table": None}

    def _load(self) -> Table:
        # lazy: avoids pyiceberg at import
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        if self._table is None:
            try:
                catalog = load_catalog(self.catalog, **self.properties)
                self._table = catalog.load_table(self.table)
            except (NoSuchTableError, NoSuchNamespaceError):
                raise TableSourceError(
                    _FIELD,
                    f"no table {self.table} in catalog {self.catalog}; check the name (namespace.table)",
                ) from None
        return self._table

    def key_type(self) -> KeyType | None:
        # lazy: avoids pyiceberg at import
        from pyiceberg.types import IntegerType, LongType, StringType

        schema = self._load().schema()
        try:
            field = schema.find_field(self.key)
        except ValueError:
            names = ", ".join(f.name for f in schema.fields)
            raise TableSourceError(
                "source.table.key", f"no column {self.key!r} in {self.table} (columns: {names})"
            ) from None
        if isinstance(field.field_type, IntegerType | LongType):
            return "integer"
        if isinstance(field.field_type, StringType):
            return "text"
        raise TableSourceError(
            "source.table.key",
            f"column {self.key!r} is {field.field_type}; an entity id is an integer (int, long) or a string",
        )

    def _filter(
        self, selection: Selection, lo: Key | None = None, hi: Key | None = None
    ) -> BooleanExpression:
        # lazy: avoids pyiceberg at import
        import pyiceberg.expressions
        from pyiceberg.expressions.parser import parse

        ex: Any = pyiceberg.expressions  # its pydantic models confuse mypy's view of the constructors
        And, GreaterThanOrEqual, LessThan = ex.And, ex.GreaterThanOrEqual, ex.LessThan
        expr: BooleanExpression = ex.NotNull(self.key)
        if selection.where is not None:
            try:
                expr = And(expr, parse(selection.where))
            except Exception as exc:  # pyparsing's ParseException and friends
                raise TableSourceError(
                    "source.table.where",
                    f"not a valid Iceberg filter: {str(exc).splitlines()[0]}; write a condition over the "
                    "table's columns, like status = 'blocked'",
                ) from None
        if lo is not None:
            expr = And(expr, GreaterThanOrEqual(self.key, lo))
        if hi is not None:
            expr = And(expr, LessThan(self.key, hi))
        return expr

    def _scan(
        self, selection: Selection, columns: tuple[str, ...], lo: Key | None = None, hi: Key | None = None
    ) -> pa.Table:
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.compute as pc

        table = self._load()
        try:
            data = table.scan(row_filter=self._filter(selection, lo, hi), selected_fields=columns).to_arrow()
        except (ValueError, TypeError) as exc:  # a column the filter names is not in the table
            if selection.where is None:
                raise
            raise TableSourceError(
                "source.table.where", f"not a valid filter for {self.table}: {str(exc).splitlines()[0]}"
            ) from None
        if selection.ids is not None:
            data = data.filter(pc.is_in(data[self.key], value_set=pa.array(list(selection.ids))))
        return data.take(pc.sort_indices(data[self.key]))

    def count(self, selection: Selection) -> int:
        return self._scan(selection, (self.key,)).num_rows

    def keys(self, selection: Selection) -> list[Key]:
        return list(self._scan(selection, (self.key,))[self.key].to_pylist())

    def null_keys(self, selection: Selection) -> int:
        # lazy: avoids pyiceberg / pyarrow at import
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.expressions.parser import parse

        expr = parse(selection.where) if selection.where is not None else AlwaysTrue()
        data = self._load().scan(row_filter=expr, selected_fields=(self.key,)).to_arrow()
        return int(pc.sum(pc.is_null(data[self.key])).as_py() or 0)

    def distinct(self, selection: Selection, column: str) -> list[Any]:
        # lazy: avoids pyarrow at import
        import pyarrow.compute as pc

        data = self._scan(selection, (self.key, column))
        return list(pc.unique(data[column]).to_pylist())

    def read(
        self, selection: Selection, lo: Key | None, hi: Key | None, batch_rows: int = 10_000
    ) -> Generator[Rows, None, None]:
        data = self._scan(selection, ("*",), lo, hi)
        columns = tuple(data.column_names)
        for start in range(0, data.num_rows, batch_rows):
            part = data.slice(start, batch_rows)
            lists = [part.column(c).to_pylist() for c in columns]
            yield Rows(columns, list(zip(*lists, strict=True)))

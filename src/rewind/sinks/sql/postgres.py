"""The PostgreSQL backend: catalog queries, locks, ``COPY`` in and out, the DDL of a staging table."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rewind.sinks.sql.backend import ORDER_COLS, Backend, Mode, Tx, conflict_sql
from rewind.sinks.sql.encoding import prefetched, read_batches, to_csv
from rewind.sinks.sql.exceptions import SqlSinkError
from rewind.sinks.sql.names import TableName, key_index_name, quote_ident, short_ident
from rewind.sinks.sql.types import SqlColumn, arrow_of, pg_type

if TYPE_CHECKING:
    import pyarrow as pa


class PostgresBackend(Backend):
    def session(self, tx: Tx) -> None:
        # a fixed text form of every value: COPY input, row hashes and CSV output depend on it
        tx.cur.execute(
            "SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL extra_float_digits = 3; "
            "SET LOCAL IntervalStyle = 'postgres'; SET LOCAL bytea_output = 'hex'"
        )

    def resolve(self, tx: Tx, table: str) -> TableName:
        parts = table.lower().split(".")
        if len(parts) == 2:
            return TableName(parts[0], parts[1])
        tx.cur.execute("SELECT current_schema()")
        return TableName(tx.cur.fetchone()[0], parts[0])

    def _oid(self, tx: Tx, name: TableName) -> int | None:
        tx.cur.execute("SELECT to_regclass(%s)::oid", (name.sql,))
        found = tx.cur.fetchone()
        return found[0] if found else None

    def exists(self, tx: Tx, name: TableName) -> bool:
        return self._oid(tx, name) is not None

    def columns(self, tx: Tx, name: TableName) -> list[SqlColumn]:
        tx.cur.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "a.atthasdef OR a.attidentity <> '' , a.attgenerated <> '' "
            "FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum",
            (name.sql,),
        )
        return [SqlColumn(*r) for r in tx.cur.fetchall()]

    def unique_keys(self, tx: Tx, name: TableName) -> list[frozenset[str]]:
        tx.cur.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1]) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indimmediate "
            "AND i.indpred IS NULL AND i.indexprs IS NULL GROUP BY i.indexrelid",
            (name.sql,),
        )
        return [frozenset(r[0]) for r in tx.cur.fetchall()]

    def blockers(self, tx: Tx, name: TableName) -> list[str]:
        out: list[str] = []
        q = name.sql
        tx.cur.execute("SELECT relkind, relrowsecurity FROM pg_class WHERE oid = to_regclass(%s)", (q,))
        kind, rls = tx.cur.fetchone()
        if kind != "r":
            out.append(f"it is not a plain table (relkind {kind!r}; partitioned tables are not supported)")
        if rls:
            out.append("it has row-level security (policies are not copied)")
        checks = [
            (
                "SELECT DISTINCT v.oid::regclass::text FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid "
                "JOIN pg_class v ON v.oid = r.ev_class WHERE d.classid = 'pg_rewrite'::regclass "
                "AND d.refobjid = to_regclass(%s) AND v.oid <> to_regclass(%s)",
                "view {} depends on it",
                2,
            ),
            (
                "SELECT conname || ' of ' || conrelid::regclass::text FROM pg_constraint "
                "WHERE contype = 'f' AND confrelid = to_regclass(%s)",
                "foreign key {} references it",
                1,
            ),
            (
                "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND NOT tgisinternal",
                "trigger {} is on it",
                1,
            ),
            (
                "SELECT p.pubname FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid "
                "WHERE pr.prrelid = to_regclass(%s)",
                "publication {} names it",
                1,
            ),
            (
                "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = to_regclass(%s) "
                "UNION ALL SELECT inhparent::regclass::text FROM pg_inherits "
                "WHERE inhrelid = to_regclass(%s)",
                "it is in an inheritance tree with {}",
                2,
            ),
        ]
        for sql, text, n in checks:
            tx.cur.execute(sql, (q,) * n)
            out += [text.format(r[0]) for r in tx.cur.fetchall()]
        return out

    def create_like(self, tx: Tx, target: TableName, staging: TableName) -> None:
        """Staging = target's DDL (LIKE ... INCLUDING ALL, FKs, owner, grants, options) and rows."""
        cur, t, s = tx.cur, target.sql, staging.sql
        cur.execute(f"CREATE TABLE {s} (LIKE {t} INCLUDING ALL)")
        cur.execute(
            "SELECT pg_get_userbyid(relowner), current_user, reloptions FROM pg_class "
            "WHERE oid = to_regclass(%s)",
            (t,),
        )
        owner, me, options = cur.fetchone()
        if options:
            cur.execute(f"ALTER TABLE {s} SET ({', '.join(options)})")
        if owner != me:
            cur.execute(f"ALTER TABLE {s} OWNER TO {quote_ident(owner)}")
        cur.execute(
            "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END, "
            "a.privilege_type, a.is_grantable FROM pg_class c, aclexplode(c.relacl) a "
            "WHERE c.oid = to_regclass(%s) AND a.grantee <> c.relowner",
            (t,),
        )
        for grantee, privilege, grantable in cur.fetchall():
            option = " WITH GRANT OPTION" if grantable else ""
            cur.execute(f"GRANT {privilege} ON {s} TO {grantee}{option}")
        cols = [c for c in self.columns(tx, target) if not c.generated]
        names = ", ".join(quote_ident(c.name) for c in cols)
        cur.execute(f"INSERT INTO {s} ({names}) OVERRIDING SYSTEM VALUE SELECT {names} FROM {t}")
        cur.execute(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attidentity <> '' "
            "AND NOT a.attisdropped",
            (t,),
        )
        for (col,) in cur.fetchall():
            cur.execute(
                "SELECT pg_get_serial_sequence(%s, %s), pg_get_serial_sequence(%s, %s)", (t, col, s, col)
            )
            theirs, ours = cur.fetchone()
            cur.execute(f"SELECT last_value, is_called FROM {theirs}")
            last, called = cur.fetchone()
            cur.execute("SELECT setval(%s, %s, %s)", (ours, last, called))
        cur.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass(%s) "
            "AND contype = 'f' ORDER BY conname",
            (t,),
        )
        for conname, definition in cur.fetchall():
            cur.execute(f"ALTER TABLE {s} ADD CONSTRAINT {quote_ident(conname)} {definition}")

    def column_type(self, kind: pa.DataType) -> str:
        return pg_type(kind)

    def fingerprint(self, tx: Tx, name: TableName) -> tuple[int, str]:
        """Row count and the sum of a 64-bit hash of every row's text: equal iff (almost surely) same rows."""
        tx.cur.execute(
            f"SELECT count(*), coalesce(sum(hashtextextended(rewind_fp::text, 0)), 0)::text "
            f"FROM {name.sql} AS rewind_fp"
        )
        rows, total = tx.cur.fetchone()
        return int(rows), f"{rows}:{total}"

    def lock_share(self, tx: Tx, name: TableName) -> None:
        tx.cur.execute(f"LOCK TABLE {name.sql} IN SHARE MODE")

    def lock_timeout(self, tx: Tx, seconds: float) -> None:
        tx.cur.execute(f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'")

    def lock_exclusive(self, tx: Tx, *names: TableName) -> tuple[float, float]:
        asked = time.perf_counter()
        tx.cur.execute(f"LOCK TABLE {', '.join(n.sql for n in names)} IN ACCESS EXCLUSIVE MODE")
        return asked, time.perf_counter()

    def _indexes(self, tx: Tx, name: TableName) -> dict[tuple[bool, str], list[str]]:
        tx.cur.execute(
            "SELECT c.relname, i.indisunique, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s) ORDER BY c.relname",
            (name.sql,),
        )
        out: dict[tuple[bool, str], list[str]] = {}
        for relname, unique, definition in tx.cur.fetchall():
            out.setdefault((bool(unique), definition.split(" USING ", 1)[-1]), []).append(relname)
        return out

    def run_all(self, tx: Tx, statements: list[str]) -> None:
        if statements:
            tx.cur.execute("; ".join(statements))  # one round trip while readers wait

    def index_swap_sql(self, tx: Tx, a: TableName, b: TableName, tag: str) -> list[str]:
        """Exchange the names of matching indexes of ``a`` and ``b`` (and so of their constraints)."""
        ia, ib = self._indexes(tx, a), self._indexes(tx, b)
        if set(ia) != set(ib) or any(len(ia[k]) != len(ib[k]) for k in ia):
            raise SqlSinkError(
                f"the indexes of {a} and {b} differ (an index was added or dropped since the run started); "
                "make them equal or start a new run"
            )
        out: list[str] = []
        for key in sorted(ia):
            for name_a, name_b in zip(ia[key], ib[key], strict=True):
                if name_a == name_b:
                    continue
                tmp = short_ident(f"rewind_swap_{tag}", f"_{len(out)}")
                out += [
                    f"ALTER INDEX {a.sibling(name_a).sql} RENAME TO {quote_ident(tmp)}",
                    f"ALTER INDEX {b.sibling(name_b).sql} RENAME TO {quote_ident(name_a)}",
                    f"ALTER INDEX {a.sibling(tmp).sql} RENAME TO {quote_ident(name_b)}",
                ]
        return out

    def key_index_sql(self, tx: Tx, where: TableName, old_table: str, new_table: str) -> list[str]:
        old = where.sibling(key_index_name(old_table))
        if not self.exists(tx, old):
            return []
        return [f"ALTER INDEX {old.sql} RENAME TO {quote_ident(key_index_name(new_table))}"]

    def drop(self, tx: Tx, name: TableName) -> None:
        """Drop ``name``; sequences it owns that other tables still use are handed over first."""
        tx.cur.execute(
            "SELECT s.oid::regclass::text, d.adrelid::regclass::text, a.attname "
            "FROM pg_depend o JOIN pg_class s ON s.oid = o.objid AND s.relkind = 'S' "
            "JOIN pg_depend u ON u.refobjid = s.oid AND u.classid = 'pg_attrdef'::regclass "
            "JOIN pg_attrdef d ON d.oid = u.objid "
            "JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
            "WHERE o.refobjid = to_regclass(%s) AND o.deptype = 'a' AND d.adrelid <> to_regclass(%s)",
            (name.sql, name.sql),
        )
        for seq, table, column in tx.cur.fetchall():
            tx.cur.execute(f"ALTER SEQUENCE {seq} OWNED BY {table}.{quote_ident(column)}")
        tx.cur.execute(f"DROP TABLE {name.sql}")

    def is_lock_timeout(self, exc: BaseException) -> bool:
        # lazy: avoids psycopg at import
        import psycopg.errors

        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, psycopg.errors.LockNotAvailable):
                return True
            seen = seen.__cause__ or getattr(seen, "orig", None)
        return False

    def _copy_in(self, tx: Tx, table: str, columns: list[str], files: list[str]) -> int:
        names = ", ".join(quote_ident(c) for c in columns)
        rows = 0

        def chunks() -> Iterator[tuple[int, bytes]]:
            for batch in read_batches(files, columns):
                yield batch.num_rows, to_csv(batch)

        with tx.cur.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT csv)") as copy:
            for n, data in prefetched(chunks()):
                copy.write(data)
                rows += n
        return rows

    def copy_direct(self, tx: Tx, staging: TableName, columns: list[str], files: list[str]) -> int | None:
        """COPY straight into staging; None (and nothing written) when a row conflicts."""
        # lazy: avoids psycopg at import
        import psycopg.errors

        tx.cur.execute("SAVEPOINT rewind_direct")
        try:
            rows = self._copy_in(tx, staging.sql, columns, files)
        except psycopg.errors.UniqueViolation:
            tx.cur.execute("ROLLBACK TO SAVEPOINT rewind_direct")
            return None
        tx.cur.execute("RELEASE SAVEPOINT rewind_direct")
        return rows

    def copy_upsert(
        self,
        tx: Tx,
        staging: TableName,
        columns: list[str],
        files: list[str],
        conflict: list[str],
        mode: Mode,
        dedupe: bool,
        ordered: bool = False,
    ) -> int:
        """COPY into a temporary table, then one INSERT ... SELECT ... ON CONFLICT into staging.

        ``ordered``: rows go in key order, so concurrent loads (tasks) lock shared keys in the
        same order and rarely deadlock."""
        names = ", ".join(quote_ident(c) for c in columns)
        load = quote_ident("rewind_load")
        tx.cur.execute(
            f"CREATE TEMP TABLE {load} ON COMMIT DROP AS SELECT {names} FROM {staging.sql} WITH NO DATA"
        )
        rows = self._copy_in(tx, load, columns, files)
        if dedupe:
            keys = ", ".join(quote_ident(c) for c in conflict)
            ts, part, off, eid = (quote_ident(c) for c in ORDER_COLS)
            select = (
                f"SELECT DISTINCT ON ({keys}) {names} FROM {load} ORDER BY {keys}, "
                f"COALESCE({ts}, '-infinity') DESC, {part} DESC, {off} DESC, {eid} DESC"
            )
        else:
            order = f" ORDER BY {', '.join(quote_ident(c) for c in conflict)}" if ordered else ""
            select = f"SELECT {names} FROM {load}{order}"
        on_conflict = conflict_sql("rewind_t", columns, conflict, mode, sqlite=False)
        tx.cur.execute(f"INSERT INTO {staging.sql} AS rewind_t ({names}) {select} {on_conflict}")
        tx.cur.execute(f"DROP TABLE {load}")
        return rows

    def read_arrow(self, tx: Tx, name: TableName, join: str = "") -> pa.Table:
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.csv as pcsv

        cols = self.columns(tx, name)
        exprs, read_types, final_types = [], {}, []
        for c in cols:
            t = arrow_of(c.type, "postgres")
            final_types.append(pa.field(c.name, t))
            if pa.types.is_timestamp(t):
                exprs.append(f"(extract(epoch FROM {quote_ident(c.name)}) * 1000000)::bigint")
                read_types[c.name] = pa.int64()
            elif pa.types.is_binary(t):
                exprs.append(f"encode({quote_ident(c.name)}, 'hex')")
                read_types[c.name] = pa.string()
            else:
                exprs.append(quote_ident(c.name))
                read_types[c.name] = t
        buf = io.BytesIO()
        query = f"SELECT {', '.join(exprs)} FROM {name.sql}{join}"
        with tx.cur.copy(f"COPY ({query}) TO STDOUT (FORMAT csv)") as copy:
            for data in copy:
                buf.write(data)
        names = [c.name for c in cols]
        if buf.tell() == 0:
            return pa.schema(final_types).empty_table()
        buf.seek(0)
        table = pcsv.read_csv(
            buf,
            read_options=pcsv.ReadOptions(column_names=names, block_size=1 << 24),
            convert_options=pcsv.ConvertOptions(
                column_types=read_types,
                true_values=["t"],
                false_values=["f"],
                null_values=[""],  # COPY's NULL: not 'null', 'NaN', 'N/A' (text and numbers)
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,  # '' is an empty string
            ),
        )
        arrays = []
        for field in final_types:
            col = table.column(field.name)
            if pa.types.is_binary(field.type):
                col = pa.array(
                    [None if v is None else bytes.fromhex(v) for v in col.to_pylist()], pa.binary()
                )
            else:
                col = col.cast(field.type)
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=pa.schema(final_types))

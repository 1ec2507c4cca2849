"""User translate functions: loading ``module.path:callable``, calling it, learning its output.

The contract (docs/design-backfill.md): the function gets a pandas frame of decoded events,
one row per source record, and returns a frame of output rows that each carry the
``_rewind_row`` of their source record, or a :class:`TranslateResult` with explicit rejects.
A record the function raises on is quarantined (stage ``translate-error``) after a retry
that isolates it (halves, down to single records); the rest of the batch goes through.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from rewind.core.columns import INPUT_COLUMNS, ROW, ROW_INDEX
from rewind.translate.columns import user_columns
from rewind.translate.exceptions import OutputSchemaUnknown, TranslateLoadError, TranslateOutputError
from rewind.translate.failures import Failure

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

log = logging.getLogger(__name__)

REJECT_DEFAULT_REASON = "rejected by translate (no reason given)"
MAX_REASON_CHARS = 1000


@dataclass(frozen=True)
class TranslateResult:
    """Output rows plus records the function rejects on purpose.

    ``rejects`` has ``_rewind_row`` (or the input's index) and ``reason``; each rejected record
    is quarantined with stage ``translate-reject``. A record both rejected and present in
    ``rows`` is rejected: its rows are dropped (the quarantine keeps the whole source record).
    """

    rows: pd.DataFrame
    rejects: pd.DataFrame | None = None


Translator = Callable[["pd.DataFrame"], Union["pd.DataFrame", TranslateResult]]


def load_callable(reference: str, field: str = "translate.function") -> Callable[..., Any]:
    """Import ``module.path:callable`` (the attribute may be dotted: ``mod:Class.method``).

    Every failure is a one-line :class:`TranslateLoadError` naming the setting, the reference
    and what to check; the import error is chained.
    """
    module_name, sep, attr_path = reference.partition(":")
    module_name, attr_path = module_name.strip(), attr_path.strip()
    if not sep or not module_name or not attr_path:
        raise TranslateLoadError(
            f"{field} {reference!r}: expected 'module.path:callable' (for example my_pkg.orders:to_rows)",
            reference=reference,
        )
    where = f"{field} {reference}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise TranslateLoadError(
                f"{where}: module {module_name} not found ({e}); check the name and that it is installed "
                "where Spark runs",
                reference=reference,
            ) from e
        raise TranslateLoadError(
            f"{where}: importing module {module_name} failed ({e}); install what it imports where Spark runs",
            reference=reference,
        ) from e
    except Exception as e:
        raise TranslateLoadError(
            f"{where}: importing module {module_name} raised {type(e).__name__}: {e}", reference=reference
        ) from e
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise TranslateLoadError(
                f"{where}: module {module_name} has no attribute {attr_path}; check the name after ':'",
                reference=reference,
            ) from e
    if not callable(obj):
        raise TranslateLoadError(
            f"{where}: {module_name}.{attr_path} is not callable (it is a {type(obj).__name__})",
            reference=reference,
        )
    return obj


def describe(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function, for messages."""
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module}:{name}"


def _exception_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _with_row_ids(frame: Any, known: np.ndarray, what: str, fn_name: str) -> pd.DataFrame:
    """``frame`` with an int64 ``_rewind_row`` column whose values are all ``known`` row ids."""
    # lazy: avoids numpy, pandas at import
    import numpy as np
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TranslateOutputError(
            f"translate.function {fn_name}: its {what} are a {type(frame).__name__}, "
            "expected a pandas DataFrame"
        )
    if ROW in frame.columns:
        ids = frame[ROW]
        if ids.isna().any():
            raise TranslateOutputError(
                f"translate.function {fn_name}: some of its {what} have a null {ROW}; every row must keep "
                f"the {ROW} of the record it came from"
            )
        try:
            values = ids.to_numpy(dtype=np.int64)
        except (TypeError, ValueError) as e:
            raise TranslateOutputError(
                f"translate.function {fn_name}: the {ROW} of its {what} is not an integer column "
                f"({ids.dtype})"
            ) from e
        if frame[ROW].dtype != np.int64:
            frame = frame.assign(**{ROW: values})
    elif frame.index.name == ROW_INDEX:
        values = frame.index.to_numpy(dtype=np.int64)
        frame = frame.assign(**{ROW: values})
    else:
        raise TranslateOutputError(
            f"translate.function {fn_name}: its {what} have no {ROW} column and their index is not the "
            f"input's; keep {ROW} in the frames it returns (merges and reset_index drop the index)"
        )
    unknown = values[~np.isin(values, known)]
    if len(unknown):
        raise TranslateOutputError(
            f"translate.function {fn_name}: its {what} carry {ROW} values that are not in its input "
            f"(for example {int(unknown[0])}); copy {ROW} from the input row each output row comes from"
        )
    return frame


def _normalise(out: Any, known: np.ndarray, fn_name: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Rows and rejects of a translate result, checked against the ``known`` input row ids."""
    # lazy: avoids pandas at import
    import pandas as pd

    if isinstance(out, TranslateResult):
        rows, rejects = out.rows, out.rejects
    elif isinstance(out, pd.DataFrame):
        rows, rejects = out, None
    elif out is None:
        raise TranslateOutputError(
            f"translate.function {fn_name} returned None; return the output frame (a function that changes "
            "df in place must still return it)"
        )
    else:
        raise TranslateOutputError(
            f"translate.function {fn_name} returned a {type(out).__name__}; expected a pandas DataFrame "
            "or a TranslateResult"
        )
    rows = _with_row_ids(rows, known, "rows", fn_name)
    if rejects is not None:
        rejects = _with_row_ids(rejects, known, "rejects", fn_name)
        if "reason" not in rejects.columns:
            raise TranslateOutputError(
                f"translate.function {fn_name}: its rejects have no 'reason' column; say why each record "
                "is rejected"
            )
    return rows, rejects


def _reject_failures(rejects: pd.DataFrame | None) -> list[Failure]:
    if rejects is None or rejects.empty:
        return []
    firsts = rejects.drop_duplicates(ROW, keep="first")
    out: list[Failure] = []
    for row, reason in zip(firsts[ROW].tolist(), firsts["reason"].tolist(), strict=True):
        text = REJECT_DEFAULT_REASON if reason is None or reason != reason else str(reason)  # NaN != NaN
        if len(text) > MAX_REASON_CHARS:
            text = text[: MAX_REASON_CHARS - 3] + "..."
        out.append(Failure(int(row), "translate-reject", text, text[:80]))
    return out


def apply_translate(
    fn: Translator,
    events: pd.DataFrame,
    name: str | None = None,
    retry_events: Callable[[], pd.DataFrame] | None = None,
) -> tuple[pd.DataFrame, list[Failure], list[Failure]]:
    """Run ``fn`` on a frame of events: ``(rows, rejects, errors)``.

    ``rows`` carry an int64 ``_rewind_row`` and hold no row of a rejected or failed record;
    ``rejects`` are failures with stage ``translate-reject`` (one per record); ``errors`` are the
    records on which ``fn`` raised even alone (stage ``translate-error``, the exception type and
    message as reason).

    A function may change its input in place and then raise; the retry must
    not see those changes. So ``fn`` gets a copy of ``events``, unless ``retry_events`` is
    given: then ``fn`` gets ``events`` itself and a retry starts from ``retry_events()`` (the
    batch decoded again), which saves a copy of every batch on the path that never raises.

    A result that breaks the contract (not a frame, rows without ``_rewind_row``, row ids that
    are not in the input) raises :class:`TranslateOutputError`: that is a bug in the function,
    not bad data, and it fails the task.
    """
    # lazy: avoids numpy, pandas at import
    import numpy as np
    import pandas as pd

    fn_name = name or describe(fn)
    known = events[ROW].to_numpy(dtype=np.int64, copy=True)  # before fn can change the frame
    try:
        out = fn(events if retry_events is not None else events.copy())
    except MemoryError:
        raise
    except Exception as e:
        if len(events) == 0:
            log.debug("translate %s raised on an empty frame: %s", fn_name, _exception_text(e))
            return _empty_rows(events), [], []
        log.info(
            "translate %s raised %s on a batch of %d records; retrying in parts down to single records",
            fn_name,
            type(e).__name__,
            len(events),
        )
        return _record_by_record(fn, events if retry_events is None else retry_events(), fn_name)
    rows, rejects_df = _normalise(out, known, fn_name)
    rejects = _reject_failures(rejects_df)
    if rejects:
        rows = rows[~rows[ROW].isin([f.row for f in rejects])]
    if not isinstance(rows, pd.DataFrame):  # pragma: no cover - keeps type checkers honest
        raise TranslateOutputError(f"translate.function {fn_name}: rows are not a frame")
    return rows, rejects, []


def _empty_rows(events: pd.DataFrame) -> pd.DataFrame:
    return events.iloc[0:0].reset_index(drop=True)


def _record_by_record(
    fn: Translator, events: pd.DataFrame, fn_name: str
) -> tuple[pd.DataFrame, list[Failure], list[Failure]]:
    """Retry a batch ``fn`` raised on until every record either went through or raised alone.

    The batch is split in halves, and a half that raises is split again, down to single
    records. For a function that treats records independently this is exactly "record by
    record" (a record is quarantined iff ``fn`` raises on it alone), but it costs about
    2·k·log2(n/k) calls for k bad records among n instead of n calls: one bad record in a
    100,000-record batch is found in ~35 calls, not 100,000.
    """
    # lazy: avoids numpy, pandas at import
    import numpy as np
    import pandas as pd

    kept: list[pd.DataFrame] = []
    rejects: list[Failure] = []
    errors: list[Failure] = []
    calls = 0
    pending: list[tuple[int, int]] = [(len(events) // 2, len(events)), (0, len(events) // 2)]
    while pending:  # depth first, first half first: rows keep the input's order
        start, stop = pending.pop()
        if start >= stop:
            continue
        part = events.iloc[start:stop]
        calls += 1
        try:
            out = fn(part.copy())
        except MemoryError:
            raise
        except Exception as e:
            if stop - start == 1:
                row_id = int(part[ROW].iat[0])
                errors.append(Failure(row_id, "translate-error", _exception_text(e), type(e).__name__))
            else:
                mid = (start + stop) // 2
                pending.extend([(mid, stop), (start, mid)])
            continue
        rows, rejects_df = _normalise(out, part[ROW].to_numpy(dtype=np.int64), fn_name)
        part_rejects = _reject_failures(rejects_df)
        if part_rejects:
            rejects.extend(part_rejects)
            rows = rows[~rows[ROW].isin([f.row for f in part_rejects])]
        if len(rows):
            kept.append(rows)
    if errors:
        log.warning(
            "translate %s raised on %d of %d records (%d calls to isolate them; first: %s)",
            fn_name,
            len(errors),
            len(events),
            calls,
            errors[0].reason,
        )
    if not kept:
        return _empty_rows(events), rejects, errors
    return pd.concat(kept, ignore_index=True), rejects, errors


@dataclass(frozen=True)
class OutputSchema:
    """The output columns of a translate function as learnt from an empty frame.

    ``types`` maps each column to its Arrow type, or None where an empty frame cannot tell
    (a Python-object column: strings, dicts, mixed values).
    """

    columns: tuple[str, ...]
    types: Mapping[str, pa.DataType | None]

    @property
    def unknown(self) -> tuple[str, ...]:
        """Columns whose type could not be learnt."""
        return tuple(c for c in self.columns if self.types.get(c) is None)

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema; raises :class:`OutputSchemaUnknown` if a column's type is unknown."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if self.unknown:
            raise OutputSchemaUnknown(
                f"the type of output column(s) {', '.join(self.unknown)} cannot be learnt from an empty "
                "frame (object columns); give them in translate.output_schema"
            )
        return pa.schema([pa.field(c, self.types[c]) for c in self.columns])


def _sample_frame(sample: pd.DataFrame | Mapping[str, Any]) -> pd.DataFrame:
    """An empty events frame: the sample's columns plus any input column it lacks."""
    # lazy: avoids numpy, pandas at import
    import numpy as np
    import pandas as pd

    if isinstance(sample, pd.DataFrame):
        frame = sample.iloc[0:0].copy()
    else:
        frame = pd.DataFrame(
            {
                name: pd.Series([], dtype=dtype if dtype is not None else object)
                for name, dtype in sample.items()
            }
        )
    input_dtypes: dict[str, Any] = {
        ROW: "int64",
        "_src_topic": object,
        "_src_partition": "int32",
        "_src_offset": "int64",
        "_src_timestamp": "datetime64[us, UTC]",
        "_src_key": object,
    }
    for name in INPUT_COLUMNS:
        if name not in frame.columns:
            frame[name] = pd.Series([], dtype=input_dtypes[name])
    frame.index = pd.Index(np.empty(0, dtype=np.int64), name=ROW_INDEX)
    return frame


def infer_output_schema(
    fn: Translator, sample_columns: pd.DataFrame | Mapping[str, Any], name: str | None = None
) -> OutputSchema:
    """Learn ``fn``'s output columns by calling it on an empty frame of the decoded columns.

    ``sample_columns`` is an (empty or not) events frame, for example a decoder's
    ``empty_events()``, or a mapping of decoded column → pandas dtype. Raises
    :class:`OutputSchemaUnknown` when the function cannot run on an empty frame (then the
    spec must give ``translate.output_schema``) and :class:`TranslateOutputError` when what it
    returns breaks the contract.
    """
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    fn_name = name or describe(fn)
    frame = _sample_frame(sample_columns)
    try:
        out = fn(frame.copy())
    except Exception as e:
        cols = ", ".join(str(c) for c in frame.columns if c not in INPUT_COLUMNS) or "no decoded columns"
        raise OutputSchemaUnknown(
            f"translate.function {fn_name}: cannot learn its output columns: it raised "
            f"{_exception_text(e)} on an empty frame ({cols}); give translate.output_schema"
        ) from e
    rows, _ = _normalise(out, frame[ROW].to_numpy(dtype="int64"), fn_name)
    names = user_columns(rows.columns)
    try:
        schema = pa.Schema.from_pandas(rows[names], preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise OutputSchemaUnknown(
            f"translate.function {fn_name}: cannot learn its output types ({e}); give translate.output_schema"
        ) from e
    types: dict[str, pa.DataType | None] = {
        f.name: None if pa.types.is_null(f.type) else f.type for f in schema if f.name in names
    }
    return OutputSchema(tuple(names), types)

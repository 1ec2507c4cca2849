"""Which of a run's rows a merge policy has to decide at all.

A row whose key the run writes once and live never wrote is applied whatever the policy
(:mod:`rewind.core.merge`): only the other rows, *contested*, need the sort and the join that
decide between rows. In a repair most keys are uncontested, so finding the contested rows
cheaply and deciding only those is what keeps a merge near the cost of a plain append
(``bench/merge_policy.py``).

Keys become integer codes, equal keys equal codes across the run's and live's arrays: an
integer key without nulls is its own code (sorting and ``numpy.isin`` on int64 are far
cheaper than hashing, measured), anything else goes through Arrow's dictionary encoding of
both arrays at once (nulls are one key, as the decisions' pandas join treats them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


def key_codes(run: pa.Array, live: pa.Array | None) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of ``run``'s and ``live``'s keys (equal keys, equal codes)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    live = live if live is not None else pa.array([], run.type)
    if isinstance(run, pa.ChunkedArray):
        run = run.combine_chunks()
    if isinstance(live, pa.ChunkedArray):
        live = live.combine_chunks()
    if live.type != run.type:
        live = live.cast(run.type)
    if pa.types.is_integer(run.type) and not run.null_count and not live.null_count:
        return run.to_numpy().astype(np.int64, copy=False), live.to_numpy().astype(np.int64, copy=False)
    both = pc.dictionary_encode(pa.concat_arrays([run, live]), null_encoding="encode")
    codes = both.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return codes[: len(run)], codes[len(run) :]


def repeated(codes: np.ndarray) -> np.ndarray:
    """A mask of the codes that occur more than once."""
    # lazy: avoids numpy at import
    import numpy as np

    ordered = np.sort(codes, kind="stable")
    twice = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(twice):
        return np.zeros(len(codes), dtype=bool)
    return np.isin(codes, np.unique(twice))


def contested(run: np.ndarray, live: np.ndarray) -> np.ndarray:
    """A mask of the run's rows the policy must decide: their key is written twice by the run,
    or live holds it."""
    # lazy: avoids numpy at import
    import numpy as np

    mask = repeated(run)
    if len(live):
        mask |= np.isin(run, live)
    return mask


def key_range(keys: pa.Array) -> tuple[Any, Any] | None:
    """The smallest and largest key, for pruning files by their column bounds (None when the
    keys are empty, all null, or of a type whose bounds are not compared)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (
        pa.types.is_integer(keys.type) or pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)
    ):
        return None
    found = pc.min_max(keys)
    low, high = found["min"].as_py(), found["max"].as_py()
    return None if low is None else (low, high)

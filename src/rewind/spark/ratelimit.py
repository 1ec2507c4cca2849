"""Job-wide rate limits for Spark tasks that run in separate Python processes.

A backfill must not flood the cluster it writes to, so Rewind caps a whole write at
``maxRecordsPerSecond`` and/or ``maxBytesPerSecond``. Spark runs each task in its own
Python worker process and tells a task nothing about the others, so the cap has to be
shared outside Python memory. Two pacers do that:

* :class:`SharedFilePacer` (the default): one pacing state per job in a small file, updated
  under an exclusive ``fcntl`` lock by every task on the host. The whole job gets exactly
  the limit, however many tasks run at once and however unevenly they finish. It is
  correct only when every task of the job runs on one host, i.e. Spark's ``local[*]``
  master (Rewind's default) or a directory all hosts share with working ``flock``. On
  other masters a job's read is paced by the driver instead (:mod:`rewind.spark.pace_server`).
* :class:`LocalPacer`: the limit divided by a task count the caller knows (the
  ``numTasks`` option, e.g. the number of input partitions). Never exceeds the limit on
  any cluster, because at most ``numTasks`` tasks exist; it under-uses the limit when
  fewer tasks run at once than exist (8 partitions on 2 cores get a quarter of it).

Both implement the same algorithm, a virtual-time scheduler (GCRA, the "leaky bucket as
a meter"): the state holds, per dimension, the earliest time the next unit may go out. A
task asking to send ``n`` records of ``b`` bytes gets the start time
``T = max(now, next_records, next_bytes)``, pushes the state forward to
``T + n / records_rate`` and ``T + b / bytes_rate``, then waits until ``T``. Idle time is
never banked, so there is no burst after a pause. Over any interval of ``D`` seconds at most
``rate * D`` plus one chunk per concurrently running task goes out; callers keep chunks at
about 1/20 s of the rate, so over a run of a few seconds the overshoot stays within a few
per cent. The clock is ``time.monotonic()``, which on Linux and macOS is one system-wide
clock shared by all processes of the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

CHUNK_SECONDS = 0.05
"""Callers send at most this many seconds' worth of the rate per acquisition."""

_STATE = struct.Struct("<dd")  # next free time for records, next free time for bytes


@dataclass(frozen=True)
class RateLimit:
    """A cap in records and/or bytes per second; ``None`` leaves a dimension unlimited."""

    records_per_second: float | None = None
    bytes_per_second: float | None = None

    def __post_init__(self) -> None:
        for name, value in (
            ("records_per_second", self.records_per_second),
            ("bytes_per_second", self.bytes_per_second),
        ):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, got {value!r}")

    @property
    def unlimited(self) -> bool:
        return self.records_per_second is None and self.bytes_per_second is None

    def share(self, parts: int) -> RateLimit:
        """The limit of one of ``parts`` equal shares."""
        if parts <= 0:
            raise ValueError("parts must be positive")
        return RateLimit(
            None if self.records_per_second is None else self.records_per_second / parts,
            None if self.bytes_per_second is None else self.bytes_per_second / parts,
        )

    def chunk_rows(self, avg_row_bytes: float) -> int:
        """How many rows of the given average size make one chunk of ``CHUNK_SECONDS``."""
        rows = math.inf
        if self.records_per_second is not None:
            rows = self.records_per_second * CHUNK_SECONDS
        if self.bytes_per_second is not None and avg_row_bytes > 0:
            rows = min(rows, self.bytes_per_second * CHUNK_SECONDS / avg_row_bytes)
        if rows == math.inf:
            return 1 << 30
        return max(1, int(rows))


class Pacer(Protocol):
    """Paces one task's sends against a (possibly shared) limit."""

    def acquire(self, records: int, nbytes: int, wait: Callable[[float], None]) -> float:
        """Reserve a slot for ``records``/``nbytes`` and block (via ``wait``) until it starts.

        ``wait(seconds)`` does the sleeping, so a producer can serve its callbacks while
        it waits. Returns the seconds waited.
        """
        ...


def reserve(
    limit: RateLimit, state: tuple[float, float], now: float, records: int, nbytes: int
) -> tuple[float, tuple[float, float]]:
    """One GCRA step: the start time of this send and the new state."""
    next_records, next_bytes = state
    start = max(now, next_records, next_bytes)
    if limit.records_per_second is not None:
        next_records = start + records / limit.records_per_second
    if limit.bytes_per_second is not None:
        next_bytes = start + nbytes / limit.bytes_per_second
    return start, (next_records, next_bytes)


def wait_until(
    start: float, wait: Callable[[float], None], clock: Callable[[], float] = time.monotonic
) -> float:
    begun = clock()
    remaining = start - begun
    while remaining > 0:
        wait(remaining)
        remaining = start - clock()
    return clock() - begun


class LocalPacer:
    """A pacer whose state lives in this process (one task's share of a job's limit)."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._state = (0.0, 0.0)
        self._lock = threading.Lock()

    def acquire(self, records: int, nbytes: int, wait: Callable[[float], None]) -> float:
        with self._lock:
            start, self._state = reserve(self.limit, self._state, self.clock(), records, nbytes)
        return wait_until(start, wait, self.clock)


class SharedFilePacer:
    """A pacer whose state is a file shared by every process of the job on this host.

    The file holds two doubles and is read and rewritten under ``flock``; a lock is held
    for a few microseconds per chunk, so contention is negligible next to producing.
    """

    def __init__(self, limit: RateLimit, path: Path) -> None:
        self.limit = limit
        self.path = path

    def acquire(self, records: int, nbytes: int, wait: Callable[[float], None]) -> float:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, _STATE.size, 0)
            state = _STATE.unpack(raw) if len(raw) == _STATE.size else (0.0, 0.0)
            start, state = reserve(self.limit, state, time.monotonic(), records, nbytes)
            os.pwrite(fd, _STATE.pack(*state), 0)
        finally:
            os.close(fd)  # closing releases the lock
        return wait_until(start, wait)


def default_state_dir() -> Path:
    """Where shared pacing files live unless the job names a directory."""
    return Path(tempfile.gettempdir()) / "rewind-ratelimit"


def shared_state_path(directory: Path, job_id: str) -> Path:
    """The pacing file of one job, creating its directory."""
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{job_id}.pace"


def remove_shared_state(directory: Path, job_id: str) -> None:
    """Forget a finished job's pacing state (best effort: a leftover file is 16 bytes)."""
    with contextlib.suppress(OSError):
        (directory / f"{job_id}.pace").unlink()

"""Records read so far, from the Spark tasks of a wave to the driver, while the wave runs.

Spark tells the driver how many tasks finished, never how far a running task got, and a wave
of a backfill is one Spark job whose tasks may each read for minutes. So the tasks report
their own running count of records read, about once a second, as UDP datagrams to a small
listener the driver opens for the run (:func:`open_listener`):

* a datagram is JSON ``{"c": channel, "r": [[unit id, split, attempt, records], ...]}``; the
  channel is random per run, so datagrams of another run or of a stray sender are dropped;
* counts are cumulative, never deltas: a lost or reordered datagram only leaves a stale
  number until the next one. ``split`` is the Spark partition (an archive unit may be read by
  several tasks, whose counts add up); a retried task (a higher ``attempt``) replaces the
  count of the attempt that failed; a unit never counts more than its offsets;
* sending never blocks and never raises: an unreachable driver, a full buffer or a firewall
  only leaves the driver with the counts it had. These numbers are for people and metrics
  only; what a wave commits comes from its tasks' results.

Where the tasks send: on a ``local`` master, the loopback (under Spark Connect too, when the
server is on this host: ``sc://127.0.0.1``). On a cluster, the driver's host as Spark knows it
(``spark.driver.host``), with the listener on ``spark.driver.bindAddress`` (or every
interface) and a port the system picks: executors must be able to send UDP to the driver, as
they already reach it over TCP. Under Spark Connect on another host the client is not the
driver; its host name is the best guess, and when the tasks cannot reach it the counts move
only when a wave commits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rewind.spark.topology import is_connect, tasks_on_this_host

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REPORT_EVERY_S = 1.0
"""A task sends its counts at most this often (and once more when it ends)."""

ENTRIES_PER_DATAGRAM = 16
"""Units per datagram: about 1.5 kB, under a typical network MTU."""

PROGRESS_OPTION = "progressTo"
"""The ``rewind-kafka`` read option that carries :meth:`ProgressAddress.to_json`."""


@dataclass(frozen=True)
class ProgressAddress:
    """Where the tasks of a run send their counts: plain data, pickled to every task."""

    host: str
    port: int
    channel: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProgressAddress:
        data = json.loads(text)
        return cls(str(data["host"]), int(data["port"]), str(data["channel"]))


class TaskReporter:
    """The sending side, inside one Spark task: ``add`` counts, a datagram goes out about
    once a second, ``close`` sends the last counts. Never raises, never blocks."""

    def __init__(self, address: ProgressAddress | None, every_s: float = REPORT_EVERY_S) -> None:
        self.address = address
        self.every_s = every_s
        self.counts: dict[str, int] = {}
        self._sock: socket.socket | None = None
        self._target: Any = None
        self._last = 0.0
        self.split, self.attempt = _task_identity()
        if address is not None:
            with contextlib.suppress(OSError, UnicodeError):
                family, _type, _proto, _name, target = socket.getaddrinfo(
                    address.host, address.port, type=socket.SOCK_DGRAM
                )[0]
                sock = socket.socket(family, socket.SOCK_DGRAM)
                sock.setblocking(False)
                self._sock, self._target = sock, target

    def add(self, unit_id: str, records: int) -> None:
        if self._sock is None or records <= 0:
            return
        self.counts[unit_id] = self.counts.get(unit_id, 0) + records
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.send()

    def send(self) -> None:
        if self._sock is None or not self.counts or self.address is None:
            return
        entries = [[uid, self.split, self.attempt, n] for uid, n in self.counts.items()]
        for i in range(0, len(entries), ENTRIES_PER_DATAGRAM):
            body = {"c": self.address.channel, "r": entries[i : i + ENTRIES_PER_DATAGRAM]}
            with contextlib.suppress(OSError):  # a progress report never fails a task
                self._sock.sendto(json.dumps(body).encode(), self._target)

    def close(self) -> None:
        if self._sock is not None:
            self.send()
            self._sock.close()
            self._sock = None

    def __enter__(self) -> TaskReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _task_identity() -> tuple[str, int]:
    """(Spark partition, attempt number) of the running task; outside Spark a unique split."""
    try:
        # lazy: avoids pyspark at import
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except Exception:  # pyspark missing or not in a task
        ctx = None
    if ctx is None:
        return f"x-{secrets.token_hex(4)}", 0
    return str(ctx.partitionId()), int(ctx.attemptNumber())


class InFlightCounts:
    """The counts of the datagrams of one channel: per unit and split, the latest attempt's
    highest count (thread-safe; the listener's thread writes, the driver reads)."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._units: dict[str, dict[str, tuple[int, int]]] = {}
        self.received = 0
        self.dropped = 0

    def take(self, data: bytes) -> None:
        """Keep one datagram's counts (a malformed or foreign one is counted and dropped)."""
        try:
            body = json.loads(data)
            if body.get("c") != self.channel:
                raise ValueError("another channel")
            entries = [(str(u), str(s), int(a), int(n)) for u, s, a, n in body["r"]]
        except (ValueError, TypeError, KeyError, AttributeError):
            with self._lock:
                self.dropped += 1
            return
        with self._lock:
            self.received += 1
            for unit_id, split, attempt, records in entries:
                splits = self._units.setdefault(unit_id, {})
                seen = splits.get(split)
                if seen is None or attempt > seen[0] or (attempt == seen[0] and records > seen[1]):
                    splits[split] = (attempt, records)

    def records(self, sizes: Mapping[str, int]) -> int:
        """Records read so far of the units ``sizes`` names (unit id -> offsets), each capped."""
        with self._lock:
            read = {uid: sum(n for _a, n in self._units.get(uid, {}).values()) for uid in sizes}
        return sum(min(size, read[uid]) for uid, size in sizes.items())

    def forget(self, unit_ids: list[str]) -> None:
        """Drop the counts of units whose wave ended (their committed counts take over)."""
        with self._lock:
            for uid in unit_ids:
                self._units.pop(uid, None)


class ProgressListener:
    """The driver's side: a UDP socket and a daemon thread that keeps the latest counts in
    :attr:`counts`, which the driver reads from any thread."""

    POLL_S = 0.25
    """How long the thread waits for a datagram before it looks whether it was closed."""

    def __init__(self, bind_host: str, advertise_host: str) -> None:
        family, _type, _proto, _name, where = socket.getaddrinfo(bind_host, 0, type=socket.SOCK_DGRAM)[0]
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.bind(where)
        self._sock.settimeout(self.POLL_S)
        port = int(self._sock.getsockname()[1])
        self.address = ProgressAddress(advertise_host, port, secrets.token_hex(16))
        self.counts = InFlightCounts(self.address.channel)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rewind-progress-listener", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                data, _sender = self._sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:  # closed under us
                return
            if self._closed.is_set():  # the wake-up of close()
                return
            self.counts.take(data)

    def close(self) -> None:
        """Stop the thread and close the socket. The thread is woken by an empty datagram: a
        socket closed under a waiting ``recvfrom`` does not wake it, and waiting out its poll
        cost every run ~0.2 s at its end (a re-produce of 1M rows takes ~3.5 s)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            family, bound = self._sock.family, self._sock.getsockname()
            host, port = str(bound[0]), int(bound[1])
            if host in ("0.0.0.0", "::"):  # bound to every address: any local one reaches it
                host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
            with socket.socket(family, socket.SOCK_DGRAM) as waker:
                waker.sendto(b"", (host, port))
        self._thread.join(timeout=2)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> ProgressListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_listener(spark: SparkSession) -> ProgressListener:
    """A listener the tasks of ``spark`` can reach (see the module docstring for where)."""
    bind, advertise = driver_addresses(spark)
    return ProgressListener(bind, advertise)


def driver_addresses(spark: SparkSession) -> tuple[str, str]:
    """(address to bind, host the tasks send to) for this session's executors."""
    if tasks_on_this_host(spark):  # a local master here, classic or behind a Connect server
        return "127.0.0.1", "127.0.0.1"
    if is_connect(spark):
        return "0.0.0.0", socket.getfqdn()  # the client is not the driver: its name is the best guess
    conf = spark.sparkContext.getConf()
    host = conf.get("spark.driver.host") or socket.getfqdn()
    return conf.get("spark.driver.bindAddress") or "0.0.0.0", host

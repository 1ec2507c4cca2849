"""One rate budget for a whole job on a cluster: the driver paces every task over TCP.

:class:`~rewind.spark.ratelimit.SharedFilePacer` shares a job's limit through a file, which
holds the limit exactly while every task runs on one host (``local[*]``); executors on N hosts
would each get the whole limit. On any other master the driver opens a :class:`PaceServer`
for the wave instead, and the tasks' :class:`RemotePacer` ask it for every chunk they send:

* one TCP connection per task, a request ``(records, bytes)`` and an answer ``delay`` (seconds
  the task waits before sending); the server runs the same virtual-time scheduler (GCRA, see
  :mod:`rewind.spark.ratelimit`) on its own clock, so the job gets the limit however many
  hosts and tasks there are, and however unevenly they finish;
* a request is 24 bytes, one per chunk of ~1/20 s of the rate: about 20 round trips a second
  for a job, whatever its size;
* the first bytes of a connection are the wave's random token, so a stray or old client gets
  its connection closed, never a share of the budget;
* a task that cannot reach the server fails with a line saying so, rather than reading
  unpaced: the limit protects the live cluster, so it fails closed. Executors reach the
  driver over TCP anyway (Spark needs it); the server listens on ``spark.driver.bindAddress``
  (or every interface) at a port the system picks, and tasks connect to
  ``spark.driver.host``, like the progress channel (:mod:`rewind.spark.progress_channel`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewind.spark.progress_channel import driver_addresses
from rewind.spark.ratelimit import RateLimit, reserve, wait_until
from rewind.spark.topology import master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PACE_OPTION = "rateLimitServer"
"""The ``rewind-kafka`` read option that carries :meth:`PaceAddress.to_json`."""

_TOKEN_BYTES = 16
_REQUEST = struct.Struct("<qq")  # records, bytes
_ANSWER = struct.Struct("<d")  # seconds to wait
_CONNECT_TIMEOUT_S = 10.0


class PaceUnreachable(RuntimeError):
    """A task could not reach the driver's rate budget."""


@dataclass(frozen=True)
class PaceAddress:
    """Where a wave's tasks ask for their budget: plain data, pickled to every task."""

    host: str
    port: int
    token: str  # hex

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "port": self.port, "token": self.token})

    @classmethod
    def from_json(cls, text: str) -> PaceAddress:
        data = json.loads(text)
        return cls(str(data["host"]), int(data["port"]), str(data["token"]))


class PaceServer:
    """The driver's side: one GCRA state for the wave, served to every task's connection."""

    def __init__(self, limit: RateLimit, bind: str = "127.0.0.1", advertise: str = "127.0.0.1") -> None:
        self.limit = limit
        self._token = secrets.token_bytes(_TOKEN_BYTES)
        self._state = (0.0, 0.0)
        self._lock = threading.Lock()
        self.grants = 0
        self.clients = 0
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((bind, 0), Handler)
        self.address = PaceAddress(advertise, self._server.server_address[1], self._token.hex())
        # a short poll: closing the server at a wave's end waits for at most one poll
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="rewind-pace", daemon=True
        )
        self._thread.start()

    def grant(self, records: int, nbytes: int, now: float | None = None) -> float:
        """Reserve a slot; the seconds the caller must wait before sending. ``now`` is the
        server's clock reading (``time.monotonic()`` unless given)."""
        with self._lock:
            now = time.monotonic() if now is None else now
            start, self._state = reserve(self.limit, self._state, now, records, nbytes)
            self.grants += 1
        return max(0.0, start - now)

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if _read_exactly(conn, _TOKEN_BYTES) != self._token:
                return  # not this wave's task: no budget, no answer
            with self._lock:
                self.clients += 1
            while True:
                raw = _read_exactly(conn, _REQUEST.size)
                if raw is None:
                    return  # the task is done
                records, nbytes = _REQUEST.unpack(raw)
                conn.sendall(_ANSWER.pack(self.grant(records, nbytes)))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _read_exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class RemotePacer:
    """A task's side: asks the driver's :class:`PaceServer` before every chunk it sends."""

    def __init__(self, address: PaceAddress) -> None:
        self.address = address
        self._conn: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self._conn is None:
            where = f"{self.address.host}:{self.address.port}"
            try:
                conn = socket.create_connection((self.address.host, self.address.port), _CONNECT_TIMEOUT_S)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.sendall(bytes.fromhex(self.address.token))
            except OSError as exc:
                raise PaceUnreachable(
                    f"the job's rate limit is kept by the driver at {where}, which this executor "
                    f"cannot reach ({exc}); executors must reach the driver over TCP "
                    "(spark.driver.host / spark.driver.bindAddress)"
                ) from exc
            self._conn = conn
        return self._conn

    def acquire(self, records: int, nbytes: int, wait: Callable[[float], None]) -> float:
        conn = self._connect()
        error: OSError | None = None
        try:
            conn.sendall(_REQUEST.pack(records, nbytes))
            raw = _read_exactly(conn, _ANSWER.size)
        except OSError as exc:
            raw, error = None, exc
        if raw is None:
            raise PaceUnreachable(
                f"the driver's rate budget at {self.address.host}:{self.address.port} closed the "
                f"connection{f' ({error})' if error else ''}; the wave ended or the driver is gone"
            )
        (delay,) = _ANSWER.unpack(raw)
        return wait_until(time.monotonic() + delay, wait)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None


def needs_pace_server(spark: SparkSession) -> bool:
    """Whether tasks may run on more than one host (any master but ``local``; a Connect
    server's master as its conf says)."""
    return not master(spark).startswith("local")


@contextlib.contextmanager
def pace_server_for(spark: SparkSession, limit: RateLimit | None) -> Iterator[PaceAddress | None]:
    """A budget server for one wave when the limit must span hosts; None otherwise (the tasks
    then share a pacing file on their one host)."""
    if limit is None or limit.unlimited or not needs_pace_server(spark):
        yield None
        return

    bind, advertise = driver_addresses(spark)
    server = PaceServer(limit, bind, advertise)
    try:
        yield server.address
    finally:
        server.close()
        log.info(
            "job-wide rate limit: %d grants to %d tasks from the driver's budget (%s records/s)",
            server.grants,
            server.clients,
            limit.records_per_second,
        )

"""``rewind dev up|down|status``: the embedded stack on loopback.

Parts and where they live (all under the state folder, ``.rewind/`` by default):

* broker — tansu, ``broker.pid`` and ``broker.log``; memory only, so ``down`` loses topics;
* catalog — an Iceberg SQL catalog on SQLite, ``catalog.db`` and ``warehouse/``;
* ledger — the run ledger on SQLite, ``ledger.db``.

``stack.json`` remembers what ``up`` started, so ``down`` stops only that: a broker that
was already listening when ``up`` ran, or a catalog and ledger configured elsewhere, are
left alone. Both commands are idempotent.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from rewind.catalog import load_catalog
from rewind.config import Settings
from rewind.embedded.broker import BrokerProcess, metadata_answers, port_open
from rewind.errors import StackError
from rewind.secrets import mask_url

State = Literal["running", "stopped", "ready", "missing", "external"]


@dataclass
class PartStatus:
    name: str
    state: State
    address: str
    detail: str = ""
    pid: int | None = None
    started_by_rewind: bool = False
    seconds: float | None = None  # how long the last up/down step took


class Stack:
    """The three parts of the embedded stack for one settings object."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dir = settings.state_path
        self.broker = BrokerProcess(
            host=settings.dev.host,
            port=settings.dev.broker_port,
            pid_file=self.dir / "broker.pid",
            log_file=self.dir / "broker.log",
        )
        self._record = self.dir / "stack.json"

    # -- what up started -------------------------------------------------------------------

    def _started(self) -> dict[str, bool]:
        try:
            return dict(json.loads(self._record.read_text()))
        except (OSError, ValueError):
            return {}

    def _remember(self, started: dict[str, bool]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._record.write_text(json.dumps(started, indent=2) + "\n")

    @property
    def _embedded_catalog(self) -> bool:
        return not self.settings.catalog.properties

    @property
    def _embedded_ledger(self) -> bool:
        return self.settings.ledger_url is None

    # -- commands --------------------------------------------------------------------------

    def up(self) -> list[PartStatus]:
        self.dir.mkdir(parents=True, exist_ok=True)
        started = self._started()
        started["catalog"] = self._embedded_catalog
        started["ledger"] = self._embedded_ledger
        try:
            return [self._broker_up(started), self._catalog_up(), self._ledger_up()]
        finally:  # even when a later part fails, `down` must know about the broker it started
            self._remember(started)

    def down(self) -> list[PartStatus]:
        started = self._started()
        parts = []
        t0 = time.monotonic()
        if started.get("broker"):
            self.broker.stop()
            started["broker"] = False
            parts.append(PartStatus("broker", "stopped", self.broker.address,
                                    "stopped (its in-memory topics are gone)",
                                    started_by_rewind=True, seconds=time.monotonic() - t0))
        elif self.broker.pid() is not None or self._external_broker():
            parts.append(PartStatus("broker", "external", self.broker.address,
                                    "not started by rewind dev up; left alone"))
        else:
            parts.append(PartStatus("broker", "stopped", self.broker.address, "not running"))
        # catalog and ledger are files, not processes: their data stays for the next `up`
        for name in ("catalog", "ledger"):
            part = self._file_status(name)
            if part.state == "ready":
                part.detail = "files kept"
            parts.append(part)
        self._remember(started)
        return parts

    def status(self) -> list[PartStatus]:
        started = self._started()
        pid = self.broker.pid()
        answers = metadata_answers(self.broker.address, timeout=1.0) if pid else False
        if pid and answers:
            broker = PartStatus("broker", "running", self.broker.address, "answers metadata",
                                pid=pid, started_by_rewind=bool(started.get("broker")))
        elif pid:
            broker = PartStatus("broker", "running", self.broker.address,
                                "process alive but not answering", pid=pid)
        elif self._external_broker():
            broker = PartStatus("broker", "external", self.broker.address,
                                "answers metadata; not started by rewind dev up")
        else:
            broker = PartStatus("broker", "stopped", self.broker.address)
        return [broker, self._file_status("catalog"), self._file_status("ledger")]

    # -- parts -----------------------------------------------------------------------------

    def _broker_up(self, started: dict[str, bool]) -> PartStatus:
        t0 = time.monotonic()
        pid = self.broker.pid()
        if pid is not None:
            return PartStatus("broker", "running", self.broker.address, "already running",
                              pid=pid, started_by_rewind=bool(started.get("broker")),
                              seconds=time.monotonic() - t0)
        if port_open(self.broker.host, self.broker.port):
            if not self._external_broker():
                raise StackError(
                    f"port {self.broker.address} is in use by a program that does not answer "
                    "Kafka metadata; stop it or choose another dev.broker_port (REWIND_DEV_BROKER_PORT)"
                )
            started["broker"] = False
            return PartStatus("broker", "external", self.broker.address,
                              "a broker already answers here; used as is, `down` leaves it alone",
                              seconds=time.monotonic() - t0)
        pid = self.broker.start(self.settings.dev.broker_start_timeout_s)
        started["broker"] = True
        return PartStatus("broker", "running", self.broker.address, "started", pid=pid,
                          started_by_rewind=True, seconds=time.monotonic() - t0)

    def _external_broker(self) -> bool:
        """True when something not started by us answers Kafka metadata at the broker address."""
        return port_open(self.broker.host, self.broker.port) and metadata_answers(
            self.broker.address, timeout=2.0)

    def _catalog_up(self) -> PartStatus:
        t0 = time.monotonic()
        if self._embedded_catalog:
            (self.dir / "warehouse").mkdir(parents=True, exist_ok=True)
        load_catalog(self.settings)  # the SQL catalog creates its tables on first load
        return PartStatus("catalog", "ready" if self._embedded_catalog else "external",
                          self._address("catalog"), seconds=time.monotonic() - t0)

    def _ledger_up(self) -> PartStatus:
        # lazy: avoids sqlalchemy at import
        from rewind.ledger import connect, ensure_schema

        t0 = time.monotonic()
        engine = connect(self.settings.ledger)
        try:
            version = ensure_schema(engine)
        finally:
            engine.dispose()
        return PartStatus("ledger", "ready" if self._embedded_ledger else "external",
                          self._address("ledger"), f"schema v{version}",
                          seconds=time.monotonic() - t0)

    def _address(self, name: str) -> str:
        if name == "catalog":
            props = self.settings.catalog_properties()
            return mask_url(props.get("uri", props.get("type", "?")))
        return mask_url(self.settings.ledger)

    def _file_status(self, name: str) -> PartStatus:
        embedded = self._embedded_catalog if name == "catalog" else self._embedded_ledger
        if not embedded:
            return PartStatus(name, "external", self._address(name), "configured in settings")
        path = self.dir / ("catalog.db" if name == "catalog" else "ledger.db")
        return PartStatus(name, "ready" if path.exists() else "missing", self._address(name))


def as_dicts(parts: list[PartStatus]) -> list[dict[str, object]]:
    return [asdict(p) for p in parts]


def state_file(settings: Settings, name: str) -> Path:
    return settings.state_path / name

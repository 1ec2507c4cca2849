"""The one emitter interface, and whether lineage is on at all.

Lineage is on only when the user configured an OpenLineage transport the standard way:
``OPENLINEAGE_URL`` (HTTP), any ``OPENLINEAGE__TRANSPORT__*`` variable, ``OPENLINEAGE_CONFIG``
naming a file, or an ``openlineage.yml`` with a ``transport`` in the working directory or
``~/.openlineage``; ``OPENLINEAGE_DISABLED=true`` turns it off again. The client's own fallback
(printing every event to the console when nothing is configured) is never used.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

from rewind.openlineage.datasets import Dataset

log = logging.getLogger(__name__)

EventType = Literal["START", "RUNNING", "COMPLETE", "FAIL", "ABORT"]
Parent = tuple[str, str, str]
"""The parent run: (OpenLineage run id, job namespace, job name)."""


class Emitter(Protocol):
    """Sends one run event; never raises."""

    enabled: bool
    namespace: str

    def emit(
        self,
        event_type: EventType,
        run_id: str,
        job_name: str,
        inputs: Sequence[Dataset],
        outputs: Sequence[Dataset],
        facets: Mapping[str, Any],
        parent: Parent | None = None,
        error: str | None = None,
    ) -> None: ...


class NoEmitter:
    """Lineage off: nothing is built, nothing is sent."""

    enabled = False
    namespace = "rewind"

    def emit(self, *args: Any, **kwargs: Any) -> None:
        return None


NO_EMITTER = NoEmitter()


def job_namespace(env: Mapping[str, str] | None = None) -> str:
    """``OPENLINEAGE_NAMESPACE`` as the integrations read it; default ``rewind``."""
    env = os.environ if env is None else env
    return env.get("OPENLINEAGE_NAMESPACE") or "rewind"


def configured(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> bool:
    """True when the user configured a transport (see the module docstring)."""
    env = os.environ if env is None else env
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OPENLINEAGE_URL") or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in env):
        return True
    if env.get("OPENLINEAGE_CONFIG"):
        return Path(env["OPENLINEAGE_CONFIG"]).is_file()
    for path in ((cwd or Path.cwd()) / "openlineage.yml", Path.home() / ".openlineage" / "openlineage.yml"):
        if path.is_file() and _has_transport(path):
            return True
    return False


def _has_transport(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and isinstance(data.get("transport"), dict)


class ClientEmitter:
    """Events through ``openlineage.client.OpenLineageClient``, configured the client's way."""

    enabled = True

    def __init__(self, namespace: str) -> None:
        # lazy: avoids openlineage at import
        from openlineage.client import OpenLineageClient
        from openlineage.client.facet_v2 import set_producer

        # lazy: avoids openlineage at import
        from rewind.openlineage.facets import PRODUCER

        set_producer(PRODUCER)  # the producer of every facet Rewind builds
        self.namespace = namespace
        self.client = OpenLineageClient()

    def emit(
        self,
        event_type: EventType,
        run_id: str,
        job_name: str,
        inputs: Sequence[Dataset],
        outputs: Sequence[Dataset],
        facets: Mapping[str, Any],
        parent: Parent | None = None,
        error: str | None = None,
    ) -> None:
        """``facets``: the run's facts (command, plan id, fingerprint, transform...), turned into
        run and job facets by :mod:`rewind.openlineage.facets`."""
        try:
            self.client.emit(self.event(event_type, run_id, job_name, inputs, outputs, facets, parent, error))
        except Exception as exc:  # lineage never fails a command
            log.warning("OpenLineage %s event of %s not sent: %s", event_type, job_name, exc)

    def event(
        self,
        event_type: EventType,
        run_id: str,
        job_name: str,
        inputs: Sequence[Dataset],
        outputs: Sequence[Dataset],
        facts: Mapping[str, Any],
        parent: Parent | None,
        error: str | None,
    ) -> Any:
        # lazy: avoids openlineage at import
        from openlineage.client import event_v2

        # lazy: avoids openlineage at import
        from rewind.openlineage import facets as f

        command = str(facts.get("command") or job_name.rsplit(".", 1)[-1])
        return event_v2.RunEvent(
            eventType=event_v2.RunState(event_type),
            eventTime=f.now(),
            producer=f.PRODUCER,
            run=event_v2.Run(runId=run_id, facets=f.run_facets(command, facts, parent, error)),
            job=event_v2.Job(namespace=self.namespace, name=job_name, facets=f.job_facets(command, facts)),
            inputs=[f.input_dataset(d) for d in inputs],
            outputs=[f.output_dataset(d) for d in outputs],
        )

    def close(self) -> None:
        try:
            self.client.close(timeout=10.0)
        except Exception as exc:
            log.warning("OpenLineage transport not closed: %s", exc)


def _config_var(name: str) -> bool:
    # the client aliases OPENLINEAGE_URL into these itself: not the user's configuration
    return name.startswith("OPENLINEAGE") and not name.startswith(
        "OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP"
    )


_lock = threading.Lock()
_emitters: dict[tuple[Any, ...], Emitter] = {}


def get_emitter() -> Emitter:
    """The process's emitter for the current configuration (a changed environment or working
    directory gets a new client); :data:`NO_EMITTER` when lineage is off."""
    if not configured():
        return NO_EMITTER
    key = (str(Path.cwd()), tuple(sorted((k, v) for k, v in os.environ.items() if _config_var(k))))
    with _lock:
        found = _emitters.get(key)
        if found is None:
            try:
                found = ClientEmitter(job_namespace())
            except Exception as exc:  # a bad transport config: said once, then lineage is off
                log.warning("OpenLineage is configured but its client could not start: %s", exc)
                found = NO_EMITTER
            _emitters[key] = found
        return found

"""One OpenLineage run of a Rewind command: START, RUNNING, then COMPLETE, FAIL or ABORT.

A command holds a :class:`LineageRun` (usually through :func:`track`, a context manager that
sends FAIL with the error's one line on an exception and ABORT on Ctrl-C). A run started while
another is the current parent (:func:`as_parent`: a shadow around its history run, a rehearsal
around its steps) carries the ``parent`` facet. With lineage off every method returns at once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from rewind.errors import error_line
from rewind.openlineage.datasets import spec_datasets
from rewind.openlineage.emitter import Emitter, EventType, Parent, get_emitter
from rewind.secrets import mask_text

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.openlineage.datasets import Dataset
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

_PARENT: ContextVar[Parent | None] = ContextVar("rewind_openlineage_parent", default=None)

INTERRUPTED = "interrupted (Ctrl-C)"


def spec_facts(spec: JobSpec) -> dict[str, Any]:
    """The plan-independent facts of a job spec: its fingerprint and transform."""
    t = spec.translate
    kind = "sql" if t.sql else ("transition" if t.transition else "function")
    name = t.name or (t.function.rsplit(":", 1)[-1] if t.function else kind)
    return {"fingerprint": spec.fingerprint(), "transform": (name, t.version, "fold" if t.fold else kind)}


class LineageRun:
    """The events of one run of ``job_name``; ``facts`` feed the facets (``rewind_run_id``,
    ``plan_id``, ``fingerprint``, ``transform``, ``staging``, ``state``, ``details``)."""

    def __init__(
        self,
        job_name: str,
        command: str,
        *,
        inputs: Sequence[Dataset] = (),
        outputs: Sequence[Dataset] = (),
        secrets: Sequence[str] = (),
        emitter: Emitter | None = None,
        run_id: str | None = None,
        **facts: Any,
    ) -> None:
        self.emitter = emitter or get_emitter()
        self.job_name = job_name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.secrets = [s for s in secrets if s]
        self.facts: dict[str, Any] = {"command": command, **facts}
        self.run_id = run_id or str(uuid.uuid4())
        self.parent = _PARENT.get()
        self.ended: EventType | None = None

    @property
    def enabled(self) -> bool:
        return self.emitter.enabled

    @property
    def ref(self) -> Parent:
        return (self.run_id, self.emitter.namespace, self.job_name)

    def note(self, **facts: Any) -> LineageRun:
        """Add or change facts for the events to come."""
        self.facts.update({k: v for k, v in facts.items() if v is not None})
        return self

    def start(self) -> LineageRun:
        self._emit("START")
        return self

    def running(
        self, inputs: Sequence[Dataset] | None = None, outputs: Sequence[Dataset] | None = None, **facts: Any
    ) -> None:
        """A progress event of a long run (per wave), with the counts so far."""
        self._emit("RUNNING", inputs, outputs, **facts)

    def complete(
        self, inputs: Sequence[Dataset] | None = None, outputs: Sequence[Dataset] | None = None, **facts: Any
    ) -> None:
        self._end("COMPLETE", inputs, outputs, **facts)

    def fail(self, exc: BaseException | str) -> None:
        line = exc if isinstance(exc, str) else error_line(exc)
        self._end("FAIL", error=mask_text(line, self.secrets), state="failed")

    def abort(self, reason: str = INTERRUPTED) -> None:
        self._end("ABORT", error=reason, state="interrupted")

    def _end(
        self,
        event_type: EventType,
        inputs: Sequence[Dataset] | None = None,
        outputs: Sequence[Dataset] | None = None,
        error: str | None = None,
        **facts: Any,
    ) -> None:
        if self.ended is not None:  # one terminal event per run
            return
        self.ended = event_type
        self._emit(event_type, inputs, outputs, error=error, **facts)

    def _emit(
        self,
        event_type: EventType,
        inputs: Sequence[Dataset] | None = None,
        outputs: Sequence[Dataset] | None = None,
        error: str | None = None,
        **facts: Any,
    ) -> None:
        if not self.emitter.enabled:
            return
        if inputs is not None:
            self.inputs = list(inputs)
        if outputs is not None:
            self.outputs = list(outputs)
        self.note(**facts)
        self.emitter.emit(
            event_type, self.run_id, self.job_name, self.inputs, self.outputs, self.facts, self.parent, error
        )

    def __enter__(self) -> LineageRun:
        if self.ended is None and self.emitter.enabled:
            self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.complete()
        elif isinstance(exc, KeyboardInterrupt):
            self.abort()
        else:
            self.fail(exc)


def track(
    settings: Settings | None,
    job_name: str,
    command: str,
    *,
    spec: JobSpec | None = None,
    inputs: Sequence[Dataset] | None = None,
    outputs: Sequence[Dataset] | None = None,
    run_id: str | None = None,
    **facts: Any,
) -> LineageRun:
    """A :class:`LineageRun` for a command (a context manager: START on entry; COMPLETE, FAIL
    or ABORT on exit). With ``spec`` its fingerprint, transform and datasets are filled in,
    unless ``inputs``/``outputs`` are given; with lineage off nothing at all is computed."""
    emitter = get_emitter()
    if not emitter.enabled:
        return LineageRun(job_name, command, emitter=emitter)
    secrets = settings.secret_values() if settings is not None else []
    if spec is not None:
        facts = {**spec_facts(spec), **facts}
        if settings is not None and (inputs is None or outputs is None):
            found_in, found_out = spec_datasets(settings, spec, facts.get("rewind_run_id"))
            inputs = found_in if inputs is None else inputs
            outputs = found_out if outputs is None else outputs
    return LineageRun(
        job_name,
        command,
        inputs=inputs or (),
        outputs=outputs or (),
        secrets=secrets,
        emitter=emitter,
        run_id=run_id,
        **facts,
    )


@contextlib.contextmanager
def as_parent(run: LineageRun) -> Iterator[LineageRun]:
    """Runs started inside name ``run`` as their parent (a shadow's history run, a rehearsal's steps)."""
    token = _PARENT.set(run.ref if run.enabled else None)
    try:
        yield run
    finally:
        _PARENT.reset(token)


def stable_run_id(*parts: str) -> str:
    """The same OpenLineage run id for every process of one Rewind operation (a reconsume's
    start and finish)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "rewind:" + "/".join(parts)))


Phase = Literal["whole", "start", "finish"]


def emits(
    make: Callable[..., LineageRun | None],
    done: Callable[[LineageRun, Any], None] | None = None,
    *,
    parent: bool = False,
    phase: Phase = "whole",
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a command: ``make(*args, **kwargs)`` (the command's own arguments) gives its
    :class:`LineageRun`, ``done(lineage, result)`` completes it with what the result says.

    ``phase``: ``whole`` sends START, then COMPLETE or FAIL/ABORT; ``start`` sends START only
    when the command succeeds (the operation goes on after it, in other processes), FAIL when it
    fails; ``finish`` sends COMPLETE or FAIL only. ``parent``: runs started inside name this
    one as their parent. With lineage off the command is called as it is."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            if not get_emitter().enabled:
                return fn(*args, **kwargs)
            try:
                lineage = make(*args, **kwargs)
            except Exception as exc:  # the command itself will say what is wrong
                log.debug("no lineage for %s: %s", fn.__name__, exc)
                lineage = None
            if lineage is None:
                return fn(*args, **kwargs)
            if phase == "whole":
                lineage.start()
            try:
                with as_parent(lineage) if parent else contextlib.nullcontext(lineage):
                    result = fn(*args, **kwargs)
            except KeyboardInterrupt:
                lineage.abort()
                raise
            except Exception as exc:
                lineage.fail(exc)
                raise
            if phase == "start":
                lineage.start()
                return result
            if done is not None:
                done(lineage, result)
            lineage.complete()  # no-op once ``done`` completed it
            return result

        return inner

    return wrap

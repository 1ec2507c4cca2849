"""Named crash points for fault tests: ``REWIND_FAULT=<point>[:<n>]`` kills this process with
SIGKILL the n-th time (default 1st) the run passes ``point`` (several points: comma-separated).
Unset, it costs one dict lookup.

Points: ``after-plan`` (plan stored, run not started), ``mid-wave`` (Spark job of a wave
running), ``after-wave-tasks`` (the wave's Spark job done: units its tasks loaded are committed),
``after-quarantine-commit``, ``after-sink-commit`` (output committed, ledger not
updated), ``after-ledger-update``; read models (:mod:`rewind.job.finalize`) add
``before-fold-commit`` and ``after-fold-commit`` around the commit of the folded rows. The
Kafka sink adds ``kafka-commit-mid-produce``,
``kafka-commit-before-marker`` and ``kafka-commit-before-end``; the archive its own
``archive-*`` points. Publishing: ``promote-after-audit`` and ``rollback-after-audit`` (the
swap and its audit entry done, the run state not moved); the Iceberg sink adds
``iceberg-promote-before-commit``, ``iceberg-promote-after-commit``,
``iceberg-rollback-before-commit`` and ``iceberg-rollback-after-commit`` around its one
catalog operation (branch swap, rebase commit or table rename); the PostgreSQL sink (and
SQLite) ``postgres-promote-before-commit``, ``postgres-promote-after-commit``,
``postgres-rollback-before-commit`` and ``postgres-rollback-after-commit`` around the commit of
its rename transaction (before: renames done and locks held, not committed); the Kafka sink
``kafka-promote-before-commit``, ``kafka-promote-after-commit``,
``kafka-rollback-before-commit`` and ``kafka-rollback-after-commit`` around the write of the
run's ``published``/``withdrawn`` record to ``rewind.commits`` (before it is produced, after
it is acknowledged). A re-produce's unit transactions, and a Kafka-source unit produced by its
task, add ``reproduce-before-marker`` and ``reproduce-before-end`` (in the Spark task).
``rewind compensate`` adds ``compensate-before-marker`` and ``compensate-before-end`` in a unit's
transaction (in the Spark task) and ``compensate-before-final-marker`` (the driver, every unit
committed). ``REWIND_FAULT_ONCE=<path>`` makes a point fire in one process only (see
:func:`_first_across_processes`).

Slow points: ``REWIND_FAULT_PAUSE=<point>:<seconds>`` (several: comma-separated) makes
:func:`pause` sleep that long each time the run passes ``point``, for tests of what a slow step
must not get wrong. ``shadow-verify-read`` sits between the reads of v2 and v1 in
:mod:`rewind.shadow.verify`; ``archive-task-read`` at the start of each archive task's read,
after the pass planned its ranges (:mod:`rewind.history.archive_files`);
``reproduce-before-end`` in a unit's transaction, flushed and not yet committed
(:mod:`rewind.sinks.kafka.unit_writer`).
``REWIND_FAULT_PAUSED=<path>`` creates ``<path>.<point>`` as a pause begins, so a test knows
the step is held there (a Spark task's pause is in another process) and acts meanwhile.
"""

from __future__ import annotations

import os
import signal
import threading
import time

_seen: dict[str, int] = {}
_lock = threading.Lock()


def point(name: str) -> None:
    wanted = os.environ.get("REWIND_FAULT")
    if not wanted:
        return
    nth = _nth(wanted, name)
    if nth is None:
        return
    with _lock:
        _seen[name] = _seen.get(name, 0) + 1
        if _seen[name] == nth and _first_across_processes(name):
            os.kill(os.getpid(), signal.SIGKILL)


def _nth(wanted: str, name: str) -> int | None:
    """Which pass of ``name`` fires (None: not armed); several points are comma-separated."""
    for item in wanted.split(","):
        target, _, nth = item.strip().partition(":")
        if target == name:
            return int(nth or 1)
    return None


def _first_across_processes(name: str) -> bool:
    """``REWIND_FAULT_ONCE=<path>``: only the first process to get there fires (it creates
    ``<path>.<point>``), so a Spark task killed at a point is retried by Spark in a fresh
    worker, which passes."""
    path = os.environ.get("REWIND_FAULT_ONCE")
    if not path:
        return True
    try:
        os.close(os.open(f"{path}.{name}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def pause(name: str) -> None:
    """Sleep at ``name`` as long as ``REWIND_FAULT_PAUSE`` says (unset: one dict lookup)."""
    wanted = os.environ.get("REWIND_FAULT_PAUSE")
    if not wanted:
        return
    for item in wanted.split(","):
        target, _, seconds = item.strip().partition(":")
        if target == name:
            mark = os.environ.get("REWIND_FAULT_PAUSED")
            if mark:
                with open(f"{mark}.{name}", "a"):
                    pass
            time.sleep(float(seconds or 0))


def after(seconds: float, name: str) -> None:
    """Arm ``name`` to fire from a timer thread (a kill in the middle of a Spark job)."""
    if _nth(os.environ.get("REWIND_FAULT", ""), name) is not None:
        threading.Timer(seconds, point, args=(name,)).start()


class InjectedFault(RuntimeError):
    """The error :func:`fail` raises: a transient failure a test injects."""


def fail(name: str) -> None:
    """``REWIND_FAULT_RAISE=<point>[:<n>]`` raises :class:`InjectedFault` the n-th time (default
    1st) this process passes ``point``; ``<point>:*`` every time (several points: comma-separated).
    For tests of what restarts after an error: ``archive-batch`` (a continuous archive's
    micro-batch), ``shadow-tail-batch`` (a shadow tail's)."""
    wanted = os.environ.get("REWIND_FAULT_RAISE")
    if not wanted:
        return
    for item in wanted.split(","):
        target, _, nth = item.strip().partition(":")
        if target != name:
            continue
        with _lock:
            key = f"raise:{name}"
            _seen[key] = _seen.get(key, 0) + 1
            if nth == "*" or _seen[key] == int(nth or 1):
                raise InjectedFault(f"injected fault at {name} (pass {_seen[key]})")

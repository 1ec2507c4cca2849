"""Named crash points for fault tests: ``REWIND_FAULT=<point>[:<n>]`` kills this process with
SIGKILL the n-th time (default 1st) the run passes ``point``. Unset, it costs one dict lookup.

Points: ``after-plan`` (plan stored, run not started), ``mid-wave`` (Spark job of a wave
running), ``after-quarantine-commit``, ``after-sink-commit`` (output committed, ledger not
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
it is acknowledged).
"""

from __future__ import annotations

import os
import signal
import threading

_seen: dict[str, int] = {}
_lock = threading.Lock()


def point(name: str) -> None:
    wanted = os.environ.get("REWIND_FAULT")
    if not wanted:
        return
    target, _, nth = wanted.partition(":")
    if target != name:
        return
    with _lock:
        _seen[name] = _seen.get(name, 0) + 1
        if _seen[name] == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)


def after(seconds: float, name: str) -> None:
    """Arm ``name`` to fire from a timer thread (a kill in the middle of a Spark job)."""
    wanted = os.environ.get("REWIND_FAULT", "")
    if wanted.partition(":")[0] == name:
        threading.Timer(seconds, point, args=(name,)).start()

"""Verification and reconciliation of a run's staging against a reference (``rewind verify``).

* :mod:`rewind.verify.rules`: the ``verify`` spec resolved against both sides' columns (pure);
* :mod:`rewind.verify.sources`: staging and the reference (target, Iceberg, PostgreSQL, SQL);
* :mod:`rewind.verify.compare`: the Spark comparison (bucket checksums, bisection, drill-down);
* :mod:`rewind.verify.assertions`: the user's SQL assertions;
* :mod:`rewind.verify.report`: the JSON report and the self-contained HTML page (pure);
* :mod:`rewind.verify.service`: :func:`verify_run` (the CLI's operation) and :func:`verify_frames`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.verify.exceptions import ReferenceUnreachable, VerifyError

if TYPE_CHECKING:
    from rewind.verify.service import verify_frames, verify_run

__all__ = ["ReferenceUnreachable", "VerifyError", "verify_frames", "verify_run"]


def __getattr__(name: str) -> Any:
    if name in ("verify_run", "verify_frames"):
        # lazy: the service imports the job machinery; `rewind.verify` alone stays light
        from rewind.verify import service

        return getattr(service, name)
    raise AttributeError(name)

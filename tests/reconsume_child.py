"""One side of a reconsume in its own process, for the kill -9 test of test_reconsume.py.

``python -m tests.reconsume_child SIDE BOOTSTRAP LEDGER_URL RECONSUME_ID OUT BATCH DELAY_S TAG``
appends ``TAG PARTITION OFFSET`` to OUT for each message it handles (an O_APPEND write per
message, so a SIGKILL loses nothing already handled). The temporary side exits when done;
the existing side runs until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from rewind.reconsume import ExistingSide, TemporarySide


def main() -> None:
    side_name, bootstrap, ledger, rid, out, batch, delay, tag = sys.argv[1:9]
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pause = float(delay)

    def handler(m: Any) -> None:
        time.sleep(pause)
        os.write(fd, f"{tag} {m.partition()} {m.offset()}\n".encode())

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cls = TemporarySide if side_name == "temporary" else ExistingSide
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if side_name == "existing":
        # a killed member sends no LeaveGroup, and noida-db then holds the next JoinGroup
        # indefinitely; a static member (as a service on Kubernetes would be) replaces its
        # killed predecessor at once
        conf["group.instance.id"] = f"reconsume-test-{rid}"
    side = cls(conf, handler, reconsume=rid, ledger=ledger,
               batch_size=int(batch), timeout_s=0.2)
    try:
        side.run(stop)
    finally:
        side.close()


if __name__ == "__main__":
    main()

"""A ``rewind shadow start`` in a child process, for kill -9 tests.

``python -m tests.shadow_child SPEC DONE_FILE MAX_SECONDS``: settings from the environment
(``REWIND_*``, ``REWIND_FAULT`` arms a crash point); the tail stops once ``DONE_FILE`` exists
(the test's producer has finished) and every partition's lag is 0, or after MAX_SECONDS.
Prints the result as JSON on its last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rewind.config import load_settings
from rewind.shadow.start import TailProgress, start_shadow
from rewind.spec import load_spec


def main() -> None:
    spec_path, done, limit = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])

    def stop(p: TailProgress) -> bool:
        return (done.exists() and p.max_lag == 0) or p.seconds > limit

    result = start_shadow(load_settings(), load_spec(spec_path), stop=stop, sample_s=0.5)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

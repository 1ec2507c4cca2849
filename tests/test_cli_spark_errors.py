"""A query Spark refuses is one ``error: Spark: ...`` line and exit 1, like Rewind's own errors.

PySpark logs a failed query's whole Java stack through loggers that must be PySpark's own;
the command line quiets them and reports the error on one line (``--debug`` shows it all).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from rewind.config import Settings
from rewind.history import archive_once
from tests import job_fixtures as jf
from tests.kafka_util import create_topic, produce
from tests.test_cli_errors import REWIND, assert_one_error_line


def test_a_query_spark_refuses_is_one_line(
    settings: Settings, spark: Any, topic_name: str, tmp_path: Path
) -> None:
    conf = settings.kafka_config()
    create_topic(conf, topic_name, 1)
    produce(conf, topic_name, [(0, None, json.dumps({"n": i}).encode(), None) for i in range(5)])
    archive = f"lake.cli_errors_{uuid.uuid4().hex[:6]}"
    archive_once(settings, [topic_name], archive, spark=spark)
    args = [
        "query",
        "SELECT CAST('x' AS INT) AS n FROM history",
        "--history",
        topic_name,
        "--archive",
        archive,
    ]
    result = subprocess.run(
        [REWIND, *args], cwd=tmp_path, env=jf.child_env(settings), capture_output=True, text=True, timeout=240
    )
    # the JVM's own start-up notice is not Rewind's to remove
    jvm = "WARNING: Using incubator modules"
    result.stderr = "\n".join(x for x in result.stderr.splitlines() if not x.startswith(jvm))
    line = assert_one_error_line(result, "Spark:", "CAST_INVALID_INPUT")
    assert "Py4J" not in line and "errorClass" not in result.stderr

"""An S3-compatible server for warehouse tests: moto's server on a free loopback port.

Spark's JVM cannot reach S3 here (no hadoop-aws); Rewind writes and reads warehouse files with
pyarrow in the Python tasks and pyiceberg in the driver, so a bucket on moto is a real object
store for everything Rewind does. The server runs in the test process (``ThreadedMotoServer``);
child processes and Spark's Python workers reach it over HTTP like any other endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import free_port

BUCKET = "lake"
ACCESS_KEY = "moto"
SECRET = "moto-secret-Zq81"
REGION = "us-east-1"


def moto_s3(bucket: str = BUCKET) -> Iterator[str]:
    """Start the server, create ``bucket``, yield the endpoint URL; stop it afterwards."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint,
            access_key=ACCESS_KEY,
            secret_key=SECRET,
            region=REGION,
            allow_bucket_creation=True,
        )
        fs.create_dir(bucket)
        yield endpoint
    finally:
        server.stop()


def s3_catalog_env(tmp: Path, endpoint: str, bucket: str = BUCKET) -> dict[str, str]:
    """The ``REWIND_CATALOG__*`` variables of a SQL catalog whose warehouse is in ``bucket``."""
    return {
        "REWIND_CATALOG__TYPE": "sql",
        "REWIND_CATALOG__URI": f"sqlite:///{tmp / 'catalog.db'}",
        "REWIND_CATALOG__WAREHOUSE": f"s3://{bucket}/warehouse",
        "REWIND_CATALOG__S3__ENDPOINT": endpoint,
        "REWIND_CATALOG__S3__REGION": REGION,
        "REWIND_CATALOG__S3__ACCESS_KEY_ID": ACCESS_KEY,
        "REWIND_CATALOG__S3__SECRET_ACCESS_KEY": SECRET,
    }

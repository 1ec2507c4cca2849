"""A raw ApiVersions request (API key 18, v0) over a plaintext socket.

confluent-kafka does not expose the versions librdkafka negotiated, and doctor wants to
show what the broker claims to support. Only used for PLAINTEXT listeners; on TLS or SASL
listeners doctor says it cannot look.
"""

from __future__ import annotations

import socket
import struct

API_NAMES = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 18: "ApiVersions",
    19: "CreateTopics", 20: "DeleteTopics", 21: "DeleteRecords", 22: "InitProducerId",
    24: "AddPartitionsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit",
}


def api_versions(host: str, port: int, timeout_s: float = 5.0) -> dict[int, tuple[int, int]]:
    """Map of API key to (min, max) version that the broker advertises."""
    client_id = b"rewind-doctor"
    header = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(header)) + header)
        size = struct.unpack(">i", _read(sock, 4))[0]
        body = _read(sock, size)
    _correlation, error, count = struct.unpack(">ihi", body[:10])
    if error:
        raise OSError(f"ApiVersions answered error code {error}")
    versions = {}
    for i in range(count):
        key, low, high = struct.unpack(">hhh", body[10 + 6 * i: 16 + 6 * i])
        versions[key] = (low, high)
    return versions


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed during ApiVersions")
        buf += chunk
    return buf

"""OffsetDelete (API key 47, v0) over a plaintext socket: drop some of a group's offsets.

confluent-kafka has no call for it (librdkafka has, the Python binding does not expose it),
and without it the only way to remove one partition's committed offset is deleting the
whole group. Like :mod:`rewind.kafka.apiversions`, this speaks the protocol directly and
only on PLAINTEXT listeners: the broker is asked whether it supports the API (ApiVersions),
where the group's coordinator is (FindCoordinator v0), then OffsetDelete v0 goes there.
Every refusal is a :class:`GroupOperationRefused` naming the reason.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from rewind.core.windows import TP
from rewind.kafka.apiversions import api_versions
from rewind.kafka.exceptions import GroupOperationRefused

OFFSET_DELETE = 47
FIND_COORDINATOR = 10
_CLIENT_ID = b"rewind-groups"


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _request(host: str, port: int, api_key: int, body: bytes, timeout_s: float) -> bytes:
    header = struct.pack(">hhih", api_key, 0, 1, len(_CLIENT_ID)) + _CLIENT_ID
    payload = header + body
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _read(sock, 4))[0]
        response = _read(sock, size)
    return response[4:]  # past the correlation id


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed by the broker")
        buf += chunk
    return buf


def _error_name(code: int) -> str:
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaError

    return str(KafkaError(code).str())


def _address(conf: Mapping[str, Any], group: str) -> tuple[str, int]:
    protocol = str(conf.get("security.protocol", "plaintext")).lower()
    if protocol != "plaintext":
        raise GroupOperationRefused(
            group, "OffsetDelete", f"Rewind sends it only over PLAINTEXT, not {protocol}", by="Rewind"
        )
    first = str(conf.get("bootstrap.servers", "")).split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise GroupOperationRefused(
            group, "OffsetDelete", f"bootstrap server {first!r} is not host:port", by="Rewind"
        )
    return host.strip("[]"), int(port)


def offset_delete(
    conf: Mapping[str, Any], group: str, partitions: Sequence[TP], *, timeout_s: float = 10.0
) -> None:
    """Delete ``group``'s committed offsets on ``partitions`` (the group must be inactive).

    Steps: (1) ApiVersions on the bootstrap broker: no OffsetDelete, a refusal; (2)
    FindCoordinator v0 for the group; (3) OffsetDelete v0 to the coordinator; (4) any error,
    for the request or one partition, is raised naming the partition.
    """
    host, port = _address(conf, group)
    try:
        if OFFSET_DELETE not in api_versions(host, port, timeout_s):
            raise GroupOperationRefused(group, "OffsetDelete", "the broker does not support it (ApiVersions)")
        body = _request(host, port, FIND_COORDINATOR, _string(group), timeout_s)
        error, _node = struct.unpack(">hi", body[:6])
        if error:
            raise GroupOperationRefused(group, "FindCoordinator", _error_name(error))
        host_len = struct.unpack(">h", body[6:8])[0]
        coord_host = body[8 : 8 + host_len].decode()
        coord_port = struct.unpack(">i", body[8 + host_len : 12 + host_len])[0]

        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(set(partitions)):
            by_topic.setdefault(topic, []).append(partition)
        request = _string(group) + struct.pack(">i", len(by_topic))
        for topic, parts in by_topic.items():
            request += _string(topic) + struct.pack(">i", len(parts))
            request += b"".join(struct.pack(">i", p) for p in parts)
        body = _request(coord_host, coord_port, OFFSET_DELETE, request, timeout_s)
    except OSError as exc:
        raise GroupOperationRefused(group, "OffsetDelete", f"the connection failed: {exc}") from None

    error, _throttle, count = struct.unpack(">hii", body[:10])
    if error:
        raise GroupOperationRefused(group, "OffsetDelete", _error_name(error))
    pos, failed = 10, []
    for _ in range(count):
        name_len = struct.unpack(">h", body[pos : pos + 2])[0]
        topic = body[pos + 2 : pos + 2 + name_len].decode()
        pos += 2 + name_len
        (n,) = struct.unpack(">i", body[pos : pos + 4])
        pos += 4
        for _ in range(n):
            partition, code = struct.unpack(">ih", body[pos : pos + 6])
            pos += 6
            if code:
                failed.append(f"{topic}/{partition}: {_error_name(code)}")
    if failed:
        raise GroupOperationRefused(group, "OffsetDelete", "; ".join(failed))

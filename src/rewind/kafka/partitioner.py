"""Which partition a keyed record goes to, exactly as the live producers compute it.

A re-produced current-state message must land on the partition the live producer would pick
for the same key, or a consumer reads the entity's messages out of order (the live one on one
partition, the synthetic one on another). Three producers' default keyed partitioners:

* ``murmur2`` — the Java client's ``BuiltInPartitioner.partitionForKey``:
  ``toPositive(Utils.murmur2(keyBytes)) % numPartitions`` with ``toPositive(x) = x &
  0x7fffffff``; also librdkafka's ``murmur2`` / ``murmur2_random`` (Java-compatible);
* ``crc32`` — librdkafka's ``consistent`` / ``consistent_random`` (its default):
  ``crc32(keyBytes) % numPartitions``, the unsigned CRC-32 of zlib;
* ``fnv1a`` — librdkafka's ``fnv1a`` / ``fnv1a_random`` (Sarama's hash partitioner): the 32-bit
  FNV-1a hash taken as a signed int, made absolute, ``% numPartitions``.

The key bytes are what the live producer serializes; Rewind's Kafka sink writes an entity id as
its UTF-8 text (a Java ``StringSerializer``). :func:`partitions_for` computes many keys at once
(murmur2 vectorised with numpy over keys of equal length: about 20x a per-key Python loop).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Literal, get_args

Partitioner = Literal["murmur2", "crc32", "fnv1a"]
PARTITIONERS: tuple[str, ...] = get_args(Partitioner)

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_CHUNK = 32_768


def murmur2(data: bytes) -> int:
    """The Java client's ``Utils.murmur2`` (a signed 32-bit int, as Java returns it)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def fnv1a(data: bytes) -> int:
    """librdkafka's ``rd_fnv1a``: FNV-1a over the bytes as a signed 32-bit int, made absolute."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & _MASK
    signed = h - (1 << 32) if h & 0x80000000 else h
    return abs(signed) & _MASK  # abs(-2**31) overflows back to 2**31 in C: & keeps it unsigned


def partition_of(key: bytes, partitions: int, partitioner: Partitioner = "murmur2") -> int:
    """The partition of one key among ``partitions``."""
    if partitions <= 0:
        raise ValueError(f"a topic has at least one partition, got {partitions}")
    if partitioner == "murmur2":
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    if partitioner == "crc32":
        return zlib.crc32(key) % partitions
    if partitioner == "fnv1a":
        return fnv1a(key) % partitions
    raise ValueError(f"unknown partitioner {partitioner!r}; one of {', '.join(PARTITIONERS)}")


def partitions_for(keys: Sequence[bytes], partitions: int, partitioner: Partitioner = "murmur2") -> list[int]:
    """:func:`partition_of` for every key, in order."""
    if partitions <= 0:
        raise ValueError(f"a topic has at least one partition, got {partitions}")
    if partitioner == "murmur2":
        out: list[int] = []
        for start in range(0, len(keys), _CHUNK):  # bounds the padded matrix's memory
            hashes = _murmur2_many(keys[start : start + _CHUNK])
            out += ((hashes & 0x7FFFFFFF) % partitions).tolist()
        return out
    if partitioner == "crc32":
        crc = zlib.crc32
        return [crc(k) % partitions for k in keys]
    return [partition_of(k, partitions, partitioner) for k in keys]


def _murmur2_many(keys: Sequence[bytes]) -> Any:
    """murmur2 of every key as a numpy uint32 array.

    The keys are laid side by side, zero-padded to the longest (numpy's fixed-width bytes), and
    hashed a 4-byte block at a time over all keys at once; a key shorter than the block leaves
    its hash as it was, then takes its own tail.
    """
    # lazy: avoids numpy at import
    import numpy as np

    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    width = max(4, int(lengths.max()) + 3 & ~3)  # room for every block and tail
    data = np.array(keys, dtype=f"S{width}").view(np.uint8).reshape(n, width)
    words = data.view("<u4").astype(np.uint32)
    m = np.uint32(_M)
    rows = np.arange(n)
    with np.errstate(over="ignore"):
        h = (np.uint32(_SEED) ^ lengths.astype(np.uint32)).astype(np.uint32)
        blocks = lengths // 4
        for b in range(int(blocks.max())):
            k = words[:, b] * m
            k ^= k >> np.uint32(24)
            k *= m
            mixed = (h * m) ^ k
            h = np.where(blocks > b, mixed, h)
        rest = lengths % 4
        tail = lengths & ~3

        def byte(at: Any) -> Any:
            return data[rows, np.minimum(at, width - 1)].astype(np.uint32)

        zero = np.uint32(0)
        h ^= np.where(rest == 3, byte(tail + 2) << np.uint32(16), zero).astype(np.uint32)
        h ^= np.where(rest >= 2, byte(tail + 1) << np.uint32(8), zero).astype(np.uint32)
        h = np.where(rest >= 1, (h ^ byte(tail)) * m, h)
        h ^= h >> np.uint32(13)
        h *= m
        h ^= h >> np.uint32(15)
    return h

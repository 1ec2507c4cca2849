"""Keys land on the partitions the live producers pick: Java's murmur2, librdkafka's three.

Three independent proofs for :mod:`rewind.kafka.partitioner`:

1. the published vectors of the Java client's own test (apache/kafka,
   clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, ``testMurmur2``);
2. a Java program compiled here with javac, implementing ``Utils.murmur2`` and
   ``BuiltInPartitioner.partitionForKey`` (``toPositive(murmur2(key)) % n``) as the Java client
   specifies them, run over random keys (ASCII, UTF-8, binary) and partition counts;
3. librdkafka itself, on each real broker: records produced with partition unassigned under its
   ``murmur2_random``, ``consistent_random`` and ``fnv1a_random`` partitioners are delivered to
   the partitions Rewind computes for ``murmur2``, ``crc32`` and ``fnv1a``.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.kafka.partitioner import murmur2, partition_of, partitions_for
from tests.kafka_util import create_topic

# apache/kafka UtilsTest.testMurmur2: the Java client's expected Utils.murmur2 outputs
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

JAVA_SOURCE = """
import java.io.BufferedReader;
import java.io.InputStreamReader;

public class JavaPartitioner {
    // org.apache.kafka.common.utils.Utils.murmur2, as the Java client specifies it
    static int murmur2(final byte[] data) {
        int length = data.length;
        int seed = 0x9747b28c;
        final int m = 0x5bd1e995;
        final int r = 24;
        int h = seed ^ length;
        int length4 = length / 4;
        for (int i = 0; i < length4; i++) {
            final int i4 = i * 4;
            int k = (data[i4 + 0] & 0xff) + ((data[i4 + 1] & 0xff) << 8)
                  + ((data[i4 + 2] & 0xff) << 16) + ((data[i4 + 3] & 0xff) << 24);
            k *= m;
            k ^= k >>> r;
            k *= m;
            h *= m;
            h ^= k;
        }
        switch (length % 4) {
            case 3: h ^= (data[(length & ~3) + 2] & 0xff) << 16;
            case 2: h ^= (data[(length & ~3) + 1] & 0xff) << 8;
            case 1: h ^= data[length & ~3] & 0xff;
                    h *= m;
        }
        h ^= h >>> 13;
        h *= m;
        h ^= h >>> 15;
        return h;
    }

    static int toPositive(int number) { return number & 0x7fffffff; }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        StringBuilder out = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.split(" ");
            String hex = parts[0].equals("-") ? "" : parts[0];
            byte[] key = new byte[hex.length() / 2];
            for (int i = 0; i < key.length; i++) {
                key[i] = (byte) Integer.parseInt(hex.substring(2 * i, 2 * i + 2), 16);
            }
            int n = Integer.parseInt(parts[1]);
            // BuiltInPartitioner.partitionForKey
            out.append(murmur2(key)).append(' ').append(toPositive(murmur2(key)) % n).append('\\n');
        }
        System.out.print(out);
    }
}
"""


def test_the_java_clients_published_vectors() -> None:
    for key, expected in JAVA_VECTORS.items():
        assert murmur2(key) == expected, key


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=60), st.integers(min_value=1, max_value=1000))
def test_the_vectorised_hash_is_the_per_key_hash(keys: list[bytes], partitions: int) -> None:
    for partitioner in ("murmur2", "crc32", "fnv1a"):
        expected = [partition_of(k, partitions, partitioner) for k in keys]  # type: ignore[arg-type]
        assert partitions_for(keys, partitions, partitioner) == expected  # type: ignore[arg-type]


def _random_keys(rng: random.Random, n: int) -> list[bytes]:
    keys: list[bytes] = [b"", b"0", b"21", "é漢字".encode()]
    for i in range(n):
        kind = i % 4
        if kind == 0:
            keys.append(str(rng.randrange(10 ** rng.randint(1, 12))).encode())
        elif kind == 1:
            keys.append(f"account-{rng.getrandbits(64):x}".encode())
        elif kind == 2:
            keys.append("".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randint(1, 9))).encode())
        else:
            keys.append(rng.randbytes(rng.randint(1, 40)))
    return keys


def test_partitions_match_a_java_program_of_the_java_clients_partitioner(tmp_path: Path) -> None:
    javac, java = shutil.which("javac"), shutil.which("java")
    assert javac and java, "Java 17 (javac) is part of the machine's set-up"
    (tmp_path / "JavaPartitioner.java").write_text(JAVA_SOURCE)
    subprocess.run([javac, "JavaPartitioner.java"], cwd=tmp_path, check=True, timeout=120)
    rng = random.Random(14)
    keys = _random_keys(rng, 4000)
    counts = [rng.choice([1, 2, 3, 6, 7, 12, 16, 50, 97, 1000]) for _ in keys]
    lines = "".join(f"{k.hex() or '-'} {n}\n" for k, n in zip(keys, counts, strict=True))
    run = subprocess.run(
        [java, "-cp", str(tmp_path), "JavaPartitioner"],
        input=lines,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    answers = [tuple(map(int, line.split())) for line in run.stdout.splitlines()]
    assert len(answers) == len(keys)
    assert [h for h, _p in answers] == [murmur2(k) for k in keys]
    by_count: dict[int, list[int]] = {}
    for i, n in enumerate(counts):
        by_count.setdefault(n, []).append(i)
    for n, indexes in by_count.items():
        ours = partitions_for([keys[i] for i in indexes], n)
        assert ours == [answers[i][1] for i in indexes], n


@pytest.mark.parametrize(
    ("librdkafka", "ours"),
    [("murmur2_random", "murmur2"), ("consistent_random", "crc32"), ("fnv1a_random", "fnv1a")],
)
def test_librdkafka_delivers_to_the_partitions_rewind_computes(
    broker_conf: dict[str, Any], topic_name: str, librdkafka: str, ours: str
) -> None:
    from confluent_kafka import Producer

    partitions = 7
    create_topic(broker_conf, topic_name, partitions)
    keys = [k for k in _random_keys(random.Random(librdkafka), 600) if k]  # no key: random partition
    delivered: dict[bytes, int] = {}

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        delivered[msg.key()] = msg.partition()

    producer = Producer({**broker_conf, "partitioner": librdkafka, "linger.ms": 5})
    for key in keys:
        producer.produce(topic_name, b"v", key, on_delivery=report)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(delivered) == len(set(keys))
    expected = dict(zip(keys, partitions_for(keys, partitions, ours), strict=True))  # type: ignore[arg-type]
    assert delivered == expected
    assert len(set(delivered.values())) == partitions  # every partition was hit: not a constant

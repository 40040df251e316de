"""A keyed record from `tierlog produce` lands in the partition the Java producer would choose:
murmur2(key) & 0x7fffffff % partitions (Kafka's BuiltInPartitioner), librdkafka's murmur2_random. The
reference below is written from Kafka's Utils.murmur2 and checked against the vectors of Kafka's UtilsTest.
"""

from __future__ import annotations

import zlib

import pytest
from cli_helpers import tierlog

from tierlog.testing.local_cluster import BrokerProcess

PARTITIONS = 7
KEYS = [f"user-{i}" for i in range(60)] + ["21", "foobar", "a-little-bit-long-string", "ключ", "🔑"]
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (seed 0x9747b28c), as the signed 32-bit int Java returns."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """BuiltInPartitioner.partitionForKey: Utils.toPositive(Utils.murmur2(key)) % numPartitions."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_reference_murmur2_matches_kafkas_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def produce_and_locate(broker: BrokerProcess, topic: str, *options: str) -> dict[str, int]:
    """Produce one record per key (the key as its value too) and read back key -> partition."""
    assert tierlog("topic", "create", topic, "-p", str(PARTITIONS), "-b", broker.bootstrap).code == 0
    lines = "".join(f"{key}\t{key}\n" for key in KEYS).encode()
    produced = tierlog("produce", topic, "-K", r"\t", *options, "-b", broker.bootstrap, stdin=lines)
    assert produced.code == 0, produced.stderr
    assert produced.first_line == f"Produced {len(KEYS)} records to {topic}"
    consumed = tierlog("consume", topic, "-e", "-f", r"%k\t%p\n", "-b", broker.bootstrap)
    assert consumed.code == 0, consumed.stderr
    placed = dict(line.split("\t") for line in consumed.stdout.splitlines())
    assert sorted(placed) == sorted(KEYS)
    return {key: int(partition) for key, partition in placed.items()}


def test_keys_land_where_the_java_producer_puts_them(shared_broker: BrokerProcess) -> None:
    placed = produce_and_locate(shared_broker, "java-partitioned")
    assert placed == {key: java_partition(key.encode(), PARTITIONS) for key in KEYS}


def test_partitioner_chooses_librdkafkas_other_ones(shared_broker: BrokerProcess) -> None:
    # librdkafka's consistent partitioner: CRC32 of the key.
    placed = produce_and_locate(shared_broker, "crc-partitioned", "--partitioner", "consistent")
    assert placed == {key: zlib.crc32(key.encode()) % PARTITIONS for key in KEYS}
    assert placed != {key: java_partition(key.encode(), PARTITIONS) for key in KEYS}

"""Records go in and come back out byte for byte with every client library and every codec: one story, told with
each library's own producer and consumer (conftest's `clients` adapters; consumers assign and seek, no group).

Each library's records are as varied as it can express them: keys and values of many lengths, null keys and null
values, headers (duplicated, empty, null-valued) and CreateTimes out of offset order, except where a library
cannot send one of these (said at its data set below). Whatever the library read is also what librdkafka's Python
binding reads."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from tierlog.testing.local_cluster import BrokerProcess

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BASE_TS = 1_700_000_000_000


def confluent_records(codec: str) -> list[dict[str, Any]]:
    """Binary keys and values of many sizes, null keys, null values (tombstones), empty-but-present keys and
    values, duplicate and null-valued headers, and CreateTimes that are not in offset order."""
    rng = random.Random(7)
    records = []
    for i in range(600):
        key: bytes | None = rng.randbytes(rng.randrange(1, 40))
        value: bytes | None = rng.randbytes(rng.choice([0, 1, 10, 100, 1000, 5000]))
        if i % 7 == 0:
            key = None
        if i % 11 == 0:
            value = None
        if i % 13 == 0:
            key = b""
        headers: list[tuple[str, bytes | None]] = []
        if i % 3 == 0:
            headers = [("trace-id", b"%08d" % i), ("dup", b"one"), ("dup", b"two"), ("bin", rng.randbytes(8))]
        if i % 5 == 0:
            headers.append(("null-valued", None))
        if i % 17 == 0:
            headers.append(("empty", b""))
        records.append(
            {"key": key, "value": value, "headers": headers, "timestamp": BASE_TS + i * 1000 - (i % 4) * 1500}
        )
    return records


def kafka_python_records(codec: str) -> list[dict[str, Any]]:
    """kafka-python refuses a record whose key and value are both null."""
    return [
        {
            "key": None if i % 5 == 0 and i % 9 else b"key-%d" % i,
            "value": None if i % 9 == 0 else bytes(range(256)) * (i % 4) + b"value-%d" % i,
            "headers": [("h", b"%d" % i), ("h", b"again"), ("empty", b"")] if i % 2 else [],
            "timestamp": BASE_TS + i * 10,
        }
        for i in range(300)
    ]


def aiokafka_records(codec: str) -> list[dict[str, Any]]:
    return [
        {
            "key": None if i % 4 == 0 else b"\x00key\xff%d" % i,
            "value": None if i % 10 == 3 else b"\x00\x01" * i + b"v%d" % i,
            "headers": [("n", b"%d" % i), ("bin", b"\x00\xff")] if i % 3 else [],
            "timestamp": BASE_TS - i,  # going backwards in time
        }
        for i in range(300)
    ]


def kcat_records(codec: str) -> list[dict[str, Any]]:
    """kcat reads text lines (`key<TAB>value`, no tabs or newlines in either), sets one set of headers on every
    record of a run and stamps each record with the time it sends it."""
    headers = [("origin", b"kcat"), ("codec", codec.encode())]
    return [
        {
            "key": None if i % 6 == 0 else f"clé-{i}".encode(),
            "value": None if i % 8 == 1 else (f"välue {i} " + "x" * (i % 300)).encode(),
            "headers": headers,
        }
        for i in range(400)
    ]


# Mostly random bytes, which librdkafka sends uncompressed when compression does not shrink a batch; that
# librdkafka really sends every codec is proven on compressible records in test_confluent_kafka.py.
INCOMPRESSIBLE = {"confluent-kafka"}

RECORDS: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    "confluent-kafka": confluent_records,
    "kafka-python": kafka_python_records,
    "aiokafka": aiokafka_records,
    "kcat": kcat_records,
}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", list(RECORDS))
def test_records_round_trip(
    shared_broker: BrokerProcess, kafka: Any, clients: Any, storage: Any, client: str, codec: str
) -> None:
    library = clients[client]
    topic = kafka.new_topic(shared_broker.bootstrap)
    sent = RECORDS[client](codec)
    assert library.produce(shared_broker.bootstrap, topic, sent, compression=codec) == list(range(len(sent)))
    # A client may send a batch uncompressed when compression would make it bigger; never only so, unless
    # every batch is mostly random bytes.
    stored = storage(shared_broker, topic, 0)
    assert stored <= {codec, "none"}, f"batches on disk are {stored}, not {codec}"
    assert codec in stored or client in INCOMPRESSIBLE, f"batches on disk are {stored}, not {codec}"

    got = library.consume(shared_broker.bootstrap, topic, len(sent))
    assert [r.offset for r in got] == list(range(len(sent)))
    for record, spec in zip(got, sent, strict=True):
        assert record.content() == (spec["key"], spec["value"], tuple(spec["headers"])), record.offset
        if "timestamp" in spec:
            assert (record.create_time, record.timestamp) == (True, spec["timestamp"]), record.offset
    assert [r.content() for r in kafka.consume_all(shared_broker.bootstrap, topic)] == [r.content() for r in got]

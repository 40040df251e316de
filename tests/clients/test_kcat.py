"""kcat (librdkafka's command-line client) against a real broker: produce, consume, metadata, offsets by time."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tierlog.testing.local_cluster import BrokerProcess

BASE_TS = 1_700_000_000_000


def kcat(*args: str, stdin: bytes = b"", timeout_s: float = 30) -> str:
    done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}: {done.stderr.decode()}"
    return done.stdout.decode()


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_records_round_trip_with_kcat(
    shared_broker: BrokerProcess, kafka: Any, clients: Any, storage: Any, codec: str
) -> None:
    client = clients["kcat"]
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic)
    headers = [("origin", b"kcat"), ("codec", codec.encode())]
    sent = [
        {
            "key": None if i % 6 == 0 else f"clé-{i}",
            "value": None if i % 8 == 1 else f"välue {i} " + "x" * (i % 300),
            "headers": headers,
        }
        for i in range(400)
    ]
    sent = [{**s, "key": s["key"] and s["key"].encode(), "value": s["value"] and s["value"].encode()} for s in sent]
    assert client.produce(shared_broker.bootstrap, topic, sent, compression=codec) == list(range(400))
    # A client may send a batch uncompressed when compression would make it bigger; never only so.
    stored = storage(shared_broker, topic, 0)
    assert codec in stored and stored <= {codec, "none"}, f"batches on disk are {stored}, not {codec}"
    got = client.consume(shared_broker.bootstrap, topic, len(sent))
    assert [r.offset for r in got] == list(range(400))
    for record, spec in zip(got, sent, strict=True):
        assert record.content() == (spec["key"], spec["value"], tuple(headers)), record.offset
    # What kcat read is what librdkafka's Python binding reads.
    assert [r.content() for r in kafka.consume_all(shared_broker.bootstrap, topic)] == [r.content() for r in got]


def test_kcat_metadata_lists_the_broker_and_the_topic(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic, partitions=3)
    listing = kcat("-L", "-b", shared_broker.bootstrap, "-t", topic)
    assert f"broker 1 at 127.0.0.1:{shared_broker.port}" in listing
    assert f'topic "{topic}" with 3 partitions:' in listing
    for partition in range(3):
        assert f"partition {partition}, leader 1, replicas: 1, isrs: 1" in listing


def test_kcat_query_finds_offsets_by_timestamp(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"v", "timestamp": BASE_TS + i * 10} for i in range(30)])
    out = kcat("-Q", "-b", shared_broker.bootstrap, "-t", f"{topic}:0:{BASE_TS + 125}")
    assert f"{topic} [0] offset 13" in out


def test_kcat_consumes_from_timestamp_and_relative_offsets(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic)
    kafka.produce(
        shared_broker.bootstrap, topic, [{"value": b"m%d" % i, "timestamp": BASE_TS + i * 10} for i in range(30)]
    )
    common = ["-C", "-b", shared_broker.bootstrap, "-t", topic, "-p", "0", "-e", "-q", "-f", "%o:%s\\n"]
    assert kcat(*common, "-o", f"s@{BASE_TS + 250}").split() == [f"{i}:m{i}" for i in range(25, 30)]
    assert kcat(*common, "-o", "-3").split() == ["27:m27", "28:m28", "29:m29"]

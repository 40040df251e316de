"""Records produced by any one client read back byte-identical with every other client.

Each producer uses a different codec, so every consumer also decodes every codec another library wrote.
The records are text without tabs or newlines (kcat's input format), with one set of headers for the run
(kcat's -H), but keys and values in many lengths, null keys and null values (never both: kafka-python
and aiokafka refuse such a record).
"""

from __future__ import annotations

from typing import Any

import pytest

from tierlog.testing.local_cluster import BrokerProcess

PRODUCER_CODECS = {"confluent-kafka": "zstd", "kafka-python": "gzip", "aiokafka": "lz4", "kcat": "snappy"}
HEADERS = [("source", b"cross-client"), ("schema", b"v1")]


def dataset(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        key = None if i % 5 == 0 else f"k-{i}-ü".encode()
        value = None if i % 7 == 3 and key is not None else (f"value {i} 🚀 " + "abc" * (i % 200)).encode()
        out.append({"key": key, "value": value, "headers": HEADERS})
    return out


@pytest.mark.parametrize("producer", list(PRODUCER_CODECS))
def test_records_from_one_client_read_back_identically_with_every_client(
    shared_broker: BrokerProcess, kafka: Any, clients: Any, storage: Any, producer: str
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    sent = dataset(500)
    offsets = clients[producer].produce(shared_broker.bootstrap, topic, sent, compression=PRODUCER_CODECS[producer])
    assert offsets == list(range(len(sent)))
    codec = PRODUCER_CODECS[producer]
    stored = storage(shared_broker, topic, 0)  # a batch that compression would enlarge may go uncompressed
    assert codec in stored and stored <= {codec, "none"}, f"batches on disk are {stored}, not {codec}"

    expected = [(s["key"], s["value"], tuple(HEADERS)) for s in sent]
    seen: dict[str, list[tuple[int, int]]] = {}
    for name, consumer in clients.items():
        got = consumer.consume(shared_broker.bootstrap, topic, len(sent))
        assert [r.content() for r in got] == expected, f"{name} read something else than {producer} wrote"
        seen[name] = [(r.offset, r.timestamp) for r in got]
    # Every client sees the same offsets and the same timestamps.
    assert all(v == seen["confluent-kafka"] for v in seen.values()), seen
    assert [offset for offset, _ in seen["confluent-kafka"]] == list(range(len(sent)))

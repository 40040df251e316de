"""A topic's compression.type on a real broker, with confluent-kafka (librdkafka) clients: batches in another
codec are stored in the topic's codec, as Kafka's leader does, consumers read every record as produced, and an
AlterConfigs change applies to the batches produced after it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tierlog.records.record_batch import CompressionType, iter_batches
from tierlog.testing.local_cluster import BrokerProcess, wait_until

CLI_TIMEOUT_S = 60
# Compressible, so librdkafka sends it compressed (it sends a batch uncompressed when compression would not
# make it smaller).
PROBE = b"probe " * 200


def varied_records(count: int) -> list[dict[str, Any]]:
    """Null and binary keys, null values, duplicate headers, CreateTimes out of order."""
    records = []
    for i in range(count):
        headers: list[tuple[str, bytes | None]] = [("seq", b"%d" % i), ("dup", b"a"), ("dup", None)] if i % 3 else []
        records.append(
            {
                "key": None if i % 7 == 0 else b"key-%d" % (i % 10),
                "value": None if i % 11 == 0 else b"event %d " % i + b"payload " * (i % 50),
                "headers": headers,
                "timestamp": 1_700_000_000_000 + i * 1000 - (i % 4) * 2500,
            }
        )
    return records


def stored_batches(broker: BrokerProcess, topic: str) -> list[tuple[int, CompressionType]]:
    """(base offset, codec) of every batch in the partition's segment files, in log order."""
    batches = []
    for segment in sorted((broker.log_dir / f"{topic}-0").glob("*.log")):
        data = segment.read_bytes()
        if data:
            batches += [(h.base_offset, h.compression_type) for h in iter_batches(data)]  # checks each CRC
    return batches


def assert_consumed_as_produced(kafka: Any, bootstrap: str, topic: str, sent: list[dict[str, Any]]) -> None:
    got = kafka.consume_all(bootstrap, topic)
    assert [r.offset for r in got] == list(range(len(sent)))
    for record, spec in zip(got, sent, strict=True):
        assert (record.key, record.value) == (spec["key"], spec["value"]), f"offset {record.offset}"
        assert list(record.headers) == spec["headers"], f"headers of offset {record.offset}"
        assert (record.create_time, record.timestamp) == (True, spec["timestamp"]), f"timestamp of {record.offset}"


def set_topic_configs(kafka: Any, bootstrap: str, topic: str, **configs: str) -> None:
    entries = [
        ConfigEntry(name.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin = kafka.admin(bootstrap)  # kept referenced: librdkafka fails the request if its handle is destroyed
    admin.incremental_alter_configs([resource])[resource].result(kafka.timeout_s)


def test_a_zstd_topic_stores_the_lz4_batches_of_an_idempotent_producer_as_zstd(
    shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, config={"compression.type": "zstd"})
    sent = varied_records(800)
    acked = kafka.produce(
        shared_broker.bootstrap, topic, sent, compression_type="lz4", enable_idempotence=True, batch_size=16384
    )
    assert acked == [(0, i) for i in range(len(sent))]

    batches = stored_batches(shared_broker, topic)
    assert len(batches) > 1 and {codec for _, codec in batches} == {CompressionType.ZSTD}
    assert_consumed_as_produced(kafka, shared_broker.bootstrap, topic, sent)

    # kafka-dump-log.sh's view of the segment shows the same.
    segment = sorted((shared_broker.log_dir / f"{topic}-0").glob("*.log"))[0]
    dumped = subprocess.run(
        [sys.executable, "-m", "tierlog", "dump-log", "--files", str(segment)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert dumped.returncode == 0, dumped.stderr
    assert dumped.stdout.splitlines()[0] == f"Dumping {segment}"
    batch_lines = [line for line in dumped.stdout.splitlines() if line.startswith("baseOffset:")]
    assert len(batch_lines) == len(batches)
    assert all("compresscodec: zstd" in line and "isvalid: true" in line for line in batch_lines)
    assert all("producerId: -1" not in line for line in batch_lines)  # the idempotent producer's id is kept


def test_an_uncompressed_topic_stores_compressed_batches_uncompressed(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, config={"compression.type": "uncompressed"})
    sent = varied_records(300)
    kafka.produce(shared_broker.bootstrap, topic, sent, compression_type="lz4", linger_ms=20)
    assert {codec for _, codec in stored_batches(shared_broker, topic)} == {CompressionType.NONE}
    assert_consumed_as_produced(kafka, shared_broker.bootstrap, topic, sent)


def produce_probes_until_stored_as(
    kafka: Any, broker: BrokerProcess, topic: str, producer_codec: str, stored: CompressionType
) -> None:
    """A topic config change takes effect when the broker applies the controller's record, which may be just
    after AlterConfigs is answered (in Kafka's KRaft mode too): produce one-record batches until one is
    stored in `stored`."""

    def last_batch_stored_as_expected() -> bool:
        kafka.produce(broker.bootstrap, topic, [{"value": PROBE}], compression_type=producer_codec)
        return stored_batches(broker, topic)[-1][1] == stored

    wait_until(last_batch_stored_as_expected, kafka.timeout_s, f"a batch of {topic} stored as {stored.name}")


def test_changing_compression_type_applies_to_the_batches_produced_after_it(
    shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.topic_name()
    bootstrap = shared_broker.bootstrap
    kafka.create_topic(bootstrap, topic, config={"compression.type": "lz4"})
    sent = varied_records(200)
    # Every value compressible on its own: librdkafka sends a batch uncompressed when compression would not
    # shrink it, and the last phase stores batches as sent.
    sent += [{**record, "value": b"compressible %d " % i * 30} for i, record in enumerate(varied_records(100))]
    first = kafka.produce(bootstrap, topic, sent[:100], compression_type="snappy")
    set_topic_configs(kafka, bootstrap, topic, compression_type="gzip", compression_gzip_level="1")
    produce_probes_until_stored_as(kafka, shared_broker, topic, "snappy", CompressionType.GZIP)
    second = kafka.produce(bootstrap, topic, sent[100:200], compression_type="snappy")
    set_topic_configs(kafka, bootstrap, topic, compression_type="producer")
    produce_probes_until_stored_as(kafka, shared_broker, topic, "snappy", CompressionType.SNAPPY)
    third = kafka.produce(bootstrap, topic, sent[200:], compression_type="snappy")

    def codecs(acked: list[tuple[int, int]]) -> set[CompressionType]:
        offsets = {offset for _, offset in acked}
        return {codec for base_offset, codec in stored_batches(shared_broker, topic) if base_offset in offsets}

    assert codecs(first) == {CompressionType.LZ4}
    assert codecs(second) == {CompressionType.GZIP}
    assert codecs(third) == {CompressionType.SNAPPY}
    records = [r for r in kafka.consume_all(bootstrap, topic) if r.value != PROBE]
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in records] == [
        (s["key"], s["value"], s["headers"], s["timestamp"]) for s in sent
    ]


def test_an_invalid_level_is_refused_with_kafkas_message(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, config={"compression.type": "zstd"})
    with pytest.raises(KafkaException) as refused:
        set_topic_configs(kafka, shared_broker.bootstrap, topic, compression_zstd_level="23")
    error = refused.value.args[0]
    assert error.name() == "INVALID_CONFIG"
    assert "Invalid value 23 for configuration compression.zstd.level: Value must be no more than 22" in error.str()

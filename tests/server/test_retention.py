"""Retention and DeleteRecords over a real broker: old segments go, the log start offset moves, the rest stays.

Each retention test writes with retention off, takes the segment layout from disk, then switches the limit
on (AlterConfigs) and computes, by Kafka's rule, exactly which segments must go; the broker's retention
check runs every 200 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tierlog.testing.local_cluster import BrokerProcess, wait_until

SEGMENT_BYTES = 16 * 1024
# A produce whose records for one partition exceed a segment is refused (RECORD_LIST_TOO_LARGE), as in Kafka,
# and librdkafka may put several batches of a partition into one request: keep batches and requests small.
SMALL_BATCHES = {"batch_size": 8000, "message_max_bytes": 12000, "linger_ms": 0}
RETENTION_OVERRIDES = {
    "log.retention.check.interval.ms": "200",
    # Deleted segments are renamed *.deleted and removed after this delay; keep it short here.
    "log.segment.delete.delay.ms": "100",
}


def segment_sizes(broker: BrokerProcess, topic: str, partition: int = 0) -> list[tuple[int, int]]:
    """(base offset, .log size) of every live segment, in offset order."""
    return sorted((int(p.stem), p.stat().st_size) for p in (broker.log_dir / f"{topic}-{partition}").glob("*.log"))


def files_of_segment(broker: BrokerProcess, topic: str, base_offset: int) -> list[Path]:
    return list((broker.log_dir / f"{topic}-0").glob(f"{base_offset:020d}.*"))


def set_topic_config(kafka: Any, broker: BrokerProcess, topic: str, name: str, value: str) -> None:
    admin = kafka.admin(broker.bootstrap)
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([resource])[resource].result(kafka.timeout_s)


def assert_retention_deleted_exactly(
    broker: BrokerProcess,
    kafka: Any,
    topic: str,
    layout: list[tuple[int, int]],
    deleted: int,
    end: int,
) -> None:
    expected_start = layout[deleted][0]
    wait_until(
        lambda: kafka.watermarks(broker.bootstrap, topic)[0] >= expected_start,
        15,
        f"the log start offset to reach {expected_start}",
    )
    assert kafka.watermarks(broker.bootstrap, topic) == (expected_start, end)
    gone = [base for base, _ in layout[:deleted]]
    wait_until(
        lambda: not any(files_of_segment(broker, topic, base) for base in gone),
        15,
        "the deleted segments' files to disappear",
    )
    assert [base for base, _ in segment_sizes(broker, topic)][: len(layout) - deleted] == [
        base for base, _ in layout[deleted:]
    ]
    got = kafka.consume_all(broker.bootstrap, topic)
    assert [r.offset for r in got] == list(range(expected_start, end))


def test_retention_ms_deletes_segments_whose_records_are_all_older_than_the_limit(
    broker_factory: Callable[..., BrokerProcess], kafka: Any
) -> None:
    broker = broker_factory(RETENTION_OVERRIDES)
    topic = kafka.new_topic(broker.bootstrap, config={"segment.bytes": str(SEGMENT_BYTES)})
    now = int(time.time() * 1000)
    old = [{"value": b"old-%04d" % i + b"." * 1000, "timestamp": now - 3 * 3_600_000 + i} for i in range(200)]
    new = [{"value": b"new-%04d" % i + b"." * 1000, "timestamp": now + i} for i in range(60)]
    kafka.produce(broker.bootstrap, topic, old, linger_ms=0, batch_num_messages=4)
    kafka.produce(broker.bootstrap, topic, new, linger_ms=0, batch_num_messages=4)
    layout = segment_sizes(broker, topic)
    assert len(layout) > 5
    # Kafka deletes segments from the oldest while their largest timestamp is beyond retention.ms: every
    # segment that ends before the first new record (offset 200).
    deleted = sum(1 for i, _ in enumerate(layout[:-1]) if layout[i + 1][0] <= 200)
    assert deleted >= 3

    set_topic_config(kafka, broker, topic, "retention.ms", str(3_600_000))
    assert_retention_deleted_exactly(broker, kafka, topic, layout, deleted, 260)


def test_retention_bytes_deletes_the_oldest_segments_beyond_the_size_limit(
    broker_factory: Callable[..., BrokerProcess], kafka: Any
) -> None:
    broker = broker_factory(RETENTION_OVERRIDES)
    topic = kafka.new_topic(broker.bootstrap, config={"segment.bytes": str(SEGMENT_BYTES)})
    kafka.produce(broker.bootstrap, topic, [{"value": b"%05d" % i + b"-" * 1000} for i in range(300)], **SMALL_BATCHES)
    layout = segment_sizes(broker, topic)
    assert len(layout) > 5
    retention_bytes = 50_000
    # Kafka's rule: with diff = total size - retention.bytes, delete from the oldest while a segment
    # still fits in diff.
    diff = sum(size for _, size in layout) - retention_bytes
    deleted = 0
    for _, size in layout:
        if diff - size < 0:
            break
        diff -= size
        deleted += 1
    assert deleted >= 3

    set_topic_config(kafka, broker, topic, "retention.bytes", str(retention_bytes))
    assert_retention_deleted_exactly(broker, kafka, topic, layout, deleted, 300)
    remaining = sum(size for _, size in segment_sizes(broker, topic))
    assert retention_bytes <= remaining < retention_bytes + SEGMENT_BYTES + 2000
    # The moved log start survives a restart.
    broker.restart()
    assert kafka.watermarks(broker.bootstrap, topic) == (layout[deleted][0], 300)


def test_retention_by_broker_defaults_applies_to_new_segments_too(
    broker_factory: Callable[..., BrokerProcess], kafka: Any
) -> None:
    # The broker-wide log.retention.bytes with a topic that has no override of its own; writing goes on
    # while retention runs.
    broker = broker_factory({**RETENTION_OVERRIDES, "log.retention.bytes": "40000", "log.segment.bytes": "16384"})
    topic = kafka.new_topic(broker.bootstrap)
    for round_ in range(5):
        values = [{"value": b"%d-%04d" % (round_, i) + b"=" * 500} for i in range(100)]
        kafka.produce(broker.bootstrap, topic, values, **SMALL_BATCHES)
    wait_until(
        lambda: sum(size for _, size in segment_sizes(broker, topic)) < 40_000 + 16_384 + 2000,
        15,
        "retention to bring the partition near 40000 bytes",
    )
    low, high = kafka.watermarks(broker.bootstrap, topic)
    assert high == 500 and 0 < low < 500
    assert [r.offset for r in kafka.consume_all(broker.bootstrap, topic)] == list(range(low, 500))


def test_delete_records_moves_the_log_start_offset_and_survives_a_restart(broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(broker.bootstrap)
    topic = kafka.new_topic(broker.bootstrap, partitions=2, config={"segment.bytes": str(SEGMENT_BYTES)})
    kafka.produce(
        broker.bootstrap,
        topic,
        [{"value": b"%04d" % i + b"#" * 300, "partition": i % 2} for i in range(400)],
        **SMALL_BATCHES,
    )
    futures = admin.delete_records([TopicPartition(topic, 0, 123), TopicPartition(topic, 1, 7)])
    assert {tp.partition: f.result(kafka.timeout_s).low_watermark for tp, f in futures.items()} == {0: 123, 1: 7}
    assert kafka.watermarks(broker.bootstrap, topic, 0) == (123, 200)
    assert kafka.watermarks(broker.bootstrap, topic, 1) == (7, 200)
    assert kafka.consume_all(broker.bootstrap, topic, (0,))[0].offset == 123

    # Reading below the log start is out of range for a consumer that asks for it.
    consumer = kafka.consumer(broker.bootstrap)
    try:
        consumer.assign([TopicPartition(topic, 0, 50)])

        def consumer_error() -> Any:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is not None and msg.error().code() != -191:  # not PARTITION_EOF
                return msg.error()
            return None

        error = wait_until(consumer_error, kafka.timeout_s, f"a consumer error reading {topic}-0 from offset 50", 0)
        assert "out of range" in str(error).lower(), error
    finally:
        consumer.close()

    broker.restart()
    assert kafka.watermarks(broker.bootstrap, topic, 0) == (123, 200)
    assert kafka.watermarks(broker.bootstrap, topic, 1) == (7, 200)
    assert [r.offset for r in kafka.consume_all(broker.bootstrap, topic, (1,))] == list(range(7, 200))

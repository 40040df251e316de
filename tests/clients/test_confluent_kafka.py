"""confluent-kafka (librdkafka) against a real broker: codecs on disk, partitions, offsets, sizes, acks and timestamps
(its produce/consume round trip is in test_round_trip.py).

Consumers never join a group: they assign() partitions and never commit.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_END, TIMESTAMP_LOG_APPEND_TIME, TopicPartition

from tierlog.testing.local_cluster import BrokerProcess, wait_until

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BASE_TS = 1_700_000_000_000


@pytest.mark.parametrize("codec", CODECS)
def test_batches_are_stored_with_the_codec_the_producer_was_configured_with(
    shared_broker: BrokerProcess, kafka: Any, storage: Callable[..., set[str]], codec: str
) -> None:
    # librdkafka silently falls back to uncompressed batches when the broker's ApiVersions make it believe
    # the codec is unsupported (lz4 needs FindCoordinator v0 advertised, zstd Produce v7 and Fetch v10).
    # The broker writes batches as sent, so the segment files show which codec really travelled.
    topic = kafka.new_topic(shared_broker.bootstrap)
    sent = [{"key": b"k", "value": b"tierlog " * 250} for _ in range(100)]
    kafka.produce(shared_broker.bootstrap, topic, sent, compression_type=codec, linger_ms=50)
    assert storage(shared_broker, topic, 0) == {codec}
    assert [r.value for r in kafka.consume_all(shared_broker.bootstrap, topic)] == [s["value"] for s in sent]


def test_records_keep_their_partition_and_order_across_partitions(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=8)
    sent = [{"key": b"key-%d" % (i % 50), "value": b"value-%06d" % i} for i in range(4000)]
    acked = kafka.produce(shared_broker.bootstrap, topic, sent, compression_type="lz4")
    got = kafka.consume_all(shared_broker.bootstrap, topic, partitions=range(8))
    assert len(got) == len(sent)
    by_position = {(r.partition, r.offset): r for r in got}
    for (partition, offset), spec in zip(acked, sent, strict=True):
        assert by_position[(partition, offset)].value == spec["value"]
    # The default partitioner hashes keys: every key lands in exactly one partition, in send order.
    partitions_of_key: dict[bytes | None, set[int]] = {}
    for r in got:
        partitions_of_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions_of_key.values())
    assert len({r.partition for r in got}) > 1
    for partition in range(8):
        values = [r.value for r in got if r.partition == partition]
        assert values == sorted(values)


def test_consuming_from_an_offset_in_the_middle_starts_exactly_there(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    sent = [{"value": b"v%d" % i} for i in range(1000)]
    # Many small batches, so the start offset falls inside a batch: the client skips its first records.
    kafka.produce(shared_broker.bootstrap, topic, sent, linger_ms=0, batch_num_messages=7)
    got = kafka.consume_all(shared_broker.bootstrap, topic, start_offset=503)
    assert [r.offset for r in got] == list(range(503, 1000))
    assert [r.value for r in got] == [s["value"] for s in sent[503:]]


def test_large_records_near_message_max_bytes_round_trip(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    sent = [{"value": random.Random(i).randbytes(900_000)} for i in range(3)]
    kafka.produce(shared_broker.bootstrap, topic, sent, linger_ms=0)
    assert [r.value for r in kafka.consume_all(shared_broker.bootstrap, topic)] == [s["value"] for s in sent]


def test_record_larger_than_max_message_bytes_is_refused(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, config={"max.message.bytes": "10000"})
    assert kafka.delivery_errors(shared_broker.bootstrap, topic, [{"value": b"x" * 20_000}]) == ["MSG_SIZE_TOO_LARGE"]
    assert kafka.watermarks(shared_broker.bootstrap, topic) == (0, 0)


def test_offsets_for_times_finds_the_first_offset_at_or_after_the_timestamp(
    shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.topic_name()
    # Small segments: the lookup has to pick the right segment and then the right batch in it.
    kafka.create_topic(shared_broker.bootstrap, topic, config={"segment.bytes": str(1024 * 1024)})
    sent = [{"value": b"x" * 2000, "timestamp": BASE_TS + i * 1000} for i in range(2000)]
    kafka.produce(shared_broker.bootstrap, topic, sent, linger_ms=0, batch_num_messages=10)
    assert len(list((shared_broker.log_dir / f"{topic}-0").glob("*.log"))) >= 3

    consumer = kafka.consumer(shared_broker.bootstrap)
    try:

        def offset_for(ts: int) -> int:
            [found] = consumer.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=kafka.timeout_s)
            assert found.error is None
            return int(found.offset)

        assert offset_for(BASE_TS - 10_000) == 0
        assert offset_for(BASE_TS) == 0
        assert offset_for(BASE_TS + 1) == 1
        assert offset_for(BASE_TS + 1234 * 1000) == 1234
        assert offset_for(BASE_TS + 1234 * 1000 - 1) == 1234
        assert offset_for(BASE_TS + 1999 * 1000) == 1999
        assert offset_for(BASE_TS + 2000 * 1000) == OFFSET_END  # -1: no record that late
    finally:
        consumer.close()


def test_offsets_for_times_with_timestamps_out_of_offset_order(shared_broker: BrokerProcess, kafka: Any) -> None:
    # Kafka answers with the first offset whose timestamp is >= the target, even when an earlier offset
    # carries a later timestamp.
    topic = kafka.new_topic(shared_broker.bootstrap)
    timestamps = [5000, 1000, 3000, 9000, 2000, 7000]
    kafka.produce(
        shared_broker.bootstrap,
        topic,
        [{"value": b"%d" % ts, "timestamp": BASE_TS + ts} for ts in timestamps],
        linger_ms=0,
        batch_num_messages=1,
    )
    consumer = kafka.consumer(shared_broker.bootstrap)
    try:
        for target, expected in [(500, 0), (5000, 0), (6000, 3), (8000, 3), (9000, 3), (9001, OFFSET_END)]:
            [found] = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_TS + target)], timeout=kafka.timeout_s)
            assert (target, found.offset) == (target, expected)
    finally:
        consumer.close()


def test_earliest_and_latest_offsets_are_log_start_and_end(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
    assert kafka.watermarks(shared_broker.bootstrap, topic, 0) == (0, 0)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"v", "partition": 1}] * 25)
    assert kafka.watermarks(shared_broker.bootstrap, topic, 0) == (0, 0)
    assert kafka.watermarks(shared_broker.bootstrap, topic, 1) == (0, 25)


def test_produce_with_acks_1_and_acks_0_both_append(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"acks1-%d" % i} for i in range(50)], acks=1)
    # acks=0 gets no answer: the records must still arrive, after the acks=1 ones, in order.
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"acks0-%d" % i} for i in range(50)], acks=0)
    wait_until(lambda: kafka.watermarks(shared_broker.bootstrap, topic)[1] == 100, 10, "the acks=0 records")
    values = [r.value for r in kafka.consume_all(shared_broker.bootstrap, topic)]
    assert values == [b"acks1-%d" % i for i in range(50)] + [b"acks0-%d" % i for i in range(50)]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_log_append_time_topics_stamp_the_broker_time(shared_broker: BrokerProcess, kafka: Any, codec: str) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    sent = [{"value": b"v%d" % i, "timestamp": BASE_TS + i} for i in range(50)]
    kafka.produce(shared_broker.bootstrap, topic, sent, compression_type=codec)
    after = int(time.time() * 1000)
    consumer = kafka.consumer(shared_broker.bootstrap)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[tuple[int, int]] = []

        def read_all() -> bool:
            seen.extend(m.timestamp() for m in consumer.consume(100, timeout=0.2) if m.error() is None)
            return len(seen) >= len(sent)

        wait_until(read_all, kafka.timeout_s, lambda: f"{len(sent)} records of {topic} (have {len(seen)})", 0)
    finally:
        consumer.close()
    assert len(seen) == len(sent)
    for ts_type, ts in seen:
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME
        assert before <= ts <= after
    # A timestamp lookup uses the append time too, not the CreateTime the producer set.
    consumer = kafka.consumer(shared_broker.bootstrap)
    try:
        [found] = consumer.offsets_for_times([TopicPartition(topic, 0, before)], timeout=kafka.timeout_s)
        assert found.offset == 0
        [found] = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_TS)], timeout=kafka.timeout_s)
        assert found.offset == 0
    finally:
        consumer.close()


def test_create_time_too_far_ahead_is_refused_with_invalid_timestamp(shared_broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, config={"message.timestamp.after.max.ms": "3600000"})
    future = int(time.time() * 1000) + 2 * 3_600_000
    records = [{"value": b"from the future", "timestamp": future}, {"value": b"now"}]
    assert kafka.delivery_errors(shared_broker.bootstrap, topic, records) == ["INVALID_TIMESTAMP", None]
    assert [r.value for r in kafka.consume_all(shared_broker.bootstrap, topic)] == [b"now"]

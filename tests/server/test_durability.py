"""Durability over real broker processes: clean restarts, kill -9 under load, garbage at a segment's end.

Everything is checked from the outside, as a client would: records come back at the offsets the broker
acknowledged. The on-disk checks only use the layout Kafka documents (`<topic>-<partition>/` directories
of 20-digit `.log` segments and the `.kafka_cleanshutdown` marker).
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicCollection, TopicPartition
from storage_helpers import T0, make_batch

from tierlog.testing.local_cluster import BrokerProcess

CLEAN_SHUTDOWN_MARKER = ".kafka_cleanshutdown"


def segments(broker: BrokerProcess, topic: str, partition: int = 0) -> list[Path]:
    return sorted((broker.log_dir / f"{topic}-{partition}").glob("*.log"))


def restart_after(broker: BrokerProcess) -> None:
    """Start a broker that was stopped or killed again on the same port and data directory."""
    broker.start()
    broker.wait_ready(30)


def test_sigterm_shuts_down_cleanly_and_restart_keeps_every_record_and_topic(broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(broker.bootstrap)
    topic = kafka.new_topic(broker.bootstrap, partitions=3, config={"retention.ms": "86400000"})
    rng = random.Random(1)
    sent = [
        {"key": b"k%d" % i, "value": rng.randbytes(rng.randrange(1, 2000)), "headers": [("i", b"%d" % i)]}
        for i in range(6000)
    ]
    kafka.produce(broker.bootstrap, topic, sent[:3000], compression_type="lz4")
    kafka.produce(broker.bootstrap, topic, sent[3000:], compression_type="none")
    assert len(segments(broker, topic, 0)) >= 2, "the test should span more than one segment"
    before = kafka.consume_all(broker.bootstrap, topic, range(3))
    ends = [kafka.watermarks(broker.bootstrap, topic, p) for p in range(3)]
    topic_id = str(admin.describe_topics(TopicCollection([topic]))[topic].result(kafka.timeout_s).topic_id)

    assert broker.stop() == 0, "SIGTERM should end the broker with exit code 0"
    assert (broker.log_dir / CLEAN_SHUTDOWN_MARKER).exists(), "a clean shutdown leaves the marker"
    restart_after(broker)

    assert kafka.consume_all(broker.bootstrap, topic, range(3)) == before
    assert [kafka.watermarks(broker.bootstrap, topic, p) for p in range(3)] == ends
    admin = kafka.admin(broker.bootstrap)
    description = admin.describe_topics(TopicCollection([topic]))[topic].result(kafka.timeout_s)
    assert str(description.topic_id) == topic_id and len(description.partitions) == 3
    # New records go on at the old log end.
    acked = kafka.produce(broker.bootstrap, topic, [{"value": b"after", "partition": 1}])
    assert acked == [(1, ends[1][1])]


def test_sigterm_with_clients_connected_shuts_down_without_errors(broker: BrokerProcess, kafka: Any) -> None:
    # A consumer waiting in a long fetch and an idle producer connection are open when SIGTERM arrives:
    # a controlled shutdown ends them quietly, exits 0, and logs no error.
    topic = kafka.new_topic(broker.bootstrap)
    kafka.produce(broker.bootstrap, topic, [{"value": b"x"}])
    producer = kafka.producer(broker.bootstrap)
    producer.produce(topic, value=b"y")
    assert producer.flush(kafka.timeout_s) == 0
    consumer = kafka.consumer(broker.bootstrap, fetch_wait_max_ms=5000)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert consumer.consume(2, timeout=kafka.timeout_s)  # connected, then parked in the fetch purgatory
        consumer.poll(0.3)
        log_start = broker.log_file.stat().st_size
        assert broker.stop() == 0
    finally:
        consumer.close()
    with broker.log_file.open("rb") as f:
        f.seek(log_start)
        shutdown_log = f.read().decode(errors="replace")
    assert "shut down cleanly" in shutdown_log
    assert " ERROR " not in shutdown_log and "Traceback" not in shutdown_log, shutdown_log


def test_second_restart_after_a_restart_still_has_everything(broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(broker.bootstrap)
    kafka.produce(broker.bootstrap, topic, [{"value": b"a%d" % i} for i in range(100)])
    broker.restart()
    kafka.produce(broker.bootstrap, topic, [{"value": b"b%d" % i} for i in range(100)])
    broker.restart()
    values = [r.value for r in kafka.consume_all(broker.bootstrap, topic)]
    assert values == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]


@pytest.mark.parametrize("acks", ["1", "all"])
def test_kill_9_during_heavy_produce_keeps_every_acknowledged_record(
    broker: BrokerProcess, kafka: Any, acks: str
) -> None:
    partitions = 4
    topic = kafka.new_topic(broker.bootstrap, partitions=partitions)
    producer = kafka.producer(
        broker.bootstrap,
        acks=acks,
        linger_ms=2,
        batch_size=64 * 1024,
        enable_idempotence=False,
        retries=0,
        message_timeout_ms=10_000,
        max_in_flight_requests_per_connection=5,
    )
    acked: dict[tuple[int, int], bytes] = {}
    failed = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal failed
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()
        else:
            failed += 1

    # Produce flat out for 1.5 s, then kill the broker while thousands more are queued or in flight.
    padding = b"." * 200
    killed_with_outstanding = -1
    started = time.monotonic()
    i = 0
    while killed_with_outstanding < 0:
        try:
            producer.produce(topic, value=b"%09d" % i + padding, key=b"%d" % i, on_delivery=on_delivery)
            i += 1
        except BufferError:
            producer.poll(0.01)
        if i % 500 == 0:
            producer.poll(0)
        if time.monotonic() - started > 1.5 and len(acked) >= 1000:
            killed_with_outstanding = len(producer)
            broker.kill(signal.SIGKILL)
    assert time.monotonic() - started < 60
    assert killed_with_outstanding > 0, "the kill should land while records are in flight"
    print(f"acknowledged {len(acked)} records before the kill, {killed_with_outstanding} outstanding")
    assert len(acked) >= 1000, f"only {len(acked)} records were acknowledged before the kill"

    # Whatever was answered before the kill still gets its delivery report; the rest fails.
    producer.poll(0.5)
    producer.purge()
    assert producer.flush(15) == 0
    assert not (broker.log_dir / CLEAN_SHUTDOWN_MARKER).exists()

    restart_after(broker)
    got = kafka.consume_all(broker.bootstrap, topic, range(partitions))
    stored = {(r.partition, r.offset): r.value for r in got}
    missing = [(pos, value[:9]) for pos, value in sorted(acked.items()) if stored.get(pos) != value]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged records are lost or changed: {missing[:10]}"
    for p in range(partitions):
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == list(range(len(offsets))), f"partition {p} has holes after recovery"
    # The log goes on where recovery left it.
    end = kafka.watermarks(broker.bootstrap, topic, 0)[1]
    assert kafka.produce(broker.bootstrap, topic, [{"value": b"after", "partition": 0}]) == [(0, end)]


def _torn_batch(base_offset: int) -> bytes:
    values = [b"torn-%d" % i * 20 for i in range(20)]
    return bytes(make_batch(20, values=values, keys=[None] * 20, timestamps=[T0] * 20, base_offset=base_offset))


def _garbage(kind: str, next_offset: int) -> bytes:
    if kind == "zeros":
        return bytes(8192)
    if kind == "random":
        return random.Random(5).randbytes(5000)
    batch = _torn_batch(next_offset)
    if kind == "torn-batch":
        return batch[: len(batch) * 2 // 3]
    assert kind == "whole-batch-bad-crc"
    damaged = bytearray(batch)
    damaged[-5] ^= 0x55
    return bytes(damaged)


@pytest.mark.parametrize("kind", ["zeros", "random", "torn-batch", "whole-batch-bad-crc"])
def test_garbage_appended_to_the_active_segment_is_truncated_on_restart(
    broker: BrokerProcess, kafka: Any, kind: str
) -> None:
    topic = kafka.new_topic(broker.bootstrap)
    sent = [{"key": b"k%d" % i, "value": b"v" * (i % 700)} for i in range(3000)]
    kafka.produce(broker.bootstrap, topic, sent, compression_type="gzip")
    before = kafka.consume_all(broker.bootstrap, topic)
    assert len(before) == 3000

    broker.kill(signal.SIGKILL)
    assert not (broker.log_dir / CLEAN_SHUTDOWN_MARKER).exists()
    active = segments(broker, topic)[-1]
    size = active.stat().st_size
    with active.open("ab") as f:
        f.write(_garbage(kind, 3000))

    restart_after(broker)
    assert kafka.consume_all(broker.bootstrap, topic) == before
    assert kafka.watermarks(broker.bootstrap, topic) == (0, 3000)
    assert active.stat().st_size == size, "recovery should cut the segment back to its last valid batch"
    assert kafka.produce(broker.bootstrap, topic, [{"value": b"next"}]) == [(0, 3000)]
    assert kafka.consume_all(broker.bootstrap, topic, start_offset=2999)[-1].value == b"next"


def test_restart_after_kill_9_without_damage_keeps_everything(broker: BrokerProcess, kafka: Any) -> None:
    topic = kafka.new_topic(broker.bootstrap, partitions=2)
    kafka.produce(broker.bootstrap, topic, [{"value": b"%d" % i, "partition": i % 2} for i in range(5000)])
    before = kafka.consume_all(broker.bootstrap, topic, range(2))
    broker.kill(signal.SIGKILL)
    restart_after(broker)
    assert kafka.consume_all(broker.bootstrap, topic, range(2)) == before


def test_clients_reconnect_after_a_restart(broker: BrokerProcess, kafka: Any) -> None:
    # One producer lives across the restart: librdkafka reconnects to the same address and goes on.
    topic = kafka.new_topic(broker.bootstrap)
    producer = kafka.producer(broker.bootstrap, acks="all", message_timeout_ms=30_000)
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for i in range(100):
        producer.produce(topic, value=b"%d" % i, on_delivery=report)
    assert producer.flush(kafka.timeout_s) == 0
    broker.restart()
    for i in range(100, 200):
        producer.produce(topic, value=b"%d" % i, on_delivery=report)
    assert producer.flush(kafka.timeout_s) == 0
    assert not errors
    assert [r.value for r in kafka.consume_all(broker.bootstrap, topic)] == [b"%d" % i for i in range(200)]


@pytest.mark.parametrize("shutdown", ["clean", "kill-9"])
def test_missing_index_files_are_rebuilt_on_restart(broker: BrokerProcess, kafka: Any, shutdown: str) -> None:
    # Offset and time indexes are derived data: without them a restart must rebuild them from the .log
    # files, after a clean shutdown as after a crash, and lookups by offset and by time work as before.
    topic = kafka.new_topic(broker.bootstrap)
    base_ts = 1_700_000_000_000
    sent = [{"value": b"%05d" % i + b"." * 700, "timestamp": base_ts + i * 10} for i in range(4000)]
    kafka.produce(broker.bootstrap, topic, sent, linger_ms=0, batch_num_messages=20)
    assert len(segments(broker, topic)) >= 2
    if shutdown == "clean":
        assert broker.stop() == 0
    else:
        broker.kill(signal.SIGKILL)
    index_files = [p for p in (broker.log_dir / f"{topic}-0").iterdir() if p.suffix in (".index", ".timeindex")]
    assert index_files
    for path in index_files:
        path.unlink()
    restart_after(broker)

    got = kafka.consume_all(broker.bootstrap, topic, start_offset=2345)
    assert [r.value for r in got] == [s["value"] for s in sent[2345:]]
    consumer = kafka.consumer(broker.bootstrap)
    try:
        for target in (0, 1234, 3999):
            [found] = consumer.offsets_for_times(
                [TopicPartition(topic, 0, base_ts + target * 10 - 5)], timeout=kafka.timeout_s
            )
            assert found.offset == target
    finally:
        consumer.close()

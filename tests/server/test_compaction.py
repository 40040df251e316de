"""Log compaction on real brokers: a compacted topic written with many updates per key ends with the latest
record per key (and tombstones until delete.retention.ms has passed) at the offsets the producer was told,
readable by confluent-kafka, kafka-python, aiokafka and kcat; records without a key are refused; every
replica of a replicated topic compacts to the same records."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import NewTopic

from tierlog.common import TopicPartition
from tierlog.records.codec import decode_batches
from tierlog.storage.checkpoints import OffsetCheckpointFile
from tierlog.storage.log_cleaner import CLEANER_OFFSET_CHECKPOINT_FILENAME
from tierlog.storage.offset_map import BYTES_PER_ENTRY
from tierlog.testing.local_cluster import BrokerProcess, wait_until

Entry = tuple[int, bytes | None, bytes | None]
CLEANER_OVERRIDES = {
    "log.cleaner.backoff.ms": "100",
    "log.segment.delete.delay.ms": "100",
    "log.retention.check.interval.ms": "200",
}
# Small segments so the cleaner has many closed ones; batches well below a segment.
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"}
SMALL_BATCHES = {"linger_ms": 0, "batch_size": 1000}
CLEAN_TIMEOUT_S = 60


def cleaner_checkpoint(log_dir: Path, topic: str) -> int | None:
    return OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT_FILENAME).read().get(TopicPartition(topic, 0))


def active_segment_base(log_dir: Path, topic: str) -> int:
    return max(int(p.name.split(".")[0]) for p in (log_dir / f"{topic}-0").glob("*.log"))


def stored_records(log_dir: Path, topic: str) -> list[Entry]:
    """(offset, key, value) of every record in the partition's segment files, in offset order."""
    entries: list[Entry] = []
    for path in sorted((log_dir / f"{topic}-0").glob("*.log")):
        for batch in decode_batches(path.read_bytes()):
            entries.extend((r.offset, r.key, r.value) for r in batch.records)
    return entries


def cleanings(http_address: str) -> float:
    """tierlog_log_cleaner_cleanings_total from the broker's /metrics."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return float(re.search(r"^tierlog_log_cleaner_cleanings_total (\S+)$", text, re.MULTILINE)[1])  # type: ignore[index]


def latest_per_key(entries: Sequence[Entry]) -> list[Entry]:
    latest: dict[bytes | None, Entry] = {}
    for entry in entries:
        latest[entry[1]] = entry
    return sorted(latest.values())


def updates(
    keys: int, rounds: int, tag: str, tombstones: Sequence[int] = (), prefix: str = "key"
) -> list[dict[str, Any]]:
    """`rounds` values for each of `keys` keys, then a tombstone for each key in `tombstones`."""
    specs: list[dict[str, Any]] = [
        {"key": f"{prefix}-{k}".encode(), "value": f"{tag}-{r}-{k}".encode(), "headers": [("h", b"x")]}
        for r in range(rounds)
        for k in range(keys)
    ]
    specs += [{"key": f"{prefix}-{k}".encode(), "value": None, "headers": [("h", b"x")]} for k in tombstones]
    return specs


def produce(kafka: Any, bootstrap: str, topic: str, specs: Sequence[dict[str, Any]]) -> list[Entry]:
    acked = kafka.produce(bootstrap, topic, specs, **SMALL_BATCHES)
    return [(offset, spec["key"], spec["value"]) for (_, offset), spec in zip(acked, specs, strict=True)]


def wait_cleaned_up_to_the_active_segment(log_dir: Path, topic: str) -> int:
    """Wait until the cleaner's checkpoint reaches the active segment; return its base offset."""
    wait_until(
        lambda: cleaner_checkpoint(log_dir, topic) == active_segment_base(log_dir, topic),
        CLEAN_TIMEOUT_S,
        f"the cleaner to reach the active segment of {topic}",
    )
    return active_segment_base(log_dir, topic)


def compacted_view(written: Sequence[Entry], active_base: int) -> list[Entry]:
    """What a cleaned log holds: the latest record per key below the active segment, then the active one."""
    return latest_per_key([e for e in written if e[0] < active_base]) + [e for e in written if e[0] >= active_base]


def test_a_compacted_topic_keeps_the_latest_record_per_key_at_its_offset_for_every_client(
    broker_factory: Any, kafka: Any, clients: dict[str, Any]
) -> None:
    broker: BrokerProcess = broker_factory(CLEANER_OVERRIDES)
    topic = kafka.new_topic(broker.bootstrap, config=COMPACTED)
    written = produce(kafka, broker.bootstrap, topic, updates(keys=30, rounds=12, tag="v", tombstones=[3, 7]))
    assert [offset for offset, _, _ in written] == list(range(len(written)))
    active_base = wait_cleaned_up_to_the_active_segment(broker.log_dir, topic)
    expected = compacted_view(written, active_base)
    assert len(expected) < len(written) // 3
    assert (3, b"key-3", None) not in expected and any(e[1] == b"key-3" and e[2] is None for e in expected)
    for name, client in clients.items():
        got = client.consume(broker.bootstrap, topic, len(expected))
        assert [(r.offset, r.key, r.value) for r in got] == expected, name
        assert all(r.headers == (("h", b"x"),) for r in got), name
    assert kafka.watermarks(broker.bootstrap, topic) == (0, len(written))


def test_tombstones_go_once_delete_retention_ms_has_passed_and_the_log_is_cleaned_again(
    broker_factory: Any, kafka: Any
) -> None:
    broker: BrokerProcess = broker_factory(CLEANER_OVERRIDES)
    topic = kafka.new_topic(broker.bootstrap, config={**COMPACTED, "delete.retention.ms": "0"})
    # Filler after the tombstones closes their segment, so the first clean sees them and dates them.
    wave = updates(keys=20, rounds=10, tag="a", tombstones=[1, 2]) + updates(100, 1, "f", prefix="filler")
    written = produce(kafka, broker.bootstrap, topic, wave)
    first = wait_cleaned_up_to_the_active_segment(broker.log_dir, topic)
    tombstones = [e for e in written if e[2] is None]
    assert len(tombstones) == 2 and all(offset < first for offset, _, _ in tombstones)
    assert [e for e in stored_records(broker.log_dir, topic) if e[2] is None] == tombstones
    # New keys make the log dirty again; the next clean finds the tombstones' horizon (now + 0) passed.
    written += produce(kafka, broker.bootstrap, topic, updates(300, 1, "o", prefix="other"))
    wait_until(
        lambda: (
            (cleaner_checkpoint(broker.log_dir, topic) or 0) > first
            and cleaner_checkpoint(broker.log_dir, topic) == active_segment_base(broker.log_dir, topic)
        ),
        CLEAN_TIMEOUT_S,
        "a second clean",
    )
    expected = [e for e in compacted_view(written, active_segment_base(broker.log_dir, topic)) if e[2] is not None]
    got = kafka.consume_all(broker.bootstrap, topic)
    assert [(r.offset, r.key, r.value) for r in got] == expected


def test_records_without_a_key_are_refused_with_invalid_record(broker_factory: Any, kafka: Any) -> None:
    broker: BrokerProcess = broker_factory(CLEANER_OVERRIDES)
    topic = kafka.new_topic(broker.bootstrap, config=COMPACTED)
    assert kafka.delivery_errors(broker.bootstrap, topic, [{"value": b"no key"}], retries=0) == ["INVALID_RECORD"]
    # Nothing was written, and keyed records still are.
    assert produce(kafka, broker.bootstrap, topic, [{"key": b"k", "value": b"v"}]) == [(0, b"k", b"v")]


def test_librdkafka_fails_exactly_the_records_without_a_key_of_a_batch(broker_factory: Any, kafka: Any) -> None:
    # The broker names the keyless records of the batch (record_errors, KIP-467); librdkafka fails those with
    # INVALID_RECORD and the others of the batch with _INVALID_DIFFERENT_RECORD.
    broker: BrokerProcess = broker_factory(CLEANER_OVERRIDES)
    topic = kafka.new_topic(broker.bootstrap, config=COMPACTED)
    producer = kafka.producer(broker.bootstrap, linger_ms=500, retries=0)
    # Connected and the partition's leader known before the batch, so its records leave together.
    assert producer.list_topics(topic, timeout=kafka.timeout_s).topics[topic].error is None
    keys = [b"k0", None, b"k2", b"k3", None, b"k5"]
    codes: dict[int, int | None] = {}

    def report(index: int) -> Callable[[KafkaError | None, Any], None]:
        return lambda err, _msg: codes.update({index: err.code() if err else None})

    for index, key in enumerate(keys):
        producer.produce(topic, key=key, value=b"v", on_delivery=report(index))
    assert producer.flush(kafka.timeout_s) == 0
    assert [codes[i] for i in range(len(keys))] == [
        KafkaError.INVALID_RECORD if key is None else KafkaError._INVALID_DIFFERENT_RECORD for key in keys
    ]
    assert kafka.watermarks(broker.bootstrap, topic) == (0, 0)


def test_every_replica_compacts_to_the_same_records(cluster_factory: Any, kafka: Any) -> None:
    cluster = cluster_factory({**CLEANER_OVERRIDES, "default.replication.factor": "3"}, brokers=3)
    topic = kafka.topic_name()
    admin = kafka.admin(cluster.bootstrap)
    # segment.ms lets one last record, dated later, roll every replica's active segment at its offset.
    config = {**COMPACTED, "segment.ms": "60000", "min.insync.replicas": "3"}
    admin.create_topics([NewTopic(topic, 1, 3, config=config)])[topic].result(kafka.timeout_s)
    wait_until(lambda: kafka.topic_exists(cluster.bootstrap, topic), kafka.timeout_s, f"{topic} to exist")
    written = produce(kafka, cluster.bootstrap, topic, updates(keys=25, rounds=8, tag="v", tombstones=[4]))
    later = int(time.time() * 1000) + 120_000
    written += produce(kafka, cluster.bootstrap, topic, [{"key": b"last", "value": b"x", "timestamp": later}])
    end = written[-1][0]
    log_dirs = [cluster.broker(node_id).log_dir for node_id in cluster.node_ids]
    for log_dir in log_dirs:
        wait_until(
            lambda log_dir=log_dir: cleaner_checkpoint(log_dir, topic) == end,
            CLEAN_TIMEOUT_S,
            f"the cleaner of {log_dir} to reach offset {end}",
        )
    expected = compacted_view(written, end)
    for log_dir in log_dirs:
        assert stored_records(log_dir, topic) == expected, log_dir
    for node_id in cluster.node_ids:
        assert cleanings(cluster.http_address(node_id)) >= 1, node_id


def test_a_producers_last_batch_left_empty_by_compaction_is_skipped_by_every_client(
    broker_factory: Any, kafka: Any, clients: dict[str, Any]
) -> None:
    broker: BrokerProcess = broker_factory(CLEANER_OVERRIDES)
    topic = kafka.new_topic(broker.bootstrap, config=COMPACTED)
    idempotent = [{"key": b"shared", "value": f"idempotent-{i}".encode()} for i in range(5)]
    written = [
        (offset, spec["key"], spec["value"])
        for (_, offset), spec in zip(
            kafka.produce(broker.bootstrap, topic, idempotent, enable_idempotence=True, linger_ms=0),
            idempotent,
            strict=True,
        )
    ]
    # A plain producer overwrites the key, then fills segments so everything so far can be cleaned.
    written += produce(kafka, broker.bootstrap, topic, [{"key": b"shared", "value": b"plain"}])
    written += produce(kafka, broker.bootstrap, topic, updates(200, 1, "f", prefix="filler"))
    active_base = wait_cleaned_up_to_the_active_segment(broker.log_dir, topic)
    headers = [
        batch.header
        for path in sorted((broker.log_dir / f"{topic}-0").glob("*.log"))
        for batch in decode_batches(path.read_bytes())
    ]
    empty = [h for h in headers if h.records_count == 0]
    assert len(empty) == 1 and empty[0].producer_id >= 0 and empty[0].last_offset == written[4][0]
    expected = compacted_view(written, active_base)
    for name, client in clients.items():
        got = client.consume(broker.bootstrap, topic, len(expected))
        assert [(r.offset, r.key, r.value) for r in got] == expected, name


def test_consumer_offsets_is_compacted_and_committed_offsets_survive_a_restart(broker_factory: Any, kafka: Any) -> None:
    broker: BrokerProcess = broker_factory(
        {
            **CLEANER_OVERRIDES,
            "offsets.topic.num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.segment.bytes": "4096",
            "log.cleaner.min.cleanable.ratio": "0.01",
        }
    )
    topic = kafka.new_topic(broker.bootstrap, partitions=2)
    group = f"{topic}-group"
    consumer = kafka.consumer(broker.bootstrap, group_id=group)
    try:
        for n in range(1, 301):
            offsets = [ConfluentTopicPartition(topic, p, n * 10 + p) for p in (0, 1)]
            consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()
    internal = "__consumer_offsets"
    wait_cleaned_up_to_the_active_segment(broker.log_dir, internal)
    # 600 offset commits; what is left is the latest per partition plus the active segment's tail.
    assert len(stored_records(broker.log_dir, internal)) < 100
    broker.restart()

    def committed() -> list[int] | None:
        reader = kafka.consumer(broker.bootstrap, group_id=group)
        try:
            answer = reader.committed([ConfluentTopicPartition(topic, p) for p in (0, 1)], timeout=kafka.timeout_s)
        except KafkaException:
            return None  # the coordinator is still loading the group
        finally:
            reader.close()
        return [tp.offset for tp in answer]

    wait_until(lambda: committed() == [3000, 3001], kafka.timeout_s, "the committed offsets after the restart")


def test_a_broker_killed_while_it_compacts_loses_nothing_and_finishes_the_clean_after_restart(
    broker_factory: Any, kafka: Any
) -> None:
    # An offset map of 18 keys: each pass cleans a few dozen offsets and the cleaner keeps writing,
    # swapping and checkpointing for seconds, so the kills land in every phase of a clean.
    broker: BrokerProcess = broker_factory(
        {**CLEANER_OVERRIDES, "log.cleaner.dedupe.buffer.size": str(BYTES_PER_ENTRY * 20)}
    )
    topic = kafka.new_topic(broker.bootstrap, config=COMPACTED)
    written: list[Entry] = []
    for round_, delay_s in enumerate((0.2, 0.45, 0.7, 1.1)):
        written += produce(kafka, broker.bootstrap, topic, updates(keys=100, rounds=10, tag=f"r{round_}"))
        time.sleep(delay_s)  # not an assertion: where in the cleaning the kill lands
        broker.kill()
        broker.start()
        broker.wait_ready(30)
        # After each restart: every key's latest record, nothing that was not written, offsets unchanged.
        got = [(r.offset, r.key, r.value) for r in kafka.consume_all(broker.bootstrap, topic)]
        offsets = [offset for offset, _, _ in got]
        assert offsets == sorted(set(offsets))
        assert set(got) <= set(written) and set(latest_per_key(written)) <= set(got)
        assert kafka.watermarks(broker.bootstrap, topic) == (0, len(written))
    active_base = wait_cleaned_up_to_the_active_segment(broker.log_dir, topic)
    got = [(r.offset, r.key, r.value) for r in kafka.consume_all(broker.bootstrap, topic)]
    assert got == compacted_view(written, active_base)

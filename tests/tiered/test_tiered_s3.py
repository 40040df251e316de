"""Tiered storage on a real S3 server (SeaweedFS, started by the tests): every client reads the whole log
from offset 0 while most of it lives in S3, brokers restart and read it again, and an S3 outage stops only
what needs S3 (docs/tiered-storage.md): produce and local reads go on, no uncopied segment is deleted locally, remote
reads fail with a retriable error instead of hanging, and copying resumes when S3 is back."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from cluster_helpers import replica_state, send_request
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from tiered_helpers import (
    EARLIEST,
    EARLIEST_LOCAL,
    LATEST_TIERED,
    TIERING_S,
    alter_topic_config,
    consume_all,
    create_topic,
    leader_of,
    list_offsets,
    produce,
    record_values,
    s3_keys,
    segment_start,
    tiered_topic_configs,
    wait_tiered,
)

from tierlog.client.requests import PartitionFetch, fetch_request
from tierlog.common import TopicPartition
from tierlog.protocol.errors import error_code
from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server

RECORDS = 2500


def _kafka_python_values(bootstrap: str, topic: str, start: int, end: int) -> list[bytes]:
    """Values of offsets [start, end) of partition 0 read with kafka-python."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        values: list[bytes] = []

        def read_all() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(record.value for record in records)
            return start + len(values) >= end

        wait_until(read_all, 60, lambda: f"offsets {start}..{end - 1} of {topic} (have {len(values)})", 0)
        return values
    finally:
        consumer.close()


def _aiokafka_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    async def consume() -> list[bytes]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            values: list[bytes] = []
            async with asyncio.timeout(60):
                while len(values) < count:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        values.extend(record.value for record in records)
            return values
        finally:
            await consumer.stop()

    return asyncio.run(consume())


def test_every_client_reads_from_offset_0_through_s3_and_again_after_restarts(
    s3_tiered_cluster: LocalCluster,
) -> None:
    cluster = s3_tiered_cluster
    topic = "s3-tiered"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(**{"min.insync.replicas": "2"}))
    values = record_values("s3", RECORDS)
    produce(cluster.bootstrap, topic, values)
    leader = leader_of(cluster, topic)
    state = wait_tiered(cluster, leader, topic, local_start_above=RECORDS // 2)

    assert [v for _, v in consume_all(cluster.bootstrap, topic, RECORDS)] == values
    assert _kafka_python_values(cluster.bootstrap, topic, 0, RECORDS) == values
    assert _aiokafka_values(cluster.bootstrap, topic, RECORDS) == values
    address = cluster.broker(leader).bootstrap
    assert list_offsets(address, topic, EARLIEST)[:2] == (0, 0)
    assert list_offsets(address, topic, EARLIEST_LOCAL)[1] >= state["local_log_start_offset"]
    assert list_offsets(address, topic, LATEST_TIERED)[1] >= state["local_log_start_offset"] - 1

    for node_id in cluster.node_ids:
        cluster.restart(node_id)
    assert [v for _, v in consume_all(cluster.bootstrap, topic, RECORDS)] == values


def _fetch_answer(address: str, topic: str, offset: int, timeout_s: float) -> tuple[str, int]:
    """(error name, bytes of records) of a consumer's Fetch at `offset` sent to the broker at `address`."""
    request = fetch_request(
        [PartitionFetch(TopicPartition(topic, 0), offset, 1 << 20)], max_wait_ms=100, max_bytes=1 << 20
    )
    answer = send_request(address, request, timeout_s).responses[0].partitions[0]
    name = "NONE" if answer.error_code == error_code(None) else str(answer.error_code.name).upper()
    return name, len(answer.records or b"")


def test_s3_outage_stops_only_what_needs_s3_and_copying_resumes(
    s3_tiered_cluster: LocalCluster, s3_server: LocalS3Server
) -> None:
    cluster = s3_tiered_cluster
    topic = "s3-outage"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(**{"min.insync.replicas": "2"}))
    first = record_values("before", 1500)
    produce(cluster.bootstrap, topic, first)
    leader = leader_of(cluster, topic)
    wait_tiered(cluster, leader, topic, local_start_above=500)
    address = cluster.broker(leader).bootstrap

    s3_server.kill()
    try:
        second = record_values("during", 1500)
        produce(cluster.bootstrap, topic, second)  # acks=all: replication needs no S3
        time.sleep(2)  # several copy rounds fail meanwhile
        state = replica_state(cluster, leader, topic)
        assert state is not None
        # Nothing uncopied left the disk: the local log still starts right after the last copied offset.
        assert state["local_log_start_offset"] <= state["highest_offset_in_remote_storage"] + 1
        assert state["log_end_offset"] == len(first) + len(second)
        # The local tail is served as usual; the remote part answers a retriable error at once.
        local_start, everything = state["local_log_start_offset"], first + second
        assert _kafka_python_values(cluster.bootstrap, topic, local_start, len(everything)) == everything[local_start:]
        # A remote read that fails answers KAFKA_STORAGE_ERROR; one still failing after remote.fetch.max.wait.ms
        # answers no records (Kafka's DelayedRemoteFetch expiry). Either way the client retries; nothing hangs.
        started = time.monotonic()
        assert _fetch_answer(address, topic, 0, timeout_s=30) in {("KAFKA_STORAGE_ERROR", 0), ("NONE", 0)}
        assert time.monotonic() - started < 5
    finally:
        s3_server.restart()

    def copied_past_the_outage() -> bool:
        state = replica_state(cluster, leader, topic)
        return state is not None and state["highest_offset_in_remote_storage"] >= len(first) + 500

    wait_until(
        copied_past_the_outage, TIERING_S * 2, lambda: f"copies resumed: {replica_state(cluster, leader, topic)}"
    )
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(first) + len(second))] == first + second


def test_leader_killed_in_the_middle_of_a_copy_leaves_nothing_unreadable_and_no_orphans_after_expiry(
    s3_tiered_cluster: LocalCluster, s3_server: LocalS3Server, s3_bucket: str, s3_prefix: str
) -> None:
    cluster = s3_tiered_cluster
    topic = "copy-interrupted"
    # Broker 2 leads: node 1 is also the (single) controller, which must survive the crash.
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(**{"min.insync.replicas": "2"}), assignment=[[2, 3, 1]])
    first = record_values("first", 1000)
    produce(cluster.bootstrap, topic, first)
    leader = leader_of(cluster, topic)
    wait_tiered(cluster, leader, topic, local_start_above=200)
    # Freeze S3 so the leader's next copies hang half-way (COPY_SEGMENT_STARTED published, data not yet).
    s3_server.pause()
    try:
        second = record_values("second", 1000)
        produce(cluster.bootstrap, topic, second)
        time.sleep(1.0)
        cluster.kill(leader)
    finally:
        s3_server.resume()
    new_leader = wait_until(
        lambda: next(
            (
                n
                for n in cluster.node_ids
                if n != leader and (replica_state(cluster, n, topic) or {}).get("role") == "leader"
            ),
            None,
        ),
        TIERING_S,
        "a new leader",
    )
    wait_tiered(cluster, new_leader, topic, local_start_above=len(first) + 200)
    cluster.restart(leader)
    everything = first + second
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(everything))] == everything

    # Expire the whole log: every object, the abandoned copy's included, must go.
    alter_topic_config(cluster.bootstrap, topic, "retention.ms", "1000")
    produce(cluster.bootstrap, topic, record_values("tail", 400))

    def old_objects() -> list[str]:
        keys = s3_keys(s3_server, s3_bucket, f"{s3_prefix}/{topic}-0")
        return [k for k in keys if segment_start(k) < len(everything) - 500]

    wait_until(lambda: not old_objects(), TIERING_S * 2, lambda: f"expired objects gone: {old_objects()[:8]}")


def test_delete_records_into_the_remote_tier_deletes_remote_objects(
    s3_tiered_cluster: LocalCluster, s3_server: LocalS3Server, s3_bucket: str, s3_prefix: str
) -> None:
    cluster = s3_tiered_cluster
    topic = "delete-records"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs())
    values = record_values("dr", 2000)
    produce(cluster.bootstrap, topic, values)
    leader = leader_of(cluster, topic)
    wait_tiered(cluster, leader, topic, local_start_above=1500)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    tp = ConfluentTopicPartition(topic, 0, 1000)
    result = admin.delete_records([tp])[tp].result(timeout=30)
    assert result.low_watermark == 1000
    address = cluster.broker(leader).bootstrap
    assert list_offsets(address, topic, EARLIEST)[1] == 1000

    def remote_starts() -> list[int]:
        keys = s3_keys(s3_server, s3_bucket, f"{s3_prefix}/{topic}-0")
        return sorted(segment_start(k) for k in keys if k.endswith(".log"))

    # Segments wholly below the new log start go; the one holding offset 1000 stays.
    wait_until(
        lambda: remote_starts() and remote_starts()[0] > 800,
        TIERING_S,
        lambda: f"remote segments below 1000 gone: {remote_starts()}",
    )
    assert [v for _, v in consume_all(cluster.bootstrap, topic, 1000)] == values[1000:]

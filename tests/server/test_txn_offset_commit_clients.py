"""Offsets committed in a transaction, seen by a real client over the wire: a broker process takes a
TxnOffsetCommit (tierlog's client codec), and kafka-python's read_committed consumer, which sends OffsetFetch with
require_stable, waits (UNSTABLE_OFFSET_COMMIT is retriable) until WriteTxnMarkers commits the transaction, while a
read_uncommitted consumer sees the previous offset at once (docs/transactions.md#offsets-stable)."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_helpers import send_request
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaTimeoutError
from kio.schema.errors import ErrorCode

from tierlog.client.requests import (
    COORDINATOR_KEY_GROUP,
    TxnMarker,
    find_coordinator_request,
    request_schema,
    write_txn_markers_request,
)
from tierlog.common import TopicPartition
from tierlog.testing.local_cluster import wait_until

TIMEOUT_S = 20.0
PRODUCER_ID = 5000
GROUP = "txn-group"


def coordinator_found(bootstrap: str) -> bool:
    """FindCoordinator for the group: the first ones create __consumer_offsets."""
    request = find_coordinator_request(GROUP, COORDINATOR_KEY_GROUP)
    (found,) = send_request(bootstrap, request).coordinators
    return bool(found.error_code == ErrorCode.none)


def txn_offset_commit(bootstrap: str, topic: str, offset: int) -> ErrorCode:
    s = request_schema(28, 3)
    request = s.TxnOffsetCommitRequest(
        transactional_id="txn-test",
        group_id=GROUP,
        producer_id=PRODUCER_ID,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=(
            s.TxnOffsetCommitRequestTopic(
                name=topic,
                partitions=(
                    s.TxnOffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
                    ),
                ),
            ),
        ),
    )
    ((partition,),) = [t.partitions for t in send_request(bootstrap, request).topics]
    return ErrorCode(partition.error_code)


def write_commit_marker(bootstrap: str, offsets_partition: int) -> ErrorCode:
    marker = TxnMarker(
        PRODUCER_ID,
        0,
        committed=True,
        coordinator_epoch=0,
        partitions=[TopicPartition("__consumer_offsets", offsets_partition)],
    )
    request = write_txn_markers_request([marker])
    (marker,) = send_request(bootstrap, request).markers
    ((partition,),) = [t.partitions for t in marker.topics]
    return ErrorCode(partition.error_code)


def consumer(bootstrap: str, isolation_level: str) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=GROUP,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        request_timeout_ms=int(TIMEOUT_S * 1000),
    )


def test_kafka_python_read_committed_consumer_waits_for_the_transaction_s_offsets(
    broker_factory: Any, kafka: Any
) -> None:
    # One __consumer_offsets partition: the group's is partition 0.
    broker = broker_factory({"offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "1"})
    topic = kafka.new_topic(broker.bootstrap)
    wait_until(lambda: coordinator_found(broker.bootstrap), TIMEOUT_S, "the group's coordinator is found")
    # Answered COORDINATOR_LOAD_IN_PROGRESS until the partition is loaded.
    wait_until(
        lambda: txn_offset_commit(broker.bootstrap, topic, 42) == ErrorCode.none,
        TIMEOUT_S,
        "the TxnOffsetCommit is taken",
    )
    tp = KafkaTopicPartition(topic, 0)
    read_committed = consumer(broker.bootstrap, "read_committed")
    read_uncommitted = consumer(broker.bootstrap, "read_uncommitted")
    try:
        assert read_uncommitted.committed(tp, timeout_ms=5000) is None
        with pytest.raises(KafkaTimeoutError):
            read_committed.committed(tp, timeout_ms=1500)
        assert write_commit_marker(broker.bootstrap, 0) == ErrorCode.none
        assert read_committed.committed(tp, timeout_ms=10_000) == 42
        assert read_uncommitted.committed(tp, timeout_ms=5000) == 42
    finally:
        read_committed.close()
        read_uncommitted.close()

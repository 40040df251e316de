"""Answers clients rely on, as Kafka 3.x gives them, for every version the broker serves, sent raw to a real
broker: a produce refused for some of its records names them (record_errors and error_message, v8+);
DeleteRecords takes no negative offset but -1 (the high watermark); and with no authorizer, Metadata,
DescribeCluster and DescribeGroups report every operation of the resource when asked, Integer.MIN_VALUE
when not."""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

import pytest
from cluster_helpers import send_request
from kio.schema.errors import ErrorCode

from tierlog.client.requests import metadata_request, produce_request, request_schema
from tierlog.common import TopicPartition
from tierlog.records.codec import RecordSpec, build_batch
from tierlog.records.record_batch import CompressionType
from tierlog.testing.local_cluster import BrokerProcess, wait_until

TIMEOUT_S = 10.0
API_FIND_COORDINATOR, API_DESCRIBE_GROUPS, API_DELETE_RECORDS, API_DESCRIBE_CLUSTER = 10, 15, 21, 60
REQUEST_CLASSES = {
    API_FIND_COORDINATOR: "FindCoordinatorRequest",
    API_DELETE_RECORDS: "DeleteRecordsRequest",
    API_DESCRIBE_GROUPS: "DescribeGroupsRequest",
    API_DESCRIBE_CLUSTER: "DescribeClusterRequest",
}
INT32_MIN = -(2**31)
# Kafka's AclOperation codes, and the operations that apply to a topic, the cluster and a group.
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12


def bit_field(*operations: int) -> int:
    return sum(1 << operation for operation in operations)


TOPIC_OPERATIONS = bit_field(READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS)
CLUSTER_OPERATIONS = bit_field(
    CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE
)
GROUP_OPERATIONS = bit_field(READ, DELETE, DESCRIBE)


def send(broker: BrokerProcess, request: Any) -> Any:
    """`request`, answered by the broker."""
    return send_request(broker.bootstrap, request, TIMEOUT_S)


def request_of(api_key: int, version: int, **body: Any) -> Any:
    """A request of an API tierlog itself never sends, of that version (fields it lacks are dropped)."""
    return getattr(request_schema(api_key, version), REQUEST_CLASSES[api_key])(**body)


def produce(broker: BrokerProcess, version: int, topic: str, batch: bytes) -> Any:
    request = produce_request(
        TopicPartition(topic, 0), batch, acks=-1, timeout_ms=int(TIMEOUT_S * 1000), version=version
    )
    ((topic_response,),) = (send(broker, request).responses,)
    (partition,) = topic_response.partition_responses
    return partition


def keyed(pattern: str) -> list[RecordSpec]:
    """A record per character of `pattern`: 'k' has a key, '-' has none."""
    now = int(time.time() * 1000)
    return [(b"k" if c == "k" else None, f"v{i}".encode(), [], now) for i, c in enumerate(pattern)]


PRODUCE_VERSIONS = range(3, 12)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_keyless_records_on_a_compacted_topic_are_named_in_record_errors_from_v8(
    shared_broker: BrokerProcess, kafka: Any, version: int
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, config={"cleanup.policy": "compact"}, hint=f"v{version}")
    refused = produce(shared_broker, version, topic, build_batch(keyed("k-k-k"), compression=CompressionType.LZ4))
    assert (refused.error_code, refused.base_offset) == (ErrorCode.invalid_record, -1)
    if version >= 5:
        assert refused.log_start_offset == 0
    message = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
    if version >= 8:
        assert [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors] == [
            (1, message),
            (3, message),
        ]
        assert refused.error_message == (
            "One or more records have been rejected due to 2 record errors in total, and only showing the first "
            f"three errors at most: [RecordError(batchIndex=1, message='{message}'), "
            f"RecordError(batchIndex=3, message='{message}')]"
        )
    # Nothing of the refused batch was written: the next batch starts at offset 0.
    accepted = produce(shared_broker, version, topic, build_batch(keyed("kk")))
    assert (accepted.error_code, accepted.base_offset) == (ErrorCode.none, 0)
    if version >= 8:
        assert (accepted.record_errors, accepted.error_message) == ((), None)


@pytest.mark.parametrize("version", [7, 8, 11])
def test_records_out_of_the_timestamp_range_are_named_with_invalid_timestamp(
    shared_broker: BrokerProcess, kafka: Any, version: int
) -> None:
    topic = kafka.new_topic(
        shared_broker.bootstrap, config={"message.timestamp.before.max.ms": "3600000"}, hint=f"v{version}"
    )
    now = int(time.time() * 1000)
    old = now - 2 * 3_600_000
    # The first and the largest timestamp are in range: only the records show the old one.
    records: list[RecordSpec] = [(None, b"a", [], now), (None, b"b", [], old), (None, b"c", [], now)]
    refused = produce(shared_broker, version, topic, build_batch(records))
    assert refused.error_code == ErrorCode.invalid_timestamp
    if version >= 8:
        ((index, text),) = [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors]
        assert index == 1
        assert re.fullmatch(
            rf"Timestamp {old} of message with offset 1 is out of range\. The timestamp should be within "
            r"\[(\d+), (\d+)\]",
            text,
        )
        assert refused.error_message == "One or more records have been rejected due to invalid timestamp"


@pytest.mark.parametrize("version", range(0, 3))
def test_delete_records_takes_no_negative_offset_but_minus_one(
    shared_broker: BrokerProcess, kafka: Any, version: int
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, hint=f"v{version}")
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"x"}] * 3)
    s = request_schema(API_DELETE_RECORDS, version)

    def delete(offset: int) -> tuple[int, int]:
        response = send(
            shared_broker,
            request_of(
                API_DELETE_RECORDS,
                version,
                topics=(
                    s.DeleteRecordsTopic(
                        name=topic, partitions=(s.DeleteRecordsPartition(partition_index=0, offset=offset),)
                    ),
                ),
                timeout=datetime.timedelta(seconds=TIMEOUT_S),
            ),
        )
        ((result,),) = (response.topics,)
        (partition,) = result.partitions
        return partition.error_code, partition.low_watermark

    assert delete(-1001) == (ErrorCode.offset_out_of_range, -1)
    assert delete(-2) == (ErrorCode.offset_out_of_range, -1)
    assert delete(4) == (ErrorCode.offset_out_of_range, -1)  # above the high watermark
    assert delete(1) == (ErrorCode.none, 1)
    assert delete(-1) == (ErrorCode.none, 3)  # the high watermark


def metadata(broker: BrokerProcess, version: int, topics: list[str], asks: bool) -> Any:
    return send(broker, metadata_request(topics, include_authorized_operations=asks, version=version))


@pytest.mark.parametrize("version", range(8, 13))
def test_metadata_reports_every_topic_and_cluster_operation_when_asked(
    shared_broker: BrokerProcess, kafka: Any, version: int
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, hint=f"v{version}")
    missing = kafka.topic_name("missing")
    asked = metadata(shared_broker, version, [topic, missing], asks=True)
    assert {t.name: (t.error_code, t.topic_authorized_operations) for t in asked.topics} == {
        topic: (ErrorCode.none, TOPIC_OPERATIONS),
        missing: (ErrorCode.unknown_topic_or_partition, TOPIC_OPERATIONS),
    }
    not_asked = metadata(shared_broker, version, [topic], asks=False)
    assert [t.topic_authorized_operations for t in not_asked.topics] == [INT32_MIN]
    # Only v8-v10 carry the cluster's operations.
    if version <= 10:
        assert (asked.cluster_authorized_operations, not_asked.cluster_authorized_operations) == (
            CLUSTER_OPERATIONS,
            INT32_MIN,
        )
    else:
        assert not hasattr(asked, "cluster_authorized_operations")


@pytest.mark.parametrize("version", range(0, 2))
def test_describe_cluster_reports_every_cluster_operation_when_asked(
    shared_broker: BrokerProcess, version: int
) -> None:
    def operations(asks: bool) -> int:
        response = send(
            shared_broker,
            request_of(API_DESCRIBE_CLUSTER, version, include_cluster_authorized_operations=asks, endpoint_type=1),
        )
        assert response.error_code == ErrorCode.none
        return int(response.cluster_authorized_operations)

    assert (operations(True), operations(False)) == (CLUSTER_OPERATIONS, INT32_MIN)


@pytest.mark.parametrize("version", range(3, 6))
def test_describe_groups_reports_every_group_operation_when_asked(shared_broker: BrokerProcess, version: int) -> None:
    group = f"no-such-group-v{version}"
    answers: list[tuple[int, int]] = []

    def described(asks: bool) -> bool:
        response = send(
            shared_broker, request_of(API_DESCRIBE_GROUPS, version, groups=(group,), include_authorized_operations=asks)
        )
        (answer,) = response.groups
        answers.append((answer.error_code, answer.authorized_operations))
        return answer.error_code not in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress)

    # The first FindCoordinator creates __consumer_offsets; until its partition is loaded, the group has no
    # coordinator (and the answer no operations).
    send(shared_broker, request_of(API_FIND_COORDINATOR, 0, key=group))
    wait_until(lambda: described(asks=True), TIMEOUT_S, f"a coordinator for {group}")
    assert all(operations == INT32_MIN for _, operations in answers[:-1])
    # A group the coordinator does not know is described as Dead, without error, as Kafka 3.x does.
    assert answers[-1] == (ErrorCode.none, GROUP_OPERATIONS)
    described(asks=False)
    assert answers[-1] == (ErrorCode.none, INT32_MIN)

"""The client's request builders and its frames: each builder gives the kio entity of the version asked for
(fields the version lacks dropped), and `encode_request` writes exactly the header kio's own header writer
does, then the body."""

from __future__ import annotations

import io
import re
import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import Records, i16, i32

from tierlog.client.requests import (
    COORDINATOR_KEY_TRANSACTION,
    FETCH_VERSION,
    PartitionFetch,
    TxnMarker,
    allocate_producer_ids_request,
    alter_partition_request,
    api_versions_request,
    broker_heartbeat_request,
    broker_registration_request,
    create_topics_request,
    describe_transactions_request,
    fetch_request,
    find_coordinator_request,
    list_offsets_request,
    list_transactions_request,
    metadata_request,
    offset_for_leader_epoch_request,
    produce_request,
    write_txn_markers_request,
)
from tierlog.client.wire import encode_request
from tierlog.common import TopicPartition
from tierlog.metadata.image import IsrChange
from tierlog.metadata.records import Endpoint
from tierlog.protocol.api_versions import SUPPORTED_APIS

TP = TopicPartition("orders", 3)
SERVED = [(api.api_key, v) for api in SUPPORTED_APIS.values() for v in range(api.min_version, api.max_version + 1)]
# kio registers strategies for its primitive types, not for its records blob.
st.register_type_strategy(Records, st.binary(max_size=64))


def every_request() -> list[Any]:
    """One request of each API tierlog sends, at the version it sends."""
    return [
        fetch_request([PartitionFetch(TP, 42, 1 << 20)], max_wait_ms=500, max_bytes=8 << 20),
        produce_request(TP, b"records", acks=-1, timeout_ms=30_000),
        list_offsets_request(TP, -4, replica_id=2),
        offset_for_leader_epoch_request(TP, 5, replica_id=2),
        metadata_request(()),
        api_versions_request(),
        create_topics_request("orders", 3, 2, {"cleanup.policy": "compact"}, timeout_ms=30_000),
        broker_registration_request(2, uuid.uuid4(), "cluster", [Endpoint("PLAINTEXT", "127.0.0.1", 9092)], None),
        broker_heartbeat_request(2, 7, 100, want_fence=False, want_shut_down=False),
        alter_partition_request(2, 7, [IsrChange(uuid.uuid4(), 3, leader_epoch=4, partition_epoch=9, new_isr=[2, 3])]),
        allocate_producer_ids_request(2, 7),
        write_txn_markers_request([TxnMarker(5, 1, True, 3, [TP, TopicPartition("orders", 4)])]),
        find_coordinator_request("payments", COORDINATOR_KEY_TRANSACTION),
        describe_transactions_request(["payments"]),
        list_transactions_request(duration_filter_ms=60_000),
    ]


def kio_frame(entity: Any, correlation_id: int, client_id: str | None) -> bytes:
    header_type = entity.__header_schema__
    out = io.BytesIO()
    entity_writer(header_type)(
        out,
        header_type(
            request_api_key=i16(entity.__api_key__),
            request_api_version=i16(entity.__version__),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(type(entity))(out, entity)
    return struct.pack(">i", out.tell()) + out.getvalue()


@pytest.mark.parametrize("client_id", ["broker-2", "", None])
def test_every_request_is_framed_as_kio_frames_it(client_id: str | None) -> None:
    for request in every_request():
        assert encode_request(request, 1234, client_id) == kio_frame(request, 1234, client_id), request


@st.composite
def served_requests(draw: st.DrawFn) -> Any:
    api_key, version = draw(st.sampled_from(SERVED))
    return draw(st.from_type(load_request_schema(api_key, version)))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(served_requests(), st.integers(min_value=0, max_value=2**31 - 1), st.none() | st.text(max_size=20))
def test_any_request_the_broker_serves_is_framed_as_kio_frames_it(
    entity: Any, correlation_id: int, client_id: str | None
) -> None:
    # The protocol tests frame their requests with encode_request: this is what makes those frames Kafka's.
    assert encode_request(entity, correlation_id, client_id) == kio_frame(entity, correlation_id, client_id)


def test_versions_tierlog_sends() -> None:
    versions = {type(r).__name__: r.__version__ for r in every_request()}
    assert versions == {
        "FetchRequest": 12,
        "ProduceRequest": 9,
        "ListOffsetsRequest": 8,
        "OffsetForLeaderEpochRequest": 4,
        "MetadataRequest": 1,
        "ApiVersionsRequest": 0,
        "CreateTopicsRequest": 7,
        "BrokerRegistrationRequest": 4,
        "BrokerHeartbeatRequest": 1,
        "AlterPartitionRequest": 3,
        "AllocateProducerIdsRequest": 0,
        "WriteTxnMarkersRequest": 1,
        "FindCoordinatorRequest": 4,
        "DescribeTransactionsRequest": 0,
        "ListTransactionsRequest": 1,
    }


def test_a_fetch_groups_partitions_by_topic_in_the_order_given() -> None:
    request = fetch_request(
        [
            PartitionFetch(TopicPartition("a", 0), 7, 100, current_leader_epoch=3, last_fetched_epoch=2),
            PartitionFetch(TopicPartition("b", 1), 9, 100),
            PartitionFetch(TopicPartition("a", 2), 8, 100, log_start_offset=4),
        ],
        replica_id=2,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=1000,
    )
    assert [(t.topic, [p.partition for p in t.partitions]) for t in request.topics] == [("a", [0, 2]), ("b", [1])]
    first, second = request.topics[0].partitions
    assert (first.fetch_offset, first.current_leader_epoch, first.last_fetched_epoch, first.log_start_offset) == (
        7,
        3,
        2,
        -1,
    )
    assert (second.fetch_offset, second.current_leader_epoch, second.log_start_offset) == (8, -1, 4)
    assert (request.replica_id, request.max_wait.total_seconds(), request.max_bytes) == (2, 0.5, 1000)
    assert (request.session_id, request.session_epoch, request.isolation_level) == (0, -1, 0)


@pytest.mark.parametrize("version", [4, 11, FETCH_VERSION])
def test_a_builder_serves_older_and_newer_versions(version: int) -> None:
    request = fetch_request([PartitionFetch(TP, 42, 1 << 20)], max_wait_ms=500, max_bytes=8 << 20, version=version)
    assert request.__version__ == version
    (partition,) = request.topics[0].partitions
    assert partition.fetch_offset == 42
    assert hasattr(partition, "last_fetched_epoch") == (version >= 12)
    assert hasattr(partition, "current_leader_epoch") == (version >= 9)


def test_metadata_asks_for_authorized_operations_only_where_the_version_has_them() -> None:
    v8 = metadata_request(["t"], include_authorized_operations=True, version=8)
    assert (v8.include_cluster_authorized_operations, v8.include_topic_authorized_operations) == (True, True)
    v11 = metadata_request(["t"], include_authorized_operations=True, version=11)
    assert not hasattr(v11, "include_cluster_authorized_operations")
    assert v11.include_topic_authorized_operations
    assert metadata_request(None, version=12).topics is None  # every topic
    assert metadata_request((), version=12).topics == ()  # the brokers only


def test_api_versions_v3_names_tierlog_as_kafka_requires() -> None:
    request = api_versions_request(version=3)
    # Kafka's ApiVersionsRequest.isValid: both fields must match this, else INVALID_REQUEST.
    valid = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
    assert request.client_software_name == "tierlog"
    assert valid.fullmatch(request.client_software_name)
    assert valid.fullmatch(request.client_software_version)


def test_write_txn_markers_groups_each_markers_partitions_by_topic() -> None:
    request = write_txn_markers_request([TxnMarker(5, 1, False, 3, [TP, TopicPartition("orders", 4)])])
    (marker,) = request.markers
    assert (marker.producer_id, marker.producer_epoch, marker.transaction_result, marker.coordinator_epoch) == (
        5,
        1,
        False,
        3,
    )
    assert [(t.name, t.partition_indexes) for t in marker.topics] == [("orders", (3, 4))]

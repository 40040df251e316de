"""parse_request on requests built the way real clients build them (aiokafka, kafka-python, kio)."""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import tracemalloc
import uuid
from typing import Any

import pytest
from aiokafka.protocol.admin import ApiVersionRequest_v0
from aiokafka.protocol.fetch import FetchRequest_v4
from aiokafka.protocol.offset import OffsetRequest_v1
from aiokafka.protocol.produce import ProduceRequest_v3
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest
from kio.index import load_payload_module
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i32Timedelta
from protocol_helpers import kio_frame

from tierlog.protocol.api_versions import enabled_apis
from tierlog.protocol.codec import InvalidRequest, UnsupportedVersion, parse_request
from tierlog.protocol.fetch_response import uvarint

TOPIC_ID = uuid.UUID("6f1c9a43-2b6d-4d8e-9a51-2f0b7d3c8e11")


def aiokafka_frame(request_struct: Any, correlation_id: int = 7) -> bytes:
    # What aiokafka's AIOKafkaConnection.send writes after the size prefix.
    header = request_struct.build_request_header(correlation_id=correlation_id, client_id="aiokafka-test")
    return bytes(header.encode() + request_struct.encode())


def kafka_python_frame(message: Any, version: int, correlation_id: int = 7) -> bytes:
    message.with_header(correlation_id=correlation_id, client_id="kafka-python-test")
    return bytes(message.encode(version=version, header=True, framed=True))[4:]


def kp_produce(records: bytes) -> ProduceRequest:
    topic = ProduceRequest.TopicProduceData
    return ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[topic(name="events", partition_data=[topic.PartitionProduceData(index=2, records=records)])],
    )


def kp_fetch() -> FetchRequest:
    topic = FetchRequest.FetchTopic
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52_428_800,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=[
            topic(
                topic="events",
                topic_id=TOPIC_ID,
                partitions=[
                    topic.FetchPartition(
                        partition=0, current_leader_epoch=4, fetch_offset=42, partition_max_bytes=1_048_576
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def test_api_versions_v0_from_aiokafka() -> None:
    request = parse_request(aiokafka_frame(ApiVersionRequest_v0(), correlation_id=1))
    assert (request.api_key, request.api_version, request.correlation_id) == (18, 0, 1)
    assert request.client_id == "aiokafka-test"
    assert type(request.body).__name__ == "ApiVersionsRequest"


def test_api_versions_v3_from_kafka_python_uses_header_v2() -> None:
    frame = kafka_python_frame(
        ApiVersionsRequest(client_software_name="kafka-python", client_software_version="3.0.12"), 3
    )
    request = parse_request(frame)
    assert (request.api_version, request.client_id, request.size) == (3, "kafka-python-test", len(frame))
    assert request.body.client_software_name == "kafka-python"
    assert request.body.client_software_version == "3.0.12"


@pytest.mark.parametrize("version", [0, 1, 4, 9, 12])
def test_metadata_from_kafka_python(version: int) -> None:
    topics = [MetadataRequest.MetadataRequestTopic(name="events", topic_id=uuid.UUID(int=0))]
    request = parse_request(
        kafka_python_frame(MetadataRequest(topics=topics, allow_auto_topic_creation=False), version)
    )
    assert request.api_version == version
    assert [topic.name for topic in request.body.topics] == ["events"]


def test_metadata_v12_all_topics_is_a_null_array() -> None:
    request = parse_request(kafka_python_frame(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12))
    assert request.body.topics is None


def test_produce_v3_from_aiokafka() -> None:
    records = b"\x00" * 70
    frame = aiokafka_frame(ProduceRequest_v3(None, 1, 1500, [("events", [(2, records)])]))
    body = parse_request(frame).body
    assert body.acks == 1
    assert body.timeout == datetime.timedelta(milliseconds=1500)
    assert body.topic_data[0].name == "events"
    assert body.topic_data[0].partition_data[0].index == 2
    assert body.topic_data[0].partition_data[0].records == records


@pytest.mark.parametrize("version", [3, 9, 11])
def test_produce_from_kafka_python(version: int) -> None:
    records = bytes(range(256)) * 4
    request = parse_request(kafka_python_frame(kp_produce(records), version))
    partition = request.body.topic_data[0].partition_data[0]
    assert (request.body.acks, partition.index, partition.records) == (-1, 2, records)


def test_fetch_v4_from_aiokafka() -> None:
    frame = aiokafka_frame(FetchRequest_v4(-1, 500, 1, 1_048_576, 0, [("events", [(0, 42, 65_536)])]))
    body = parse_request(frame).body
    assert body.max_wait == datetime.timedelta(milliseconds=500)
    partition = body.topics[0].partitions[0]
    assert (body.topics[0].topic, partition.partition, partition.fetch_offset) == ("events", 0, 42)
    assert partition.partition_max_bytes == 65_536


@pytest.mark.parametrize("version", [4, 12, 15, 16])
def test_fetch_from_kafka_python(version: int) -> None:
    body = parse_request(kafka_python_frame(kp_fetch(), version)).body
    topic = body.topics[0]
    if version >= 13:
        assert topic.topic_id == TOPIC_ID
    else:
        assert topic.topic == "events"
    assert topic.partitions[0].fetch_offset == 42
    assert body.isolation_level == 1
    if version >= 15:
        # v15 moved the replica id into the ReplicaState tagged field (KIP-903).
        assert body.replica_state.replica_id == -1


def test_list_offsets_v1_from_aiokafka() -> None:
    body = parse_request(aiokafka_frame(OffsetRequest_v1(-1, [("events", [(0, -2)])]))).body
    assert body.topics[0].partitions[0].timestamp == -2


@pytest.mark.parametrize(("version", "timestamp"), [(6, -1), (9, -5)])
def test_list_offsets_from_kafka_python(version: int, timestamp: int) -> None:
    topic = ListOffsetsRequest.ListOffsetsTopic
    message = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[topic(name="events", partitions=[topic.ListOffsetsPartition(partition_index=3, timestamp=timestamp)])],
    )
    partition = parse_request(kafka_python_frame(message, version)).body.topics[0].partitions[0]
    assert (partition.partition_index, partition.timestamp) == (3, timestamp)


@pytest.mark.parametrize("version", [3, 7, 9, 11])
def test_produce_serialised_by_kio_round_trips(version: int) -> None:
    schema = load_payload_module(0, version, EntityType.request)
    entity = schema.ProduceRequest(
        transactional_id="txn-1",
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            schema.TopicProduceData(
                name="events",
                partition_data=(
                    schema.PartitionProduceData(index=i32(0), records=b"batch-0"),
                    schema.PartitionProduceData(index=i32(1), records=None),
                ),
            ),
        ),
    )
    request = parse_request(kio_frame(entity, client_id=None))
    assert request.body == entity
    assert request.client_id is None


# --- unknown tagged fields (KIP-482: skip them) ---------------------------------------------------------


def tagged(tags: list[tuple[int, bytes]]) -> bytes:
    return uvarint(len(tags)) + b"".join(uvarint(tag) + uvarint(len(data)) + data for tag, data in tags)


def test_unknown_top_level_tag_is_skipped() -> None:
    frame = kafka_python_frame(ApiVersionsRequest(client_software_name="x", client_software_version="1"), 3)
    assert frame[-1] == 0  # the body's empty tag section
    request = parse_request(frame[:-1] + tagged([(42, b"future field")]))
    assert request.body.client_software_name == "x"


def test_unknown_tags_are_skipped_next_to_known_ones_and_in_nested_structs() -> None:
    frame = kafka_python_frame(kp_fetch(), 12)
    # The frame ends with: partition tags, topic tags, forgotten topics (empty), rack id (""), body tags.
    assert frame[-5:] == b"\x00\x00\x01\x01\x00"
    cluster_id = uvarint(len(b"cluster-a") + 1) + b"cluster-a"
    mutated = (
        frame[:-5]
        + tagged([(5, b"\xff" * 200)])  # unknown tag in FetchPartition, longer than one varint byte
        + b"\x00\x01\x01"
        + tagged([(0, cluster_id), (7, b"??")])  # known ClusterId next to an unknown tag
    )
    body = parse_request(mutated).body
    assert body.cluster_id == "cluster-a"
    assert body.topics[0].partitions[0].fetch_offset == 42
    assert body == dataclasses.replace(parse_request(frame).body, cluster_id="cluster-a")


def test_unknown_tag_in_request_header_v2_is_skipped() -> None:
    frame = kafka_python_frame(kp_produce(b"r"), 9)
    client_id_end = 8 + 2 + len("kafka-python-test")
    assert frame[client_id_end] == 0
    mutated = frame[:client_id_end] + tagged([(3, b"header extension")]) + frame[client_id_end + 1 :]
    assert parse_request(mutated).body == parse_request(frame).body


def test_a_known_tag_whose_size_disagrees_with_its_content_is_invalid() -> None:
    frame = kafka_python_frame(kp_fetch(), 15)
    # ReplicaState (tag 1) holds 9 bytes; declare 10, next to an unknown tag so the tolerant reader runs.
    mutated = frame[:-1] + tagged([(1, struct.pack(">ii", 3, 4) + b"\x00" + b"\x00"), (9, b"x")])
    with pytest.raises(InvalidRequest):
        parse_request(mutated)


# --- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(0, 2), (0, 12), (1, 3), (1, 17), (3, 13), (18, 5), (17, 2), (36, 3), (9999, 0), (-1, 0)],
)
def test_unknown_keys_and_versions_are_unsupported(api_key: int, version: int) -> None:
    frame = struct.pack(">hhi", api_key, version, 1234) + b"\xff\xff" + b"garbage the codec must not read"
    with pytest.raises(UnsupportedVersion) as caught:
        parse_request(frame)
    assert (caught.value.api_key, caught.value.api_version, caught.value.correlation_id) == (api_key, version, 1234)


def test_an_api_the_server_did_not_enable_is_unsupported() -> None:
    frame = kafka_python_frame(kp_fetch(), 12)
    with pytest.raises(UnsupportedVersion):
        parse_request(frame, enabled_apis([18, 0, 3]))


@pytest.mark.parametrize("cut", [0, 3, 7, 9, 12, 30, -1])
def test_truncated_frames_are_invalid(cut: int) -> None:
    frame = kafka_python_frame(kp_produce(b"records"), 9)
    with pytest.raises(InvalidRequest):
        parse_request(frame[:cut])


def test_trailing_bytes_are_ignored_as_kafka_does() -> None:
    frame = aiokafka_frame(ApiVersionRequest_v0())
    assert parse_request(frame + b"\x00\x01\x02").api_key == 18


def test_invalid_utf8_in_a_topic_name_is_invalid() -> None:
    frame = aiokafka_frame(ProduceRequest_v3(None, 1, 1500, [("events", [(2, b"r")])]))
    with pytest.raises(InvalidRequest):
        parse_request(frame.replace(b"events", b"\xff\xfevent"))


def test_header_v1_and_v2_parse_the_same_client_id() -> None:
    for header_type, version in ((RequestHeaderV1, 0), (RequestHeaderV2, 3)):
        out = io.BytesIO()
        entity_writer(header_type)(
            out,
            header_type(
                request_api_key=i16(18), request_api_version=i16(version), correlation_id=i32(9), client_id="é-client"
            ),
        )
        body = b"" if version == 0 else b"\x02a\x02b\x00"
        assert parse_request(out.getvalue() + body).client_id == "é-client"


def test_produce_records_are_copied_once() -> None:
    records = b"\x5a" * 1_000_000
    frame = kafka_python_frame(kp_produce(records), 9)
    parse_request(frame)  # load and cache the reader outside the measurement
    tracemalloc.start()
    try:
        request = parse_request(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert request.body.topic_data[0].partition_data[0].records == records
    assert peak < 1.2 * len(records)


@pytest.mark.parametrize(
    ("api_key", "version", "array_length"),
    [
        (3, 12, bytes.fromhex("d1cd81b31b")),  # Metadata v12 topics: compact array of ~7 billion entries
        (3, 1, struct.pack(">i", 2**31 - 1)),  # Metadata v1 topics: int32 length
        (56, 3, bytes.fromhex("ffffffff07")),  # AlterPartition v3 topics
    ],
)
def test_a_forged_array_length_is_an_invalid_request_not_an_allocation(
    api_key: int, version: int, array_length: bytes
) -> None:
    # kio's native entity reader sized the array by this claim and aborted the process (Rust OOM): one
    # malformed frame from any client killed the broker. Found by fuzzing mutated frames.
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"fuzz"
    if version >= (12 if api_key == 3 else 0):
        header += b"\x00"  # request header v2: no tagged fields
    body = (struct.pack(">i", 1) if api_key == 56 else b"") + struct.pack(">q", 1) * (api_key == 56) + array_length
    with pytest.raises(InvalidRequest):
        parse_request(header + body + bytes(16))

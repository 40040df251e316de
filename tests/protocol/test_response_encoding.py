"""encode_response and the ApiVersions fallback, checked by decoding the bytes with kio's own reader."""

from __future__ import annotations

import datetime
import io
import os
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, cast

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from kio.index import load_payload_module, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64
from protocol_helpers import SERVED

from tierlog.protocol.api_versions import SUPPORTED_APIS
from tierlog.protocol.codec import (
    Request,
    UnsupportedVersion,
    api_versions_fallback,
    encode_response,
    unsupported_version_response,
)
from tierlog.protocol.fetch_response import INLINE_RECORDS_MAX, ResponseChunk

st.register_type_strategy(Records, st.binary(max_size=64))

FETCH_VERSIONS = range(SUPPORTED_APIS[1].min_version, SUPPORTED_APIS[1].max_version + 1)


@dataclass(frozen=True)
class FileSlice:
    """Storage's FileSlice shape; reading it through this object would defeat sendfile."""

    file: BinaryIO
    position: int
    size: int

    def read_bytes(self) -> bytes:
        raise AssertionError("the encoder must not read a FileSlice")


def request(api_key: int, version: int, correlation_id: int = 77) -> Request:
    # The response encoder only reads the header fields of the request.
    return Request(api_key, version, correlation_id, "test", body=cast(Any, None), size=0)


def assemble(chunks: list[ResponseChunk]) -> bytes:
    """What the socket receives: byte chunks as they are, slices as sendfile reads them (pread)."""
    out = bytearray()
    for chunk in chunks:
        if isinstance(chunk, bytes | memoryview):
            out += chunk
        else:
            out += os.pread(chunk.file.fileno(), chunk.size, chunk.position)
    return bytes(out)


def decode(frame: bytes, response_type: type[Any]) -> tuple[int, Any]:
    """Check the size prefix, read the header version kio assigns to the type, then the body."""
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    view = memoryview(frame).toreadonly()
    header, header_size = entity_reader(response_type.__header_schema__)(view, 4)
    body, body_size = entity_reader(response_type)(view, 4 + header_size)
    assert 4 + header_size + body_size == len(frame)
    return header.correlation_id, body


def kio_frame(correlation_id: int, entity: Any) -> bytes:
    header_type = type(entity).__header_schema__
    assert header_type in (ResponseHeaderV0, ResponseHeaderV1)
    out = io.BytesIO()
    entity_writer(header_type)(out, header_type(correlation_id=i32(correlation_id)))
    entity_writer(type(entity))(out, entity)
    return struct.pack(">i", out.tell()) + out.getvalue()


@pytest.fixture
def segment(tmp_path: Any) -> Iterator[BinaryIO]:
    with open(tmp_path / "00000000000000000000.log", "w+b") as file:
        file.write(b"\xee" * 1000 + bytes(range(256)) * 64 + b"\xee" * 1000)
        file.flush()
        file.seek(123)  # the encoder must not move it
        yield file


def fetch_response(version: int, records: list[Any]) -> Any:
    """A FetchResponse of `version` with one partition per records value."""
    schema = load_payload_module(1, version, EntityType.response)
    partitions = []
    for index, value in enumerate(records):
        fields: dict[str, Any] = {
            "partition_index": i32(index),
            "error_code": ErrorCode.none if value is not None else ErrorCode.offset_out_of_range,
            "high_watermark": i64(1000 + index),
            "last_stable_offset": i64(990 + index),
            "aborted_transactions": None
            if index % 2
            else (schema.AbortedTransaction(producer_id=i64(9), first_offset=i64(7)),),
            "records": value,
        }
        if version >= 5:
            fields["log_start_offset"] = i64(index)
        if version >= 11:
            fields["preferred_read_replica"] = i32(-1)
        if version >= 12 and index == 0:
            fields["diverging_epoch"] = schema.EpochEndOffset(epoch=i32(3), end_offset=i64(500))
            fields["current_leader"] = schema.LeaderIdAndEpoch(leader_id=i32(1), leader_epoch=i32(4))
        if version >= 12 and index == 1:
            fields["snapshot_id"] = schema.SnapshotId(end_offset=i64(80), epoch=i32(2))
        partitions.append(schema.PartitionData(**fields))
    topic = (
        schema.FetchableTopicResponse(topic_id=uuid.UUID(int=12345), partitions=tuple(partitions))
        if version >= 13
        else schema.FetchableTopicResponse(topic="events", partitions=tuple(partitions))
    )
    top: dict[str, Any] = {
        "throttle_time": i32Timedelta.parse(datetime.timedelta(milliseconds=25)),
        "responses": (topic,),
    }
    if version >= 7:
        top.update(error_code=ErrorCode.none, session_id=i32(0))
    if version >= 16:
        top["node_endpoints"] = (schema.NodeEndpoint(node_id=i32(1), host="broker-1", port=i32(9092), rack=None),)
    return schema.FetchResponse(**top)


def with_slices_read(response: Any) -> Any:
    """The response the client sees: every slice replaced by the bytes sendfile sends."""
    topics = []
    for topic in response.responses:
        partitions = []
        for partition in topic.partitions:
            records = partition.records
            if isinstance(records, FileSlice):
                records = os.pread(records.file.fileno(), records.size, records.position)
            elif isinstance(records, memoryview):
                records = bytes(records)
            partitions.append(replace(partition, records=records))
        topics.append(replace(topic, partitions=tuple(partitions)))
    return replace(response, responses=tuple(topics))


@pytest.mark.parametrize("version", [4, 5, 7, 11, 12, 13, 15, 16])
def test_fetch_file_slices_become_chunks_and_decode_with_kio(version: int, segment: BinaryIO) -> None:
    file_slice = FileSlice(segment, position=1000, size=256 * 64)
    large_view = memoryview(bytes(range(200)) * 50)
    records = [file_slice, b"small inline batch", large_view, None, FileSlice(segment, 1000, 0)]
    response = fetch_response(version, records)

    chunks = encode_response(request(1, version), response)

    assert any(chunk is file_slice for chunk in chunks)
    assert any(chunk is large_view for chunk in chunks)
    assert not any(isinstance(chunk, FileSlice) and chunk.size == 0 for chunk in chunks)
    assert segment.tell() == 123
    # The bytes chunk before the slice ends with the records length: compact (size + 1) or int32.
    before = chunks[[id(chunk) for chunk in chunks].index(id(file_slice)) - 1]
    assert isinstance(before, bytes)
    expected_prefix = b"\x81\x80\x01" if version >= 12 else struct.pack(">i", 16384)
    assert before.endswith(expected_prefix)

    correlation_id, decoded = decode(assemble(chunks), type(response))
    assert correlation_id == 77
    assert decoded == with_slices_read(response)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_encoder_matches_kio_byte_for_byte(version: int) -> None:
    response_type = load_response_schema(1, version)

    @settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.from_type(response_type), st.integers(min_value=-(2**31), max_value=2**31 - 1))
    def check(response: Any, correlation_id: int) -> None:
        chunks = encode_response(request(1, version, correlation_id), response)
        assert b"".join(cast(list[bytes], chunks)) == kio_frame(correlation_id, response)

    check()


def test_large_bytes_records_are_not_copied() -> None:
    blob = b"\x01" * (INLINE_RECORDS_MAX + 1)
    chunks = encode_response(request(1, 12), fetch_response(12, [blob]))
    assert any(chunk is blob for chunk in chunks)


@pytest.mark.parametrize(("api_key", "version"), [served for served in SERVED if served[0] != 1])
def test_every_other_response_round_trips_through_kio(api_key: int, version: int) -> None:
    response_type = load_response_schema(api_key, version)

    @settings(max_examples=5, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.from_type(response_type))
    def check(response: Any) -> None:
        try:
            chunks = encode_response(request(api_key, version), response)
        except ValueError as e:
            # kio's strategy may draw a duration (SaslAuthenticate's session_lifetime) past what int64
            # milliseconds hold: no Kafka response carries it, and kio's own writer refuses it.
            if "timedelta milliseconds overflow" in str(e):
                reject()
            raise
        assert len(chunks) == 1
        assert decode(assemble(chunks), response_type) == (77, response)

    check()


def test_api_versions_v3_response_uses_header_v0() -> None:
    schema = load_payload_module(18, 3, EntityType.response)
    response = schema.ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(schema.ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(4)),),
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
    )
    (frame,) = encode_response(request(18, 3, correlation_id=5), response)
    assert isinstance(frame, bytes)
    assert frame[4:8] == struct.pack(">i", 5)
    assert frame[8:10] == b"\x00\x00"  # the error code follows at once: no header tag section
    assert decode(frame, type(response)) == (5, response)


def test_response_of_another_api_or_version_is_refused() -> None:
    with pytest.raises(ValueError, match="does not answer"):
        encode_response(request(1, 11), fetch_response(12, []))


def test_api_versions_fallback_is_a_v0_response_with_unsupported_version_and_our_apis() -> None:
    frame = b"".join(api_versions_fallback(correlation_id=99))
    response_type = load_response_schema(18, 0)
    correlation_id, response = decode(frame, response_type)
    assert correlation_id == 99
    assert response.error_code == ErrorCode.unsupported_version
    advertised = {entry.api_key: (entry.min_version, entry.max_version) for entry in response.api_keys}
    assert advertised[18] == (0, 4)
    assert advertised[0] == (0, 11)
    assert advertised.keys() == SUPPORTED_APIS.keys()


def test_unsupported_version_answers_api_versions_and_closes_anything_else() -> None:
    reply = unsupported_version_response(UnsupportedVersion(18, 9, 3), [18, 3])
    assert reply is not None
    _, response = decode(b"".join(reply), load_response_schema(18, 0))
    assert [entry.api_key for entry in response.api_keys] == [3, 18]
    assert unsupported_version_response(UnsupportedVersion(1, 99, 3)) is None

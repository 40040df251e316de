"""KafkaConnection: requests a real broker answers (ApiVersions, Metadata, CreateTopics, Produce, Fetch,
ListOffsets), and against a scripted fake server every way a connection fails (refused, timeout, EOF, a
wrong correlation id, a malformed frame, cancellation) is one KafkaConnectionError and a closed connection;
`send_blocking`, the same exchange on a blocking socket, fails the same ways.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asyncio_helpers import run_bounded
from client_helpers import HOST, Answer, scripted_peer
from kio.schema.api_versions.v3 import response as api_versions_v3_response
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1 import response as metadata_v1_response
from kio.schema.metadata.v12 import response as metadata_v12_response
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from tierlog.client.connection import ApiNotServedError, KafkaConnection, KafkaConnectionError, send_blocking
from tierlog.client.requests import (
    API_DESCRIBE_LOG_DIRS,
    PartitionFetch,
    api_versions_request,
    create_topics_request,
    describe_log_dirs_request,
    fetch_request,
    list_offsets_request,
    metadata_request,
    produce_request,
)
from tierlog.common import TopicPartition
from tierlog.protocol.api_versions import SUPPORTED_APIS
from tierlog.protocol.framing import read_frame
from tierlog.records.codec import build_batch, decode_batches
from tierlog.testing.local_cluster import BrokerProcess, free_port

TIMEOUT_S = 10.0
# Bounds every test's event loop, so a hang fails the test instead of reaching pytest's global timeout.
TEST_DEADLINE_S = 30.0

# --- a real broker --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_broker(module_broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return module_broker_factory()


def with_connection(port: int, body: Callable[[KafkaConnection], Awaitable[Any]]) -> Any:
    async def scenario() -> Any:
        connection = await KafkaConnection.open(HOST, port, client_id="test-client", timeout_s=TIMEOUT_S)
        try:
            return await body(connection)
        finally:
            await connection.close()

    return run_bounded(scenario, TEST_DEADLINE_S)


def test_api_versions_v3_lists_the_apis_a_follower_needs(real_broker: BrokerProcess) -> None:
    request = api_versions_request(version=3)

    async def body(connection: KafkaConnection) -> Any:
        return await connection.send(request, timeout_s=TIMEOUT_S)

    response = with_connection(real_broker.port, body)
    assert isinstance(response, api_versions_v3_response.ApiVersionsResponse)
    assert response.error_code == ErrorCode.none
    served = {entry.api_key: (entry.min_version, entry.max_version) for entry in response.api_keys}
    for api_key, version in [(0, 9), (1, 12), (2, 7), (3, 12), (19, 7)]:
        low, high = served[api_key]
        assert low <= version <= high


def create_topic_request(name: str, partitions: int) -> Any:
    return create_topics_request(name, partitions, 1, {}, timeout_ms=10_000)


def metadata_v12_request(name: str) -> Any:
    return metadata_request([name], version=12)


def test_create_topics_v7_then_metadata_v12_describes_the_topic(real_broker: BrokerProcess) -> None:
    async def body(connection: KafkaConnection) -> tuple[Any, Any]:
        created = await connection.send(create_topic_request("described", 3), timeout_s=TIMEOUT_S)
        return created, await connection.send(metadata_v12_request("described"), timeout_s=TIMEOUT_S)

    created, metadata = with_connection(real_broker.port, body)
    ((topic_result,),) = (created.topics,)
    assert (topic_result.name, topic_result.error_code, topic_result.num_partitions) == ("described", ErrorCode.none, 3)
    assert isinstance(metadata, metadata_v12_response.MetadataResponse)
    (topic,) = metadata.topics
    assert (topic.name, topic.error_code) == ("described", ErrorCode.none)
    assert topic.topic_id == topic_result.topic_id
    assert sorted(p.partition_index for p in topic.partitions) == [0, 1, 2]
    assert {p.leader_id for p in topic.partitions} == {real_broker.node_id}
    assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(real_broker.node_id, HOST, real_broker.port)]


def test_non_flexible_metadata_v1_uses_request_header_v1_and_response_header_v0(real_broker: BrokerProcess) -> None:
    async def body(connection: KafkaConnection) -> Any:
        return await connection.send(metadata_request(()), timeout_s=TIMEOUT_S)

    response = with_connection(real_broker.port, body)
    assert isinstance(response, metadata_v1_response.MetadataResponse)
    assert [b.node_id for b in response.brokers] == [real_broker.node_id]


def consumer_fetch(topic: str, offset: int) -> Any:
    return fetch_request(
        [PartitionFetch(TopicPartition(topic, 0), offset, 1 << 20)], max_wait_ms=100, max_bytes=1 << 20
    )


RECORDS = [(f"key-{i}".encode(), f"value-{i}".encode(), [("h", b"x")], 1_700_000_000_000 + i) for i in range(5)]


def test_produce_v9_then_fetch_v12_returns_the_records_and_list_offsets_v7_the_end(real_broker: BrokerProcess) -> None:
    topic = "round-trip"

    async def body(connection: KafkaConnection) -> tuple[Any, ...]:
        await connection.send(create_topic_request(topic, 1), timeout_s=TIMEOUT_S)
        produced = await connection.send(
            produce_request(TopicPartition(topic, 0), build_batch(RECORDS), acks=-1, timeout_ms=10_000),
            timeout_s=TIMEOUT_S,
        )
        fetched = await connection.send(consumer_fetch(topic, 0), timeout_s=TIMEOUT_S)
        latest = await connection.send(
            list_offsets_request(TopicPartition(topic, 0), -1, version=7), timeout_s=TIMEOUT_S
        )
        earliest = await connection.send(
            list_offsets_request(TopicPartition(topic, 0), -2, version=7), timeout_s=TIMEOUT_S
        )
        return produced, fetched, latest, earliest

    produced, fetched, latest, earliest = with_connection(real_broker.port, body)
    (produced_partition,) = produced.responses[0].partition_responses
    assert (produced_partition.error_code, produced_partition.base_offset) == (ErrorCode.none, 0)

    assert fetched.error_code == ErrorCode.none
    (fetched_partition,) = fetched.responses[0].partitions
    assert (fetched_partition.error_code, fetched_partition.high_watermark) == (ErrorCode.none, len(RECORDS))
    assert isinstance(fetched_partition.records, bytes)
    (batch,) = decode_batches(fetched_partition.records)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in batch.records] == [
        (offset, key, value, timestamp) for offset, (key, value, _headers, timestamp) in enumerate(RECORDS)
    ]

    assert latest.topics[0].partitions[0].offset == len(RECORDS)
    assert earliest.topics[0].partitions[0].offset == 0


def test_fetch_beyond_the_end_decodes_with_null_records(real_broker: BrokerProcess) -> None:
    topic = "empty-fetch"

    async def body(connection: KafkaConnection) -> Any:
        await connection.send(create_topic_request(topic, 1), timeout_s=TIMEOUT_S)
        return await connection.send(consumer_fetch(topic, 0), timeout_s=TIMEOUT_S)

    fetched = with_connection(real_broker.port, body)
    (partition,) = fetched.responses[0].partitions
    assert partition.error_code == ErrorCode.none
    assert partition.high_watermark == 0
    assert not partition.records


def test_concurrent_sends_on_one_connection_each_get_their_own_response(real_broker: BrokerProcess) -> None:
    names = [f"concurrent-{i}" for i in range(8)]

    async def body(connection: KafkaConnection) -> list[Any]:
        await asyncio.gather(*(connection.send(create_topic_request(n, 1), timeout_s=TIMEOUT_S) for n in names))
        return list(
            await asyncio.gather(*(connection.send(metadata_v12_request(n), timeout_s=TIMEOUT_S) for n in names))
        )

    responses = with_connection(real_broker.port, body)
    assert [r.topics[0].name for r in responses] == names
    assert all(r.topics[0].error_code == ErrorCode.none for r in responses)


def test_send_negotiated_sends_the_newest_version_both_serve_and_names_an_api_the_broker_lacks(
    real_broker: BrokerProcess,
) -> None:
    async def body(connection: KafkaConnection) -> tuple[Any, str]:
        # Newer than any broker serves: the broker's newest is used. A key no broker serves: refused by name.
        response = await connection.send_negotiated(
            API_DESCRIBE_LOG_DIRS,
            lambda version: describe_log_dirs_request(None, version=version),
            99,
            timeout_s=TIMEOUT_S,
        )
        with pytest.raises(ApiNotServedError) as refused:
            await connection.send_negotiated(9999, lambda _: describe_log_dirs_request(None), 0, timeout_s=TIMEOUT_S)
        return response, str(refused.value)

    response, refusal = with_connection(real_broker.port, body)
    assert type(response).__version__ == SUPPORTED_APIS[API_DESCRIBE_LOG_DIRS].max_version
    assert response.results and refusal == "does not serve API 9999 (API 9999)"


# --- a scripted fake server -----------------------------------------------------------------------------

# What the fake does with a request frame: returns the bytes to write back (a whole frame, size prefix
# included), None to close the connection, or waits forever.
Script = Callable[[bytes], Awaitable[bytes | None]]


class FakeServer:
    """Answers each request frame with `script`; `close_after_answer` hangs up after the first answer."""

    def __init__(self, script: Script, *, close_after_answer: bool = False) -> None:
        self.script = script
        self.close_after_answer = close_after_answer
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while (frame := await read_frame(reader, 1 << 20)) is not None:
                self.requests.append(frame)
                answer = await self.script(frame)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after_answer:
                    break
        finally:
            writer.close()


def correlation_id_of(frame: bytes) -> int:
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    return correlation_id


def response_frame(correlation_id: int, body: Any, *, header_tags: bool) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">i", correlation_id))
    if header_tags:
        out.write(b"\x00")
    entity_writer(type(body))(out, body)
    payload = out.getvalue()
    return struct.pack(">i", len(payload)) + payload


METADATA_V12 = metadata_v12_response.MetadataResponse(
    throttle_time=datetime.timedelta(0),
    brokers=(
        metadata_v12_response.MetadataResponseBroker(node_id=i32(4), host="elsewhere", port=i32(9092), rack=None),
    ),
    cluster_id="fake",
    controller_id=i32(4),
    topics=(),
)


def answer_metadata(*, correlation_offset: int = 0) -> Script:
    async def script(frame: bytes) -> bytes:
        return response_frame(correlation_id_of(frame) + correlation_offset, METADATA_V12, header_tags=True)

    return script


def fake_exchange(
    script: Script, *, timeout_s: float = TIMEOUT_S, close_after_answer: bool = False
) -> tuple[Any, bool, FakeServer]:
    """One Metadata v12 send to a fake serving `script`: (response or the KafkaConnectionError, whether the
    connection is closed afterwards, the server)."""
    fake = FakeServer(script, close_after_answer=close_after_answer)

    async def scenario() -> tuple[Any, bool, FakeServer]:
        async with fake as port:
            connection = await KafkaConnection.open(HOST, port, client_id="fake-client", timeout_s=TIMEOUT_S)
            try:
                outcome: Any = await connection.send(metadata_v12_request("t"), timeout_s=timeout_s)
            except KafkaConnectionError as exc:
                outcome = exc
            closed = connection.closed
            await connection.close()
            return outcome, closed, fake

    result: tuple[Any, bool, FakeServer] = run_bounded(scenario, TEST_DEADLINE_S)
    return result


def test_request_frame_carries_header_v2_with_client_id_and_empty_tags() -> None:
    response, closed, fake = fake_exchange(answer_metadata())
    assert response == METADATA_V12
    assert not closed
    (frame,) = fake.requests
    api_key, api_version, correlation_id, client_id_length = struct.unpack_from(">hhih", frame)
    assert (api_key, api_version, client_id_length) == (3, 12, len("fake-client"))
    assert frame[10 : 10 + client_id_length] == b"fake-client"
    assert frame[10 + client_id_length] == 0  # no tagged fields in request header v2
    assert correlation_id == 0


def test_correlation_ids_increase_per_request() -> None:
    fake = FakeServer(answer_metadata())

    async def scenario() -> None:
        async with fake as port:
            connection = await KafkaConnection.open(HOST, port, client_id="c", timeout_s=TIMEOUT_S)
            for _ in range(3):
                await connection.send(metadata_v12_request("t"), timeout_s=TIMEOUT_S)
            await connection.close()

    run_bounded(scenario, TEST_DEADLINE_S)
    assert [correlation_id_of(frame) for frame in fake.requests] == [0, 1, 2]


def assert_failed(outcome: Any, closed: bool, *fragments: str) -> None:
    assert isinstance(outcome, KafkaConnectionError), outcome
    message = str(outcome)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert closed


def test_a_wrong_correlation_id_fails_and_closes_the_connection() -> None:
    outcome, closed, _ = fake_exchange(answer_metadata(correlation_offset=5))
    assert_failed(outcome, closed, "MetadataRequest v12", "correlation id 5", "expected 0")


def test_eof_instead_of_a_response_fails_and_closes_the_connection() -> None:
    async def hang_up(_frame: bytes) -> None:
        return None

    outcome, closed, _ = fake_exchange(hang_up)
    assert_failed(outcome, closed, "connection closed by the peer")


def test_eof_inside_a_response_frame_fails_and_closes_the_connection() -> None:
    async def truncated(frame: bytes) -> bytes:
        return response_frame(correlation_id_of(frame), METADATA_V12, header_tags=True)[:-3]

    outcome, closed, _ = fake_exchange(truncated, close_after_answer=True)
    assert_failed(outcome, closed, "connection closed after")


def test_a_malformed_body_fails_and_closes_the_connection() -> None:
    async def garbage(frame: bytes) -> bytes:
        payload = struct.pack(">i", correlation_id_of(frame)) + b"\x00" + b"\xff" * 7
        return struct.pack(">i", len(payload)) + payload

    outcome, closed, _ = fake_exchange(garbage)
    assert_failed(outcome, closed, "malformed response")


def test_a_negative_frame_size_fails_and_closes_the_connection() -> None:
    async def negative(_frame: bytes) -> bytes:
        return struct.pack(">i", -1)

    outcome, closed, _ = fake_exchange(negative)
    assert_failed(outcome, closed, "invalid frame size -1")


def test_no_response_in_time_fails_and_closes_the_connection() -> None:
    async def silent(_frame: bytes) -> None:
        await asyncio.Event().wait()

    outcome, closed, _ = fake_exchange(silent, timeout_s=0.2)
    assert_failed(outcome, closed, "no response within 0.2s")


def test_a_closed_connection_refuses_further_sends() -> None:
    async def scenario() -> Any:
        async with FakeServer(answer_metadata()) as port:
            connection = await KafkaConnection.open(HOST, port, client_id="c", timeout_s=TIMEOUT_S)
            await connection.close()
            await connection.close()  # idempotent
            try:
                await connection.send(metadata_v12_request("t"), timeout_s=TIMEOUT_S)
            except KafkaConnectionError as exc:
                return exc
            return None

    assert_failed(run_bounded(scenario, TEST_DEADLINE_S), True, "connection is closed")


def test_a_cancelled_send_closes_the_connection() -> None:
    arrived = asyncio.Event()

    async def silent(_frame: bytes) -> None:
        arrived.set()
        await asyncio.Event().wait()

    async def scenario() -> bool:
        async with FakeServer(silent) as port:
            connection = await KafkaConnection.open(HOST, port, client_id="c", timeout_s=TIMEOUT_S)
            send = asyncio.ensure_future(connection.send(metadata_v12_request("t"), timeout_s=TIMEOUT_S))
            await arrived.wait()
            send.cancel()
            with pytest.raises(asyncio.CancelledError):
                await send
            return connection.closed

    assert run_bounded(scenario, TEST_DEADLINE_S)


def test_connecting_to_a_port_nobody_listens_on_fails_with_one_line() -> None:
    port = free_port()

    async def scenario() -> KafkaConnectionError:
        with pytest.raises(KafkaConnectionError) as caught:
            await KafkaConnection.open(HOST, port, client_id="c", timeout_s=TIMEOUT_S)
        return caught.value

    error = run_bounded(scenario, TEST_DEADLINE_S)
    assert f"connect to {HOST}:{port} failed" in str(error)
    assert "\n" not in str(error)


def test_api_versions_responses_are_read_with_header_v0_even_when_flexible() -> None:
    body = api_versions_v3_response.ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(api_versions_v3_response.ApiVersion(api_key=i16(1), min_version=i16(4), max_version=i16(16)),),
        throttle_time=datetime.timedelta(0),
    )

    async def answer(frame: bytes) -> bytes:
        return response_frame(correlation_id_of(frame), body, header_tags=False)

    fake = FakeServer(answer)

    async def scenario() -> Any:
        async with fake as port:
            connection = await KafkaConnection.open(HOST, port, client_id="c", timeout_s=TIMEOUT_S)
            response = await connection.send(api_versions_request(version=3), timeout_s=TIMEOUT_S)
            await connection.close()
            return response

    assert run_bounded(scenario, TEST_DEADLINE_S) == body


# --- send_blocking: the same exchange on a blocking socket ----------------------------------------------


def test_send_blocking_gets_the_answer_of_a_real_broker(real_broker: BrokerProcess) -> None:
    with socket.create_connection((HOST, real_broker.port), timeout=TIMEOUT_S) as sock:
        response = send_blocking(sock, metadata_request(()), client_id="blocking")
    assert isinstance(response, metadata_v1_response.MetadataResponse)
    assert [(b.node_id, b.port) for b in response.brokers] == [(real_broker.node_id, real_broker.port)]


def blocking_exchange(answer: Answer, *, timeout_s: float = TIMEOUT_S) -> Any:
    """One Metadata v12 send_blocking to a scripted peer that answers with `answer`: the response or the
    KafkaConnectionError."""
    with scripted_peer(answer) as port:
        try:
            with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
                return send_blocking(sock, metadata_v12_request("t"), client_id="blocking")
        except KafkaConnectionError as exc:
            return exc


def test_send_blocking_reads_a_well_formed_answer() -> None:
    assert blocking_exchange(
        lambda frame: response_frame(correlation_id_of(frame), METADATA_V12, header_tags=True)
    ) == (METADATA_V12)


@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        (lambda frame: b"", "connection closed by the peer"),
        (
            lambda frame: response_frame(correlation_id_of(frame) + 5, METADATA_V12, header_tags=True),
            "correlation id 5",
        ),
        (
            lambda frame: response_frame(correlation_id_of(frame), METADATA_V12, header_tags=True)[:-3],
            "connection closed after",
        ),
        (lambda frame: b"HTTP/1.1 400 Bad Request\r\n\r\n", "exceeds"),
        (
            lambda frame: struct.pack(">i", 9) + struct.pack(">i", correlation_id_of(frame)) + b"\xff" * 5,
            "malformed response",
        ),
        (lambda frame: None, "no response within 0.3s"),
    ],
    ids=["eof", "wrong-correlation-id", "truncated", "not-kafka", "malformed", "silent"],
)
def test_send_blocking_fails_with_one_line(answer: Answer, fragment: str) -> None:
    outcome = blocking_exchange(answer, timeout_s=0.3)
    assert isinstance(outcome, KafkaConnectionError), outcome
    assert "MetadataRequest v12 to 127.0.0.1:" in str(outcome)
    assert fragment in str(outcome)
    assert "\n" not in str(outcome)

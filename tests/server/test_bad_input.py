"""Bad input gets Kafka's answer and loses nothing, and the broker keeps serving everyone else.

Requests are built by hand here (struct, non-flexible versions), independently of the broker's own codec,
and then damaged. Each test checks three things: the answer (a Kafka error code, or the connection
closed), that nothing was appended where that matters, and that a connection opened before the bad input
and a new one are both still served. Cases that close the connection must leave exactly one warning line
in the broker log naming the connection, and no traceback.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import make_batch

from tierlog.testing.local_cluster import BrokerProcess, wait_until

MAX_REQUEST_BYTES = 256 * 1024
IO_TIMEOUT_S = 10.0

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_API_VERSIONS, API_CREATE_TOPICS = 18, 19

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87

CRC_OFFSET = 17  # baseOffset(8) batchLength(4) partitionLeaderEpoch(4) magic(1), then crc(4)


# --- a minimal Kafka wire client ------------------------------------------------------------------------


def i8(v: int) -> bytes:
    return struct.pack(">b", v)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    raw = s.encode()
    return i16(len(raw)) + raw


def nbytes(b: bytes | None) -> bytes:
    return i32(-1) if b is None else i32(len(b)) + b


def array(items: list[bytes] | None) -> bytes:
    return i32(-1) if items is None else i32(len(items)) + b"".join(items)


def request_header(api_key: int, version: int, correlation_id: int, client_id: str = "bad-input-test") -> bytes:
    """Request header v1: the header of every non-flexible request version."""
    return i16(api_key) + i16(version) + i32(correlation_id) + string(client_id)


def frame(payload: bytes) -> bytes:
    return i32(len(payload)) + payload


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def i8(self) -> int:
        return int(self._take(">b"))

    def i16(self) -> int:
        return int(self._take(">h"))

    def i32(self) -> int:
        return int(self._take(">i"))

    def i64(self) -> int:
        return int(self._take(">q"))

    def string(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        s = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return s

    def nbytes(self) -> bytes | None:
        n = self.i32()
        if n < 0:
            return None
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def array(self, item: Callable[[Reader], Any]) -> list[Any]:
        n = self.i32()
        return [] if n < 0 else [item(self) for _ in range(n)]


class Wire:
    """One TCP connection speaking hand-built frames."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=IO_TIMEOUT_S)
        self.local_port: int = self.sock.getsockname()[1]
        self._correlation_id = 1000

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exactly(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(data)} of {n} bytes")
            data += chunk
        return bytes(data)

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._recv_exactly(4))
        return self._recv_exactly(size)

    def request(self, api_key: int, version: int, body: bytes) -> Reader:
        """Send one non-flexible request and return a reader positioned after the response header v0."""
        self._correlation_id += 1
        cid = self._correlation_id
        self.send(frame(request_header(api_key, version, cid) + body))
        reader = Reader(self.read_frame())
        got = reader.i32()
        assert got == cid, f"response correlation id {got}, expected {cid}"
        return reader

    def closed_by_broker(self, timeout_s: float = IO_TIMEOUT_S) -> bool:
        """True if the broker closes this connection (EOF or reset) within `timeout_s` without sending
        anything; False if it sends bytes or keeps the connection open that long."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(IO_TIMEOUT_S)
        return data == b""


# --- requests and responses we need ---------------------------------------------------------------------


def metadata_v1(wire: Wire, topics: list[str] | None) -> dict[str, tuple[int, list[int]]]:
    """topic -> (error code, partition indexes)."""
    r = wire.request(API_METADATA, 1, array(None if topics is None else [string(t) for t in topics]))
    r.array(lambda r: (r.i32(), r.string(), r.i32(), r.string()))  # brokers
    r.i32()  # controller id

    def topic(r: Reader) -> tuple[str, tuple[int, list[int]]]:
        error = r.i16()
        name = r.string()
        r.i8()  # is_internal
        partitions = r.array(lambda r: (r.i16(), r.i32(), r.i32(), r.array(Reader.i32), r.array(Reader.i32))[1])
        assert name is not None
        return name, (error, partitions)

    return dict(r.array(topic))


def metadata_v4(wire: Wire, topics: list[str], allow_auto_topic_creation: bool) -> dict[str, int]:
    """topic -> error code, with auto-creation as requested."""
    body = array([string(t) for t in topics]) + i8(1 if allow_auto_topic_creation else 0)
    r = wire.request(API_METADATA, 4, body)
    r.i32()  # throttle
    r.array(lambda r: (r.i32(), r.string(), r.i32(), r.string()))
    r.string()  # cluster id
    r.i32()

    def topic(r: Reader) -> tuple[str | None, int]:
        error = r.i16()
        name = r.string()
        r.i8()
        r.array(lambda r: (r.i16(), r.i32(), r.i32(), r.array(Reader.i32), r.array(Reader.i32)))
        return name, error

    return dict(r.array(topic))


def create_topics_v2(wire: Wire, name: str, partitions: int = 1) -> tuple[int, str | None]:
    """(error code, error message) for one topic."""
    topic = string(name) + i32(partitions) + i16(1) + array([]) + array([])
    r = wire.request(API_CREATE_TOPICS, 2, array([topic]) + i32(10_000) + i8(0))
    r.i32()  # throttle
    results = r.array(lambda r: (r.string(), r.i16(), r.string()))
    assert len(results) == 1 and results[0][0] == name
    return results[0][1], results[0][2]


def produce_body_v3(topic: str, partition: int, records: bytes, acks: int = -1) -> bytes:
    partition_data = i32(partition) + nbytes(records)
    return string(None) + i16(acks) + i32(10_000) + array([string(topic) + array([partition_data])])


def produce_v3(wire: Wire, topic: str, partition: int, records: bytes) -> tuple[int, int]:
    """(error code, base offset)."""
    r = wire.request(API_PRODUCE, 3, produce_body_v3(topic, partition, records))
    topics = r.array(lambda r: (r.string(), r.array(lambda r: (r.i32(), r.i16(), r.i64(), r.i64()))))
    assert len(topics) == 1 and topics[0][0] == topic and len(topics[0][1]) == 1
    index, error, base_offset, _ = topics[0][1][0]
    assert index == partition
    return error, base_offset


@dataclass
class FetchResult:
    error: int
    high_watermark: int
    records: bytes


def fetch_v4(wire: Wire, topic: str, partition: int, offset: int) -> FetchResult:
    partitions = array([i32(partition) + i64(offset) + i32(1024 * 1024)])
    body = i32(-1) + i32(100) + i32(1) + i32(1024 * 1024) + i8(0) + array([string(topic) + partitions])
    r = wire.request(API_FETCH, 4, body)
    r.i32()  # throttle

    def partition_data(r: Reader) -> FetchResult:
        r.i32()
        error = r.i16()
        hw = r.i64()
        r.i64()  # last stable offset
        r.array(lambda r: (r.i64(), r.i64()))
        return FetchResult(error, hw, r.nbytes() or b"")

    topics = r.array(lambda r: (r.string(), r.array(partition_data)))
    assert len(topics) == 1 and len(topics[0][1]) == 1
    result: FetchResult = topics[0][1][0]
    return result


def list_offsets_v1(wire: Wire, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
    """(error code, offset) for ListOffsets with `timestamp` (-1 latest, -2 earliest)."""
    body = i32(-1) + array([string(topic) + array([i32(partition) + i64(timestamp)])])
    r = wire.request(API_LIST_OFFSETS, 1, body)
    topics = r.array(lambda r: (r.string(), r.array(lambda r: (r.i32(), r.i16(), r.i64(), r.i64()))))
    _, error, _, offset = topics[0][1][0]
    return error, offset


def log_end_offset(wire: Wire, topic: str, partition: int = 0) -> int:
    error, offset = list_offsets_v1(wire, topic, partition, -1)
    assert error == NONE
    return offset


def api_versions_v0(wire: Wire) -> tuple[int, dict[int, tuple[int, int]]]:
    r = wire.request(API_API_VERSIONS, 0, b"")
    error = r.i16()
    return error, {k: (lo, hi) for k, lo, hi in r.array(lambda r: (r.i16(), r.i16(), r.i16()))}


def record_batch(values: list[bytes], timestamp: int = 1_700_000_000_000) -> bytes:
    keys: list[bytes | None] = [b"key-%d" % i for i in range(len(values))]
    return bytes(make_batch(len(values), values=values, keys=keys, timestamp=timestamp))


# --- fixtures -------------------------------------------------------------------------------------------


class BrokerLog:
    """The broker's log file from a mark on: what the broker said about what a test just did."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size

    def new_text(self) -> str:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def problem_lines(self) -> list[str]:
        """Warning and error lines, and traceback starts, written since the mark."""
        return [
            line
            for line in self.new_text().splitlines()
            if " WARNING " in line or " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")
        ]


@pytest.fixture(scope="module")
def bad_input_broker(module_broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return module_broker_factory(socket_request_max_bytes=MAX_REQUEST_BYTES)


@dataclass
class Scene:
    broker: BrokerProcess
    bystander: Wire  # a client connected before the bad input arrives
    log: BrokerLog
    topic: str

    def wire(self) -> Wire:
        return Wire(self.broker)


@pytest.fixture
def scene(bad_input_broker: BrokerProcess, kafka: Any) -> Iterator[Scene]:
    """A topic with two records, a bystander connection, and the log marked; afterwards, proof that the
    bystander and a brand-new connection are both still served and the broker is alive."""
    broker = bad_input_broker
    topic = kafka.new_topic(broker.bootstrap, partitions=1)
    bystander = Wire(broker)
    assert produce_v3(bystander, topic, 0, record_batch([b"first", b"second"])) == (NONE, 0)
    assert log_end_offset(bystander, topic) == 2
    log = BrokerLog(broker.log_file)
    yield Scene(broker, bystander, log, topic)
    try:
        assert broker.running, "the broker process died"
        assert topic in metadata_v1(bystander, [topic]), "the bystander connection is no longer served"
        fresh = Wire(broker)
        try:
            error, apis = api_versions_v0(fresh)
            assert error == NONE and API_PRODUCE in apis
            assert log_end_offset(fresh, topic) >= 2
        finally:
            fresh.close()
        assert not [line for line in log.new_text().splitlines() if line.startswith("Traceback")], log.new_text()
    finally:
        bystander.close()


def assert_closed_with_one_log_line(scene: Scene, wire: Wire) -> None:
    assert wire.closed_by_broker(), "the broker did not close the connection"
    wire.close()
    wait_until(scene.log.problem_lines, IO_TIMEOUT_S, "a log line about the closed connection")
    # The bystander's round trip gives any further lines about this connection time to appear.
    metadata_v1(scene.bystander, [scene.topic])
    lines = scene.log.problem_lines()
    assert len(lines) == 1, f"expected one log line about the closed connection, got {lines}"
    assert str(wire.local_port) in lines[0], f"the log line does not name the connection: {lines[0]}"


# --- framing ---------------------------------------------------------------------------------------------


def test_frame_above_socket_request_max_bytes_closes_the_connection(scene: Scene) -> None:
    wire = scene.wire()
    wire.send(i32(MAX_REQUEST_BYTES + 1) + request_header(API_METADATA, 1, 7) + array(None))
    assert_closed_with_one_log_line(scene, wire)


def test_negative_frame_size_closes_the_connection(scene: Scene) -> None:
    wire = scene.wire()
    wire.send(i32(-1) + b"\x00" * 16)
    assert_closed_with_one_log_line(scene, wire)


def test_http_request_on_the_kafka_port_closes_the_connection(scene: Scene) -> None:
    # "GET " read as a size prefix is 1195725856 bytes: far above the limit, and never allocated.
    wire = scene.wire()
    wire.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert_closed_with_one_log_line(scene, wire)


def test_frame_of_exactly_socket_request_max_bytes_is_served(scene: Scene) -> None:
    overhead = len(request_header(API_PRODUCE, 3, 1) + produce_body_v3(scene.topic, 0, b""))
    value_size = MAX_REQUEST_BYTES - overhead - 100
    for _ in range(10):  # varints in the batch may grow by a byte or two: converge on the exact size
        batch = record_batch([b"x" * value_size])
        payload = len(request_header(API_PRODUCE, 3, 1) + produce_body_v3(scene.topic, 0, batch))
        if payload == MAX_REQUEST_BYTES:
            break
        value_size += MAX_REQUEST_BYTES - payload
    assert payload == MAX_REQUEST_BYTES
    wire = scene.wire()
    try:
        assert produce_v3(wire, scene.topic, 0, batch) == (NONE, 2)
    finally:
        wire.close()


def test_truncated_frame_then_close_leaves_nothing_behind(scene: Scene) -> None:
    wire = scene.wire()
    whole = frame(request_header(API_PRODUCE, 3, 9) + produce_body_v3(scene.topic, 0, record_batch([b"lost"])))
    wire.send(whole[: len(whole) // 2])
    wire.close()
    # The broker must notice the EOF and carry on; it may say so in one line, never with a traceback.
    # Nothing tells when it has noticed, so give it a bounded second to speak.
    deadline = time.monotonic() + 1.0
    while not scene.log.problem_lines() and time.monotonic() < deadline:
        metadata_v1(scene.bystander, [scene.topic])
        time.sleep(0.05)
    lines = scene.log.problem_lines()
    assert len(lines) <= 1 and not any(line.startswith("Traceback") for line in lines), scene.log.new_text()
    assert log_end_offset(scene.bystander, scene.topic) == 2, "a half-sent produce appended records"


def test_a_client_stalled_halfway_through_a_frame_does_not_hold_up_others(scene: Scene) -> None:
    slow = scene.wire()
    try:
        whole = frame(request_header(API_PRODUCE, 3, 21) + produce_body_v3(scene.topic, 0, record_batch([b"slow"])))
        slow.send(whole[:30])
        for _ in range(3):  # everyone else is served while the slow client dawdles
            assert log_end_offset(scene.bystander, scene.topic) == 2
            other = scene.wire()
            try:
                assert api_versions_v0(other)[0] == NONE
            finally:
                other.close()
        slow.send(whole[30:])
        reader = Reader(slow.read_frame())
        assert reader.i32() == 21
        assert log_end_offset(scene.bystander, scene.topic) == 3
    finally:
        slow.close()


def test_garbage_bytes_in_a_frame_close_the_connection(scene: Scene) -> None:
    garbage = bytes.fromhex("7fff") + os.urandom(46)  # api key 32767: no such API; the rest is noise
    wire = scene.wire()
    wire.send(frame(garbage))
    assert_closed_with_one_log_line(scene, wire)


def test_request_body_that_does_not_parse_closes_the_connection(scene: Scene) -> None:
    # A Metadata v1 header followed by a topic array that claims a million entries and holds three bytes.
    wire = scene.wire()
    wire.send(frame(request_header(API_METADATA, 1, 11) + i32(1_000_000) + b"abc"))
    assert_closed_with_one_log_line(scene, wire)


# --- unknown APIs and versions -----------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [1000, 32000])
def test_unknown_api_key_closes_the_connection(scene: Scene, api_key: int) -> None:
    wire = scene.wire()
    wire.send(frame(request_header(api_key, 0, 12)))
    assert_closed_with_one_log_line(scene, wire)


def test_unsupported_version_of_a_known_api_closes_the_connection(scene: Scene) -> None:
    wire = scene.wire()
    wire.send(frame(request_header(API_METADATA, 99, 13) + array(None)))
    assert_closed_with_one_log_line(scene, wire)


def test_api_versions_of_an_unknown_version_gets_a_v0_answer_with_unsupported_version(scene: Scene) -> None:
    wire = scene.wire()
    try:
        # As a client from the future sends it: flexible header (v2) and a flexible body.
        header = i16(API_API_VERSIONS) + i16(99) + i32(77) + string("future-client") + b"\x00"
        body = b"\x07future" + b"\x021" + b"\x00"  # compact strings: software name, version; no tags
        wire.send(frame(header + body))
        r = Reader(wire.read_frame())
        assert r.i32() == 77
        assert r.i16() == UNSUPPORTED_VERSION
        apis = {k: (lo, hi) for k, lo, hi in r.array(lambda r: (r.i16(), r.i16(), r.i16()))}
        assert apis[API_API_VERSIONS][0] == 0 and apis[API_API_VERSIONS][1] >= 3
        assert {API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA} <= apis.keys()
        # The client retries with v0 on the same connection, as librdkafka and the Java client do.
        error, apis_v0 = api_versions_v0(wire)
        assert error == NONE and apis_v0 == apis
    finally:
        wire.close()


# --- produce and fetch errors ---------------------------------------------------------------------------------


def _flip(data: bytes, position: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: _flip(b, CRC_OFFSET + 1), id="crc-byte"),
        pytest.param(lambda b: _flip(b, len(b) - 3), id="record-byte"),
    ],
)
def test_produce_with_crc_mismatch_gets_corrupt_message_and_appends_nothing(
    scene: Scene, damage: Callable[[bytes], bytes]
) -> None:
    wire = scene.wire()
    try:
        batch = record_batch([b"payload-%d" % i for i in range(5)])
        error, _ = produce_v3(wire, scene.topic, 0, damage(batch))
        assert error == CORRUPT_MESSAGE
        assert log_end_offset(wire, scene.topic) == 2
        fetched = fetch_v4(wire, scene.topic, 0, 0)
        assert fetched.error == NONE and fetched.high_watermark == 2
        assert b"payload-" not in fetched.records and b"good" not in fetched.records
        # The partition goes on at the offset it was at.
        assert produce_v3(wire, scene.topic, 0, batch) == (NONE, 2)
    finally:
        wire.close()


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(lambda b: b + record_batch([b"second"]), id="two-valid-batches"),
        pytest.param(lambda b: b + _flip(record_batch([b"second"]), CRC_OFFSET), id="valid-then-corrupt"),
        pytest.param(lambda b: (5).to_bytes(8, "big") + b[8:], id="base-offset-not-0"),
    ],
)
def test_produce_records_that_break_the_v3_rules_get_invalid_record_and_append_nothing(
    scene: Scene, records: Callable[[bytes], bytes]
) -> None:
    # Since Produce v3 a partition's records are exactly one batch of magic 2 whose base offset is 0
    # (Kafka's ProduceRequest.validateRecords and LogValidator); anything else is INVALID_RECORD.
    wire = scene.wire()
    try:
        batch = record_batch([b"payload-%d" % i for i in range(5)])
        error, _ = produce_v3(wire, scene.topic, 0, records(batch))
        assert error == INVALID_RECORD
        assert log_end_offset(wire, scene.topic) == 2
    finally:
        wire.close()


def test_produce_to_a_missing_partition_gets_unknown_topic_or_partition(scene: Scene) -> None:
    wire = scene.wire()
    try:
        assert produce_v3(wire, scene.topic, 7, record_batch([b"nowhere"])) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert produce_v3(wire, scene.topic, -1, record_batch([b"nowhere"])) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert log_end_offset(wire, scene.topic) == 2
        assert metadata_v1(wire, [scene.topic])[scene.topic] == (NONE, [0]), "produce must not add partitions"
    finally:
        wire.close()


def test_produce_to_a_missing_topic_gets_unknown_topic_or_partition_and_creates_nothing(scene: Scene) -> None:
    # Produce never auto-creates (only Metadata does), even with auto.create.topics.enable=true.
    missing = scene.topic + "-missing"
    wire = scene.wire()
    try:
        assert produce_v3(wire, missing, 0, record_batch([b"nowhere"])) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert metadata_v4(wire, [missing], allow_auto_topic_creation=False)[missing] == UNKNOWN_TOPIC_OR_PARTITION
    finally:
        wire.close()


@pytest.mark.parametrize("offset", [3, 1000, -5])
def test_fetch_out_of_range_gets_offset_out_of_range(scene: Scene, offset: int) -> None:
    wire = scene.wire()
    try:
        result = fetch_v4(wire, scene.topic, 0, offset)
        assert result.error == OFFSET_OUT_OF_RANGE
        assert result.records == b""
        # The log end itself is in range: an empty answer, no error.
        at_end = fetch_v4(wire, scene.topic, 0, 2)
        assert (at_end.error, at_end.records) == (NONE, b"")
    finally:
        wire.close()


# --- invalid topic names -------------------------------------------------------------------------------------

INVALID_NAMES = ["has space", "slash/name", "..", ".", "x" * 250, "ünïcode", "colon:name", ""]


@pytest.mark.parametrize("name", INVALID_NAMES, ids=lambda n: repr(n)[:20])
def test_create_topic_with_an_invalid_name_gets_invalid_topic_exception(scene: Scene, name: str) -> None:
    wire = scene.wire()
    try:
        error, message = create_topics_v2(wire, name)
        assert error == INVALID_TOPIC_EXCEPTION
        assert message, "the error should say what is wrong with the name"
        assert name not in metadata_v1(wire, None)
    finally:
        wire.close()


@pytest.mark.parametrize("name", ["has space", "slash/name", "..", "x" * 250])
def test_metadata_for_an_invalid_name_gets_invalid_topic_exception(scene: Scene, name: str) -> None:
    wire = scene.wire()
    try:
        # v1 allows auto-creation (and the broker has it enabled): the name must still be refused.
        assert metadata_v1(wire, [name])[name][0] == INVALID_TOPIC_EXCEPTION
        assert metadata_v4(wire, [name], allow_auto_topic_creation=False)[name] == INVALID_TOPIC_EXCEPTION
        assert name not in metadata_v1(wire, None)
    finally:
        wire.close()

"""Fuzzing a live broker with every API and version it serves.

For each served (api key, version), hypothesis builds well-typed requests with nonsense values (kio's type
strategies: negative partitions, huge sizes, random names, random bytes as records) and, for half of them,
mutates the encoded frame (bit flips, truncation, inserted and deleted bytes; the size prefix always matches
what is sent, so the broker is never left waiting for bytes that do not come). Each frame goes on a new
connection, followed by an ApiVersions probe on the same connection.

The oracle, within `IO_TIMEOUT_S`: the broker answers the frame with its correlation id and then the probe,
or answers only the probe (a Produce with acks=0), or closes the connection. A wait that runs out (a hang) or
an answer with a correlation id that was never sent fails with the API, the version and the frame in hex.
The last test checks the aftermath: the broker is alive and serves real clients, and after a kill -9 and a
restart every segment file holds valid Kafka batches and the canary records are still there.

TIERLOG_FUZZ_EXAMPLES scales the number of frames per API (CI: 40; `make fuzz`: 2000).
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.static.primitive import Records
from protocol_helpers import SERVED, edits, kio_frame, mutate

from tierlog.records.record_batch import iter_batches
from tierlog.testing.local_cluster import BrokerProcess

EXAMPLES = int(os.environ.get("TIERLOG_FUZZ_EXAMPLES", "40"))
IO_TIMEOUT_S = 10.0
PROBE_CORRELATION_ID = 0x7E57_0001
CANARY_TOPIC = "canary"
CANARY_VALUES = [f"canary-{i}".encode() for i in range(10)]
# Creating 100,000 partitions is allowed, and slow, in Kafka too: keep the admin APIs to sizes that finish.
MAX_PARTITIONS_ASKED = 64

st.register_type_strategy(Records, st.binary(max_size=256))

VERSIONS: dict[int, list[int]] = defaultdict(list)
for _api_key, _version in SERVED:
    VERSIONS[_api_key].append(_version)


def api_versions_probe() -> bytes:
    body = struct.pack(">hhi", 18, 0, PROBE_CORRELATION_ID) + struct.pack(">h", 5) + b"probe"
    return struct.pack(">i", len(body)) + body


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def correlation_ids_answered(port: int, frame: bytes) -> list[int] | None:
    """Send `frame` and the probe on a new connection; the correlation ids of the answers up to the probe's,
    or None if the broker closed the connection first. TimeoutError if it does neither."""
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S) as sock:
        try:
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            sock.sendall(api_versions_probe())
        except (BrokenPipeError, ConnectionResetError):
            return None
        answered = []
        while True:
            try:
                size = recv_exactly(sock, 4)
                if size is None:
                    return None
                body = recv_exactly(sock, struct.unpack(">i", size)[0])
            except ConnectionResetError:
                return None
            if body is None:
                return None
            (correlation_id,) = struct.unpack(">i", body[:4])
            answered.append(correlation_id)
            if correlation_id == PROBE_CORRELATION_ID:
                return answered


edit_lists = st.lists(edits, max_size=3)


def reasonable(entity: Any) -> bool:
    """Whether an admin request asks for a size the broker can create in a test's time."""
    for topic in getattr(entity, "topics", ()) or ():
        for name in ("num_partitions", "count"):
            if getattr(topic, name, 0) > MAX_PARTITIONS_ASKED:
                return False
    return True


@pytest.fixture(scope="module")
def fuzzed_broker(module_broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    broker = module_broker_factory(log_segment_bytes=4096)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(CANARY_TOPIC, 2, 1)])[CANARY_TOPIC].result(30)
    produce(broker.bootstrap, CANARY_VALUES)
    return broker


def produce(bootstrap: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 30_000})
    for value in values:
        producer.produce(CANARY_TOPIC, value, partition=0)
    assert producer.flush(30) == 0


def consume(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-canary", "enable.auto.commit": False})
    consumer.assign([KafkaTopicPartition(CANARY_TOPIC, 0, 0)])
    values: list[bytes] = []
    try:
        for _ in range(300):
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
            if len(values) >= count:
                break
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("api_key", sorted(VERSIONS))
def test_every_frame_of_an_api_is_answered_or_its_connection_closed(fuzzed_broker: BrokerProcess, api_key: int) -> None:
    port = fuzzed_broker.port

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(st.data(), st.sampled_from(VERSIONS[api_key]), st.integers(min_value=1, max_value=2**31 - 1), edit_lists)
    def check(data: st.DataObject, version: int, correlation_id: int, edits: list[tuple[str, int, int]]) -> None:
        entity = data.draw(st.from_type(load_request_schema(api_key, version)))
        assume(reasonable(entity))
        frame = mutate(kio_frame(entity, correlation_id), edits)
        where = f"api {api_key} v{version}, frame {frame.hex()[:400]}"
        try:
            answered = correlation_ids_answered(port, frame)
        except TimeoutError:
            pytest.fail(f"no answer and no close within {IO_TIMEOUT_S}s: {where}")
        if answered is None:
            return  # closed: refused as malformed, the connection's answer to a frame it cannot parse
        sent = struct.unpack(">i", frame[4:8])[0] if len(frame) >= 8 else None
        assert answered[-1] == PROBE_CORRELATION_ID
        assert answered[:-1] in ([], [sent]), f"answered correlation ids {answered}: {where}"
        if not answered[:-1]:
            # Only Produce with acks=0 goes unanswered (a mutation may have turned a frame into one).
            assert frame[:2] == b"\x00\x00", f"no answer to a frame that needs one: {where}"

    check()


def test_after_the_fuzzing_the_broker_serves_clients_and_its_logs_are_valid_after_kill_9(
    fuzzed_broker: BrokerProcess,
) -> None:
    fuzzed_broker.check_alive()
    assert correlation_ids_answered(fuzzed_broker.port, b"") in (None, [PROBE_CORRELATION_ID])
    produce(fuzzed_broker.bootstrap, [b"after-fuzzing"])
    assert consume(fuzzed_broker.bootstrap, len(CANARY_VALUES) + 1) == [*CANARY_VALUES, b"after-fuzzing"]
    fuzzed_broker.kill()
    segments = sorted(Path(fuzzed_broker.log_dir).glob("*-*/*.log"))
    assert segments, "no segment files"
    for segment in segments:
        data = segment.read_bytes()
        if data:
            offsets = [(batch.base_offset, batch.last_offset) for batch in iter_batches(data)]
            assert all(a[1] < b[0] for a, b in itertools.pairwise(offsets)), f"{segment}: {offsets}"
    fuzzed_broker.start()
    fuzzed_broker.wait_ready(30)
    assert consume(fuzzed_broker.bootstrap, len(CANARY_VALUES) + 1) == [*CANARY_VALUES, b"after-fuzzing"]

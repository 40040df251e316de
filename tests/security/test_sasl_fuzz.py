"""Fuzzing SASL authentication: garbage before and after the handshake, truncated and padded frames, requests of
every API, oversize sizes and silence never crash the authenticator or the broker, never leave a connection
waiting past its bounds, and never reach an API without authentication (docs/security.md#sasl).

The authenticator is fuzzed on its own (whatever the frames, it only answers, asks the broker for ApiVersions or
closes, and never authenticates without the password), then a live SASL broker over sockets: after any frames a
Metadata request is never answered, and the connection ends within the authentication timeout.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sasl_helpers import PLAIN_JAAS, authenticate, authenticator, frame, handshake

from tierlog.client.requests import api_versions_request, metadata_request
from tierlog.client.wire import encode_request
from tierlog.protocol.api_versions import SUPPORTED_APIS
from tierlog.protocol.framing import SIZE_PREFIX
from tierlog.testing.local_cluster import BrokerProcess

EXAMPLES = int(os.environ.get("TIERLOG_FUZZ_EXAMPLES", "40"))
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", ""]
PROBE_CORRELATION_ID = 0x7E57_0002


def valid_frames() -> list[bytes]:
    frames = [frame(api_versions_request(version=v)) for v in (0, 3)]
    frames += [frame(handshake(m, v)) for m in MECHANISMS for v in (0, 1)]
    frames += [frame(authenticate(token, v)) for token in (b"\0alice\0nope", b"n,,n=alice,r=abc", b"") for v in (0, 2)]
    return frames


# One frame's body (no size prefix): garbage, a valid frame cut short or padded, or a request header of any API
# (served or not) with a random body.
frame_bodies = st.one_of(
    st.binary(max_size=64),
    st.tuples(st.sampled_from(valid_frames()), st.integers(min_value=0, max_value=80), st.binary(max_size=16)).map(
        lambda t: t[0][: t[1]] + t[2]
    ),
    st.tuples(
        st.sampled_from([*SUPPORTED_APIS, 999, -1]),
        st.integers(min_value=-1, max_value=20),
        st.binary(max_size=48),
    ).map(lambda t: struct.pack(">hhi", t[0], t[1], 7) + t[2]),
)


@settings(max_examples=EXAMPLES * 25, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frame_bodies, min_size=1, max_size=6), st.sampled_from(MECHANISMS), st.booleans())
def test_the_authenticator_answers_or_closes_and_never_authenticates_garbage(
    frames: list[bytes], mechanism: str, handshake_first: bool
) -> None:
    auth = authenticator()
    sequence = ([frame(handshake(mechanism))] if handshake_first else []) + frames
    for body in sequence:
        step = auth.on_frame(body)
        for sent in step.frames:
            (size,) = SIZE_PREFIX.unpack_from(sent)
            assert size == len(sent) - SIZE_PREFIX.size
        if step.api_versions is not None:
            assert step.api_versions.api_key == 18, "only ApiVersions is handed to the broker before authentication"
        assert not auth.complete, "authenticated without the password"
        if step.close_reason is not None:
            return


def send_frame(sock: socket.socket, body: bytes) -> None:
    sock.sendall(SIZE_PREFIX.pack(len(body)) + body)


def metadata_answered(sock: socket.socket, deadline: float) -> bool:
    """Read everything the broker sends until it closes the connection; True if a response carries the Metadata
    request's correlation id. TimeoutError if the connection is still open at `deadline`."""
    received = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            raise TimeoutError("the broker neither closed the connection nor stopped waiting") from None
        if not chunk:
            break
        received += chunk
    position = 0
    while position + 8 <= len(received):
        (size,) = SIZE_PREFIX.unpack_from(received, position)
        (correlation_id,) = struct.unpack_from(">i", received, position + 4)
        if correlation_id == PROBE_CORRELATION_ID:
            return True
        position += 4 + size
    return False


AUTHENTICATION_TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def sasl_broker(module_broker_factory: Any) -> BrokerProcess:
    broker: BrokerProcess = module_broker_factory(
        {
            "listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
            "tierlog.sasl.authentication.timeout.ms": str(AUTHENTICATION_TIMEOUT_MS),
            "sasl.server.max.receive.size": "4096",
        }
    )
    return broker


def probe_metadata() -> bytes:
    """A whole Metadata request frame (size prefix included) with its own correlation id."""
    return encode_request(metadata_request(()), PROBE_CORRELATION_ID, "fuzz")


@pytest.mark.cluster
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(frame_bodies, max_size=4), st.sampled_from(MECHANISMS), st.booleans())
def test_a_live_broker_never_serves_metadata_before_authentication(
    sasl_broker: BrokerProcess, frames: list[bytes], mechanism: str, handshake_first: bool
) -> None:
    host, port = sasl_broker.bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + AUTHENTICATION_TIMEOUT_MS / 1000 + 5
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            if handshake_first:
                send_frame(sock, frame(handshake(mechanism)))
            for body in frames:
                send_frame(sock, body)
            sock.sendall(probe_metadata())
        except (BrokenPipeError, ConnectionResetError):
            return
        assert not metadata_answered(sock, deadline), "Metadata answered before authentication"


@pytest.mark.cluster
@pytest.mark.parametrize(
    "prefix",
    [SIZE_PREFIX.pack(4097), SIZE_PREFIX.pack(2**31 - 1), SIZE_PREFIX.pack(-1), b"\x00\x00"],
    ids=["above-max-receive", "int32-max", "negative", "half-a-size"],
)
def test_oversize_sizes_and_partial_frames_close_the_connection_in_bounded_time(
    sasl_broker: BrokerProcess, prefix: bytes
) -> None:
    host, port = sasl_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(prefix)
        assert not metadata_answered(sock, time.monotonic() + AUTHENTICATION_TIMEOUT_MS / 1000 + 5)


@pytest.mark.cluster
def test_a_silent_client_is_disconnected_after_the_authentication_timeout(sasl_broker: BrokerProcess) -> None:
    host, port = sasl_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        started = time.monotonic()
        send_frame(sock, frame(handshake("PLAIN")))
        assert not metadata_answered(sock, started + AUTHENTICATION_TIMEOUT_MS / 1000 + 5)
        assert time.monotonic() - started >= AUTHENTICATION_TIMEOUT_MS / 1000 - 0.1


@pytest.mark.cluster
def test_the_broker_serves_authenticated_clients_after_the_fuzzing(sasl_broker: BrokerProcess) -> None:
    admin = AdminClient(
        {
            "bootstrap.servers": sasl_broker.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }
    )
    assert list(admin.list_topics(timeout=30).brokers) == [1]
    assert sasl_broker.running
    assert "Traceback" not in sasl_broker.log_tail(2000)

"""KIP-368 on the broker's connection task (served in this process on a real socket): with connections.max.reauth.ms
a client re-authenticates in band and is served on; one that does not is disconnected at its next request after
the session's end; a re-authentication as another user ends the connection. Then librdkafka and kafka-python, which
both re-authenticate, against a live broker (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import kafka
import pytest
from confluent_kafka import Producer
from sasl_helpers import CORRELATION_ID, PLAIN_JAAS, RecordingApis, authenticate, handshake, serving_sasl, settings

from tierlog.client.requests import api_versions_request
from tierlog.client.wire import decode_response, encode_request
from tierlog.protocol.errors import error_code
from tierlog.protocol.framing import read_frame
from tierlog.testing.local_cluster import BrokerProcess

LIFETIME_MS = 300
CREDENTIALS = {"login": ("alice", "alice-secret"), "reauth-as-admin": ("admin", "admin-secret")}


class RawClient:
    """Kafka requests on one connection, each answered before the next; None once the broker closed it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def ask(self, request: Any) -> Any | None:
        self.writer.write(encode_request(request, CORRELATION_ID, "raw"))
        await self.writer.drain()
        async with asyncio.timeout(5):
            frame = await read_frame(self.reader, 1 << 20)
        return None if frame is None else decode_response(request, CORRELATION_ID, frame)

    async def plain(self, user: str, password: str) -> Any:
        assert (await self.ask(handshake("PLAIN"))).error_code == error_code(None)
        return await self.ask(authenticate(f"\0{user}\0{password}".encode()))


async def session_story(steps: list[str]) -> list[str]:
    """Play `steps` (login, reauth-as-admin, ask, wait) on one connection; what each answered."""
    apis = RecordingApis()
    results = []
    async with serving_sasl(apis, settings(max_reauth_ms=LIFETIME_MS)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = RawClient(reader, writer)
        try:
            for step in steps:
                if step == "wait":
                    await asyncio.sleep(LIFETIME_MS / 1000 * 1.5)
                    continue
                if step == "ask":
                    answered = await client.ask(api_versions_request(version=3))
                else:
                    user, password = (
                        ("admin", "admin-secret") if step.endswith("as-admin") else ("alice", "alice-secret")
                    )
                    answered = await client.plain(user, password)
                results.append("closed" if answered is None else f"{step}:{int(answered.error_code)}")
                if answered is None:
                    break
        finally:
            writer.close()
    return results


def test_a_client_that_re_authenticates_before_its_session_ends_is_served_on() -> None:
    steps = ["login", "ask", "login", "ask", "wait", "login", "ask"]
    assert asyncio.run(session_story(steps)) == ["login:0", "ask:0", "login:0", "ask:0", "login:0", "ask:0"]


def test_a_client_that_does_not_re_authenticate_is_disconnected_at_its_next_request() -> None:
    assert asyncio.run(session_story(["login", "ask", "wait", "ask"])) == ["login:0", "ask:0", "closed"]


def test_a_re_authentication_as_another_user_fails_and_ends_the_connection() -> None:
    assert asyncio.run(session_story(["login", "reauth-as-admin", "ask"])) == [
        "login:0",
        "reauth-as-admin:58",
        "closed",
    ]


REAUTH_BROKER_LIFETIME_MS = 1000


@pytest.fixture
def reauth_broker(broker_factory: Any) -> BrokerProcess:
    broker: BrokerProcess = broker_factory(
        {
            "listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
            "connections.max.reauth.ms": str(REAUTH_BROKER_LIFETIME_MS),
        }
    )
    return broker


class DebugLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def assert_no_connection_was_dropped(broker: BrokerProcess) -> None:
    log = broker.log_tail(2000)
    assert "its SASL session ended" not in log and "Failed" not in log, log


def test_librdkafka_re_authenticates_and_its_producer_is_served_on(reauth_broker: BrokerProcess) -> None:
    debug = DebugLines()
    logger = logging.getLogger(f"librdkafka-{uuid.uuid4().hex[:6]}")
    logger.addHandler(debug)
    logger.setLevel(logging.DEBUG)
    producer = Producer(
        {
            "bootstrap.servers": reauth_broker.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
            "debug": "security,broker",
            "logger": logger,
        }
    )
    for _ in range(12):  # about four session lifetimes
        producer.produce("reauth", b"x")
        assert producer.flush(10) == 0
        time.sleep(REAUTH_BROKER_LIFETIME_MS / 1000 / 3)
    assert sum("Auth in state REAUTH" in line for line in debug.lines) >= 2, "librdkafka never re-authenticated"
    # One connection to broker 1 all along: it was never closed for an ended session.
    assert sum("/1: Connected to" in line for line in debug.lines) == 1
    assert_no_connection_was_dropped(reauth_broker)


def test_kafka_python_re_authenticates_and_its_producer_is_served_on(
    reauth_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kafka.net.connection")
    producer = kafka.KafkaProducer(
        bootstrap_servers=reauth_broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password="alice-secret",
    )
    offsets = []
    for _ in range(12):
        offsets.append(producer.send("reauth-kp", b"x").get(timeout=10).offset)
        time.sleep(REAUTH_BROKER_LIFETIME_MS / 1000 / 3)
    producer.close()
    assert offsets == list(range(12))
    messages = [record.getMessage() for record in caplog.records]
    assert sum("Beginning SASL re-authentication" in m for m in messages) >= 2, "kafka-python never re-authenticated"
    assert not [m for m in messages if "re-authentication failed" in m]
    # One connection to broker 1 all along: it was never closed for an ended session.
    assert sum("node_id=1 " in m and m.endswith(": Connected") for m in messages) == 1
    assert_no_connection_was_dropped(reauth_broker)

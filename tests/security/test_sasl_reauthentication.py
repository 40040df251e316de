"""KIP-368 on the broker's connection task (served in this process on a real socket): with connections.max.reauth.ms
a client re-authenticates in band and is served on; one that does not is disconnected at its next request after
the session's end; a re-authentication as another user ends the connection (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio
from typing import Any

from sasl_helpers import CORRELATION_ID, RecordingApis, authenticate, handshake, serving_sasl, settings

from tierlog.client.requests import api_versions_request
from tierlog.client.wire import decode_response, encode_request
from tierlog.protocol.errors import error_code
from tierlog.protocol.framing import read_frame

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

"""Kafka's SaslServerAuthenticator rules, frame by frame: what may come before authentication, KIP-152 framing
(SaslHandshake v1: SaslAuthenticate requests; v0: bare tokens), the answers and when the connection closes
(docs/security.md#sasl)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from sasl_helpers import (
    answer,
    authenticate,
    authenticator,
    frame,
    handshake,
    request,
)
from scramp import ScramClient

from tierlog.client.requests import api_versions_request, metadata_request
from tierlog.protocol.errors import error_code
from tierlog.protocol.framing import SIZE_PREFIX
from tierlog.security.principal import KafkaPrincipal
from tierlog.server.sasl_authenticator import SaslAuthenticator, SaslSession

ILLEGAL_SASL_STATE = error_code("ILLEGAL_SASL_STATE")


def test_plain_over_handshake_v1_and_sasl_authenticate_makes_the_user_the_principal() -> None:
    auth = authenticator()
    shake = handshake("PLAIN")
    step = auth.on_frame(frame(shake))
    accepted = answer(shake, step.frames[0])
    assert (accepted.error_code, accepted.mechanisms) == (error_code(None), ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))
    assert step.close_reason is None and not auth.complete
    token = authenticate(b"\0alice\0alice-secret")
    step = auth.on_frame(frame(token))
    done = answer(token, step.frames[0])
    assert (done.error_code, done.error_message, done.auth_bytes) == (error_code(None), None, b"")
    assert done.session_lifetime.total_seconds() == 0
    assert auth.complete and auth.principal == KafkaPrincipal("User", "alice") and auth.mechanism == "PLAIN"


def test_api_versions_first_is_answered_by_the_broker_then_only_a_handshake_may_follow() -> None:
    auth = authenticator()
    versions = api_versions_request(version=3)
    step = auth.on_frame(frame(versions))
    assert step.api_versions is not None and step.api_versions.api_key == 18 and not step.frames
    again = auth.on_frame(frame(versions))
    assert again.close_reason is not None and not again.frames


def test_an_api_versions_version_the_broker_does_not_serve_gets_kafkas_fallback_and_may_be_retried() -> None:
    auth = authenticator()
    unsupported = struct.pack(">hhi", 18, 99, 7) + b"\xff\xff"
    step = auth.on_frame(unsupported)
    assert step.close_reason is None and len(step.frames) == 1
    assert auth.on_frame(frame(api_versions_request(version=3))).api_versions is not None


@pytest.mark.parametrize("before", [[], ["versions"], ["versions", "handshake"]])
def test_any_other_request_before_authentication_closes_the_connection_without_an_answer(before: list[str]) -> None:
    auth = authenticator()
    for what in before:
        entity = api_versions_request(version=3) if what == "versions" else handshake("PLAIN")
        assert auth.on_frame(frame(entity)).close_reason is None
    step = auth.on_frame(frame(metadata_request(())))
    assert step.close_reason is not None and "Metadata" in step.close_reason
    assert not step.frames and not auth.complete


def test_a_second_handshake_during_authentication_is_answered_illegal_sasl_state_and_closes() -> None:
    auth = authenticator()
    auth.on_frame(frame(handshake("PLAIN")))
    second = handshake("PLAIN")
    step = auth.on_frame(frame(second))
    assert answer(second, step.frames[0]).error_code == ILLEGAL_SASL_STATE
    assert step.close_reason is not None


def test_an_unsupported_mechanism_is_answered_with_the_enabled_ones_then_closed() -> None:
    auth = authenticator(("PLAIN",))
    shake = handshake("GSSAPI")
    step = auth.on_frame(frame(shake))
    refused = answer(shake, step.frames[0])
    assert (refused.error_code, refused.mechanisms) == (error_code("UNSUPPORTED_SASL_MECHANISM"), ("PLAIN",))
    assert step.close_reason == "Unsupported SASL mechanism GSSAPI"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (b"\0alice\0wrong", "Authentication failed: Invalid username or password"),
        (b"\0mallory\0alice-secret", "Authentication failed: Invalid username or password"),
        (b"\0alice\0", "Authentication failed: password not specified"),
        (b"\0\0alice-secret", "Authentication failed: username not specified"),
        (b"alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"a\0b\0c\0d", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (
            b"admin\0alice\0alice-secret",
            "Authentication failed: Client requested an authorization id that is different from username",
        ),
    ],
)
def test_a_failed_plain_authentication_answers_sasl_authentication_failed_with_kafkas_message(
    token: bytes, message: str
) -> None:
    auth = authenticator()
    auth.on_frame(frame(handshake("PLAIN")))
    sent = authenticate(token, version=1)
    step = auth.on_frame(frame(sent))
    failed = answer(sent, step.frames[0])
    assert (failed.error_code, failed.error_message) == (error_code("SASL_AUTHENTICATION_FAILED"), message)
    assert int(failed.error_code) == 58
    assert step.close_reason == message and not auth.complete


def test_plain_with_the_authzid_of_the_user_itself_is_accepted() -> None:
    auth = authenticator()
    auth.on_frame(frame(handshake("PLAIN")))
    auth.on_frame(frame(authenticate(b"alice\0alice\0alice-secret", version=0)))
    assert auth.principal == KafkaPrincipal("User", "alice")


def test_handshake_v0_means_bare_tokens_and_bare_answers() -> None:
    auth = authenticator()
    shake = handshake("PLAIN", version=0)
    assert answer(shake, auth.on_frame(frame(shake)).frames[0]).error_code == error_code(None)
    step = auth.on_frame(b"\0alice\0alice-secret")
    assert step.frames == [SIZE_PREFIX.pack(0)]
    assert auth.principal == KafkaPrincipal("User", "alice")


def test_handshake_v0_with_a_wrong_password_closes_without_an_answer() -> None:
    auth = authenticator()
    auth.on_frame(frame(handshake("PLAIN", version=0)))
    step = auth.on_frame(b"\0alice\0wrong")
    assert step.frames == [] and step.close_reason == "Authentication failed: Invalid username or password"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("version", [0, 1])
def test_scram_against_scramps_client_over_both_framings(mechanism: str, version: int) -> None:
    auth = authenticator()
    auth.on_frame(frame(handshake(mechanism, version)))
    client = ScramClient([mechanism], "carol", "carol-secret")

    def exchange(token: bytes) -> bytes:
        if version == 0:
            step = auth.on_frame(token)
            (size,) = SIZE_PREFIX.unpack_from(step.frames[0])
            return step.frames[0][SIZE_PREFIX.size : SIZE_PREFIX.size + size]
        sent = authenticate(token)
        response = answer(sent, auth.on_frame(frame(sent)).frames[0])
        assert response.error_code == error_code(None)
        return bytes(response.auth_bytes)

    client.set_server_first(exchange(client.get_client_first().encode()).decode())
    assert not auth.complete
    client.set_server_final(exchange(client.get_client_final().encode()).decode())
    assert auth.complete and auth.principal == KafkaPrincipal("User", "carol") and auth.mechanism == mechanism


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize(("user", "password"), [("carol", "wrong"), ("mallory", "carol-secret")])
def test_scram_with_a_wrong_password_or_an_unknown_user_fails_with_kafkas_message(
    mechanism: str, user: str, password: str
) -> None:
    auth = authenticator()
    auth.on_frame(frame(handshake(mechanism)))
    client = ScramClient([mechanism], user, password)
    first = authenticate(client.get_client_first().encode())
    response = answer(first, auth.on_frame(frame(first)).frames[0])
    if response.error_code == error_code(None):
        client.set_server_first(response.auth_bytes.decode())
        final = authenticate(client.get_client_final().encode())
        step = auth.on_frame(frame(final))
        response = answer(final, step.frames[0])
    else:
        assert user == "mallory", "Kafka refuses an unknown user at the first message"
    assert response.error_code == error_code("SASL_AUTHENTICATION_FAILED")
    assert response.error_message == (
        f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    )
    assert not auth.complete


def test_a_mechanism_the_listener_did_not_enable_is_refused_even_if_tierlog_knows_it() -> None:
    auth = authenticator(("SCRAM-SHA-512",))
    shake = handshake("PLAIN")
    step = auth.on_frame(frame(shake))
    assert answer(shake, step.frames[0]).error_code == error_code("UNSUPPORTED_SASL_MECHANISM")
    assert step.close_reason is not None


def test_a_non_sasl_request_during_the_exchange_closes_the_connection() -> None:
    auth = authenticator()
    auth.on_frame(frame(handshake("PLAIN")))
    step = auth.on_frame(frame(request(18, 3, client_software_name="x", client_software_version="1")))
    assert step.close_reason is not None and not auth.complete


def test_no_frame_is_taken_after_the_authenticator_failed() -> None:
    auth = authenticator()
    auth.on_frame(frame(metadata_request(())))
    with pytest.raises(RuntimeError):
        auth.on_frame(frame(handshake("PLAIN")))


# Re-authentication (KIP-368)


def plain_session(auth: SaslAuthenticator, user: str, password: str, version: int = 2) -> Any:
    """Run PLAIN on `auth`; the SaslAuthenticate response."""
    shake = handshake("PLAIN")
    assert answer(shake, auth.on_frame(frame(shake)).frames[0]).error_code == error_code(None)
    token = authenticate(f"\0{user}\0{password}".encode(), version)
    return answer(token, auth.on_frame(frame(token)).frames[0])


def test_with_connections_max_reauth_ms_the_session_lifetime_is_told_to_the_client() -> None:
    auth = authenticator(max_reauth_ms=60000)
    done = plain_session(auth, "alice", "alice-secret")
    assert done.session_lifetime.total_seconds() == 60
    assert auth.session == SaslSession(KafkaPrincipal("User", "alice"), "PLAIN", 60000, True)


def test_a_client_of_sasl_authenticate_v0_does_not_know_session_lifetimes() -> None:
    auth = authenticator(max_reauth_ms=60000)
    plain_session(auth, "alice", "alice-secret", version=0)
    assert not auth.session.client_supports_reauthentication


def test_a_re_authentication_as_the_same_user_succeeds_and_starts_a_new_session() -> None:
    first = authenticator(max_reauth_ms=60000)
    plain_session(first, "alice", "alice-secret")
    again = authenticator(max_reauth_ms=60000, reauthenticating=first.session)
    assert plain_session(again, "alice", "alice-secret").error_code == error_code(None)
    assert again.session == first.session


def test_a_re_authentication_may_not_begin_with_api_versions() -> None:
    first = authenticator(max_reauth_ms=60000)
    plain_session(first, "alice", "alice-secret")
    again = authenticator(max_reauth_ms=60000, reauthenticating=first.session)
    assert again.on_frame(frame(api_versions_request(version=3))).close_reason is not None


def test_a_re_authentication_as_another_user_is_refused_with_kafkas_message() -> None:
    first = authenticator(max_reauth_ms=60000)
    plain_session(first, "alice", "alice-secret")
    again = authenticator(max_reauth_ms=60000, reauthenticating=first.session)
    refused = plain_session(again, "admin", "admin-secret")
    assert (refused.error_code, refused.error_message) == (
        error_code("SASL_AUTHENTICATION_FAILED"),
        "Cannot change principals during re-authentication from User.alice: User.admin",
    )
    assert not again.complete


def test_a_re_authentication_with_another_mechanism_fails_at_its_first_token() -> None:
    first = authenticator(max_reauth_ms=60000)
    plain_session(first, "alice", "alice-secret")
    again = authenticator(max_reauth_ms=60000, reauthenticating=first.session)
    shake = handshake("SCRAM-SHA-256")
    assert answer(shake, again.on_frame(frame(shake)).frames[0]).error_code == error_code(None)
    step = again.on_frame(frame(authenticate(b"n,,n=alice,r=abc")))
    assert step.close_reason == (
        "SASL mechanism 'SCRAM-SHA-256' requested by client is not supported for re-authentication of mechanism 'PLAIN'"
    )


def test_a_failed_scram_re_authentication_says_re_authentication() -> None:
    first = authenticator(max_reauth_ms=60000)
    first.on_frame(frame(handshake("SCRAM-SHA-256")))
    client = ScramClient(["SCRAM-SHA-256"], "carol", "carol-secret")
    first_message = authenticate(client.get_client_first().encode())
    client.set_server_first(answer(first_message, first.on_frame(frame(first_message)).frames[0]).auth_bytes.decode())
    final = authenticate(client.get_client_final().encode())
    assert answer(final, first.on_frame(frame(final)).frames[0]).error_code == error_code(None)
    again = authenticator(max_reauth_ms=60000, reauthenticating=first.session)
    again.on_frame(frame(handshake("SCRAM-SHA-256")))
    wrong = ScramClient(["SCRAM-SHA-256"], "carol", "wrong")
    first_message = authenticate(wrong.get_client_first().encode())
    wrong.set_server_first(answer(first_message, again.on_frame(frame(first_message)).frames[0]).auth_bytes.decode())
    final = authenticate(wrong.get_client_final().encode())
    refused = answer(final, again.on_frame(frame(final)).frames[0])
    assert refused.error_message == (
        "Authentication failed during re-authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256"
    )

"""SCRAM credential management (KIP-554) against real brokers: confluent-kafka's AdminClient and the raw
AlterUserScramCredentials / DescribeUserScramCredentials requests kafka-configs.sh sends. Credentials live in
the metadata log, so a restarted broker still has them; a describe shows mechanisms and iteration counts only
(docs/security.md#scram-credentials)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import pytest
from cluster_helpers import BrokerFactory, ClusterFactory, send_request
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kio.schema.errors import ErrorCode

from tierlog.client.requests import request_schema
from tierlog.testing.local_cluster import BrokerProcess

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0
API_DESCRIBE_USER_SCRAM_CREDENTIALS, API_ALTER_USER_SCRAM_CREDENTIALS = 50, 51
SHA_256, SHA_512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


def upsert(admin: AdminClient, user: str, mechanism: ScramMechanism, iterations: int, password: bytes) -> None:
    alteration = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, iterations), password)
    admin.alter_user_scram_credentials([alteration])[user].result(timeout=TIMEOUT_S)


def described(admin: AdminClient, *users: str) -> dict[str, list[tuple[ScramMechanism, int]]]:
    """user -> [(mechanism, iterations)], of the named users or (none named) of every user."""
    if users:
        descriptions = {
            user: future.result(timeout=TIMEOUT_S)
            for user, future in admin.describe_user_scram_credentials(list(users)).items()
        }
    else:
        descriptions = admin.describe_user_scram_credentials().result(timeout=TIMEOUT_S)
    return {
        user: sorted((info.mechanism, info.iterations) for info in description.scram_credential_infos)
        for user, description in descriptions.items()
    }


def refusal(future: Any) -> tuple[str, str]:
    with pytest.raises(KafkaException) as refused:
        future.result(timeout=TIMEOUT_S)
    error = refused.value.args[0]
    return error.name(), error.str()


def alter_raw(
    broker: BrokerProcess,
    upsertions: Sequence[tuple[str, int, int, bytes]] = (),
    deletions: Sequence[tuple[str, int]] = (),
) -> dict[str, tuple[ErrorCode, str | None]]:
    """AlterUserScramCredentials v0 as kafka-configs.sh sends it: upsertions (user, mechanism, iterations,
    password), the client salting the password itself."""
    s = request_schema(API_ALTER_USER_SCRAM_CREDENTIALS, 0)
    salt = b"raw-request-salt"
    request = s.AlterUserScramCredentialsRequest(
        deletions=tuple(s.ScramCredentialDeletion(name=user, mechanism=mechanism) for user, mechanism in deletions),
        upsertions=tuple(
            s.ScramCredentialUpsertion(
                name=user,
                mechanism=mechanism,
                iterations=iterations,
                salt=salt,
                salted_password=hashlib.pbkdf2_hmac("sha256", password, salt, iterations) if password else b"",
            )
            for user, mechanism, iterations, password in upsertions
        ),
    )
    response = send_request(broker.bootstrap, request)
    return {r.user: (r.error_code, r.error_message) for r in response.results}


def describe_raw(broker: BrokerProcess, users: list[str] | None) -> list[Any]:
    s = request_schema(API_DESCRIBE_USER_SCRAM_CREDENTIALS, 0)
    request = s.DescribeUserScramCredentialsRequest(
        users=None if users is None else tuple(s.UserName(name=user) for user in users)
    )
    response = send_request(broker.bootstrap, request)
    assert response.error_code == ErrorCode.none
    return list(response.results)


def test_credentials_are_upserted_described_and_deleted_with_the_admin_client(shared_broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    upsert(admin, "ann", SHA_256, 8192, b"ann-secret")
    upsert(admin, "ann", SHA_512, 4096, b"ann-secret")
    upsert(admin, "ben", SHA_512, 16384, b"ben-secret")
    assert described(admin, "ann", "ben") == {"ann": [(SHA_256, 8192), (SHA_512, 4096)], "ben": [(SHA_512, 16384)]}
    upsert(admin, "ann", SHA_256, 10000, b"new-secret")
    assert described(admin, "ann") == {"ann": [(SHA_256, 10000), (SHA_512, 4096)]}

    deletion = UserScramCredentialDeletion("ann", SHA_512)
    admin.alter_user_scram_credentials([deletion])["ann"].result(timeout=TIMEOUT_S)
    assert described(admin, "ann") == {"ann": [(SHA_256, 10000)]}
    every = described(admin)
    assert every["ann"] == [(SHA_256, 10000)] and every["ben"] == [(SHA_512, 16384)]


def test_the_admin_client_gets_kafkas_errors(shared_broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    too_few = UserScramCredentialUpsertion("cid", ScramCredentialInfo(SHA_256, 4095), b"secret")
    assert refusal(admin.alter_user_scram_credentials([too_few])["cid"]) == (
        "UNACCEPTABLE_CREDENTIAL",
        "Too few iterations",
    )
    too_many = UserScramCredentialUpsertion("cid", ScramCredentialInfo(SHA_512, 16385), b"secret")
    assert refusal(admin.alter_user_scram_credentials([too_many])["cid"]) == (
        "UNACCEPTABLE_CREDENTIAL",
        "Too many iterations",
    )
    missing = UserScramCredentialDeletion("cid", SHA_256)
    assert refusal(admin.alter_user_scram_credentials([missing])["cid"]) == (
        "RESOURCE_NOT_FOUND",
        "Attempt to delete a user credential that does not exist",
    )
    name, message = refusal(admin.describe_user_scram_credentials(["cid"])["cid"])
    # librdkafka reads this message up to the next NUL byte of the response, so it keeps the length byte of the
    # empty credential array that follows it (as it would from Kafka); the raw test below reads it exactly.
    assert (name, message.rstrip("\x01")) == (
        "RESOURCE_NOT_FOUND",
        "Attempt to describe a user credential that does not exist: cid",
    )


def test_raw_requests_get_kafkas_answers(shared_broker: BrokerProcess) -> None:
    """What the admin client cannot send: an unknown mechanism, an empty salted password, one user altered twice
    in a request, null users and a user named twice in a describe."""
    assert alter_raw(
        shared_broker,
        upsertions=[
            ("dee", 1, 4096, b"secret"),
            ("eve", 0, 4096, b"secret"),
            ("fay", 1, 4096, b""),
            ("", 1, 4096, b"secret"),
            ("gus", 1, 4096, b"secret"),
            ("gus", 2, 4096, b"secret"),
            ("hal", 2, 4096, b"secret"),
        ],
        deletions=[("hal", 1)],
    ) == {
        "dee": (ErrorCode.none, None),
        "eve": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
        "fay": (ErrorCode.unacceptable_credential, "Salted password must not be empty"),
        "": (ErrorCode.unacceptable_credential, "Username must not be empty"),
        "gus": (ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request"),
        "hal": (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"),
    }
    every = {r.user: r for r in describe_raw(shared_broker, None)}
    assert "dee" in every and not {"eve", "fay", "", "gus", "hal"} & every.keys()
    assert [(r.user, r.error_code, r.error_message) for r in describe_raw(shared_broker, ["dee", "nobody", "dee"])] == [
        (
            "dee",
            ErrorCode.duplicate_resource,
            "Cannot describe SCRAM credentials for the same user twice in a single request: dee",
        ),
        ("nobody", ErrorCode.resource_not_found, "Attempt to describe a user credential that does not exist: nobody"),
    ]
    (dee,) = describe_raw(shared_broker, ["dee"])
    assert dee.error_code == ErrorCode.none
    assert [(info.mechanism, info.iterations) for info in dee.credential_infos] == [(1, 4096)]


def test_credentials_altered_on_any_broker_reach_every_broker(cluster_factory: ClusterFactory) -> None:
    """Broker 2 forwards the alteration to the controller on node 1 and answers once its own image has it."""
    cluster = cluster_factory(brokers=2)
    follower = AdminClient({"bootstrap.servers": cluster.broker(2).bootstrap})
    upsert(follower, "ivy", SHA_512, 4096, b"secret")
    assert described(follower, "ivy") == {"ivy": [(SHA_512, 4096)]}
    controller_node = AdminClient({"bootstrap.servers": cluster.broker(1).bootstrap})
    assert described(controller_node, "ivy") == {"ivy": [(SHA_512, 4096)]}


def test_a_restarted_broker_replays_its_credentials_from_the_metadata_log(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    upsert(AdminClient({"bootstrap.servers": broker.bootstrap}), "jo", SHA_256, 5000, b"secret")
    assert alter_raw(broker, deletions=[("jo", 1)], upsertions=[("kim", 2, 6000, b"secret")]) == {
        "jo": (ErrorCode.none, None),
        "kim": (ErrorCode.none, None),
    }
    upsert(AdminClient({"bootstrap.servers": broker.bootstrap}), "jo", SHA_512, 7000, b"secret")
    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert described(admin) == {"jo": [(SHA_512, 7000)], "kim": [(SHA_512, 6000)]}

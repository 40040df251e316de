"""SCRAM credentials (KIP-554): the controller's rules for AlterUserScramCredentials, as Kafka's
ScramControlManager applies them, and the image they fold into, replayed the same after a restart."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytest
import scramp
from controller_helpers import SingleVoterMetadataLog, new_controller, restart

from tierlog.controller.controller import (
    Controller,
    ScramAlterationResult,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from tierlog.metadata.image import ClusterMetadata, ScramCredential
from tierlog.metadata.records import (
    ClusterIdRecord,
    MetadataRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from tierlog.records.codec import decode_batches

SHA_256 = 1
SHA_512 = 2
HASH_NAMES = {SHA_256: "sha256", SHA_512: "sha512"}
SALT = b"a salt of sixteen"


def image(*records: MetadataRecord) -> ClusterMetadata:
    metadata = ClusterMetadata()
    for offset, record in enumerate(records):
        metadata.apply(offset, record)
    return metadata


def upsertion(
    name: str, mechanism: int = SHA_256, iterations: int = 4096, password: str = "secret"
) -> ScramCredentialUpsertion:
    """What a client sends: SaltedPassword = Hi(password, salt, iterations), computed as librdkafka does."""
    hash_name = HASH_NAMES.get(mechanism, "sha256")
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), SALT, iterations)
    return ScramCredentialUpsertion(name, mechanism, iterations, SALT, salted)


def alter(
    controller: Controller,
    upsertions: Sequence[ScramCredentialUpsertion] = (),
    deletions: Sequence[ScramCredentialDeletion] = (),
) -> set[ScramAlterationResult]:
    return set(controller.alter_user_scram_credentials(upsertions, deletions))


def test_an_upserted_credential_holds_rfc_5802_keys_the_scram_library_agrees_with(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    assert alter(controller, [upsertion("alice", SHA_256), upsertion("bob", SHA_512, 8192)]) == {
        ScramAlterationResult("alice"),
        ScramAlterationResult("bob"),
    }
    for user, mechanism, iterations in (("alice", "SCRAM-SHA-256", 4096), ("bob", "SCRAM-SHA-512", 8192)):
        salt, stored_key, server_key, _ = scramp.ScramMechanism(mechanism).make_auth_info(
            "secret", iteration_count=iterations, salt=SALT
        )
        assert controller.metadata.scram_credentials[(user, mechanism)] == ScramCredential(
            salt, stored_key, server_key, iterations
        )


def test_one_request_is_one_batch_and_survives_a_restart(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    before = controller.metadata_log.end_offset
    alter(controller, [upsertion("alice"), upsertion("bob", SHA_512)])
    assert isinstance(controller.metadata_log, SingleVoterMetadataLog)
    batches = list(decode_batches(controller.metadata_log.client.log.read(before, 1 << 20)))
    assert [(b.header.base_offset, len(b.records)) for b in batches] == [(before, 2)]
    credentials = dict(controller.metadata.scram_credentials)
    assert restart(controller, tmp_path).metadata.scram_credentials == credentials


def test_an_upsertion_replaces_the_credential_and_a_deletion_removes_it(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    alter(controller, [upsertion("alice", password="old")])
    alter(controller, [upsertion("alice", iterations=5000, password="new")])
    assert controller.metadata.scram_credentials[("alice", "SCRAM-SHA-256")].iterations == 5000
    alter(controller, [upsertion("alice", SHA_512)])
    assert alter(controller, [], [ScramCredentialDeletion("alice", SHA_256)]) == {ScramAlterationResult("alice")}
    assert set(controller.metadata.scram_credentials) == {("alice", "SCRAM-SHA-512")}


@pytest.mark.parametrize(
    ("alteration", "error", "message"),
    [
        (upsertion(""), "UNACCEPTABLE_CREDENTIAL", "Username must not be empty"),
        (upsertion("alice", mechanism=0), "UNSUPPORTED_SASL_MECHANISM", "Unknown SCRAM mechanism"),
        (upsertion("alice", mechanism=3), "UNSUPPORTED_SASL_MECHANISM", "Unknown SCRAM mechanism"),
        (upsertion("alice", iterations=4095), "UNACCEPTABLE_CREDENTIAL", "Too few iterations"),
        (upsertion("alice", SHA_512, iterations=16385), "UNACCEPTABLE_CREDENTIAL", "Too many iterations"),
        (
            ScramCredentialUpsertion("alice", SHA_256, 4096, SALT, b""),
            "UNACCEPTABLE_CREDENTIAL",
            "Salted password must not be empty",
        ),
        (ScramCredentialDeletion("", SHA_256), "UNACCEPTABLE_CREDENTIAL", "Username must not be empty"),
        (ScramCredentialDeletion("alice", 0), "UNSUPPORTED_SASL_MECHANISM", "Unknown SCRAM mechanism"),
        (
            ScramCredentialDeletion("alice", SHA_512),
            "RESOURCE_NOT_FOUND",
            "Attempt to delete a user credential that does not exist",
        ),
    ],
)
def test_an_invalid_alteration_fails_its_user_alone(
    tmp_path: Path, alteration: ScramCredentialUpsertion | ScramCredentialDeletion, error: str, message: str
) -> None:
    controller = new_controller(tmp_path)
    alter(controller, [upsertion("alice")])
    before = dict(controller.metadata.scram_credentials)
    upsertions, deletions = (
        ([alteration], []) if isinstance(alteration, ScramCredentialUpsertion) else ([], [alteration])
    )
    assert alter(controller, [*upsertions, upsertion("carol")], deletions) == {
        ScramAlterationResult(alteration.name, error, message),
        ScramAlterationResult("carol"),
    }
    assert set(controller.metadata.scram_credentials) == {*before, ("carol", "SCRAM-SHA-256")}
    assert controller.metadata.scram_credentials[("alice", "SCRAM-SHA-256")] == before[("alice", "SCRAM-SHA-256")]


TWICE = ScramAlterationResult(
    "alice", "DUPLICATE_RESOURCE", "A user credential cannot be altered twice in the same request"
)


@pytest.mark.parametrize(
    ("upsertions", "deletions"),
    [
        ([upsertion("alice"), upsertion("alice")], []),
        ([upsertion("alice", SHA_256), upsertion("alice", SHA_512)], []),
        ([upsertion("alice", SHA_512)], [ScramCredentialDeletion("alice", SHA_256)]),
        ([], [ScramCredentialDeletion("alice", SHA_256), ScramCredentialDeletion("alice", SHA_256)]),
        ([upsertion("alice"), upsertion("alice"), upsertion("alice")], []),
    ],
)
def test_a_user_altered_twice_in_one_request_is_a_duplicate_and_nothing_changes_for_it(
    tmp_path: Path, upsertions: list[ScramCredentialUpsertion], deletions: list[ScramCredentialDeletion]
) -> None:
    controller = new_controller(tmp_path)
    alter(controller, [upsertion("alice", password="kept")])
    kept = dict(controller.metadata.scram_credentials)
    before = controller.metadata_log.end_offset
    assert alter(controller, upsertions, deletions) == {TWICE}
    assert controller.metadata.scram_credentials == kept
    assert controller.metadata_log.end_offset == before, "nothing valid, nothing written"


def test_credentials_fold_into_the_image_by_user_and_mechanism_name() -> None:
    metadata = image(
        ClusterIdRecord("cluster"),
        UserScramCredentialRecord("alice", 1, b"s1", b"k1", b"v1", 4096),
        UserScramCredentialRecord("alice", 2, b"s2", b"k2", b"v2", 8192),
        UserScramCredentialRecord("alice", 1, b"s3", b"k3", b"v3", 5000),
        RemoveUserScramCredentialRecord("alice", 2),
    )
    assert metadata.scram_credentials == {("alice", "SCRAM-SHA-256"): ScramCredential(b"s3", b"k3", b"v3", 5000)}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (RemoveUserScramCredentialRecord("bob", 1), "for unknown credential \\('bob', 'SCRAM-SHA-256'\\)"),
        (UserScramCredentialRecord("bob", 7, b"", b"", b"", 4096), "for unknown SCRAM mechanism 7"),
        (RemoveUserScramCredentialRecord("bob", 0), "for unknown SCRAM mechanism 0"),
    ],
)
def test_a_scram_record_that_does_not_fit_the_image_is_refused(
    record: UserScramCredentialRecord | RemoveUserScramCredentialRecord, message: str
) -> None:
    metadata = image(ClusterIdRecord("cluster"))
    with pytest.raises(ValueError, match=message):
        metadata.apply(1, record)
    assert metadata.scram_credentials == {}
    assert metadata.offset == 0

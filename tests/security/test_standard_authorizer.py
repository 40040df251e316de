"""StandardAuthorizer decides as Kafka's StandardAuthorizerData: DENY beats ALLOW, LITERAL names, the "*"
wildcard, PREFIXED patterns, implied operations, principal and host matching, super users, and
allow.everyone.if.no.acl.found only for resources without any ACL."""

from __future__ import annotations

import time
import uuid

import pytest

from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import RemoveAccessControlEntryRecord
from tierlog.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    Action,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierlog.security.acl_filter import ANY_ACL, acl_binding_filter, record_of
from tierlog.security.authorizer import StandardAuthorizer, parse_super_users
from tierlog.security.principal import ANONYMOUS, KafkaPrincipal

ALICE = KafkaPrincipal("User", "alice")
BOB = KafkaPrincipal("User", "bob")
HOST = "192.168.0.1"

ALLOW = AclPermissionType.ALLOW
DENY = AclPermissionType.DENY
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED
TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
READ = AclOperation.READ
WRITE = AclOperation.WRITE
DESCRIBE = AclOperation.DESCRIBE


def acl(
    name: str,
    operation: AclOperation = READ,
    permission: AclPermissionType = ALLOW,
    *,
    principal: str = "User:alice",
    host: str = "*",
    pattern_type: PatternType = LITERAL,
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, pattern_type), AccessControlEntry(principal, host, operation, permission)
    )


def authorizer(*bindings: AclBinding, super_users: str = "", allow_if_no_acl: bool = False) -> StandardAuthorizer:
    result = StandardAuthorizer(parse_super_users(super_users), allow_everyone_if_no_acl_found=allow_if_no_acl)
    for binding in bindings:
        result.add_acl(uuid.uuid4(), binding)
    return result


def allowed(
    auth: StandardAuthorizer,
    operation: AclOperation,
    name: str,
    principal: KafkaPrincipal = ALICE,
    *,
    host: str = HOST,
    resource_type: ResourceType = TOPIC,
) -> bool:
    [verdict] = auth.authorize(principal, host, [Action(operation, resource_type, name)])
    return verdict


def test_a_literal_allow_grants_exactly_that_operation_on_exactly_that_name() -> None:
    auth = authorizer(acl("orders"))
    assert allowed(auth, READ, "orders")
    assert not allowed(auth, WRITE, "orders")
    assert not allowed(auth, READ, "orders2")
    assert not allowed(auth, READ, "order")
    assert not allowed(auth, READ, "orders", resource_type=GROUP)
    assert not allowed(auth, READ, "orders", BOB)


def test_deny_beats_allow_whatever_pattern_grants_the_allow() -> None:
    for granting in (acl("orders"), acl("*"), acl("ord", pattern_type=PREFIXED), acl("orders", AclOperation.ALL)):
        auth = authorizer(granting, acl("orders", READ, DENY))
        assert not allowed(auth, READ, "orders"), granting
    # A DENY through a prefix or the wildcard beats a literal ALLOW just the same.
    assert not allowed(authorizer(acl("orders"), acl("or", READ, DENY, pattern_type=PREFIXED)), READ, "orders")
    assert not allowed(authorizer(acl("orders"), acl("*", READ, DENY)), READ, "orders")
    # DENY for everyone ("User:*") denies alice too.
    assert not allowed(authorizer(acl("orders"), acl("orders", READ, DENY, principal="User:*")), READ, "orders")


def test_a_prefixed_pattern_covers_every_name_that_starts_with_it_and_only_those() -> None:
    auth = authorizer(acl("sales-", pattern_type=PREFIXED))
    assert allowed(auth, READ, "sales-eu")
    assert allowed(auth, READ, "sales-")
    assert not allowed(auth, READ, "sales")
    assert not allowed(auth, READ, "presales-eu")


def test_prefixes_of_several_lengths_are_all_consulted() -> None:
    auth = authorizer(
        acl("a", pattern_type=PREFIXED),
        acl("ab", WRITE, pattern_type=PREFIXED),
        acl("abcd", READ, DENY, pattern_type=PREFIXED),
        acl("x", WRITE, pattern_type=PREFIXED),
    )
    assert allowed(auth, READ, "abc")
    assert allowed(auth, WRITE, "abc")
    assert not allowed(auth, READ, "abcde")
    assert allowed(auth, WRITE, "abcde")
    assert not allowed(auth, WRITE, "a")


def test_the_literal_wildcard_covers_every_name_but_a_prefixed_star_is_just_a_prefix() -> None:
    assert allowed(authorizer(acl("*")), READ, "anything")
    star_prefix = authorizer(acl("*", pattern_type=PREFIXED))
    assert not allowed(star_prefix, READ, "anything")
    assert allowed(star_prefix, READ, "*anything")


def test_the_wildcard_principal_matches_everyone_even_anonymous() -> None:
    auth = authorizer(acl("orders", principal="User:*"))
    assert allowed(auth, READ, "orders", BOB)
    assert allowed(auth, READ, "orders", ANONYMOUS)
    # As in Kafka, "User:*" covers a principal of any type; "Group:*" is no wildcard.
    assert allowed(auth, READ, "orders", KafkaPrincipal("Group", "ops"))
    assert not allowed(authorizer(acl("orders", principal="Group:*")), READ, "orders", KafkaPrincipal("Group", "ops"))


@pytest.mark.parametrize("implying", [READ, WRITE, AclOperation.DELETE, AclOperation.ALTER, DESCRIBE])
def test_describe_is_implied_by_read_write_delete_and_alter(implying: AclOperation) -> None:
    assert allowed(authorizer(acl("orders", implying)), DESCRIBE, "orders")


@pytest.mark.parametrize(
    "not_implying", [AclOperation.CREATE, AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS]
)
def test_describe_is_not_implied_by_other_operations(not_implying: AclOperation) -> None:
    assert not allowed(authorizer(acl("orders", not_implying)), DESCRIBE, "orders")


def test_describe_configs_is_implied_by_alter_configs_and_all_implies_everything() -> None:
    assert allowed(authorizer(acl("orders", AclOperation.ALTER_CONFIGS)), AclOperation.DESCRIBE_CONFIGS, "orders")
    assert not allowed(authorizer(acl("orders", AclOperation.ALTER)), AclOperation.DESCRIBE_CONFIGS, "orders")
    everything = authorizer(acl("orders", AclOperation.ALL))
    for operation in (READ, WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER_CONFIGS, DESCRIBE):
        assert allowed(everything, operation, "orders"), operation


def test_a_deny_implies_nothing_but_a_deny_of_all_denies_everything() -> None:
    # Kafka: a DENY of READ leaves DESCRIBE to the ALLOW of READ.
    auth = authorizer(acl("orders", READ), acl("orders", READ, DENY, principal="User:alice"))
    assert allowed(auth, DESCRIBE, "orders")
    assert not allowed(auth, READ, "orders")
    deny_all = authorizer(acl("orders", AclOperation.ALL), acl("orders", AclOperation.ALL, DENY))
    assert not allowed(deny_all, DESCRIBE, "orders")


def test_an_acl_for_a_host_applies_only_to_clients_from_that_host() -> None:
    auth = authorizer(acl("orders", host="10.0.0.7"))
    assert allowed(auth, READ, "orders", host="10.0.0.7")
    # The "/10.0.0.7" form the connection records is the same address.
    assert allowed(auth, READ, "orders", host="/10.0.0.7")
    assert not allowed(auth, READ, "orders", host="10.0.0.8")
    denied_there = authorizer(acl("orders"), acl("orders", READ, DENY, host="10.0.0.8"))
    assert allowed(denied_there, READ, "orders", host="10.0.0.7")
    assert not allowed(denied_there, READ, "orders", host="10.0.0.8")


def test_super_users_may_do_everything_even_what_an_acl_denies() -> None:
    auth = authorizer(acl("orders", AclOperation.ALL, DENY, principal="User:*"), super_users="User:admin; User:ops")
    for name in ("admin", "ops"):
        assert allowed(auth, AclOperation.DELETE, "orders", KafkaPrincipal("User", name))
    assert not allowed(auth, READ, "orders", ALICE)


def test_without_any_acl_on_the_resource_allow_everyone_if_no_acl_found_decides() -> None:
    assert not allowed(authorizer(), READ, "orders")
    assert allowed(authorizer(allow_if_no_acl=True), READ, "orders")
    # ACLs on other resources do not count.
    elsewhere = authorizer(acl("payments"), acl("or", pattern_type=PREFIXED, resource_type=GROUP))
    assert not allowed(elsewhere, READ, "orders")
    assert allowed(authorizer(acl("payments"), allow_if_no_acl=True), READ, "orders")


def test_an_acl_on_the_resource_for_someone_else_takes_the_default_away() -> None:
    # Kafka: once a resource has ACLs, a principal none of them allows is denied, whatever the default.
    auth = authorizer(acl("orders", principal="User:bob"), allow_if_no_acl=True)
    assert not allowed(auth, READ, "orders", ALICE)
    assert allowed(auth, READ, "orders", BOB)
    prefixed = authorizer(acl("ord", WRITE, principal="User:bob", pattern_type=PREFIXED), allow_if_no_acl=True)
    assert not allowed(prefixed, READ, "orders", ALICE)


def test_one_verdict_per_action_in_order() -> None:
    auth = authorizer(acl("a"), acl("c", WRITE))
    actions = [Action(READ, TOPIC, "a"), Action(READ, TOPIC, "b"), Action(WRITE, TOPIC, "c")]
    assert auth.authorize(ALICE, HOST, actions) == [True, False, True]


def test_it_follows_the_images_acls_as_they_are_added_and_removed() -> None:
    image = ClusterMetadata()
    auth = authorizer()
    ids = [uuid.uuid4() for _ in range(3)]
    for offset, (acl_id, binding) in enumerate(
        zip(ids, [acl("orders"), acl("pay", WRITE, pattern_type=PREFIXED), acl("*", DESCRIBE)], strict=True)
    ):
        image.apply(offset, record_of(acl_id, binding))
    auth.sync(image.acls)
    assert allowed(auth, READ, "orders") and allowed(auth, WRITE, "payments") and allowed(auth, DESCRIBE, "x")
    image.apply(3, RemoveAccessControlEntryRecord(ids[1]))
    auth.sync(image.acls)
    assert allowed(auth, READ, "orders")
    assert not allowed(auth, WRITE, "payments")
    assert len(auth.acls(ANY_ACL)) == 2


def test_acls_lists_what_a_filter_matches() -> None:
    literal, prefixed, wildcard, other = (
        acl("orders"),
        acl("ord", WRITE, pattern_type=PREFIXED),
        acl("*", DESCRIBE, principal="User:bob"),
        acl("payments"),
    )
    auth = authorizer(literal, prefixed, wildcard, other)

    def listed(**fields: object) -> set[AclBinding]:
        spec: dict[str, object] = {
            "resource_type": ResourceType.ANY,
            "resource_name": None,
            "pattern_type": PatternType.ANY,
            "principal": None,
            "host": None,
            "operation": AclOperation.ANY,
            "permission_type": AclPermissionType.ANY,
        }
        spec.update(fields)
        return set(auth.acls(acl_binding_filter(**spec)))  # type: ignore[arg-type]

    assert listed() == {literal, prefixed, wildcard, other}
    # ANY: the exact name under any pattern type; MATCH: every pattern that would cover the name.
    assert listed(resource_name="orders") == {literal}
    assert listed(resource_name="orders", pattern_type=PatternType.MATCH) == {literal, prefixed, wildcard}
    assert listed(resource_name="ord", pattern_type=PREFIXED) == {prefixed}
    assert listed(pattern_type=LITERAL) == {literal, wildcard, other}
    assert listed(principal="User:bob") == {wildcard}
    assert listed(operation=WRITE) == {prefixed}
    assert listed(resource_type=GROUP) == set()


def test_super_users_must_be_principals() -> None:
    assert parse_super_users(" User:a ;User:b;; ") == {"User:a", "User:b"}
    with pytest.raises(ValueError, match="expected a string in format principalType:principalName but got bob"):
        parse_super_users("User:a;bob")


def test_many_acls_are_checked_quickly() -> None:
    """10 000 literal and 10 000 prefixed ACLs: a check looks up its name, not every ACL."""
    bindings = [acl(f"topic-{i}") for i in range(10_000)]
    bindings += [acl(f"team-{i}-", WRITE, pattern_type=PREFIXED) for i in range(10_000)]
    auth = authorizer(*bindings)
    actions = [Action(READ, TOPIC, f"topic-{i}") for i in range(0, 10_000, 10)]
    actions += [Action(WRITE, TOPIC, f"team-{i}-events") for i in range(0, 10_000, 10)]
    started = time.perf_counter()
    verdicts = auth.authorize(ALICE, HOST, actions)
    elapsed = time.perf_counter() - started
    assert all(verdicts)
    assert elapsed < 0.5, f"2000 checks against 20000 ACLs took {elapsed:.3f} s"

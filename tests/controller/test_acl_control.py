"""The controller keeps ACLs as Kafka's AclControlManager does: each new ACL is validated with Kafka's messages,
stored once in the metadata log, removed by filters, and a restarted controller has the same ACLs."""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_helpers import new_controller, restart

from tierlog.controller.errors import InvalidRequestError
from tierlog.metadata.records import AccessControlEntryRecord, RemoveAccessControlEntryRecord
from tierlog.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierlog.security.acl_filter import acl_binding_filter, binding_of


def acl(
    name: str = "orders",
    resource_type: ResourceType = ResourceType.TOPIC,
    pattern_type: PatternType = PatternType.LITERAL,
    principal: str = "User:alice",
    operation: AclOperation = AclOperation.READ,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, pattern_type), AccessControlEntry(principal, host, operation, permission)
    )


def any_filter(**fields: object) -> object:
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
    return acl_binding_filter(**spec)  # type: ignore[arg-type]


def stored(controller: object) -> set[AclBinding]:
    return {binding_of(record) for record in controller.metadata.acls.values()}  # type: ignore[attr-defined]


def test_created_acls_are_records_in_the_metadata_log_and_survive_a_restart(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    bindings = [acl(), acl("sales-", pattern_type=PatternType.PREFIXED, permission=AclPermissionType.DENY)]
    before = controller.metadata.offset
    assert controller.create_acls(bindings) == [None, None]
    records = [record for _, record in controller.metadata_log.records_from(before + 1)]
    assert [type(r) for r in records] == [AccessControlEntryRecord, AccessControlEntryRecord]
    assert records[0].resource_type == 2 and records[0].pattern_type == 3 and records[0].operation == 3
    assert {binding_of(r) for r in records} == set(bindings)
    assert stored(restart(controller, tmp_path)) == set(bindings)


def test_an_acl_that_exists_is_not_stored_twice(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    assert controller.create_acls([acl(), acl()]) == [None, None]
    assert controller.create_acls([acl()]) == [None]
    assert len(controller.metadata.acls) == 1


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (acl("other", ResourceType.CLUSTER), "The only valid name for the CLUSTER resource is kafka-cluster"),
        (acl(""), "Invalid empty resource name"),
        (acl(resource_type=ResourceType.ANY), "Invalid resourceType ANY"),
        (acl(resource_type=ResourceType.UNKNOWN), "Invalid resourceType UNKNOWN"),
        (acl(pattern_type=PatternType.MATCH), "Invalid patternType MATCH"),
        (acl(pattern_type=PatternType.ANY), "Invalid patternType ANY"),
        (acl(operation=AclOperation.ANY), "Invalid operation ANY"),
        (acl(operation=AclOperation.UNKNOWN), "Invalid operation UNKNOWN"),
        (acl(permission=AclPermissionType.ANY), "Invalid permissionType ANY"),
        (acl(principal="alice"), "expected a string in format principalType:principalName but got alice"),
    ],
)
def test_invalid_acls_are_refused_one_by_one_with_kafkas_messages(
    tmp_path: Path, binding: AclBinding, message: str
) -> None:
    controller = new_controller(tmp_path)
    valid = acl("kafka-cluster", ResourceType.CLUSTER, operation=AclOperation.ALTER)
    refused, created = controller.create_acls([binding, valid])
    assert isinstance(refused, InvalidRequestError) and str(refused) == message
    assert refused.error_name == "INVALID_REQUEST"
    assert created is None
    assert stored(controller) == {valid}


def test_delete_removes_what_each_filter_matches_and_lists_it_per_filter(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    literal = acl("orders")
    prefixed = acl("ord", pattern_type=PatternType.PREFIXED, operation=AclOperation.WRITE)
    wildcard = acl("*", principal="User:bob")
    group = acl("orders", ResourceType.GROUP)
    controller.create_acls([literal, prefixed, wildcard, group])
    before = controller.metadata.offset
    matching_orders = any_filter(
        resource_type=ResourceType.TOPIC, resource_name="orders", pattern_type=PatternType.MATCH
    )
    bobs = any_filter(principal="User:bob")
    results = controller.delete_acls([matching_orders, bobs])
    assert [set(r) for r in results] == [{literal, prefixed, wildcard}, {wildcard}]  # type: ignore[arg-type]
    removed = [record for _, record in controller.metadata_log.records_from(before + 1)]
    assert len(removed) == 3 and all(isinstance(r, RemoveAccessControlEntryRecord) for r in removed)
    assert stored(controller) == {group}
    assert stored(restart(controller, tmp_path)) == {group}


def test_delete_filters_match_exact_names_unless_asked_to_match(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    literal, prefixed = acl("orders"), acl("orders", pattern_type=PatternType.PREFIXED)
    controller.create_acls([literal, prefixed, acl("*")])
    [only_literal] = controller.delete_acls([any_filter(resource_name="orders", pattern_type=PatternType.LITERAL)])
    assert only_literal == [literal]
    [by_name] = controller.delete_acls([any_filter(resource_name="orders")])
    assert by_name == [prefixed]
    assert [binding_of(r).pattern.name for r in controller.metadata.acls.values()] == ["*"]


def test_unknown_filters_are_refused_and_remove_nothing(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_acls([acl()])
    unknown_pattern, unknown_entry, nothing = controller.delete_acls(
        [
            any_filter(resource_type=ResourceType.UNKNOWN),
            any_filter(operation=AclOperation.UNKNOWN),
            any_filter(resource_name="nothing"),
        ]
    )
    assert isinstance(unknown_pattern, InvalidRequestError) and str(unknown_pattern) == "Unknown patternFilter."
    assert isinstance(unknown_entry, InvalidRequestError) and str(unknown_entry) == "Unknown entryFilter."
    assert nothing == []
    assert len(controller.metadata.acls) == 1

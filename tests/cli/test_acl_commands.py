"""`tierlog acl create|list|delete`, the real command against a real broker with StandardAuthorizer (the CLI is
User:ANONYMOUS, a super user here), and against one without an authorizer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cli_helpers import tierlog

from tierlog.testing.local_cluster import BrokerProcess

AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}
NO_AUTHORIZER = (
    "Error: the broker has no authorizer: set "
    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer to use ACLs"
)


@pytest.fixture(scope="module")
def acl_broker(module_broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return module_broker_factory(AUTHORIZER)


def rows(output: str) -> list[list[str]]:
    """The table's rows below its header, split into cells."""
    return [line.split() for line in output.splitlines()[1:] if line.strip()]


def test_acls_are_created_listed_with_filters_and_deleted(acl_broker: BrokerProcess) -> None:
    b = ("-b", acl_broker.bootstrap)
    created = tierlog(
        "acl", "create", *b, "--allow-principal", "User:alice", "--operation", "Read", "--operation", "write",
        "--topic", "orders",
    )  # fmt: skip
    assert created.code == 0, created.stderr
    assert created.first_line.split() == [
        "RESOURCE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION", "STATUS",
    ]  # fmt: skip
    assert rows(created.stdout) == [
        ["TOPIC", "orders", "LITERAL", "User:alice", "*", "READ", "ALLOW", "created"],
        ["TOPIC", "orders", "LITERAL", "User:alice", "*", "WRITE", "ALLOW", "created"],
    ]
    denied = tierlog(
        "acl", "create", *b, "--deny-principal", "User:bob", "--operation", "All", "--topic", "sales-",
        "--resource-pattern-type", "prefixed", "--host", "10.0.0.1",
    )  # fmt: skip
    assert denied.code == 0, denied.stderr
    ops = tierlog("acl", "create", *b, "--allow-principal", "User:ops", "--operation", "Alter", "--cluster")
    assert ops.code == 0, ops.stderr

    listed = tierlog("acl", "list", *b)
    assert listed.code == 0, listed.stderr
    assert rows(listed.stdout) == [
        ["CLUSTER", "kafka-cluster", "LITERAL", "User:ops", "*", "ALTER", "ALLOW"],
        ["TOPIC", "orders", "LITERAL", "User:alice", "*", "READ", "ALLOW"],
        ["TOPIC", "orders", "LITERAL", "User:alice", "*", "WRITE", "ALLOW"],
        ["TOPIC", "sales-", "PREFIXED", "User:bob", "10.0.0.1", "ALL", "DENY"],
    ]
    matching = tierlog("acl", "list", *b, "--topic", "sales-eu", "--resource-pattern-type", "match")
    assert rows(matching.stdout) == [["TOPIC", "sales-", "PREFIXED", "User:bob", "10.0.0.1", "ALL", "DENY"]]
    writes = tierlog("acl", "list", *b, "--principal", "User:alice", "--operation", "Write")
    assert rows(writes.stdout) == [["TOPIC", "orders", "LITERAL", "User:alice", "*", "WRITE", "ALLOW"]]

    # Without --yes it asks, and a "no" (here: no answer) deletes nothing.
    asked = tierlog("acl", "delete", *b, "--topic", "orders")
    assert asked.code == 1
    assert asked.first_error_line.startswith("Delete every ACL matching topic 'orders' (any)? [y/N]")
    deleted = tierlog("acl", "delete", *b, "--topic", "orders", "--yes")
    assert deleted.code == 0, deleted.stderr
    assert [row[-1] for row in rows(deleted.stdout)] == ["deleted", "deleted"]
    assert [row[1] for row in rows(tierlog("acl", "list", *b).stdout)] == ["kafka-cluster", "sales-"]


def test_mistakes_are_told_in_one_line(acl_broker: BrokerProcess) -> None:
    b = ("-b", acl_broker.bootstrap)
    no_principal = tierlog("acl", "create", *b, "--operation", "Read", "--topic", "t")
    assert (no_principal.code, no_principal.first_error_line) == (
        1,
        "Error: give --allow-principal or --deny-principal (e.g. --allow-principal User:alice)",
    )
    no_resource = tierlog("acl", "create", *b, "--allow-principal", "User:a", "--operation", "Read")
    assert no_resource.first_error_line == "Error: give a resource: --topic, --group, --transactional-id or --cluster"
    bad_principal = tierlog("acl", "create", *b, "--allow-principal", "alice", "--operation", "Read", "--topic", "t")
    assert bad_principal.code == 2
    assert bad_principal.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--allow-principal': 'alice' is not a principal of the form Type:name "
        "(e.g. User:alice)"
    )
    bad_operation = tierlog("acl", "create", *b, "--allow-principal", "User:a", "--operation", "Frob", "--topic", "t")
    assert bad_operation.code == 2
    assert "'Frob' is not an operation (one of All, Alter, AlterConfigs," in bad_operation.stderr


def test_without_an_authorizer_each_command_says_so_in_one_line(shared_broker: BrokerProcess) -> None:
    b = ("-b", shared_broker.bootstrap)
    created = tierlog("acl", "create", *b, "--allow-principal", "User:alice", "--operation", "Read", "--topic", "t")
    assert created.code == 1
    assert created.first_error_line == (
        "Error: creating the ACL: the broker has no authorizer (set "
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer to use ACLs)"
    )
    listed = tierlog("acl", "list", *b)
    assert (listed.code, listed.first_error_line) == (1, NO_AUTHORIZER)
    deleted = tierlog("acl", "delete", *b, "--yes")
    assert deleted.code == 1
    assert deleted.first_error_line.startswith("Error: deleting ACLs: the broker has no authorizer")

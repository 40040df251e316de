"""confluent-kafka's AdminClient manages ACLs on a real broker with StandardAuthorizer configured: CreateAcls,
DescribeAcls with filters, DeleteAcls, Kafka's per-ACL errors, ACLs kept across a restart, and SECURITY_DISABLED
from a broker without an authorizer.

The client here is User:ANONYMOUS, made a super user so these tests keep passing once every API is checked."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as ACLResourceType
from kafka.errors import SecurityDisabledError

from tierlog.testing.local_cluster import BrokerProcess, wait_until

AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}

EVERY_ACL = AclBindingFilter(
    ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
)


def binding(
    name: str,
    resource_type: ResourceType = ResourceType.TOPIC,
    pattern_type: ResourcePatternType = ResourcePatternType.LITERAL,
    principal: str = "User:alice",
    operation: AclOperation = AclOperation.READ,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(resource_type, name, pattern_type, principal, host, operation, permission)


def create(admin: Any, bindings: list[AclBinding], timeout_s: float) -> dict[AclBinding, str | None]:
    """Each binding's error name, None when it was created."""
    results: dict[AclBinding, str | None] = {}
    for acl, future in admin.create_acls(bindings, request_timeout=timeout_s).items():
        try:
            future.result(timeout_s)
            results[acl] = None
        except KafkaException as e:
            results[acl] = f"{e.args[0].name()}: {e.args[0].str()}"
    return results


def describe(admin: Any, acl_filter: AclBindingFilter, timeout_s: float) -> set[AclBinding]:
    return set(admin.describe_acls(acl_filter, request_timeout=timeout_s).result(timeout_s))


@pytest.fixture
def secured(broker_factory: Any) -> BrokerProcess:
    return broker_factory(AUTHORIZER)


def test_created_acls_are_described_with_filters_and_deleted(secured: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(secured.bootstrap)
    timeout = kafka.timeout_s
    read_orders = binding("orders")
    write_sales = binding("sales-", pattern_type=ResourcePatternType.PREFIXED, operation=AclOperation.WRITE)
    deny_bob = binding("*", principal="User:bob", permission=AclPermissionType.DENY, host="10.0.0.1")
    group = binding("etl", ResourceType.GROUP, operation=AclOperation.READ)
    cluster = binding("kafka-cluster", ResourceType.BROKER, operation=AclOperation.DESCRIBE_CONFIGS)
    everything = [read_orders, write_sales, deny_bob, group, cluster]
    assert create(admin, everything, timeout) == dict.fromkeys(everything)
    # Again: an existing ACL is no error and is not stored twice.
    assert create(admin, [read_orders], timeout) == {read_orders: None}
    assert describe(admin, EVERY_ACL, timeout) == set(everything)

    def topics(name: str | None, pattern_type: ResourcePatternType, **entry: Any) -> AclBindingFilter:
        return AclBindingFilter(
            ResourceType.TOPIC,
            name,
            pattern_type,
            entry.get("principal"),
            entry.get("host"),
            entry.get("operation", AclOperation.ANY),
            entry.get("permission", AclPermissionType.ANY),
        )

    assert describe(admin, topics(None, ResourcePatternType.ANY), timeout) == {read_orders, write_sales, deny_bob}
    assert describe(admin, topics("sales-eu", ResourcePatternType.MATCH), timeout) == {write_sales, deny_bob}
    assert describe(admin, topics("orders", ResourcePatternType.LITERAL), timeout) == {read_orders}
    assert describe(admin, topics(None, ResourcePatternType.ANY, principal="User:bob"), timeout) == {deny_bob}
    assert describe(admin, topics(None, ResourcePatternType.ANY, host="10.0.0.1"), timeout) == {deny_bob}
    assert describe(admin, topics(None, ResourcePatternType.ANY, operation=AclOperation.WRITE), timeout) == {
        write_sales
    }

    orders_filter = topics("orders", ResourcePatternType.MATCH)
    group_filter = AclBindingFilter(
        ResourceType.GROUP, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    deleted = admin.delete_acls([orders_filter, group_filter], request_timeout=timeout)
    assert {f: set(future.result(timeout)) for f, future in deleted.items()} == {
        orders_filter: {read_orders, deny_bob},
        group_filter: {group},
    }
    assert describe(admin, EVERY_ACL, timeout) == {write_sales, cluster}


def test_invalid_acls_get_kafkas_errors_and_the_valid_ones_are_created(secured: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(secured.bootstrap)
    valid = binding("orders")
    wrong_cluster = binding("my-cluster", ResourceType.BROKER, operation=AclOperation.ALTER)
    no_type = binding("orders", principal="alice")
    results = create(admin, [valid, wrong_cluster, no_type], kafka.timeout_s)
    assert results == {
        valid: None,
        wrong_cluster: "INVALID_REQUEST: The only valid name for the CLUSTER resource is kafka-cluster",
        no_type: "INVALID_REQUEST: expected a string in format principalType:principalName but got alice",
    }
    assert describe(admin, EVERY_ACL, kafka.timeout_s) == {valid}


def test_acls_survive_a_restart(secured: BrokerProcess, kafka: Any) -> None:
    acls = [binding("orders"), binding("t-", pattern_type=ResourcePatternType.PREFIXED, operation=AclOperation.ALL)]
    assert create(kafka.admin(secured.bootstrap), acls, kafka.timeout_s) == dict.fromkeys(acls)
    secured.restart()
    assert describe(kafka.admin(secured.bootstrap), EVERY_ACL, kafka.timeout_s) == set(acls)


def test_without_an_authorizer_the_acl_apis_answer_security_disabled(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    acl = binding("orders")
    assert create(admin, [acl], kafka.timeout_s) == {acl: "SECURITY_DISABLED: No Authorizer is configured."}
    # librdkafka drops DescribeAcls' top-level error (it returns no ACLs); kafka-python reports it.
    python_admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        every_acl = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(ACLResourceType.ANY, None, ACLResourcePatternType.ANY),
        )
        with pytest.raises(SecurityDisabledError, match="No Authorizer is configured on the broker"):
            python_admin.describe_acls(every_acl)
    finally:
        python_admin.close()
    [future] = admin.delete_acls([EVERY_ACL], request_timeout=kafka.timeout_s).values()
    with pytest.raises(KafkaException) as deleted:
        future.result(kafka.timeout_s)
    assert deleted.value.args[0].name() == "SECURITY_DISABLED"


def test_acls_created_through_one_broker_reach_every_broker(cluster_factory: Any, kafka: Any) -> None:
    """Broker 2 forwards CreateAcls and DeleteAcls to the controller on node 1; each broker's authorizer follows
    the metadata log, so DescribeAcls on either shows the change."""
    cluster = cluster_factory(AUTHORIZER, brokers=2)
    via_2 = kafka.admin(cluster.broker(2).bootstrap)
    via_1 = kafka.admin(cluster.broker(1).bootstrap)
    acl = binding("orders", principal="User:carol")
    assert create(via_2, [acl], kafka.timeout_s) == {acl: None}
    assert describe(via_2, EVERY_ACL, kafka.timeout_s) == {acl}
    wait_until(lambda: describe(via_1, EVERY_ACL, kafka.timeout_s) == {acl}, kafka.timeout_s, "broker 1 to show it")
    [future] = via_2.delete_acls([EVERY_ACL], request_timeout=kafka.timeout_s).values()
    assert future.result(kafka.timeout_s) == [acl]
    wait_until(lambda: not describe(via_1, EVERY_ACL, kafka.timeout_s), kafka.timeout_s, "broker 1 to drop it")

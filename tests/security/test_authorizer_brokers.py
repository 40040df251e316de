"""Real broker processes with the StandardAuthorizer (docs/security.md#api-checks): a client without ACLs gets
Kafka's authorization errors through confluent-kafka and sees no topic; `allow.everyone.if.no.acl.found` lets it
through; SASL PLAIN users get what the ACLs an admin created through confluent-kafka allow them (a DENY beating
an ALLOW); three brokers whose principal (User:ANONYMOUS on PLAINTEXT) is a super user replicate, follow the
controller and elect new leaders with the authorizer on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from cluster_helpers import confirmed_leader, send_request, wait_confirmed_leader
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.errors import ErrorCode

from tierlog.client.requests import metadata_request
from tierlog.security.authorizer import STANDARD_AUTHORIZER
from tierlog.testing.local_cluster import BrokerProcess, LocalCluster, wait_until

AUTHORIZER = {"authorizer.class.name": STANDARD_AUTHORIZER}
TIMEOUT_S = 30.0


def test_a_client_without_acls_is_refused_and_sees_no_topic(
    broker_factory: Callable[..., BrokerProcess], kafka: Any
) -> None:
    broker = broker_factory({**AUTHORIZER, "super.users": "User:admin"})
    topic = kafka.topic_name()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Producing to it would auto-create it: DESCRIBE (then CREATE) on it is missing.
    assert kafka.delivery_errors(broker.bootstrap, topic, [{"value": b"v"}]) == ["TOPIC_AUTHORIZATION_FAILED"]
    assert admin.list_topics(timeout=TIMEOUT_S).topics == {}
    # The cluster's operations are none without DESCRIBE on the cluster; the request itself is answered.
    answer = send_request(broker.bootstrap, metadata_request([topic], include_authorized_operations=True, version=10))
    assert [(t.name, t.error_code) for t in answer.topics] == [(topic, ErrorCode.topic_authorization_failed)]
    assert answer.cluster_authorized_operations == 0


def test_allow_everyone_if_no_acl_found_lets_the_same_client_through(
    broker_factory: Callable[..., BrokerProcess], kafka: Any
) -> None:
    broker = broker_factory({**AUTHORIZER, "allow.everyone.if.no.acl.found": "true"})
    topic = kafka.topic_name()
    kafka.create_topic(broker.bootstrap, topic)
    kafka.produce(broker.bootstrap, topic, [{"value": b"allowed"}])
    assert [r.value for r in kafka.consume_all(broker.bootstrap, topic)] == [b"allowed"]


def test_brokers_that_are_super_users_replicate_and_elect_with_the_authorizer_on(
    cluster_factory: Callable[..., LocalCluster], kafka: Any
) -> None:
    cluster = cluster_factory(
        {
            **AUTHORIZER,
            "super.users": "User:ANONYMOUS",
            "broker.session.timeout.ms": "2000",
            "broker.heartbeat.interval.ms": "300",
            "replica.lag.time.max.ms": "5000",
            "min.insync.replicas": "2",
        }
    )
    topic = kafka.topic_name()
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    # Broker 2 leads first (node 1 runs the controller, which must outlive the leader).
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[2, 3, 1]])])[topic].result(TIMEOUT_S)
    leader, epoch = wait_confirmed_leader(cluster, topic, 0, TIMEOUT_S, "with the authorizer on: ")
    assert leader == 2
    first = [{"value": f"before-{i}".encode()} for i in range(50)]
    kafka.produce(cluster.bootstrap, topic, first)
    # The leader goes; the controller elects another replica, which the remaining follower fetches from.
    cluster.broker(leader).kill()
    later = [{"value": f"after-{i}".encode()} for i in range(50)]
    kafka.produce(cluster.bootstrap, topic, later)
    cluster.broker(leader).start()
    cluster.broker(leader).wait_ready(TIMEOUT_S)
    # The restarted broker catches up as a follower: a later leader epoch, every broker in the ISR again.
    wait_until(
        lambda: found if (found := confirmed_leader(cluster, topic, 0)) and found[1] > epoch else None,
        TIMEOUT_S,
        lambda: "a new leader with the full ISR",
    )
    values = [r.value for r in kafka.consume_all(cluster.bootstrap, topic)]
    assert values == [r["value"] for r in first + later]


# SASL PLAIN users (docs/security.md#sasl): the broker itself authenticates as admin, a super user.
SASL_AUTHORIZED_BROKER = {
    **AUTHORIZER,
    "super.users": "User:admin",
    "listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN",
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "listener.name.plaintext.plain.sasl.jaas.config": (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret" '
        'user_bob="bob-secret";'
    ),
}


def as_user(user: str) -> dict[str, str]:
    """librdkafka settings (in `Kafka`'s underscore form) of a PLAIN user whose password is `<user>-secret`."""
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_username": user,
        "sasl_password": f"{user}-secret",
    }


def dotted(settings: dict[str, str]) -> dict[str, str]:
    return {key.replace("_", "."): value for key, value in settings.items()}


def test_authenticated_users_get_what_their_acls_allow(
    broker_factory: Callable[..., BrokerProcess], kafka: Any
) -> None:
    broker = broker_factory(SASL_AUTHORIZED_BROKER)
    topic, group = kafka.topic_name(), f"group-{kafka.topic_name()}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **dotted(as_user("admin"))})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(TIMEOUT_S)
    alice = "User:alice"
    grants = [
        AclBinding(
            ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, alice, "*", operation, AclPermissionType.ALLOW
        )
        for operation in (AclOperation.WRITE, AclOperation.READ)
    ]
    grants.append(
        AclBinding(
            ResourceType.GROUP,
            group,
            ResourcePatternType.LITERAL,
            alice,
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        )
    )
    for future in admin.create_acls(grants, request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)

    assert kafka.delivery_errors(broker.bootstrap, topic, [{"value": b"from-bob"}], **as_user("bob")) == [
        "TOPIC_AUTHORIZATION_FAILED"
    ]
    kafka.produce(broker.bootstrap, topic, [{"value": b"from-alice"}], **as_user("alice"))
    bob_admin = AdminClient({"bootstrap.servers": broker.bootstrap, **dotted(as_user("bob"))})
    assert topic not in bob_admin.list_topics(timeout=TIMEOUT_S).topics
    assert (
        topic
        in AdminClient({"bootstrap.servers": broker.bootstrap, **dotted(as_user("alice"))})
        .list_topics(timeout=TIMEOUT_S)
        .topics
    )

    # Alice reads as a member of her group: READ on the group and the topic.
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            **dotted(as_user("alice")),
        }
    )
    try:
        consumer.subscribe([topic])
        message = wait_until(lambda: _record(consumer), TIMEOUT_S, lambda: "alice's record, read in her group")
        assert message.value() == b"from-alice"
    finally:
        consumer.close()

    # A DENY for alice beats her ALLOW.
    deny = AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, alice, "*", AclOperation.WRITE, AclPermissionType.DENY
    )
    admin.create_acls([deny], request_timeout=TIMEOUT_S)[deny].result(TIMEOUT_S)
    assert kafka.delivery_errors(broker.bootstrap, topic, [{"value": b"denied"}], **as_user("alice")) == [
        "TOPIC_AUTHORIZATION_FAILED"
    ]


def _record(consumer: Consumer) -> Any:
    message = consumer.poll(0.5)
    if message is None:
        return None
    assert message.error() is None, message.error()
    return message

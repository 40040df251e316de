"""Client certificates as principals under the StandardAuthorizer: on SSL listeners with ssl.client.auth=required,
ssl.principal.mapping.rules makes a certificate's CN the user name; a client with CN=alice, to whom ACLs give WRITE
and READ on a topic, produces and consumes; CN=bob is refused with TOPIC_AUTHORIZATION_FAILED and sees no topic.
The brokers replicate to each other over the same TLS, as User:broker, a super user (docs/security.md#tls,
docs/security.md#authorizer)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from tls_helpers import CN_MAPPING_RULES, Identity, TlsFiles, issue_identity

from tierlog.security.authorizer import STANDARD_AUTHORIZER
from tierlog.testing.local_cluster import LocalCluster, wait_until

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0


class MtlsCluster:
    def __init__(self, cluster: LocalCluster, files: TlsFiles, identities: dict[str, Identity]) -> None:
        self.cluster = cluster
        self.files = files
        self.identities = identities

    def config(self, name: str) -> dict[str, Any]:
        """librdkafka's settings of the client whose certificate says CN=<name>."""
        identity = self.identities[name]
        return {
            "bootstrap.servers": ",".join(self.cluster.listener_address("SSL", n) for n in self.cluster.node_ids),
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.files.ca_path),
            "ssl.certificate.location": str(identity.certificate_path),
            "ssl.key.location": str(identity.key_path),
        }


@pytest.fixture(scope="module")
def mtls(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsCluster]:
    base = tmp_path_factory.mktemp("mtls-acls")
    identities = {
        name: issue_identity(tls_files.ca, base / "certs", name) for name in ("broker", "admin", "alice", "bob")
    }
    overrides = {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(identities["broker"].keystore_path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls_files.ca_path),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": CN_MAPPING_RULES,
        "authorizer.class.name": STANDARD_AUTHORIZER,
        # The brokers' own certificate says CN=broker: their registrations, heartbeats and replica fetches need it.
        "super.users": "User:broker;User:admin",
        "log.segment.bytes": str(1024 * 1024),
    }
    with LocalCluster(base / "cluster", brokers=2, overrides=overrides, extra_listeners=("SSL",)) as cluster:
        yield MtlsCluster(cluster, tls_files, identities)


def grant(admin: AdminClient, resource: ResourceType, name: str, user: str, *operations: AclOperation) -> None:
    bindings = [
        AclBinding(resource, name, ResourcePatternType.LITERAL, f"User:{user}", "*", op, AclPermissionType.ALLOW)
        for op in operations
    ]
    for future in admin.create_acls(bindings, request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)


def produce(config: dict[str, Any], topic: str, values: list[bytes]) -> list[str | None]:
    """Each record's delivery error name (None: acknowledged)."""
    outcomes: list[str | None] = []
    producer = Producer({**config, "acks": "all", "message.timeout.ms": 10000})
    for value in values:
        producer.produce(
            topic, value, partition=0, on_delivery=lambda e, m: outcomes.append(None if e is None else e.name())
        )
    assert producer.flush(TIMEOUT_S) == 0
    return outcomes


def test_a_certificates_cn_is_the_principal_the_acls_name(mtls: MtlsCluster) -> None:
    topic = f"mtls-acl-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(mtls.config("admin"))
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=2)])[topic].result(TIMEOUT_S)
    grant(admin, ResourceType.TOPIC, topic, "alice", AclOperation.WRITE, AclOperation.READ)
    # librdkafka looks up the consumer's group coordinator even for assigned partitions: READ on the group too.
    grant(admin, ResourceType.GROUP, topic, "alice", AclOperation.READ)

    values = [b"a%d" % i for i in range(20)]
    assert produce(mtls.config("alice"), topic, values) == [None] * len(values)
    consumer = Consumer({**mtls.config("alice"), "group.id": topic, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(read) < len(values) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                read.append(message.value())
    finally:
        consumer.close()
    assert read == values

    assert produce(mtls.config("bob"), topic, [b"from-bob"]) == [
        KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED).name()
    ]
    assert topic not in AdminClient(mtls.config("bob")).list_topics(timeout=TIMEOUT_S).topics

    # Both replicas stayed in sync: the follower fetched as User:broker through the authorizer.
    def in_sync() -> bool:
        partition = admin.list_topics(topic, timeout=5).topics[topic].partitions[0]
        return sorted(partition.isrs) == [1, 2]

    wait_until(in_sync, TIMEOUT_S, "both replicas in the ISR")

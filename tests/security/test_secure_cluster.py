"""Everything at once on three brokers: clients on SASL_SSL (the client user's SCRAM-SHA-512 credential created
after the start by an admin), brokers talking to each other on SASL_SSL with PLAIN (their credentials in the
listener's JAAS config) and to the controller over SSL with client certificates, the StandardAuthorizer on with
the brokers' principal and the admin as super users. A topic of replication factor 3 takes acks=all writes while a
broker that is not the controller is killed with SIGKILL, and every acknowledged record reads back for a user with
a READ ACL; a user without ACLs sees no topic (docs/security.md)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from tls_helpers import CN_MAPPING_RULES, TlsFiles, issue_identity, librdkafka_sasl_ssl

from tierlog.security.authorizer import STANDARD_AUTHORIZER
from tierlog.testing.local_cluster import CONTROLLER_NODE_ID, LocalCluster, wait_until

pytestmark = pytest.mark.cluster

TIMEOUT_S = 60.0
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule required"
# The brokers authenticate to each other as `broker` (PLAIN); the same name is in their certificate's CN, which the
# controller's SSL listener maps to User:broker. `admin` is the operator.
BROKER_JAAS = (
    f'{PLAIN_LOGIN} username="broker" password="broker-secret" user_broker="broker-secret" user_admin="admin-secret";'
)
RECORDS = 300


@pytest.fixture
def secure_cluster(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("secure-cluster")
    broker_identity = issue_identity(tls_files.ca, base / "certs", "broker")
    overrides = {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "SASL_SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(broker_identity.keystore_path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls_files.ca_path),
        "listener.name.controller.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": CN_MAPPING_RULES,
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": BROKER_JAAS,
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:broker;User:admin",
        "min.insync.replicas": "2",
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "300",
        "replica.lag.time.max.ms": "5000",
        "log.segment.bytes": str(1024 * 1024),
    }
    cluster = LocalCluster(base / "cluster", brokers=3, overrides=overrides, extra_listeners=("SASL_SSL",))
    with cluster:
        yield cluster
    for node_id in cluster.node_ids:
        print(f"\n---- last lines of broker {node_id}'s log ----\n{cluster.broker(node_id).log_tail(40)}")


def sasl_ssl(cluster: LocalCluster, files: TlsFiles, mechanism: str, user: str, password: str) -> dict[str, Any]:
    bootstrap = ",".join(cluster.listener_address("SASL_SSL", node_id) for node_id in cluster.node_ids)
    return librdkafka_sasl_ssl(bootstrap, files, mechanism, user, password)


def test_everything_on_three_brokers_survives_a_killed_broker(
    secure_cluster: LocalCluster, tls_files: TlsFiles
) -> None:
    admin = AdminClient(sasl_ssl(secure_cluster, tls_files, "PLAIN", "admin", "admin-secret"))
    for user in ("carol", "dave"):
        upsertion = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), f"{user}-secret".encode()
        )
        admin.alter_user_scram_credentials([upsertion])[user].result(timeout=TIMEOUT_S)
    topic = f"secure-{uuid.uuid4().hex[:6]}"
    # Broker 2 leads (node 1 runs the controller and stays up).
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[2, 3, 1]])])[topic].result(TIMEOUT_S)
    grants = [
        AclBinding(
            ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:carol", "*", op, AclPermissionType.ALLOW
        )
        for op in (AclOperation.WRITE, AclOperation.READ)
    ]
    # librdkafka looks up the consumer's group coordinator even for assigned partitions: READ on the group too.
    grants.append(
        AclBinding(
            ResourceType.GROUP,
            topic,
            ResourcePatternType.LITERAL,
            "User:carol",
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        )
    )
    for future in admin.create_acls(grants, request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)

    def fully_replicated() -> bool:
        partition = admin.list_topics(topic, timeout=5).topics[topic].partitions.get(0)
        return partition is not None and partition.leader == 2 and sorted(partition.isrs) == [1, 2, 3]

    wait_until(fully_replicated, TIMEOUT_S, "broker 2 leading with every replica in the ISR")

    carol = sasl_ssl(secure_cluster, tls_files, "SCRAM-SHA-512", "carol", "carol-secret")
    acknowledged: list[bytes] = []
    failed: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            acknowledged.append(message.value())
        else:
            failed.append(error.name())

    producer = Producer({**carol, "acks": "all", "enable.idempotence": True, "message.timeout.ms": 45000})
    for i in range(RECORDS):
        producer.produce(topic, f"r{i}".encode(), partition=0, on_delivery=delivered)
        producer.poll(0)
        if i == RECORDS // 2:
            assert producer.flush(TIMEOUT_S) == 0
            assert CONTROLLER_NODE_ID != 2
            secure_cluster.kill(2)
        time.sleep(0.005)
    assert producer.flush(TIMEOUT_S) == 0
    assert failed == []
    assert len(acknowledged) == RECORDS
    # The second half went to the replica the controller elected in broker 2's place.
    partition = admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions[0]
    assert partition.leader in (1, 3)
    assert 2 not in partition.isrs

    consumer = Consumer({**carol, "group.id": topic, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(read) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                read.append(message.value())
    finally:
        consumer.close()
    assert read == acknowledged

    dave = AdminClient(sasl_ssl(secure_cluster, tls_files, "SCRAM-SHA-512", "dave", "dave-secret"))
    assert dave.list_topics(timeout=TIMEOUT_S).topics == {}
    assert topic in admin.list_topics(timeout=TIMEOUT_S).topics
    for node_id in (1, 3):
        log = secure_cluster.broker(node_id).log_tail(2000)
        assert "Failed authentication" not in log, f"broker {node_id} refused a peer"

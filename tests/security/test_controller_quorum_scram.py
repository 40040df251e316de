"""Dedicated controllers whose listener is SASL_PLAINTEXT with SCRAM: a controller that is not the active one checks
SCRAM logins and ACLs against the metadata its committed log holds (its standby image, docs/quorum.md#snapshots),
so once the voters' SCRAM user exists the voters can talk SCRAM to each other and still elect a new leader when
the active controller dies (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster_helpers import ClusterFactory
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

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import request_schema
from tierlog.client.security import ClientSecurity
from tierlog.raft.raft_log import METADATA_TOPIC
from tierlog.security.authorizer import STANDARD_AUTHORIZER
from tierlog.testing.local_cluster import FIRST_DEDICATED_CONTROLLER_ID, LocalCluster, wait_until

TIMEOUT_S = 60.0
CONTROLLER_IDS = [FIRST_DEDICATED_CONTROLLER_ID + i for i in range(3)]
PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="controller" password="c-plain" user_controller="c-plain";'
)
SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="controller" password="c-s";'
SCRAM_SETTINGS = {
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
    "sasl.mechanism.controller.protocol": "PLAIN",
    "listener.name.controller.plain.sasl.jaas.config": PLAIN_JAAS,
    "listener.name.controller.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
    "authorizer.class.name": STANDARD_AUTHORIZER,
    "super.users": "User:controller;User:ANONYMOUS",
}


def scram_as(user: str, password: str) -> ClientSecurity:
    return ClientSecurity("SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_username=user, sasl_password=password)


def describe_quorum_error(address: str, security: ClientSecurity) -> str:
    """The top-level error of a DescribeQuorum sent to one controller, or the login's failure."""

    async def ask() -> str:
        host, port = address.rsplit(":", 1)
        try:
            connection = await KafkaConnection.open(host, int(port), client_id="test", timeout_s=5, security=security)
        except KafkaConnectionError as e:
            return f"login failed: {e}"
        try:
            s = request_schema(55, 2)
            request = s.DescribeQuorumRequest(
                topics=(s.TopicData(topic_name=METADATA_TOPIC, partitions=(s.PartitionData(partition_index=0),)),)
            )
            response: Any = await connection.send(request, timeout_s=5)
        finally:
            await connection.close()
        return str(response.error_code.name)

    return asyncio.run(ask())


def controller_address(cluster: LocalCluster, node_id: int) -> str:
    return f"127.0.0.1:{cluster.controller_ports[node_id]}"


def active_controller(cluster: LocalCluster) -> int | None:
    """The controller whose log says it became the active one last."""
    latest: tuple[str, int] | None = None
    for node_id in CONTROLLER_IDS:
        for line in cluster.broker(node_id).log_file.read_text().splitlines():
            if "active in epoch" in line and (latest is None or line[:25] > latest[0]):
                latest = (line[:25], node_id)
    return None if latest is None else latest[1]


def test_controllers_that_are_not_active_check_scram_logins_and_acls_with_their_committed_metadata(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(SCRAM_SETTINGS, brokers=1, controllers=3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    upsertions = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password)
        for user, password in (("controller", b"c-s"), ("alice", b"alice-s"))
    ]
    for future in admin.alter_user_scram_credentials(upsertions).values():
        future.result(timeout=TIMEOUT_S)
    alice = scram_as("alice", "alice-s")

    # Every controller, active or not, knows alice's credential; she holds no ACL yet.
    for node_id in CONTROLLER_IDS:
        wait_until(
            lambda node_id=node_id: (
                describe_quorum_error(controller_address(cluster, node_id), alice) == "cluster_authorization_failed"
            ),
            TIMEOUT_S,
            f"controller {node_id} to accept alice's SCRAM login and refuse her",
        )
    cluster_action = AclBinding(
        ResourceType.BROKER,
        "kafka-cluster",
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.CLUSTER_ACTION,
        AclPermissionType.ALLOW,
    )
    admin.create_acls([cluster_action])[cluster_action].result(timeout=TIMEOUT_S)
    active = active_controller(cluster)
    for node_id in CONTROLLER_IDS:
        # The leader describes the quorum; the others pass the check and say they do not lead.
        wait_until(
            lambda node_id=node_id: describe_quorum_error(controller_address(cluster, node_id), alice) == "none",
            TIMEOUT_S,
            f"controller {node_id} (active: {active}) to let alice describe the quorum",
        )

    # The voters talk SCRAM to each other from now on, one restarted at a time.
    for node_id in CONTROLLER_IDS:
        cluster.broker(node_id).overrides["sasl.mechanism.controller.protocol"] = "SCRAM-SHA-256"
        cluster.restart(node_id)
        wait_until(
            lambda node_id=node_id: describe_quorum_error(controller_address(cluster, node_id), alice) == "none",
            TIMEOUT_S,
            f"restarted controller {node_id} to know alice again",
        )
    active = wait_until(lambda: active_controller(cluster), TIMEOUT_S, "an active controller")
    cluster.kill(active)
    # The two left elect a leader: their votes are SCRAM logins on controllers that are not active.
    wait_until(lambda: active_controller(cluster) not in (None, active), TIMEOUT_S, "another active controller")
    admin.create_topics([NewTopic("after-failover", 1, 1)])["after-failover"].result(timeout=TIMEOUT_S)

"""The controller quorum over TLS with an authorizer: voters reach each other's SSL controller listener with the
settings a broker reaches the controller with (the listener's ssl.* settings, the key store as client certificate),
and only a principal holding CLUSTER_ACTION on the cluster takes part in the quorum or (DESCRIBE) describes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncio_helpers import run_bounded
from quorum_helpers import active_leader, append_and_commit, committed_values, quorum
from tls_helpers import CN_MAPPING_RULES, TlsFiles, issue_identity

from tierlog.client.connection import KafkaConnection
from tierlog.client.raft_requests import raft_request
from tierlog.client.requests import request_schema
from tierlog.client.security import ClientSecurity
from tierlog.raft.messages import VoteRequest
from tierlog.raft.raft_log import METADATA_TOPIC
from tierlog.security.authorizer import STANDARD_AUTHORIZER
from tierlog.security.ssl_context import SslSettings, client_context


def secure_quorum_settings(tls_files: TlsFiles, directory: Path) -> dict[str, str]:
    controller = issue_identity(tls_files.ca, directory, "controller")
    return {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(controller.keystore_path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls_files.ca_path),
        "listener.name.controller.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": CN_MAPPING_RULES,
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:controller",
    }


def client_as(tls_files: TlsFiles, directory: Path, name: str) -> ClientSecurity:
    identity = issue_identity(tls_files.ca, directory, name)
    settings = SslSettings(
        keystore_type="PEM",
        keystore_location=str(identity.keystore_path),
        truststore_type="PEM",
        truststore_location=str(tls_files.ca_path),
    )
    return ClientSecurity("SSL", client_context(settings))


def describe_quorum_request() -> Any:
    s = request_schema(55, 2)
    return s.DescribeQuorumRequest(
        topics=(s.TopicData(topic_name=METADATA_TOPIC, partitions=(s.PartitionData(partition_index=0),)),)
    )


def test_three_voters_form_a_quorum_over_tls(tls_files: TlsFiles, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3, secure_quorum_settings(tls_files, tmp_path / "certs")) as voters:
            leader = await active_leader(voters)
            await append_and_commit(leader, [b"over TLS"])
            assert committed_values(leader) == [b"over TLS"]

    run_bounded(scenario, 30)


def test_only_a_cluster_member_votes_or_describes_the_quorum(tls_files: TlsFiles, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3, secure_quorum_settings(tls_files, tmp_path / "certs")) as voters:
            leader = await active_leader(voters)
            host, port = leader.config.quorum_voters[leader.node_id]
            vote = raft_request(VoteRequest(2, leader.raft.client.epoch + 1, 0, 0, pre_vote=True))
            mallory = await KafkaConnection.open(
                host, port, client_id="mallory", timeout_s=5, security=client_as(tls_files, tmp_path, "mallory")
            )
            try:
                refused = await mallory.send(vote, timeout_s=5)
                assert refused.error_code.name == "cluster_authorization_failed"
                refused = await mallory.send(describe_quorum_request(), timeout_s=5)
                assert refused.error_code.name == "cluster_authorization_failed"
            finally:
                await mallory.close()
            member = await KafkaConnection.open(
                host, port, client_id="controller", timeout_s=5, security=leader.config.controller_client_security()
            )
            try:
                described = await member.send(describe_quorum_request(), timeout_s=5)
            finally:
                await member.close()
            (partition,) = described.topics[0].partitions
            assert (partition.error_code, partition.leader_id) == (0, leader.node_id)
            assert sorted(voter.replica_id for voter in partition.current_voters) == [1, 2, 3]
            assert sorted(node.node_id for node in described.nodes) == [1, 2, 3]

    run_bounded(scenario, 30)

"""What each API checks (docs/security.md#api-checks), on a whole broker in this process with the StandardAuthorizer:
for every API a principal without the ACL Kafka's KafkaApis asks for gets Kafka's exact *_AUTHORIZATION_FAILED
code and one with it gets the answer an unrestricted broker gives; DENY beats ALLOW, PREFIXED patterns and super
users apply; Metadata hides what the principal may not describe; the KIP-430 fields show what it may do.

The requests are raw kio entities handed to the broker's KafkaApis from a task that looks like a client
connection (a listener name and a principal, as the connection's task sets them once the client authenticated).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kio.schema.errors import ErrorCode

from tierlog.client.requests import (
    PartitionFetch,
    alter_partition_reassignments_request,
    describe_log_dirs_request,
    describe_quorum_request,
    fetch_request,
    list_offsets_request,
    list_partition_reassignments_request,
    metadata_request,
    offset_for_leader_epoch_request,
    produce_request,
    request_schema,
    unregister_broker_request,
)
from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.raft.raft_log import METADATA_TOPIC
from tierlog.records.codec import build_batch
from tierlog.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierlog.security.authorizer import STANDARD_AUTHORIZER, StandardAuthorizer
from tierlog.security.principal import KafkaPrincipal
from tierlog.server.authorized_operations import OMITTED, SUPPORTED_OPERATIONS, to_32_bit_field
from tierlog.server.broker import Broker
from tierlog.server.request_context import authenticated_as, enter_connection

T = TypeVar("T")

TOPIC = "events"
# Where the transactional checks write (their transactions stay open, holding that partition's LSO back).
TRANSACTIONAL_TOPIC = "transactional"
ADMIN = KafkaPrincipal("User", "admin")
TIMEOUT = datetime.timedelta(seconds=5)
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4

Op, Type = AclOperation, ResourceType


class InProcessBroker:
    """One broker (its own controller) with the StandardAuthorizer on an event loop in a thread, shared by the
    module's tests; each test runs coroutines on that loop."""

    def __init__(self, log_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="in-process-broker", daemon=True)
        self._thread.start()
        config = KafkaConfig(
            {
                "log.dirs": str(log_dir),
                "listeners": "PLAINTEXT://127.0.0.1:0",
                "auto.create.topics.enable": "true",
                "authorizer.class.name": STANDARD_AUTHORIZER,
                "super.users": str(ADMIN),
            }
        )
        self.broker = self.run(self._start(config), timeout_s=60)

    async def _start(self, config: KafkaConfig) -> Broker:
        self.broker = Broker(config)
        await self.broker.start()
        for name in (TOPIC, "doomed", "growing", "team.orders", TRANSACTIONAL_TOPIC):
            await self.create_topic(name)
        return self.broker

    async def create_topic(self, name: str) -> None:
        """A topic of one partition, made by the controller itself (no request, so nothing checked)."""
        if name not in self.broker.loader.image.topics:
            self.broker.controller_server.controller.create_topic(name, 1, 1, {})  # type: ignore[union-attr]
            await self.broker.forwarding_manager.sync_metadata()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def call(self, principal: KafkaPrincipal, api_key: int, version: int, body: Any) -> Any:
        """`body` as if `principal` had sent it on the PLAINTEXT listener from 127.0.0.1."""

        async def as_client() -> Any:
            enter_connection("/127.0.0.1", "PLAINTEXT")
            authenticated_as(principal)
            return await self.broker.apis.handle(Request(api_key, version, 1, "matrix", body, 0))

        async def in_own_task() -> Any:
            # A task of its own, so the connection's context stays with it.
            return await asyncio.create_task(as_client())

        return self.run(in_own_task())

    def grant(self, *bindings: AclBinding) -> None:
        """ACLs written to the metadata log by the controller, in force once this broker's image has them."""

        async def write() -> None:
            controller = self.broker.controller_server.controller  # type: ignore[union-attr]
            assert controller.create_acls(bindings) == [None] * len(bindings)
            await self.broker.forwarding_manager.sync_metadata()

        self.run(write())

    def close(self) -> None:
        self.run(self.broker.stop(), timeout_s=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    running = InProcessBroker(tmp_path_factory.mktemp("authorized-broker"))
    try:
        # The group coordinator's topic exists before any test asks for a coordinator.
        request = request_schema(10, 4).FindCoordinatorRequest(key_type=0, coordinator_keys=("warm-up",))
        for _ in range(100):
            (found,) = running.call(ADMIN, 10, 4, request).coordinators
            if found.error_code == ErrorCode.none:
                break
            running.run(asyncio.sleep(0.1))
        yield running
    finally:
        running.close()


def acl(
    principal: KafkaPrincipal,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
    *,
    pattern: PatternType = PatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    host: str = WILDCARD,
) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, pattern), AccessControlEntry(str(principal), host, operation, permission)
    )


# The matrix: one row per check an API makes.


@dataclass(frozen=True)
class Check:
    # Unique: it names the two principals of the row (one is granted `needs`, the other nothing).
    name: str
    api_key: int
    version: int
    request: Callable[[], Any]
    # The error code that shows whether the request passed, out of the response.
    outcome: Callable[[Any], ErrorCode]
    needs: tuple[tuple[AclOperation, ResourceType, str], ...]
    refused: ErrorCode
    # What an allowed principal gets: the broker's answer to this request without any authorizer.
    allowed: ErrorCode


def _s(api_key: int, version: int) -> Any:
    return request_schema(api_key, version)


def _only_partition(field: str, partitions: str = "partitions") -> Callable[[Any], ErrorCode]:
    def outcome(response: Any) -> ErrorCode:
        (topic,) = getattr(response, field)
        (partition,) = getattr(topic, partitions)
        return ErrorCode(partition.error_code)

    return outcome


def _top_level(response: Any) -> ErrorCode:
    return ErrorCode(response.error_code)


def _only(field: str) -> Callable[[Any], ErrorCode]:
    def outcome(response: Any) -> ErrorCode:
        (entry,) = getattr(response, field)
        return ErrorCode(entry.error_code)

    return outcome


def _produce() -> Any:
    batch = build_batch([(None, b"v", [], int(time.time() * 1000))])
    return produce_request(TopicPartition(TOPIC, 0), batch, acks=1, timeout_ms=5000)


# Each transactional Produce and WriteTxnMarkers as a producer of its own.
_data_path_producer_ids = itertools.count(8000)


def _transactional_produce(transactional_id: str) -> Callable[[], Any]:
    def request() -> Any:
        batch = build_batch(
            [(None, b"v", [], int(time.time() * 1000))],
            producer_id=next(_data_path_producer_ids),
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        )
        s = _s(0, 9)
        return s.ProduceRequest(
            transactional_id=transactional_id,
            acks=1,
            timeout=TIMEOUT,
            topic_data=(
                s.TopicProduceData(
                    name=TRANSACTIONAL_TOPIC, partition_data=(s.PartitionProduceData(index=0, records=batch),)
                ),
            ),
        )

    return request


def _write_txn_markers() -> Any:
    s = _s(27, 1)
    return s.WriteTxnMarkersRequest(
        markers=(
            s.WritableTxnMarker(
                producer_id=next(_data_path_producer_ids),
                producer_epoch=0,
                transaction_result=False,
                topics=(s.WritableTxnMarkerTopic(name=TRANSACTIONAL_TOPIC, partition_indexes=(0,)),),
                coordinator_epoch=0,
            ),
        )
    )


def _only_marker_partition(response: Any) -> ErrorCode:
    (marker,) = response.markers
    (topic,) = marker.topics
    (partition,) = topic.partitions
    return ErrorCode(partition.error_code)


def _fetch(replica_id: int, topic: str = TOPIC) -> Callable[[], Any]:
    def request() -> Any:
        partition = PartitionFetch(TopicPartition(topic, 0), fetch_offset=0, partition_max_bytes=1 << 20)
        return fetch_request([partition], max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, replica_id=replica_id)

    return request


def _group_request(api_key: int, version: int, **fields: Any) -> Callable[[], Any]:
    names = {
        11: "JoinGroupRequest",
        12: "HeartbeatRequest",
        13: "LeaveGroupRequest",
        14: "SyncGroupRequest",
        15: "DescribeGroupsRequest",
        42: "DeleteGroupsRequest",
    }
    return lambda: getattr(_s(api_key, version), names[api_key])(**fields)


def _offset_commit(group: str) -> Callable[[], Any]:
    def request() -> Any:
        s = _s(8, 8)
        return s.OffsetCommitRequest(
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                s.OffsetCommitRequestTopic(
                    name=TOPIC,
                    partitions=(
                        s.OffsetCommitRequestPartition(
                            partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""
                        ),
                    ),
                ),
            ),
        )

    return request


def _offset_fetch(group: str) -> Callable[[], Any]:
    def request() -> Any:
        s = _s(9, 8)
        return s.OffsetFetchRequest(
            groups=(
                s.OffsetFetchRequestGroup(
                    group_id=group, topics=(s.OffsetFetchRequestTopics(name=TOPIC, partition_indexes=(0,)),)
                ),
            ),
            require_stable=False,
        )

    return request


def _offset_fetch_group(response: Any) -> ErrorCode:
    (group,) = response.groups
    return ErrorCode(group.error_code)


def _offset_fetch_partition(response: Any) -> ErrorCode:
    (group,) = response.groups
    (topic,) = group.topics
    (partition,) = topic.partitions
    return ErrorCode(partition.error_code)


def _offset_delete(group: str) -> Callable[[], Any]:
    def request() -> Any:
        s = _s(47, 0)
        return s.OffsetDeleteRequest(
            group_id=group,
            topics=(
                s.OffsetDeleteRequestTopic(name=TOPIC, partitions=(s.OffsetDeleteRequestPartition(partition_index=0),)),
            ),
        )

    return request


# Each TxnOffsetCommit as a producer of its own, so no append of the offsets batch is another's retry.
_txn_producer_ids = itertools.count(7000)


def _txn_offset_commit(group: str, transactional_id: str) -> Callable[[], Any]:
    def request() -> Any:
        s = _s(28, 3)
        return s.TxnOffsetCommitRequest(
            transactional_id=transactional_id,
            group_id=group,
            producer_id=next(_txn_producer_ids),
            producer_epoch=0,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                s.TxnOffsetCommitRequestTopic(
                    name=TOPIC,
                    partitions=(
                        s.TxnOffsetCommitRequestPartition(
                            partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""
                        ),
                    ),
                ),
            ),
        )

    return request


def _describe_configs(resource_type: int, name: str) -> Callable[[], Any]:
    def request() -> Any:
        s = _s(32, 4)
        return s.DescribeConfigsRequest(
            resources=(
                s.DescribeConfigsResource(resource_type=resource_type, resource_name=name, configuration_keys=None),
            ),
            include_synonyms=False,
            include_documentation=False,
        )

    return request


def _incremental_alter(resource_type: int, name: str, config: str, value: str) -> Callable[[], Any]:
    def request() -> Any:
        s = _s(44, 1)
        return s.IncrementalAlterConfigsRequest(
            resources=(
                s.AlterConfigsResource(
                    resource_type=resource_type,
                    resource_name=name,
                    configs=(s.AlterableConfig(name=config, config_operation=0, value=value),),
                ),
            ),
            validate_only=True,
        )

    return request


def _alter_configs() -> Any:
    s = _s(33, 2)
    return s.AlterConfigsRequest(
        resources=(
            s.AlterConfigsResource(
                resource_type=RESOURCE_TOPIC,
                resource_name=TOPIC,
                configs=(s.AlterableConfig(name="retention.ms", value="3600000"),),
            ),
        ),
        validate_only=True,
    )


def _create_topics() -> Any:
    s = _s(19, 7)
    return s.CreateTopicsRequest(
        topics=(s.CreatableTopic(name="created", num_partitions=1, replication_factor=1, assignments=(), configs=()),),
        timeout=TIMEOUT,
        validate_only=True,
    )


def _delete_topics() -> Any:
    s = _s(20, 6)
    return s.DeleteTopicsRequest(
        topics=(s.DeleteTopicState(name="doomed", topic_id=uuid.UUID(int=0)),), timeout=TIMEOUT
    )


def _create_partitions() -> Any:
    s = _s(37, 3)
    return s.CreatePartitionsRequest(
        topics=(s.CreatePartitionsTopic(name="growing", count=2, assignments=None),),
        timeout=TIMEOUT,
        validate_only=True,
    )


def _elect_leaders() -> Any:
    s = _s(43, 2)
    return s.ElectLeadersRequest(
        election_type=0, topic_partitions=(s.TopicPartitions(topic=TOPIC, partitions=(0,)),), timeout=TIMEOUT
    )


def _alter_partition_reassignments() -> Any:
    # The partition's own replica again: allowed, it changes nothing.
    return alter_partition_reassignments_request({TopicPartition(TOPIC, 0): [1]}, timeout_ms=5000)


def _delete_records() -> Any:
    s = _s(21, 2)
    return s.DeleteRecordsRequest(
        topics=(s.DeleteRecordsTopic(name=TOPIC, partitions=(s.DeleteRecordsPartition(partition_index=0, offset=0),)),),
        timeout=TIMEOUT,
    )


def _describe_producers() -> Any:
    s = _s(61, 0)
    return s.DescribeProducersRequest(topics=(s.TopicRequest(name=TOPIC, partition_indexes=(0,)),))


def _init_producer_id() -> Any:
    return _s(22, 4).InitProducerIdRequest(
        transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1
    )


def _broker_heartbeat() -> Any:
    return _s(63, 1).BrokerHeartbeatRequest(
        broker_id=7,
        broker_epoch=1,
        current_metadata_offset=0,
        want_fence=False,
        want_shut_down=False,
        offline_log_dirs=(),
    )


# The ACL an allowed CreateAcls creates and an allowed DeleteAcls removes (it grants nothing any test uses).
ACL_FIELDS = {
    "resource_name": "acl-managed",
    "principal": "User:nobody",
    "host": WILDCARD,
    "operation": Op.READ,
    "permission_type": AclPermissionType.ALLOW,
}


def _create_acls() -> Any:
    s = _s(30, 3)
    creation = s.AclCreation(resource_type=Type.TOPIC, resource_pattern_type=PatternType.LITERAL, **ACL_FIELDS)
    return s.CreateAclsRequest(creations=(creation,))


def _acl_filter(builder: Callable[..., Any]) -> Any:
    return builder(
        resource_type_filter=Type.TOPIC,
        resource_name_filter=ACL_FIELDS["resource_name"],
        pattern_type_filter=PatternType.LITERAL,
        principal_filter=ACL_FIELDS["principal"],
        host_filter=WILDCARD,
        operation=Op.READ,
        permission_type=AclPermissionType.ALLOW,
    )


def _alter_scram() -> Any:
    s = _s(51, 0)
    upsertion = s.ScramCredentialUpsertion(
        name="scram-user", mechanism=1, iterations=4096, salt=b"salt", salted_password=bytes(32)
    )
    return s.AlterUserScramCredentialsRequest(deletions=(), upsertions=(upsertion,))


def _describe_scram() -> Any:
    s = _s(50, 0)
    return s.DescribeUserScramCredentialsRequest(users=(s.UserName(name="nobody"),))


def _find_coordinator(group: str) -> Callable[[], Any]:
    return lambda: _s(10, 4).FindCoordinatorRequest(key_type=0, coordinator_keys=(group,))


SESSION = datetime.timedelta(seconds=10)

CHECKS = (
    Check(
        "produce",
        0,
        9,
        _produce,
        _only_partition("responses", "partition_responses"),
        ((Op.WRITE, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "transactional-produce",
        0,
        9,
        _transactional_produce("t-produce"),
        _only_partition("responses", "partition_responses"),
        ((Op.WRITE, Type.TRANSACTIONAL_ID, "t-produce"), (Op.WRITE, Type.TOPIC, TRANSACTIONAL_TOPIC)),
        ErrorCode.transactional_id_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "write-txn-markers",
        27,
        1,
        _write_txn_markers,
        _only_marker_partition,
        ((Op.CLUSTER_ACTION, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "fetch",
        1,
        12,
        _fetch(-1),
        _only_partition("responses"),
        ((Op.READ, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "follower-fetch",
        1,
        12,
        _fetch(2),
        _only_partition("responses"),
        ((Op.CLUSTER_ACTION, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.not_leader_or_follower,
    ),
    Check(
        "list-offsets",
        2,
        7,
        lambda: list_offsets_request(TopicPartition(TOPIC, 0), -1, version=7),
        _only_partition("topics"),
        ((Op.DESCRIBE, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "metadata",
        3,
        12,
        lambda: metadata_request([TOPIC], version=12),
        _only("topics"),
        ((Op.DESCRIBE, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "offset-for-leader-epoch",
        23,
        4,
        lambda: offset_for_leader_epoch_request(TopicPartition(TOPIC, 0), 0, replica_id=-1),
        _only_partition("topics"),
        ((Op.DESCRIBE, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "offset-for-leader-epoch-replica",
        23,
        4,
        lambda: offset_for_leader_epoch_request(TopicPartition(TOPIC, 0), 0, replica_id=2),
        _only_partition("topics"),
        ((Op.CLUSTER_ACTION, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "delete-records",
        21,
        2,
        _delete_records,
        _only_partition("topics"),
        ((Op.DELETE, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "describe-producers",
        61,
        0,
        _describe_producers,
        _only_partition("topics"),
        ((Op.READ, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "init-producer-id",
        22,
        4,
        _init_producer_id,
        _top_level,
        ((Op.IDEMPOTENT_WRITE, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "init-producer-id-topic-writer",
        22,
        4,
        _init_producer_id,
        _top_level,
        ((Op.WRITE, Type.TOPIC, "anything"),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "create-topics-on-topic",
        19,
        7,
        _create_topics,
        _only("topics"),
        ((Op.CREATE, Type.TOPIC, "created"),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "create-topics-on-cluster",
        19,
        7,
        _create_topics,
        _only("topics"),
        ((Op.CREATE, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "delete-topics",
        20,
        6,
        _delete_topics,
        _only("responses"),
        ((Op.DELETE, Type.TOPIC, "doomed"),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "create-partitions",
        37,
        3,
        _create_partitions,
        _only("results"),
        ((Op.ALTER, Type.TOPIC, "growing"),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "elect-leaders",
        43,
        2,
        _elect_leaders,
        _top_level,
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "alter-partition-reassignments",
        45,
        0,
        _alter_partition_reassignments,
        _top_level,
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "alter-partition-reassignments-partition",
        45,
        0,
        _alter_partition_reassignments,
        _only_partition("responses"),
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "list-partition-reassignments",
        46,
        0,
        lambda: list_partition_reassignments_request([TopicPartition(TOPIC, 0)], timeout_ms=5000),
        _top_level,
        ((Op.DESCRIBE, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "unregister-broker",
        64,
        0,
        # An id no broker has: allowed, the controller answers it is not registered.
        lambda: unregister_broker_request(7),
        _top_level,
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.broker_id_not_registered,
    ),
    Check(
        "describe-topic-configs",
        32,
        4,
        _describe_configs(RESOURCE_TOPIC, TOPIC),
        _only("results"),
        ((Op.DESCRIBE_CONFIGS, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "describe-broker-configs",
        32,
        4,
        _describe_configs(RESOURCE_BROKER, "1"),
        _only("results"),
        ((Op.DESCRIBE_CONFIGS, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "alter-topic-configs",
        44,
        1,
        _incremental_alter(RESOURCE_TOPIC, TOPIC, "retention.ms", "3600000"),
        _only("responses"),
        ((Op.ALTER_CONFIGS, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "alter-broker-configs",
        44,
        1,
        _incremental_alter(RESOURCE_BROKER, "", "log.retention.ms", "3600000"),
        _only("responses"),
        ((Op.ALTER_CONFIGS, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "legacy-alter-configs",
        33,
        2,
        _alter_configs,
        _only("responses"),
        ((Op.ALTER_CONFIGS, Type.TOPIC, TOPIC),),
        ErrorCode.topic_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "find-coordinator",
        10,
        4,
        _find_coordinator("g-find"),
        _only("coordinators"),
        ((Op.DESCRIBE, Type.GROUP, "g-find"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "join-group",
        11,
        5,
        _group_request(
            11,
            5,
            group_id="g-join",
            session_timeout=SESSION,
            rebalance_timeout=SESSION,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(_s(11, 5).JoinGroupRequestProtocol(name="range", metadata=b""),),
        ),
        _top_level,
        ((Op.READ, Type.GROUP, "g-join"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.member_id_required,
    ),
    Check(
        "sync-group",
        14,
        5,
        _group_request(
            14,
            5,
            group_id="g-sync",
            generation_id=1,
            member_id="m",
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=(),
        ),
        _top_level,
        ((Op.READ, Type.GROUP, "g-sync"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.unknown_member_id,
    ),
    Check(
        "heartbeat",
        12,
        4,
        _group_request(12, 4, group_id="g-beat", generation_id=1, member_id="m", group_instance_id=None),
        _top_level,
        ((Op.READ, Type.GROUP, "g-beat"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.unknown_member_id,
    ),
    Check(
        "leave-group",
        13,
        5,
        _group_request(
            13,
            5,
            group_id="g-leave",
            members=(_s(13, 5).MemberIdentity(member_id="m", group_instance_id=None, reason=None),),
        ),
        _top_level,
        ((Op.READ, Type.GROUP, "g-leave"),),
        ErrorCode.group_authorization_failed,
        # The member's own error (UNKNOWN_MEMBER_ID) is in its entry.
        ErrorCode.none,
    ),
    Check(
        "offset-commit-group",
        8,
        8,
        _offset_commit("g-commit"),
        _only_partition("topics"),
        ((Op.READ, Type.GROUP, "g-commit"), (Op.READ, Type.TOPIC, TOPIC)),
        ErrorCode.group_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "offset-fetch-group",
        9,
        8,
        _offset_fetch("g-fetch"),
        _offset_fetch_group,
        ((Op.DESCRIBE, Type.GROUP, "g-fetch"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "describe-groups",
        15,
        5,
        _group_request(15, 5, groups=("g-describe",), include_authorized_operations=False),
        _only("groups"),
        ((Op.DESCRIBE, Type.GROUP, "g-describe"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "delete-groups",
        42,
        2,
        _group_request(42, 2, groups_names=("g-delete",)),
        _only("results"),
        ((Op.DELETE, Type.GROUP, "g-delete"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.group_id_not_found,
    ),
    Check(
        "offset-delete",
        47,
        0,
        _offset_delete("g-offset-delete"),
        _top_level,
        ((Op.DELETE, Type.GROUP, "g-offset-delete"),),
        ErrorCode.group_authorization_failed,
        ErrorCode.group_id_not_found,
    ),
    Check(
        "txn-offset-commit",
        28,
        3,
        _txn_offset_commit("g-txn-commit", "t-txn-commit"),
        _only_partition("topics"),
        (
            (Op.WRITE, Type.TRANSACTIONAL_ID, "t-txn-commit"),
            (Op.READ, Type.GROUP, "g-txn-commit"),
            (Op.READ, Type.TOPIC, TOPIC),
        ),
        ErrorCode.transactional_id_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "create-acls",
        30,
        3,
        _create_acls,
        _only("results"),
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "describe-acls",
        29,
        3,
        lambda: _acl_filter(_s(29, 3).DescribeAclsRequest),
        _top_level,
        ((Op.DESCRIBE, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "delete-acls",
        31,
        3,
        lambda: _s(31, 3).DeleteAclsRequest(filters=(_acl_filter(_s(31, 3).DeleteAclsFilter),)),
        _only("filter_results"),
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "alter-user-scram-credentials",
        51,
        0,
        _alter_scram,
        _only("results"),
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "describe-user-scram-credentials",
        50,
        0,
        _describe_scram,
        _only("results"),
        ((Op.DESCRIBE, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        # The user has no credential; the answer says so rather than refusing.
        ErrorCode.resource_not_found,
    ),
    Check(
        "describe-log-dirs",
        35,
        4,
        lambda: describe_log_dirs_request(None, version=4),
        _top_level,
        ((Op.DESCRIBE, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.none,
    ),
    Check(
        "alter-replica-log-dirs",
        34,
        2,
        lambda: _s(34, 2).AlterReplicaLogDirsRequest(
            dirs=(
                _s(34, 2).AlterReplicaLogDir(
                    path="/not/a/log/dir", topics=(_s(34, 2).AlterReplicaLogDirTopic(name=TOPIC, partitions=(0,)),)
                ),
            )
        ),
        _only_partition("results"),
        ((Op.ALTER, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        # Allowed, the request is carried out: that path is not one of the broker's log dirs.
        ErrorCode.log_dir_not_found,
    ),
    Check(
        "broker-heartbeat",
        63,
        1,
        _broker_heartbeat,
        _top_level,
        ((Op.CLUSTER_ACTION, Type.CLUSTER, CLUSTER_NAME),),
        ErrorCode.cluster_authorization_failed,
        ErrorCode.broker_id_not_registered,
    ),
)


@pytest.mark.parametrize("check", CHECKS, ids=[check.name for check in CHECKS])
def test_api_answers_kafkas_error_without_the_acl_and_serves_with_it(broker: InProcessBroker, check: Check) -> None:
    without = KafkaPrincipal("User", f"{check.name}-without")
    granted = KafkaPrincipal("User", f"{check.name}-with")
    broker.grant(*(acl(granted, operation, rtype, name) for operation, rtype, name in check.needs))
    assert check.outcome(broker.call(without, check.api_key, check.version, check.request())) == check.refused
    assert check.outcome(broker.call(granted, check.api_key, check.version, check.request())) == check.allowed


def test_a_super_user_is_allowed_every_api_without_any_acl(broker: InProcessBroker) -> None:
    broker.run(broker.create_topic("doomed"))
    for check in CHECKS:
        assert check.outcome(broker.call(ADMIN, check.api_key, check.version, check.request())) == check.allowed, (
            check.name
        )


def test_offset_commit_and_fetch_need_the_topic_too(broker: InProcessBroker) -> None:
    reader = KafkaPrincipal("User", "group-only")
    broker.grant(acl(reader, Op.READ, Type.GROUP, "g-commit"), acl(reader, Op.DESCRIBE, Type.GROUP, "g-fetch"))
    commit = broker.call(reader, 8, 8, _offset_commit("g-commit")())
    assert _only_partition("topics")(commit) == ErrorCode.topic_authorization_failed
    fetched = broker.call(reader, 9, 8, _offset_fetch("g-fetch")())
    assert (_offset_fetch_group(fetched), _offset_fetch_partition(fetched)) == (
        ErrorCode.none,
        ErrorCode.topic_authorization_failed,
    )


def test_txn_offset_commit_needs_the_group_then_each_topic(broker: InProcessBroker) -> None:
    producer = KafkaPrincipal("User", "txn-producer")
    broker.grant(acl(producer, Op.WRITE, Type.TRANSACTIONAL_ID, "t-partial"))
    request = _txn_offset_commit("g-partial", "t-partial")
    assert _only_partition("topics")(broker.call(producer, 28, 3, request())) == ErrorCode.group_authorization_failed
    broker.grant(acl(producer, Op.READ, Type.GROUP, "g-partial"))
    assert _only_partition("topics")(broker.call(producer, 28, 3, request())) == ErrorCode.topic_authorization_failed
    broker.grant(acl(producer, Op.READ, Type.TOPIC, TOPIC))
    assert _only_partition("topics")(broker.call(producer, 28, 3, request())) == ErrorCode.none


def test_deny_beats_allow(broker: InProcessBroker) -> None:
    user = KafkaPrincipal("User", "denied-writer")
    broker.grant(
        acl(user, Op.ALL, Type.TOPIC, WILDCARD),
        acl(user, Op.WRITE, Type.TOPIC, TOPIC, permission=AclPermissionType.DENY),
    )
    produce = _only_partition("responses", "partition_responses")
    assert produce(broker.call(user, 0, 9, _produce())) == ErrorCode.topic_authorization_failed
    # The DENY of WRITE leaves READ (allowed by ALL) alone.
    assert _only_partition("responses")(broker.call(user, 1, 12, _fetch(-1)())) == ErrorCode.none
    # A DENY for every principal (User:*) beats a principal's own ALLOW of a prefix.
    everyone_denied = KafkaPrincipal("User", "everyone-denied")
    broker.grant(
        acl(everyone_denied, Op.READ, Type.TOPIC, "team.", pattern=PatternType.PREFIXED),
        acl(KafkaPrincipal("User", "*"), Op.READ, Type.TOPIC, "team.orders", permission=AclPermissionType.DENY),
    )
    fetch_orders = _fetch(-1, "team.orders")()
    assert _only_partition("responses")(broker.call(everyone_denied, 1, 12, fetch_orders)) == (
        ErrorCode.topic_authorization_failed
    )


def test_prefixed_patterns_and_hosts(broker: InProcessBroker) -> None:
    user = KafkaPrincipal("User", "team-reader")
    broker.grant(acl(user, Op.DESCRIBE, Type.TOPIC, "team.", pattern=PatternType.PREFIXED))
    answer = broker.call(user, 3, 12, metadata_request(["team.orders", TOPIC], version=12))
    assert {t.name: ErrorCode(t.error_code) for t in answer.topics} == {
        "team.orders": ErrorCode.none,
        TOPIC: ErrorCode.topic_authorization_failed,
    }
    elsewhere = KafkaPrincipal("User", "other-host")
    broker.grant(acl(elsewhere, Op.DESCRIBE, Type.TOPIC, TOPIC, host="10.0.0.1"))
    (topic,) = broker.call(elsewhere, 3, 12, metadata_request([TOPIC], version=12)).topics
    assert topic.error_code == ErrorCode.topic_authorization_failed
    local = KafkaPrincipal("User", "local-host")
    broker.grant(acl(local, Op.DESCRIBE, Type.TOPIC, TOPIC, host="127.0.0.1"))
    (topic,) = broker.call(local, 3, 12, metadata_request([TOPIC], version=12)).topics
    assert topic.error_code == ErrorCode.none


def test_metadata_hides_topics_the_principal_may_not_describe(broker: InProcessBroker) -> None:
    user = KafkaPrincipal("User", "sees-events")
    broker.grant(acl(user, Op.READ, Type.TOPIC, TOPIC))
    every = broker.call(user, 3, 12, metadata_request(None, version=12))
    assert [t.name for t in every.topics] == [TOPIC]
    assert broker.call(KafkaPrincipal("User", "sees-nothing"), 3, 12, metadata_request(None, version=12)).topics == ()
    assert TOPIC in {t.name for t in broker.call(ADMIN, 3, 12, metadata_request(None, version=12)).topics}
    # A topic named by id that the principal may not describe keeps its id, never its name.
    topic_id = broker.broker.loader.image.topics["growing"].topic_id
    s = _s(3, 12)
    by_id = s.MetadataRequest(
        topics=(s.MetadataRequestTopic(topic_id=topic_id, name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (topic,) = broker.call(user, 3, 12, by_id).topics
    assert (topic.name, topic.topic_id, topic.error_code) == (None, topic_id, ErrorCode.topic_authorization_failed)


def test_metadata_auto_creates_only_with_create(broker: InProcessBroker) -> None:
    describer = KafkaPrincipal("User", "describer")
    creator = KafkaPrincipal("User", "creator")
    broker.grant(
        acl(describer, Op.DESCRIBE, Type.TOPIC, "auto-", pattern=PatternType.PREFIXED),
        acl(creator, Op.DESCRIBE, Type.TOPIC, "auto-", pattern=PatternType.PREFIXED),
        acl(creator, Op.CREATE, Type.TOPIC, "auto-", pattern=PatternType.PREFIXED),
    )
    s = _s(3, 12)

    def asking(name: str) -> Any:
        return s.MetadataRequest(
            topics=(s.MetadataRequestTopic(topic_id=None, name=name),),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )

    (refused,) = broker.call(describer, 3, 12, asking("auto-one")).topics
    assert refused.error_code == ErrorCode.topic_authorization_failed
    assert "auto-one" not in broker.broker.loader.image.topics
    (created,) = broker.call(creator, 3, 12, asking("auto-two")).topics
    assert (created.name, created.error_code) == ("auto-two", ErrorCode.none)


def test_list_groups_shows_only_describable_groups_without_cluster_describe(broker: InProcessBroker) -> None:
    for group in ("listed-a", "listed-b"):
        commit = _offset_commit(group)()
        assert _only_partition("topics")(broker.call(ADMIN, 8, 8, commit)) == ErrorCode.none
    user = KafkaPrincipal("User", "lists-a")
    broker.grant(acl(user, Op.DESCRIBE, Type.GROUP, "listed-a"))
    request = _s(16, 4).ListGroupsRequest(states_filter=())
    assert {g.group_id for g in broker.call(user, 16, 4, request).groups} == {"listed-a"}
    cluster_describer = KafkaPrincipal("User", "lists-all")
    broker.grant(acl(cluster_describer, Op.DESCRIBE, Type.CLUSTER, CLUSTER_NAME))
    assert {"listed-a", "listed-b"} <= {g.group_id for g in broker.call(cluster_describer, 16, 4, request).groups}


def test_authorized_operations_are_what_the_authorizer_allows(broker: InProcessBroker) -> None:
    user = KafkaPrincipal("User", "kip-430")
    broker.grant(
        acl(user, Op.READ, Type.TOPIC, TOPIC),
        acl(user, Op.DESCRIBE, Type.CLUSTER, CLUSTER_NAME),
        acl(user, Op.READ, Type.GROUP, "listed-a"),
    )
    metadata = broker.call(user, 3, 10, metadata_request([TOPIC], include_authorized_operations=True, version=10))
    (topic,) = metadata.topics
    # READ implies DESCRIBE (Kafka's implied operations).
    assert topic.topic_authorized_operations == to_32_bit_field((Op.READ, Op.DESCRIBE))
    assert metadata.cluster_authorized_operations == to_32_bit_field((Op.DESCRIBE,))
    cluster = _s(60, 1).DescribeClusterRequest(include_cluster_authorized_operations=True, endpoint_type=1)
    assert broker.call(user, 60, 1, cluster).cluster_authorized_operations == to_32_bit_field((Op.DESCRIBE,))
    # Without DESCRIBE on the cluster the field is 0 (and the request is still answered).
    stranger = KafkaPrincipal("User", "stranger")
    assert broker.call(stranger, 60, 1, cluster).cluster_authorized_operations == 0
    assert broker.call(ADMIN, 60, 1, cluster).cluster_authorized_operations == to_32_bit_field(
        SUPPORTED_OPERATIONS[Type.CLUSTER]
    )
    groups = _s(15, 5).DescribeGroupsRequest(groups=("listed-a",), include_authorized_operations=True)
    (group,) = broker.call(user, 15, 5, groups).groups
    assert group.authorized_operations == to_32_bit_field((Op.READ, Op.DESCRIBE))
    not_asked = _s(15, 5).DescribeGroupsRequest(groups=("listed-a",), include_authorized_operations=False)
    assert broker.call(user, 15, 5, not_asked).groups[0].authorized_operations == OMITTED


def test_requests_made_inside_the_broker_are_not_checked(broker: InProcessBroker) -> None:
    async def from_inside() -> Any:
        return await broker.broker.apis.handle(Request(0, 9, 1, "inside", _produce(), 0))

    answer = broker.run(from_inside())
    assert _only_partition("responses", "partition_responses")(answer) == ErrorCode.none


def test_offset_fetch_of_every_partition_leaves_out_topics_not_describable(broker: InProcessBroker) -> None:
    s = _s(8, 8)
    commit = s.OffsetCommitRequest(
        group_id="g-all-offsets",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=tuple(
            s.OffsetCommitRequestTopic(
                name=name,
                partitions=(
                    s.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""
                    ),
                ),
            )
            for name in (TOPIC, "growing")
        ),
    )
    assert {t.name for t in broker.call(ADMIN, 8, 8, commit).topics} == {TOPIC, "growing"}
    user = KafkaPrincipal("User", "fetches-all-offsets")
    broker.grant(acl(user, Op.DESCRIBE, Type.GROUP, "g-all-offsets"), acl(user, Op.DESCRIBE, Type.TOPIC, TOPIC))
    f = _s(9, 8)
    every = f.OffsetFetchRequest(
        groups=(f.OffsetFetchRequestGroup(group_id="g-all-offsets", topics=None),), require_stable=False
    )
    (group,) = broker.call(user, 9, 8, every).groups
    assert (group.error_code, [t.name for t in group.topics]) == (ErrorCode.none, [TOPIC])


def test_create_topics_without_describe_configs_answers_no_configs(broker: InProcessBroker) -> None:
    user = KafkaPrincipal("User", "creates-blind")
    broker.grant(acl(user, Op.CREATE, Type.TOPIC, "created"))
    (blind,) = broker.call(user, 19, 7, _create_topics()).topics
    assert (blind.error_code, blind.topic_config_error_code, blind.configs, blind.num_partitions) == (
        ErrorCode.none,
        ErrorCode.topic_authorization_failed,
        (),
        -1,
    )
    (seeing,) = broker.call(ADMIN, 19, 7, _create_topics()).topics
    assert (seeing.topic_config_error_code, seeing.num_partitions) == (ErrorCode.none, 1) and seeing.configs


def test_delete_topics_by_id_never_names_a_topic_the_principal_may_not_describe(broker: InProcessBroker) -> None:
    broker.run(broker.create_topic("kept"))
    topic_id = broker.broker.loader.image.topics["kept"].topic_id
    s = _s(20, 6)
    request = s.DeleteTopicsRequest(topics=(s.DeleteTopicState(name=None, topic_id=topic_id),), timeout=TIMEOUT)
    (hidden,) = broker.call(KafkaPrincipal("User", "blind-deleter"), 20, 6, request).responses
    assert (hidden.name, hidden.topic_id, hidden.error_code) == (None, topic_id, ErrorCode.topic_authorization_failed)
    describer = KafkaPrincipal("User", "seeing-deleter")
    broker.grant(acl(describer, Op.DESCRIBE, Type.TOPIC, "kept"))
    (named,) = broker.call(describer, 20, 6, request).responses
    assert (named.name, named.error_code) == ("kept", ErrorCode.topic_authorization_failed)
    assert "kept" in broker.broker.loader.image.topics


@pytest.mark.parametrize(
    ("bindings", "allowed"),
    [
        ((), False),
        (((AclPermissionType.ALLOW, PatternType.LITERAL, "orders"),), True),
        # A LITERAL DENY of the same name, or a PREFIXED DENY of a prefix of it, leaves that ALLOW nothing.
        (
            (
                (AclPermissionType.ALLOW, PatternType.LITERAL, "orders"),
                (AclPermissionType.DENY, PatternType.LITERAL, "orders"),
            ),
            False,
        ),
        (
            (
                (AclPermissionType.ALLOW, PatternType.PREFIXED, "ord"),
                (AclPermissionType.DENY, PatternType.PREFIXED, "or"),
            ),
            False,
        ),
        (
            (
                (AclPermissionType.ALLOW, PatternType.PREFIXED, "or"),
                (AclPermissionType.DENY, PatternType.PREFIXED, "ord"),
            ),
            True,
        ),
        # A DENY elsewhere leaves another ALLOW standing; a LITERAL "*" DENY refuses every one.
        (
            (
                (AclPermissionType.ALLOW, PatternType.LITERAL, "orders"),
                (AclPermissionType.DENY, PatternType.LITERAL, "sales"),
            ),
            True,
        ),
        (
            (
                (AclPermissionType.ALLOW, PatternType.LITERAL, WILDCARD),
                (AclPermissionType.DENY, PatternType.LITERAL, WILDCARD),
            ),
            False,
        ),
        (((AclPermissionType.ALLOW, PatternType.LITERAL, WILDCARD),), True),
    ],
)
def test_write_on_some_topic_is_kafkas_authorize_by_resource_type(
    bindings: tuple[tuple[AclPermissionType, PatternType, str], ...], allowed: bool
) -> None:
    """What InitProducerId asks of an idempotent producer without IDEMPOTENT_WRITE (KIP-679)."""
    writer = KafkaPrincipal("User", "writer")
    authorizer = StandardAuthorizer()
    for permission, pattern, name in bindings:
        authorizer.add_acl(
            uuid.uuid4(), acl(writer, Op.WRITE, Type.TOPIC, name, pattern=pattern, permission=permission)
        )
    assert authorizer.authorize_by_resource_type(writer, "127.0.0.1", Op.WRITE, Type.TOPIC) is allowed
    assert StandardAuthorizer({str(writer)}).authorize_by_resource_type(writer, "127.0.0.1", Op.WRITE, Type.TOPIC)


def test_describe_quorum_without_describe_on_the_cluster_is_refused_before_it_is_forwarded(
    broker: InProcessBroker,
) -> None:
    # Allowed, the broker forwards it to the controller (whose DescribeQuorum answer comes with the Raft quorum);
    # refused, it never leaves the broker.
    outsider = KafkaPrincipal("User", "describe-quorum-without")
    response = broker.call(outsider, 55, 2, describe_quorum_request(METADATA_TOPIC))
    assert _top_level(response) == ErrorCode.cluster_authorization_failed
    assert response.topics == ()

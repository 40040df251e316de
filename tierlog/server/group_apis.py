"""Handlers of the group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete and TxnOffsetCommit.

Each turns a request entity (any version the broker advertises) into a call on the GroupCoordinator core
and its answer back into the response of that version, through `ResponseSchema`. Parked requests
(JoinGroup, SyncGroup, OffsetCommit) await a future the core's callback resolves. Each first checks what Kafka's
KafkaApis checks (docs/security.md#api-checks).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.coordinator.group.group_coordinator import GroupDescription, TxnProducer
from tierlog.coordinator.group.member_metadata import JoinGroupResult, SyncGroupResult
from tierlog.coordinator.group.records import OffsetAndMetadata
from tierlog.metadata.image import ClusterMetadata
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.security.acl import AclOperation, ResourceType
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.authorized_operations import OMITTED
from tierlog.server.clock import now_ms
from tierlog.server.coordinator_runtime import parked
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema
from tierlog.server.group_coordinator import GroupCoordinatorService
from tierlog.server.request_context import client_host, listener_name

API_OFFSET_COMMIT = 8
API_OFFSET_FETCH = 9
API_FIND_COORDINATOR = 10
API_JOIN_GROUP = 11
API_HEARTBEAT = 12
API_LEAVE_GROUP = 13
API_SYNC_GROUP = 14
API_DESCRIBE_GROUPS = 15
API_LIST_GROUPS = 16
API_DELETE_GROUPS = 42
API_TXN_OFFSET_COMMIT = 28
API_OFFSET_DELETE = 47

COORDINATOR_KEY_GROUP = 0

T = TypeVar("T")
Handler = Callable[[Request], Awaitable[Any]]


def _ms(value: Any) -> int:
    """A kio timedelta field as Kafka's milliseconds."""
    return round(value.total_seconds() * 1000)


# (error, message, node id, host, port) of one coordinator key.
CoordinatorLookup = tuple[str | None, str | None, int, str, int]


class CoordinatorService(Protocol):
    def topic_ready(self) -> str | None: ...

    def leader_of(self, key: str) -> int: ...


def coordinator_of(
    service: CoordinatorService, key: str, config: KafkaConfig, image: ClusterMetadata, no_leader: str
) -> CoordinatorLookup:
    """The leader of `key`'s partition of the coordinator's topic, at its endpoint on the listener the request
    came in on; COORDINATOR_NOT_AVAILABLE while the topic is being created or the partition has no leader."""
    not_ready = service.topic_ready()
    if not_ready is not None:
        return "COORDINATOR_NOT_AVAILABLE", not_ready, -1, "", -1
    leader = service.leader_of(key)
    endpoint = image.endpoint_of(leader, config.answering_listener_name(listener_name())) if leader >= 0 else None
    if endpoint is None:
        return "COORDINATOR_NOT_AVAILABLE", no_leader, -1, "", -1
    return None, None, leader, endpoint.host, endpoint.port


def find_coordinator_response(request: Request, find: Callable[[str], CoordinatorLookup]) -> Any:
    """FindCoordinator's answer for every key of the request (v4+ batches them, KIP-699; older versions ask for one
    key and get it in the top-level fields)."""
    s = response_schema(request.api_key, request.api_version)
    body = request.body
    keys = body.coordinator_keys if request.api_version >= 4 else (body.key,)
    found = [(key, *find(key)) for key in keys]
    _, error, message, node_id, host, port = found[0]
    return s.FindCoordinatorResponse(
        throttle_time=NO_THROTTLE,
        error_code=error_code(error),
        error_message=message,
        node_id=node_id,
        host=host,
        port=port,
        coordinators=tuple(
            s.Coordinator(key=k, node_id=n, host=h, port=p, error_code=error_code(e), error_message=m)
            for k, e, m, n, h, p in found
        ),
    )


class GroupApis:
    def __init__(
        self,
        config: KafkaConfig,
        service: GroupCoordinatorService,
        image: Callable[[], ClusterMetadata],
        auth: AuthHelper,
    ) -> None:
        self.service = service
        self.auth = auth
        self.coordinator = service.coordinator
        self._image = image
        self._node_id = config.node_id
        self._config = config
        self.handlers: dict[int, Handler] = {
            API_FIND_COORDINATOR: self.handle_find_coordinator,
            API_JOIN_GROUP: self.handle_join_group,
            API_SYNC_GROUP: self.handle_sync_group,
            API_HEARTBEAT: self.handle_heartbeat,
            API_LEAVE_GROUP: self.handle_leave_group,
            API_OFFSET_COMMIT: self.handle_offset_commit,
            API_OFFSET_FETCH: self.handle_offset_fetch,
            API_LIST_GROUPS: self.handle_list_groups,
            API_DESCRIBE_GROUPS: self.handle_describe_groups,
            API_DELETE_GROUPS: self.handle_delete_groups,
            API_OFFSET_DELETE: self.handle_offset_delete,
            API_TXN_OFFSET_COMMIT: self.handle_txn_offset_commit,
        }

    @staticmethod
    def _schema(request: Request) -> ResponseSchema:
        return response_schema(request.api_key, request.api_version)

    def _may_read(self, group_id: str) -> bool:
        """READ on the group: what joining, syncing, heartbeating, leaving and committing need."""
        return self.auth.authorize(AclOperation.READ, ResourceType.GROUP, group_id)

    def _exists(self, tp: TopicPartition) -> bool:
        topic = self._image().topics.get(tp.topic)
        return topic is not None and 0 <= tp.partition < len(topic.partitions)

    async def _parked(self, call: Callable[[Callable[[T], None]], None]) -> T:
        return await parked(call, self.service.after_call)

    # FindCoordinator

    def _find(self, key_type: int, key: str) -> CoordinatorLookup:
        """(error, message, node id, host, port) for one coordinator key (transactional ids, key type 1, are the
        transaction APIs', which answer them before they reach here)."""
        if key_type == COORDINATOR_KEY_GROUP and not self.auth.authorize(
            AclOperation.DESCRIBE, ResourceType.GROUP, key
        ):
            return "GROUP_AUTHORIZATION_FAILED", None, -1, "", -1
        if key_type != COORDINATOR_KEY_GROUP:
            return "INVALID_REQUEST", f"unknown coordinator key type {key_type}", -1, "", -1
        return coordinator_of(
            self.service, key, self._config, self._image(), "the group's __consumer_offsets partition has no leader"
        )

    async def handle_find_coordinator(self, request: Request) -> Any:
        key_type = getattr(request.body, "key_type", COORDINATOR_KEY_GROUP)
        return find_coordinator_response(request, lambda key: self._find(key_type, key))

    # Membership

    async def handle_join_group(self, request: Request) -> Any:
        body = request.body
        version = request.api_version
        s = self._schema(request)
        if not self._may_read(body.group_id):
            return s.JoinGroupResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code("GROUP_AUTHORIZATION_FAILED"),
                generation_id=-1,
                protocol_type=None,
                protocol_name=None if version >= 7 else "",
                leader="",
                skip_assignment=False,
                member_id="",
                members=(),
            )
        session_timeout_ms = _ms(body.session_timeout)
        rebalance_timeout_ms = _ms(body.rebalance_timeout) if version >= 1 else session_timeout_ms
        result: JoinGroupResult = await self._parked(
            lambda respond: self.coordinator.join_group(
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                version >= 4,
                request.client_id or "",
                client_host(),
                rebalance_timeout_ms,
                session_timeout_ms,
                body.protocol_type,
                [(p.name, p.metadata) for p in body.protocols],
                now_ms(),
                respond,
            )
        )
        return s.JoinGroupResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(result.error),
            generation_id=result.generation_id,
            protocol_type=result.protocol_type,
            # Nullable only from v7; older versions send "" (Kafka's JoinGroupResponse does the same).
            protocol_name=result.protocol_name if result.protocol_name is not None or version >= 7 else "",
            leader=result.leader_id,
            skip_assignment=result.skip_assignment,
            member_id=result.member_id,
            members=tuple(
                s.JoinGroupResponseMember(
                    member_id=m.member_id, group_instance_id=m.group_instance_id, metadata=m.metadata
                )
                for m in result.members
            ),
        )

    async def handle_sync_group(self, request: Request) -> Any:
        body = request.body
        if not self._may_read(body.group_id):
            return self._schema(request).SyncGroupResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code("GROUP_AUTHORIZATION_FAILED"),
                protocol_type=None,
                protocol_name=None,
                assignment=b"",
            )
        result: SyncGroupResult = await self._parked(
            lambda respond: self.coordinator.sync_group(
                body.group_id,
                body.generation_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                getattr(body, "protocol_type", None),
                getattr(body, "protocol_name", None),
                {a.member_id: a.assignment for a in body.assignments},
                now_ms(),
                respond,
            )
        )
        return self._schema(request).SyncGroupResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(result.error),
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    async def handle_heartbeat(self, request: Request) -> Any:
        body = request.body
        if not self._may_read(body.group_id):
            error: str | None = "GROUP_AUTHORIZATION_FAILED"
        else:
            error = self.coordinator.heartbeat(
                body.group_id, body.member_id, getattr(body, "group_instance_id", None), body.generation_id, now_ms()
            )
            self.service.after_call()
        return self._schema(request).HeartbeatResponse(throttle_time=NO_THROTTLE, error_code=error_code(error))

    async def handle_leave_group(self, request: Request) -> Any:
        body = request.body
        s = self._schema(request)
        if not self._may_read(body.group_id):
            return s.LeaveGroupResponse(
                throttle_time=NO_THROTTLE, error_code=error_code("GROUP_AUTHORIZATION_FAILED"), members=()
            )
        if request.api_version >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        else:
            leaving = [(body.member_id, None)]
        error, member_errors = self.coordinator.leave_group(body.group_id, leaving, now_ms())
        self.service.after_call()
        if request.api_version < 3 and error is None and member_errors:
            # Before batching, the single member's error is the response's.
            error = member_errors[0]
        return s.LeaveGroupResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(error),
            members=tuple(
                s.MemberResponse(member_id=member_id, group_instance_id=instance_id, error_code=error_code(e))
                for (member_id, instance_id), e in zip(leaving, member_errors, strict=False)
            ),
        )

    # Offsets

    async def handle_offset_commit(self, request: Request) -> Any:
        body = request.body
        now = now_ms()
        retention = getattr(body, "retention_time", None)
        retention_ms = _ms(retention) if retention is not None else -1
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        requested: list[TopicPartition] = []
        errors: dict[TopicPartition, str | None] = {}
        # Kafka's KafkaApis: READ on the group, else every partition is refused; READ on each topic.
        group_readable = self._may_read(body.group_id)
        readable = self.auth.filter_authorized(AclOperation.READ, ResourceType.TOPIC, (t.name for t in body.topics))
        for topic in body.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                requested.append(tp)
                if not group_readable:
                    errors[tp] = "GROUP_AUTHORIZATION_FAILED"
                elif topic.name not in readable:
                    errors[tp] = "TOPIC_AUTHORIZATION_FAILED"
                elif not self._exists(tp):
                    # Kafka's KafkaApis refuses these before the coordinator sees the request.
                    errors[tp] = "UNKNOWN_TOPIC_OR_PARTITION"
                if tp in errors:
                    continue
                offsets[tp] = OffsetAndMetadata(
                    offset=p.committed_offset,
                    leader_epoch=getattr(p, "committed_leader_epoch", -1),
                    metadata=p.committed_metadata or "",
                    commit_timestamp=now,
                    expire_timestamp=now + retention_ms if retention_ms >= 0 else -1,
                )
        if offsets:
            errors |= await self._parked(
                lambda respond: self.coordinator.commit_offsets(
                    body.group_id,
                    body.member_id,
                    getattr(body, "group_instance_id", None),
                    body.generation_id_or_member_epoch,
                    offsets,
                    now,
                    respond,
                )
            )
        s = self._schema(request)
        partitions = [
            (tp, s.OffsetCommitResponsePartition(partition_index=tp.partition, error_code=error_code(errors.get(tp))))
            for tp in dict.fromkeys(requested)
        ]
        return s.OffsetCommitResponse(
            throttle_time=NO_THROTTLE, topics=_by_topic(s.OffsetCommitResponseTopic, partitions)
        )

    async def handle_txn_offset_commit(self, request: Request) -> Any:
        """TxnOffsetCommit (docs/transactions.md#offsets): Kafka's handleTxnOffsetCommitRequest checks WRITE on the
        transactional id, then READ on the group (either refuses every partition), then READ on each topic."""
        body = request.body
        now = now_ms()
        requested = [TopicPartition(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        errors: dict[TopicPartition, str | None] = {}
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        if not self.auth.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
            errors = dict.fromkeys(requested, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
        elif not self._may_read(body.group_id):
            errors = dict.fromkeys(requested, "GROUP_AUTHORIZATION_FAILED")
        else:
            readable = self.auth.filter_authorized(AclOperation.READ, ResourceType.TOPIC, (t.name for t in body.topics))
            for topic in body.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    if topic.name not in readable:
                        errors[tp] = "TOPIC_AUTHORIZATION_FAILED"
                    elif not self._exists(tp):
                        errors[tp] = "UNKNOWN_TOPIC_OR_PARTITION"
                    else:
                        offsets[tp] = OffsetAndMetadata(
                            offset=p.committed_offset,
                            leader_epoch=getattr(p, "committed_leader_epoch", -1),
                            metadata=p.committed_metadata or "",
                            commit_timestamp=now,
                        )
        if offsets:
            errors |= await self._parked(
                lambda respond: self.coordinator.commit_transactional_offsets(
                    body.group_id,
                    TxnProducer(body.producer_id, body.producer_epoch),
                    getattr(body, "member_id", ""),
                    getattr(body, "group_instance_id", None),
                    getattr(body, "generation_id", -1),
                    offsets,
                    now,
                    respond,
                )
            )
        if request.api_version < 2:
            # Kafka: producers before 2.0 (KAFKA-7296) do not retry COORDINATOR_LOAD_IN_PROGRESS here.
            errors = {
                tp: "COORDINATOR_NOT_AVAILABLE" if e == "COORDINATOR_LOAD_IN_PROGRESS" else e
                for tp, e in errors.items()
            }
        s = self._schema(request)
        partitions = [
            (tp, s.TxnOffsetCommitResponsePartition(partition_index=tp.partition, error_code=error_code(errors[tp])))
            for tp in dict.fromkeys(requested)
        ]
        return s.TxnOffsetCommitResponse(
            throttle_time=NO_THROTTLE, topics=_by_topic(s.TxnOffsetCommitResponseTopic, partitions)
        )

    async def handle_offset_fetch(self, request: Request) -> Any:
        body = request.body
        s = self._schema(request)
        # KIP-447 (v7+): a read_committed consumer asks for offsets no transaction or commit is still writing.
        require_stable = getattr(body, "require_stable", False)
        if request.api_version >= 8:
            groups = []
            for group in body.groups:
                error, topics = self._fetch_group(
                    s, group.group_id, group.topics, "Topics", "Partitions", require_stable=require_stable
                )
                groups.append(s.OffsetFetchResponseGroup(group_id=group.group_id, topics=topics, error_code=error))
            return s.OffsetFetchResponse(throttle_time=NO_THROTTLE, groups=tuple(groups))
        error, topics = self._fetch_group(
            s, body.group_id, body.topics, "Topic", "Partition", request.api_version, require_stable
        )
        return s.OffsetFetchResponse(throttle_time=NO_THROTTLE, topics=topics, error_code=error)

    def _fetch_group(
        self,
        s: ResponseSchema,
        group_id: str,
        requested: Any,
        topic_suffix: str,
        partition_suffix: str,
        version: int = 8,
        require_stable: bool = False,
    ) -> tuple[Any, tuple[Any, ...]]:
        """One group's (error code, topics); kio names the nested classes differently before v8.

        Kafka's KafkaApis: DESCRIBE on the group, else the group's error alone; a topic the principal may not
        describe is answered TOPIC_AUTHORIZATION_FAILED when named, and left out of an all-offsets answer."""
        topic_cls = getattr(s, "OffsetFetchResponse" + topic_suffix)
        partition_cls = getattr(s, "OffsetFetchResponse" + partition_suffix)
        if not self.auth.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            return error_code("GROUP_AUTHORIZATION_FAILED"), ()
        refused: list[TopicPartition] = []
        if requested is None:
            partitions = None
        else:
            describable = self.auth.filter_authorized(
                AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in requested)
            )
            partitions = [
                TopicPartition(t.name, index)
                for t in requested
                if t.name in describable
                for index in t.partition_indexes
            ]
            refused = [
                TopicPartition(t.name, index)
                for t in requested
                if t.name not in describable
                for index in t.partition_indexes
            ]
        error, fetched = self.coordinator.fetch_offsets(group_id, partitions, require_stable)
        if error is not None and partitions is not None and version < 2:
            # v0-1 have no group-level error: each partition carries it.
            fetched = {tp: None for tp in partitions}
        if requested is None:
            describable = self.auth.filter_authorized(
                AclOperation.DESCRIBE, ResourceType.TOPIC, (tp.topic for tp in fetched)
            )
            fetched = {tp: o for tp, o in fetched.items() if tp.topic in describable}
        answers = [
            (
                tp,
                partition_cls(
                    partition_index=tp.partition,
                    committed_offset=o.offset if o else -1,
                    committed_leader_epoch=o.leader_epoch if o else -1,
                    metadata=o.metadata if o else "",
                    error_code=error_code(error if o is None else o.error),
                ),
            )
            for tp, o in fetched.items()
        ]
        if error is None:
            answers += [
                (
                    tp,
                    partition_cls(
                        partition_index=tp.partition,
                        committed_offset=-1,
                        committed_leader_epoch=-1,
                        metadata="",
                        error_code=error_code("TOPIC_AUTHORIZATION_FAILED"),
                    ),
                )
                for tp in refused
            ]
        return error_code(error), _by_topic(topic_cls, answers)

    async def handle_offset_delete(self, request: Request) -> Any:
        body = request.body
        s = self._schema(request)
        if not self.auth.authorize(AclOperation.DELETE, ResourceType.GROUP, body.group_id):
            return s.OffsetDeleteResponse(
                error_code=error_code("GROUP_AUTHORIZATION_FAILED"), throttle_time=NO_THROTTLE, topics=()
            )
        readable = self.auth.filter_authorized(AclOperation.READ, ResourceType.TOPIC, (t.name for t in body.topics))
        requested = [TopicPartition(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        known = [tp for tp in requested if tp.topic in readable and self._exists(tp)]
        error, errors = self.coordinator.delete_offsets(body.group_id, known, now_ms())
        self.service.after_call()
        errors.update(
            {
                tp: "TOPIC_AUTHORIZATION_FAILED" if tp.topic not in readable else "UNKNOWN_TOPIC_OR_PARTITION"
                for tp in requested
                if tp not in known
            }
        )
        # A group-level error answers no partition.
        partitions = [
            (tp, s.OffsetDeleteResponsePartition(partition_index=tp.partition, error_code=error_code(errors[tp])))
            for tp in dict.fromkeys(requested)
            if error is None
        ]
        return s.OffsetDeleteResponse(
            error_code=error_code(error),
            throttle_time=NO_THROTTLE,
            topics=_by_topic(s.OffsetDeleteResponseTopic, partitions),
        )

    # Groups

    async def handle_list_groups(self, request: Request) -> Any:
        body = request.body
        s = self._schema(request)
        error, groups = self.coordinator.list_groups(
            set(getattr(body, "states_filter", ())), set(getattr(body, "types_filter", ()))
        )
        # DESCRIBE on the cluster lists every group; otherwise only the groups the principal may describe.
        if not self.auth.authorize_cluster(AclOperation.DESCRIBE):
            describable = self.auth.filter_authorized(
                AclOperation.DESCRIBE, ResourceType.GROUP, (g.group_id for g in groups)
            )
            groups = [g for g in groups if g.group_id in describable]
        return s.ListGroupsResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(error),
            groups=tuple(
                s.ListedGroup(
                    group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state, group_type="classic"
                )
                for g in groups
            ),
        )

    async def handle_describe_groups(self, request: Request) -> Any:
        s = self._schema(request)
        # v3+ may ask for the operations; Kafka answers them for every group it could describe.
        asks_operations = getattr(request.body, "include_authorized_operations", False)
        describable = self.auth.filter_authorized(AclOperation.DESCRIBE, ResourceType.GROUP, request.body.groups)
        described = []
        for group_id in request.body.groups:
            d = (
                self.coordinator.describe_group(group_id)
                if group_id in describable
                else GroupDescription(group_id, "GROUP_AUTHORIZATION_FAILED")
            )
            operations = OMITTED
            if asks_operations and d.error is None:
                operations = self.auth.authorized_operations(ResourceType.GROUP, group_id)
            described.append(
                s.DescribedGroup(
                    error_code=error_code(d.error),
                    group_id=group_id,
                    group_state=d.state,
                    protocol_type=d.protocol_type,
                    protocol_data=d.protocol,
                    members=tuple(
                        s.DescribedGroupMember(
                            member_id=m.member_id,
                            group_instance_id=m.group_instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata,
                            member_assignment=m.assignment,
                        )
                        for m in d.members
                    ),
                    authorized_operations=operations,
                )
            )
        return s.DescribeGroupsResponse(throttle_time=NO_THROTTLE, groups=tuple(described))

    async def handle_delete_groups(self, request: Request) -> Any:
        s = self._schema(request)
        names = list(dict.fromkeys(request.body.groups_names))
        deletable = self.auth.filter_authorized(AclOperation.DELETE, ResourceType.GROUP, names)
        results = self.coordinator.delete_groups([g for g in names if g in deletable], now_ms())
        self.service.after_call()
        results |= {g: "GROUP_AUTHORIZATION_FAILED" for g in names if g not in deletable}
        return s.DeleteGroupsResponse(
            throttle_time=NO_THROTTLE,
            results=tuple(
                s.DeletableGroupResult(group_id=group_id, error_code=error_code(error))
                for group_id, error in results.items()
            ),
        )


def _by_topic(topic_response: Callable[..., Any], partitions: Iterable[tuple[TopicPartition, Any]]) -> tuple[Any, ...]:
    """Partition responses as the topic responses (`name`, `partitions`) holding them, topics in the order they
    first come."""
    grouped: dict[str, list[Any]] = {}
    for tp, partition in partitions:
        grouped.setdefault(tp.topic, []).append(partition)
    return tuple(topic_response(name=name, partitions=tuple(parts)) for name, parts in grouped.items())

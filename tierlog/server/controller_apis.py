"""ControllerApis (Kafka's class of that name): the requests the controller decides, on the controller's own node.

- The admin requests only the controller decides: CreateTopics, DeleteTopics, CreatePartitions, ElectLeaders,
  CreateAcls, DeleteAcls, AlterUserScramCredentials, AlterPartitionReassignments, ListPartitionReassignments and
  UnregisterBroker (docs/reassignment.md).
  They reach it through the `ForwardingManager`, from this node's own KafkaApis or forwarded by another broker.
- The controller APIs brokers call: BrokerRegistration, BrokerHeartbeat, AlterPartition, AllocateProducerIds,
  and the Fetch of `__cluster_metadata` (KRaft brokers follow the metadata log like any partition).
- The controller quorum's APIs other voters call: Vote, BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot and the
  Fetch of `__cluster_metadata` by a voter, answered by the Raft core through the `RaftManager`; and
  DescribeQuorum (`kafka-metadata-quorum.sh`), answered by the leader (docs/quorum.md#the-wire).

Each turns a request entity into a call on `tierlog.controller.controller.Controller`, where the rules live,
and its answer into the response of the request's version. Only the active controller of the quorum decides:
elsewhere every request is answered NOT_CONTROLLER, and the active one answers only once what the request
wrote is committed, NOT_CONTROLLER if it lost leadership first (docs/quorum.md#active-controller). The metadata
Fetch of a broker is answered by the Raft core, which gives brokers (observers) committed records only. What
brokers ask needs CLUSTER_ACTION on the cluster (docs/security.md#api-checks); the admin requests are checked
where the client sent them (`tierlog.server.admin_authorization`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from tierlog.client.raft_requests import (
    API_BEGIN_QUORUM_EPOCH,
    API_DESCRIBE_QUORUM,
    API_END_QUORUM_EPOCH,
    API_FETCH_SNAPSHOT,
    API_VOTE,
    InvalidRaftMessageError,
    describe_quorum_response,
    describe_quorum_unknown_partition_response,
    raft_error_response,
    raft_request_of,
    raft_response,
)
from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.controller.controller import (
    PREFERRED_ELECTION,
    Controller,
    PartitionElectionResult,
    ScramAlterationResult,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from tierlog.controller.errors import (
    ControllerError,
    InvalidReplicaAssignmentError,
    NotControllerError,
    UnknownTopicIdError,
)
from tierlog.metadata.image import IsrChange, PartitionRegistration
from tierlog.metadata.records import Endpoint
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.raft.raft_log import METADATA_TOPIC, METADATA_TOPIC_ID
from tierlog.replication.replica_manager import error_name_of
from tierlog.security.acl import AclBinding, AclOperation
from tierlog.security.acl_filter import acl_binding, acl_binding_filter_of
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.clock import now_ms
from tierlog.server.controller_server import ControllerServer
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema
from tierlog.server.request_context import listener_name

logger = logging.getLogger(__name__)

API_CREATE_ACLS = 30
API_DELETE_ACLS = 31
API_CREATE_TOPICS = 19
API_DELETE_TOPICS = 20
API_CREATE_PARTITIONS = 37
API_ELECT_LEADERS = 43
API_ALTER_PARTITION_REASSIGNMENTS = 45
API_LIST_PARTITION_REASSIGNMENTS = 46
API_UNREGISTER_BROKER = 64
API_ALTER_USER_SCRAM_CREDENTIALS = 51
API_ALTER_PARTITION = 56
API_BROKER_REGISTRATION = 62
API_BROKER_HEARTBEAT = 63
API_ALLOCATE_PRODUCER_IDS = 67

# Admin requests the controller decides (a broker that is not the controller forwards them).
ADMIN_APIS = (
    API_CREATE_TOPICS,
    API_DELETE_TOPICS,
    API_CREATE_PARTITIONS,
    API_ELECT_LEADERS,
    API_CREATE_ACLS,
    API_DELETE_ACLS,
    API_ALTER_USER_SCRAM_CREDENTIALS,
    API_ALTER_PARTITION_REASSIGNMENTS,
    API_LIST_PARTITION_REASSIGNMENTS,
    API_UNREGISTER_BROKER,
)
# What brokers ask of the controller (besides the metadata Fetch).
BROKER_TO_CONTROLLER_APIS = (
    API_ALTER_PARTITION,
    API_BROKER_REGISTRATION,
    API_BROKER_HEARTBEAT,
    API_ALLOCATE_PRODUCER_IDS,
)

Handler = Callable[[Request], Awaitable[Any]]

# Set while a handler runs again to answer NOT_CONTROLLER for a request whose records did not commit: it then
# sees no controller, as any request does on a controller that is not the active one.
_answering_not_controller: ContextVar[bool] = ContextVar("answering_not_controller", default=False)


class ControllerApis:
    def __init__(self, config: KafkaConfig, server: ControllerServer, auth: AuthHelper) -> None:
        self.config = config
        self._server = server
        self._auth = auth
        self.handlers: dict[int, Handler] = {
            API_CREATE_TOPICS: self.handle_create_topics,
            API_DELETE_TOPICS: self.handle_delete_topics,
            API_CREATE_PARTITIONS: self.handle_create_partitions,
            API_ELECT_LEADERS: self.handle_elect_leaders,
            API_CREATE_ACLS: self.handle_create_acls,
            API_DELETE_ACLS: self.handle_delete_acls,
            API_ALTER_USER_SCRAM_CREDENTIALS: self.handle_alter_user_scram_credentials,
            API_ALTER_PARTITION_REASSIGNMENTS: self.handle_alter_partition_reassignments,
            API_LIST_PARTITION_REASSIGNMENTS: self.handle_list_partition_reassignments,
            API_UNREGISTER_BROKER: self.handle_unregister_broker,
            API_BROKER_REGISTRATION: self.handle_broker_registration,
            API_BROKER_HEARTBEAT: self.handle_broker_heartbeat,
            API_ALTER_PARTITION: self.handle_alter_partition,
            API_ALLOCATE_PRODUCER_IDS: self.handle_allocate_producer_ids,
        }
        # What the other voters and the quorum tools ask.
        self.quorum_handlers: dict[int, Handler] = {
            API_VOTE: self.handle_raft_request,
            API_BEGIN_QUORUM_EPOCH: self.handle_raft_request,
            API_END_QUORUM_EPOCH: self.handle_raft_request,
            API_FETCH_SNAPSHOT: self.handle_raft_request,
            API_DESCRIBE_QUORUM: self.handle_describe_quorum,
        }
        self.handlers.update(self.quorum_handlers)

    @property
    def controller(self) -> Controller:
        """The active controller; NotControllerError, which each handler answers as NOT_CONTROLLER, when this
        node's controller is not the active one."""
        controller = None if _answering_not_controller.get() else self._server.controller
        if controller is None:
            raise NotControllerError("This controller is not the active controller of the quorum.")
        return controller

    def is_active(self) -> bool:
        """Whether this node's controller is the quorum's active one."""
        return self._server.controller is not None

    def reached_as_controller(self) -> bool:
        """Whether the request being handled came in on a controller listener: another broker sent it to what it
        took for the active controller, and it is answered here (NOT_CONTROLLER if this is not the active
        one), never sent on again."""
        return listener_name() in {listener.name for listener in self.config.controller_listeners}

    async def handle(self, request: Request) -> Any:
        """The answer once what the request wrote is committed; NOT_CONTROLLER if this controller is not, or
        stopped being, the active one (Kafka answers a write only when committed, and so do reads, which may
        have seen uncommitted records)."""
        handler = self.handlers[request.api_key]
        controller = self._server.controller
        response = await handler(request)
        if controller is None or await self._server.wait_for_commit(controller):
            return response
        token = _answering_not_controller.set(True)
        try:
            return await handler(request)
        finally:
            _answering_not_controller.reset(token)

    @staticmethod
    def _schema(request: Request) -> ResponseSchema:
        return response_schema(request.api_key, request.api_version)

    # Topic administration

    async def handle_create_topics(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        results = []
        for t in body.topics:
            num_partitions = t.num_partitions
            replication_factor = t.replication_factor
            if t.assignments:
                num_partitions = len(t.assignments)
                replication_factor = len(t.assignments[0].broker_ids)
            if num_partitions == -1:
                num_partitions = self.config.get_int("num.partitions")
            if replication_factor == -1:
                replication_factor = self.config.get_int("default.replication.factor")
            configs = {c.name: c.value for c in t.configs if c.value is not None}
            assignments = [list(a.broker_ids) for a in sorted(t.assignments, key=lambda a: a.partition_index)]
            try:
                if assignments and [a.partition_index for a in t.assignments] != list(range(len(assignments))):
                    raise InvalidReplicaAssignmentError("Partitions of a manual assignment must be numbered from 0.")
                topic = self.controller.create_topic(
                    t.name,
                    num_partitions,
                    replication_factor,
                    configs,
                    validate_only=body.validate_only,
                    assignments=assignments or None,
                )
            except ControllerError as e:
                results.append(
                    s.CreatableTopicResult(
                        name=t.name,
                        topic_id=uuid.UUID(int=0),
                        error_code=error_code(e.error_name),
                        error_message=str(e),
                        topic_config_error_code=0,
                        num_partitions=-1,
                        replication_factor=-1,
                        configs=None,
                    )
                )
                continue
            results.append(
                s.CreatableTopicResult(
                    name=t.name,
                    topic_id=topic.topic_id,
                    error_code=error_code(None),
                    error_message=None,
                    topic_config_error_code=0,
                    num_partitions=len(topic.partitions),
                    replication_factor=len(topic.partitions[0].replicas),
                    configs=tuple(
                        s.CreatableTopicConfigs(
                            name=c.name, value=c.value, read_only=False, config_source=c.source, is_sensitive=False
                        )
                        for c in self.config.describe_topic(topic.configs)
                    ),
                )
            )
        return s.CreateTopicsResponse(throttle_time=NO_THROTTLE, topics=tuple(results))

    async def handle_delete_topics(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        if hasattr(body, "topics"):  # v6+ names a topic or gives its id
            requested = [(t.name, t.topic_id) for t in body.topics]
        else:
            requested = [(name, None) for name in body.topic_names]
        deletion_enabled = self.config.get_bool("delete.topic.enable")
        results = []
        for name, topic_id in requested:
            try:
                if name is None:
                    name = self._topic_name(topic_id)
                topic = self.controller.delete_topic(name, deletion_enabled=deletion_enabled)
                error, message, topic_id = None, None, topic.topic_id
            except ControllerError as e:
                # An unknown id is answered without a message, as Kafka does.
                error, message = e.error_name, None if isinstance(e, UnknownTopicIdError) else str(e)
                topic_id = topic_id if name is None else uuid.UUID(int=0)
            results.append(
                s.DeletableTopicResult(
                    name=name, topic_id=topic_id, error_code=error_code(error), error_message=message
                )
            )
        return s.DeleteTopicsResponse(throttle_time=NO_THROTTLE, responses=tuple(results))

    def _topic_name(self, topic_id: uuid.UUID | None) -> str:
        topic = self.controller.topic_by_id(topic_id) if topic_id is not None else None
        if topic is None:
            raise UnknownTopicIdError(f"Topic id {topic_id} does not exist")
        return topic.name

    async def handle_create_partitions(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        results = []
        for t in body.topics:
            try:
                self.controller.create_partitions(t.name, t.count, validate_only=body.validate_only)
                error, message = None, None
            except ControllerError as e:
                error, message = e.error_name, str(e)
            results.append(
                s.CreatePartitionsTopicResult(name=t.name, error_code=error_code(error), error_message=message)
            )
        return s.CreatePartitionsResponse(throttle_time=NO_THROTTLE, results=tuple(results))

    async def handle_elect_leaders(self, request: Request) -> Any:
        """ElectLeaders (KIP-460; `kafka-leader-election.sh`, AdminClient.electLeaders). v0 has no election type:
        it is always PREFERRED. An unknown type fails the whole request, every partition named with it, as
        Kafka's ElectLeadersRequest.getErrorResponse answers."""
        s = self._schema(request)
        body = request.body
        requested: dict[str, list[int]] | None = None
        if body.topic_partitions is not None:
            requested = {}
            for t in body.topic_partitions:  # a topic named twice keeps the partitions of both entries
                requested.setdefault(t.topic, []).extend(t.partitions)
        try:
            results = self.controller.elect_leaders(getattr(body, "election_type", PREFERRED_ELECTION), requested)
            error = None
        except ControllerError as e:
            error = e.error_name
            results = {
                name: [PartitionElectionResult(p, e.error_name, str(e)) for p in ids]
                for name, ids in (requested or {}).items()
            }
        return s.ElectLeadersResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(error),
            replica_election_results=tuple(
                s.ReplicaElectionResult(
                    topic=name,
                    partition_result=tuple(
                        s.PartitionResult(
                            partition_id=r.partition, error_code=error_code(r.error), error_message=r.message
                        )
                        for r in partition_results
                    ),
                )
                for name, partition_results in results.items()
            ),
        )

    async def handle_alter_user_scram_credentials(self, request: Request) -> Any:
        """AlterUserScramCredentials (KIP-554; `kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[...]'`,
        AdminClient.alterUserScramCredentials): one result per user (docs/security.md#scram-credentials)."""
        s = self._schema(request)
        body = request.body
        try:
            results = self.controller.alter_user_scram_credentials(
                [
                    ScramCredentialUpsertion(u.name, u.mechanism, u.iterations, u.salt, u.salted_password)
                    for u in body.upsertions
                ],
                [ScramCredentialDeletion(d.name, d.mechanism) for d in body.deletions],
            )
        except NotControllerError as e:
            users = dict.fromkeys([*(u.name for u in body.upsertions), *(d.name for d in body.deletions)])
            results = [ScramAlterationResult(user, e.error_name, str(e)) for user in users]
        return s.AlterUserScramCredentialsResponse(
            throttle_time=NO_THROTTLE,
            results=tuple(
                s.AlterUserScramCredentialsResult(user=r.user, error_code=error_code(r.error), error_message=r.message)
                for r in results
            ),
        )

    # Reassignments and decommissioning (docs/reassignment.md#the-wire)

    async def handle_alter_partition_reassignments(self, request: Request) -> Any:
        """AlterPartitionReassignments (KIP-455; `kafka-reassign-partitions.sh --execute`,
        AdminClient.alterPartitionReassignments): one answer per partition named, a null replica list cancelling
        its reassignment in progress. Answered once the records are committed, as every controller write."""
        s = self._schema(request)
        targets: dict[TopicPartition, tuple[int, ...] | None] = {}
        for t in request.body.topics:
            for p in t.partitions:
                targets[TopicPartition(t.name, p.partition_index)] = p.replicas
        try:
            results = self.controller.alter_partition_reassignments(targets)
        except NotControllerError as e:
            return alter_partition_reassignments_refused(s, request, e.error_name, str(e))
        return s.AlterPartitionReassignmentsResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            error_message=None,
            responses=tuple(
                s.ReassignableTopicResponse(
                    name=t.name,
                    partitions=tuple(
                        s.ReassignablePartitionResponse(
                            partition_index=p.partition_index,
                            error_code=error_code(result.error_name if result else None),
                            error_message=str(result) if result else None,
                        )
                        for p in t.partitions
                        for result in (results[TopicPartition(t.name, p.partition_index)],)
                    ),
                )
                for t in request.body.topics
            ),
        )

    async def handle_list_partition_reassignments(self, request: Request) -> Any:
        """ListPartitionReassignments (KIP-455; `kafka-reassign-partitions.sh --verify`/`--list`): the
        reassignments in progress among the partitions named (every partition when none is), grouped by topic;
        unknown partitions are left out, as Kafka answers."""
        s = self._schema(request)
        topics = request.body.topics
        partitions = (
            None if topics is None else [TopicPartition(t.name, index) for t in topics for index in t.partition_indexes]
        )
        try:
            ongoing = self.controller.list_partition_reassignments(partitions)
        except NotControllerError as e:
            return list_partition_reassignments_refused(s, request, e.error_name, str(e))
        by_topic: dict[str, list[Any]] = {}
        for tp, registration in ongoing.items():
            by_topic.setdefault(tp.topic, []).append(
                s.OngoingPartitionReassignment(
                    partition_index=tp.partition,
                    replicas=tuple(registration.replicas),
                    adding_replicas=tuple(registration.adding_replicas),
                    removing_replicas=tuple(registration.removing_replicas),
                )
            )
        return s.ListPartitionReassignmentsResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            error_message=None,
            topics=tuple(
                s.OngoingTopicReassignment(name=name, partitions=tuple(partitions))
                for name, partitions in by_topic.items()
            ),
        )

    async def handle_unregister_broker(self, request: Request) -> Any:
        """UnregisterBroker (KIP-500; `kafka-cluster.sh unregister`): remove a decommissioned broker's
        registration; BROKER_ID_NOT_REGISTERED for an id the controller does not know."""
        s = self._schema(request)
        try:
            self.controller.unregister_broker(request.body.broker_id)
            error = None
        except ControllerError as e:
            error = e
        return s.UnregisterBrokerResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(error.error_name if error else None),
            error_message=str(error) if error else None,
        )

    # ACLs (docs/security.md#authorizer). The broker that received the request has answered SECURITY_DISABLED
    # already if it has no authorizer.

    async def handle_create_acls(self, request: Request) -> Any:
        s = self._schema(request)
        bindings = [
            acl_binding(
                c.resource_type,
                c.resource_name,
                c.resource_pattern_type,
                c.principal,
                c.host,
                c.operation,
                c.permission_type,
            )
            for c in request.body.creations
        ]
        try:
            results: list[ControllerError | None] = list(self.controller.create_acls(bindings))
        except NotControllerError as e:
            results = [e] * len(bindings)
        return s.CreateAclsResponse(
            throttle_time=NO_THROTTLE,
            results=tuple(
                s.AclCreationResult(
                    error_code=error_code(error.error_name if error else None),
                    error_message=str(error) if error else None,
                )
                for error in results
            ),
        )

    async def handle_delete_acls(self, request: Request) -> Any:
        s = self._schema(request)
        filters = [acl_binding_filter_of(f) for f in request.body.filters]
        try:
            outcomes: list[list[AclBinding] | ControllerError] = list(self.controller.delete_acls(filters))
        except NotControllerError as e:
            outcomes = [e] * len(filters)
        filter_results = []
        for result in outcomes:
            if isinstance(result, ControllerError):
                filter_results.append(
                    s.DeleteAclsFilterResult(
                        error_code=error_code(result.error_name), error_message=str(result), matching_acls=()
                    )
                )
                continue
            filter_results.append(
                s.DeleteAclsFilterResult(
                    error_code=error_code(None),
                    error_message=None,
                    matching_acls=tuple(
                        s.DeleteAclsMatchingAcl(
                            error_code=error_code(None),
                            error_message=None,
                            resource_type=b.pattern.resource_type,
                            resource_name=b.pattern.name,
                            pattern_type=b.pattern.pattern_type,
                            principal=b.entry.principal,
                            host=b.entry.host,
                            operation=b.entry.operation,
                            permission_type=b.entry.permission_type,
                        )
                        for b in result
                    ),
                )
            )
        return s.DeleteAclsResponse(throttle_time=NO_THROTTLE, filter_results=tuple(filter_results))

    # What brokers ask of the controller

    def _is_broker(self) -> bool:
        """Whether the peer may do what brokers ask of the controller: CLUSTER_ACTION on the cluster."""
        return self._auth.authorize_cluster(AclOperation.CLUSTER_ACTION)

    async def handle_broker_registration(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        if not self._is_broker():
            return s.BrokerRegistrationResponse(
                throttle_time=NO_THROTTLE, error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"), broker_epoch=-1
            )
        try:
            broker_epoch = self.controller.register_broker(
                body.broker_id,
                str(body.incarnation_id),
                body.cluster_id,
                [Endpoint(listener.name, listener.host, listener.port) for listener in body.listeners],
                body.rack,
                now_ms(),
            )
            error = None
        except NotControllerError:
            # Brokers look for the active controller this way: nothing to warn about.
            broker_epoch, error = -1, NotControllerError.error_name
        except Exception as e:
            broker_epoch, error = -1, error_name_of(e)
            logger.warning(
                "[Controller id=%d] refused registration of broker %d: %s", self.config.node_id, body.broker_id, e
            )
        return s.BrokerRegistrationResponse(
            throttle_time=NO_THROTTLE, error_code=error_code(error), broker_epoch=broker_epoch
        )

    async def handle_broker_heartbeat(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        refusal = None if self._is_broker() else "CLUSTER_AUTHORIZATION_FAILED"
        if refusal is None:
            try:
                result = self.controller.heartbeat(
                    broker_id=body.broker_id,
                    broker_epoch=body.broker_epoch,
                    current_metadata_offset=body.current_metadata_offset,
                    want_fence=body.want_fence,
                    want_shut_down=body.want_shut_down,
                    now_ms=now_ms(),
                )
            except Exception as e:
                refusal = error_name_of(e)
        if refusal is not None:
            return s.BrokerHeartbeatResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code(refusal),
                is_caught_up=False,
                is_fenced=True,
                should_shut_down=False,
            )
        return s.BrokerHeartbeatResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            is_caught_up=result.is_caught_up,
            is_fenced=result.is_fenced,
            should_shut_down=result.should_shut_down,
        )

    async def handle_alter_partition(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        if not self._is_broker():
            return s.AlterPartitionResponse(
                throttle_time=NO_THROTTLE, error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"), topics=()
            )
        # Every change of the request decided and committed together: one metadata commit for all of them
        # (docs/replication.md#alter-partition).
        changes = [
            IsrChange(
                topic.topic_id,
                p.partition_index,
                p.leader_epoch,
                p.partition_epoch,
                [b.broker_id for b in p.new_isr_with_epochs],
            )
            for topic in body.topics
            for p in topic.partitions
        ]
        outcomes: list[PartitionRegistration | Exception]
        try:
            outcomes = list(self.controller.alter_partitions(body.broker_id, body.broker_epoch, changes))
        except Exception as e:
            outcomes = [e] * len(changes)
        outcome_of = iter(outcomes)
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                outcome = next(outcome_of)
                registration: PartitionRegistration | None
                error: str | None
                if isinstance(outcome, Exception):
                    registration, error = None, error_name_of(outcome)
                elif outcome.leader != body.broker_id:
                    # Committed, but it completed a reassignment that moved the leadership: the leader that
                    # asked learns it must wait for the metadata (Kafka's answer, docs/reassignment.md#completion).
                    registration, error = None, "NEW_LEADER_ELECTED"
                else:
                    registration, error = outcome, None
                partitions.append(
                    s.PartitionData(
                        partition_index=p.partition_index,
                        error_code=error_code(error),
                        leader_id=registration.leader if registration else -1,
                        leader_epoch=registration.leader_epoch if registration else -1,
                        isr=tuple(registration.isr) if registration else (),
                        leader_recovery_state=0,
                        partition_epoch=registration.partition_epoch if registration else -1,
                    )
                )
            topics.append(s.TopicData(topic_id=topic.topic_id, partitions=tuple(partitions)))
        return s.AlterPartitionResponse(throttle_time=NO_THROTTLE, error_code=error_code(None), topics=tuple(topics))

    async def handle_allocate_producer_ids(self, request: Request) -> Any:
        s = self._schema(request)
        if not self._is_broker():
            return s.AllocateProducerIdsResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"),
                producer_id_start=0,
                producer_id_len=0,
            )
        try:
            block = self.controller.allocate_producer_id_block(request.body.broker_id)
        except NotControllerError as e:
            return s.AllocateProducerIdsResponse(
                throttle_time=NO_THROTTLE, error_code=error_code(e.error_name), producer_id_start=0, producer_id_len=0
            )
        return s.AllocateProducerIdsResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            producer_id_start=block.start,
            producer_id_len=len(block),
        )

    # The metadata log

    @staticmethod
    def is_metadata_fetch(request: Request) -> bool:
        return any(
            getattr(t, "topic", None) == METADATA_TOPIC or getattr(t, "topic_id", None) == METADATA_TOPIC_ID
            for t in request.body.topics
        )

    async def handle_metadata_fetch(self, request: Request) -> Any:
        """A voter replicating the metadata log, or a broker following it (an observer: docs/quorum.md#observers),
        which the Raft core gives committed records only; NOT_LEADER_OR_FOLLOWER with the leader it knows on a
        voter that is not the leader."""
        return await self.handle_raft_request(request)

    # The controller quorum (docs/quorum.md#the-wire)

    async def handle_raft_request(self, request: Request) -> Any:
        """Vote, BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot, or a Fetch of the metadata log: the Raft core's
        answer. Only cluster members send these: CLUSTER_ACTION on the cluster, as Kafka's ControllerApis asks."""
        if not self._is_broker():
            return raft_error_response(request.api_key, request.api_version, "CLUSTER_AUTHORIZATION_FAILED")
        try:
            core_request = raft_request_of(request.body)
        except InvalidRaftMessageError:
            # Kafka's KafkaRaftClient: one Raft partition, anything else is INVALID_REQUEST.
            return raft_error_response(request.api_key, request.api_version, "INVALID_REQUEST")
        return raft_response(await self._server.raft.handle(core_request), request.api_version)

    async def handle_describe_quorum(self, request: Request) -> Any:
        """DescribeQuorum (KIP-595; `kafka-metadata-quorum.sh describe`): the leader's view of the quorum,
        NOT_LEADER_OR_FOLLOWER from any other voter. DESCRIBE on the cluster, as Kafka's ControllerApis asks."""
        if not self._auth.authorize_cluster(AclOperation.DESCRIBE):
            return raft_error_response(request.api_key, request.api_version, "CLUSTER_AUTHORIZATION_FAILED")
        unknown = describe_quorum_unknown_partition_response(request.body, request.api_version)
        if unknown is not None:
            return unknown
        controller_listener = self.config.controller_listener_name or ""
        return describe_quorum_response(
            self._server.raft.client.describe_quorum(now_ms()),
            request.api_version,
            voter_listeners={
                node_id: (controller_listener, host, port)
                for node_id, (host, port) in self.config.quorum_voters.items()
            },
        )


def alter_partition_reassignments_refused(s: ResponseSchema, request: Request, error_name: str, message: str) -> Any:
    """The whole AlterPartitionReassignments refused, with each partition it names (Kafka's
    AlterPartitionReassignmentsRequest.getErrorResponse)."""
    refused = error_code(error_name)
    return s.AlterPartitionReassignmentsResponse(
        throttle_time=NO_THROTTLE,
        error_code=refused,
        error_message=message,
        responses=tuple(
            s.ReassignableTopicResponse(
                name=t.name,
                partitions=tuple(
                    s.ReassignablePartitionResponse(
                        partition_index=p.partition_index, error_code=refused, error_message=message
                    )
                    for p in t.partitions
                ),
            )
            for t in request.body.topics
        ),
    )


def list_partition_reassignments_refused(s: ResponseSchema, request: Request, error_name: str, message: str) -> Any:
    """The whole ListPartitionReassignments refused, each partition it names listed with no replicas (Kafka's
    ListPartitionReassignmentsRequest.getErrorResponse)."""
    return s.ListPartitionReassignmentsResponse(
        throttle_time=NO_THROTTLE,
        error_code=error_code(error_name),
        error_message=message,
        topics=tuple(
            s.OngoingTopicReassignment(
                name=t.name,
                partitions=tuple(
                    s.OngoingPartitionReassignment(
                        partition_index=index, replicas=(), adding_replicas=(), removing_replicas=()
                    )
                    for index in t.partition_indexes
                ),
            )
            for t in request.body.topics or ()
        ),
    )

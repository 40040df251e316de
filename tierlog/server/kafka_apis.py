"""KafkaApis: the broker's request handlers, turning request entities into calls on the core and back, and the
one dispatch table of every API the broker serves.

Handlers are thin: validation rules and state live in the controller and the replication core. Every
handler answers every version the broker advertises, through `ResponseSchema` (fields a version lacks
are dropped). The table also holds the handlers of the other API classes the broker is built with: the
group APIs (`GroupApis`), the config APIs (`ConfigApis`), the log-dir APIs (`LogDirApis`), the ACL APIs
(`AclApis`), the admin requests only the controller decides (through the `ForwardingManager`) and, on the
controller's own node, the controller's APIs (`ControllerApis`).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.metadata.image import ClusterMetadata, TopicMetadata
from tierlog.metadata.records import SCRAM_MECHANISM_NAMES
from tierlog.protocol.api_versions import supported_api_versions
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.records.record_batch import RECORD_BATCH_OVERHEAD, batch_size_at, read_header
from tierlog.replication.errors import UnknownTopicOrPartitionError
from tierlog.replication.fetch_request import FetchAnswer, fetch_messages_for_request
from tierlog.replication.fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchManager,
    FetchRequestPartition,
    FetchSessionCache,
)
from tierlog.replication.fetcher import FetchRequestData
from tierlog.replication.partition import LogReadResult, OffsetAndEpoch
from tierlog.replication.replica_manager import (
    AppendResult,
    ReplicaManager,
    error_name_of,
)
from tierlog.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from tierlog.server import request_context
from tierlog.server.acl_apis import AclApis
from tierlog.server.admin_authorization import CHECKED_ADMIN_APIS, forward_authorized
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.authorized_operations import OMITTED
from tierlog.server.auto_topic_creation_manager import AutoTopicCreationManager, check_topic_name
from tierlog.server.clock import now_ms
from tierlog.server.config_apis import ConfigApis
from tierlog.server.controller_apis import ADMIN_APIS, BROKER_TO_CONTROLLER_APIS, ControllerApis
from tierlog.server.controller_channel import ControllerChannel
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema, timestamp_or_none
from tierlog.server.forwarding_manager import ForwardingManager
from tierlog.server.group_apis import GroupApis
from tierlog.server.log_dir_apis import LogDirApis
from tierlog.server.metadata_loader import MetadataLoaderTask
from tierlog.server.metrics import BrokerMetrics
from tierlog.server.remote_log_tasks import RemoteLogTasks
from tierlog.server.transaction_apis import INTERNAL_TOPICS, TransactionApis
from tierlog.server.txn_marker_apis import OffsetsTransactionCompleted, TxnMarkerApis
from tierlog.storage.errors import KafkaStorageError
from tierlog.storage.producer_state import AppendOrigin
from tierlog.tiered.remote_storage_manager import RemoteStorageError

API_PRODUCE = 0
API_FETCH = 1
API_LIST_OFFSETS = 2
API_METADATA = 3
API_OFFSET_FOR_LEADER_EPOCH = 23
API_API_VERSIONS = 18
API_DELETE_RECORDS = 21
API_DESCRIBE_USER_SCRAM_CREDENTIALS = 50
API_DESCRIBE_QUORUM = 55
API_DESCRIBE_CLUSTER = 60
API_DESCRIBE_PRODUCERS = 61
API_SASL_HANDSHAKE = 17
API_SASL_AUTHENTICATE = 36

Handler = Callable[[Request], Awaitable[Any]]

# A Produce may not write to INTERNAL_TOPICS except from the client id Kafka's admin tools use
# (AdminUtils.ADMIN_CLIENT_ID).
ADMIN_CLIENT_ID = "__admin_client"


def api_versions_response(request: Request, api_keys: Iterable[int]) -> Any:
    """ApiVersions: the versions this node serves of `api_keys` (its handlers on every listener)."""
    s = response_schema(request.api_key, request.api_version)
    return s.ApiVersionsResponse(
        error_code=error_code(None),
        api_keys=tuple(
            s.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, low, high in supported_api_versions(api_keys)
        ),
        throttle_time=NO_THROTTLE,
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )


# SaslHandshake and SaslAuthenticate reach the handlers only after the connection has authenticated, or on a
# listener without SASL: as Kafka, the answer is ILLEGAL_SASL_STATE (docs/security.md#sasl).


async def handle_sasl_handshake(request: Request) -> Any:
    return response_schema(request.api_key, request.api_version).SaslHandshakeResponse(
        error_code=error_code("ILLEGAL_SASL_STATE"), mechanisms=()
    )


async def handle_sasl_authenticate(request: Request) -> Any:
    return response_schema(request.api_key, request.api_version).SaslAuthenticateResponse(
        error_code=error_code("ILLEGAL_SASL_STATE"),
        error_message="SaslAuthenticate request received after successful authentication",
        auth_bytes=b"",
        session_lifetime=NO_THROTTLE,
    )


class KafkaApis:
    def __init__(
        self,
        config: KafkaConfig,
        loader: MetadataLoaderTask,
        replica_manager: ReplicaManager,
        arm_timer: Callable[[int], None],
        channel: ControllerChannel,
        *,
        forwarding_manager: ForwardingManager,
        auto_topic_creation: AutoTopicCreationManager,
        group_apis: GroupApis,
        transaction_apis: TransactionApis,
        config_apis: ConfigApis,
        log_dir_apis: LogDirApis,
        acl_apis: AclApis,
        controller_apis: ControllerApis | None,
        remote_log: RemoteLogTasks | None,
        auth: AuthHelper,
        metrics: BrokerMetrics | None = None,
        after_request: Callable[[], None] = lambda: None,
        offsets_transaction_completed: OffsetsTransactionCompleted | None = None,
    ) -> None:
        self.config = config
        self.loader = loader
        self.replica_manager = replica_manager
        self.channel = channel
        self._auto_topic_creation = auto_topic_creation
        # What each request may do (docs/security.md#api-checks).
        self.auth = auth
        # Set on the controller's own node (it also serves the controller's APIs).
        self._controller_apis = controller_apis
        # Set when remote.log.storage.system.enable is on.
        self._remote_log = remote_log
        self._metrics = metrics
        self._after_request = after_request
        # The shell arms a timer for a delayed operation's deadline (epoch ms) so the purgatory expires it.
        self._arm_timer = arm_timer
        self.node_id = config.node_id
        self._fetch_max_bytes = config.get_int("fetch.max.bytes")
        # The fetch sessions of followers and consumers (docs/performance.md#fetch-sessions).
        self.fetch_manager = FetchManager(
            FetchSessionCache(
                config.get_int("max.incremental.fetch.session.cache.slots"),
                config.get_int("min.incremental.fetch.session.eviction.ms"),
                random.Random(),
            ),
            self._topic_name,
        )
        self.handlers: dict[int, Handler] = {
            API_PRODUCE: self.handle_produce,
            API_FETCH: self.handle_fetch,
            API_LIST_OFFSETS: self.handle_list_offsets,
            API_METADATA: self.handle_metadata,
            API_OFFSET_FOR_LEADER_EPOCH: self.handle_offset_for_leader_epoch,
            API_API_VERSIONS: self.handle_api_versions,
            API_DELETE_RECORDS: self.handle_delete_records,
            API_DESCRIBE_CLUSTER: self.handle_describe_cluster,
            API_DESCRIBE_PRODUCERS: self.handle_describe_producers,
            API_SASL_HANDSHAKE: handle_sasl_handshake,
            API_SASL_AUTHENTICATE: handle_sasl_authenticate,
            API_DESCRIBE_USER_SCRAM_CREDENTIALS: self.handle_describe_user_scram_credentials,
        }
        self.handlers.update(group_apis.handlers)
        # FindCoordinator's transactional ids and InitProducerId (idempotent too) are the transaction APIs'.
        self.handlers.update(transaction_apis.handlers)
        self.handlers.update(config_apis.handlers)
        self.handlers.update(log_dir_apis.handlers)
        # The markers of transactions (docs/transactions.md#write-txn-markers), appended as a produce is.
        self.txn_marker_apis = TxnMarkerApis(
            auth, self._append, config.get_int("request.timeout.ms"), offsets_transaction_completed
        )
        self.handlers.update(self.txn_marker_apis.handlers)
        # Only the controller decides these (Kafka's ForwardingManager), once checked here.
        self._forwarding_manager = forwarding_manager
        self.handlers.update(dict.fromkeys(ADMIN_APIS, forwarding_manager.forward))
        self.handlers.update(dict.fromkeys(CHECKED_ADMIN_APIS & set(ADMIN_APIS), self.handle_admin))
        # The ACL APIs forward CreateAcls and DeleteAcls only when there is an authorizer.
        self.handlers.update(acl_apis.handlers)
        if controller_apis is not None:
            self.handlers.update(dict.fromkeys(BROKER_TO_CONTROLLER_APIS, controller_apis.handle))
            self.handlers.update(controller_apis.quorum_handlers)
            self.handlers[API_FETCH] = self._fetch_on_the_controllers_node
        # From any listener, DescribeQuorum goes to the controller through the forwarding manager (on a controller
        # node, that decides whether this node's controller answers it).
        self.handlers[API_DESCRIBE_QUORUM] = self.handle_describe_quorum

    @property
    def image(self) -> ClusterMetadata:
        return self.loader.image

    async def handle(self, request: Request) -> Any:
        """The response entity, or None when the request gets no response (acks=0 produce)."""
        started = time.perf_counter()
        try:
            return await self.handlers[request.api_key](request)
        finally:
            self._after_request()
            if self._metrics is not None:
                self._metrics.observe_request(request.api_key, time.perf_counter() - started)

    @staticmethod
    def _schema(request: Request) -> ResponseSchema:
        return response_schema(request.api_key, request.api_version)

    async def handle_admin(self, request: Request) -> Any:
        """An admin request only the controller decides: what the principal may do goes to the controller."""
        return await forward_authorized(self.auth, self.image, request, self._forwarding_manager.forward)

    async def handle_describe_quorum(self, request: Request) -> Any:
        """DescribeQuorum (kafka-metadata-quorum.sh --bootstrap-server): only the controller knows the quorum, so
        the broker forwards it there, as Kafka's brokers do, once the principal may DESCRIBE the cluster (Kafka's
        controller checks that on the forwarded request; tierlog forwards without an Envelope, so the broker
        checks it: docs/security.md#api-checks)."""
        if self.auth.authorize_cluster(AclOperation.DESCRIBE):
            return await self._forwarding_manager.forward(request)
        return self._schema(request).DescribeQuorumResponse(
            error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"),
            error_message="Cluster authorization failed.",
            topics=(),
            nodes=(),
        )

    # ApiVersions, Metadata, DescribeCluster

    async def handle_api_versions(self, request: Request) -> Any:
        return api_versions_response(request, self.handlers.keys())

    def _broker_entries(self, s: ResponseSchema, builder: str) -> tuple[Any, ...]:
        """Every unfenced broker, at its endpoint for the listener the request came in on, as Kafka answers."""
        listener_name = self.config.answering_listener_name(request_context.listener_name())
        entries = []
        for broker_id in sorted(self.image.unfenced_broker_ids()):
            endpoint = self.image.endpoint_of(broker_id, listener_name)
            if endpoint is not None:
                entries.append(
                    getattr(s, builder)(
                        node_id=broker_id, broker_id=broker_id, host=endpoint.host, port=endpoint.port, rack=None
                    )
                )
        return tuple(entries)

    def _controller_id(self) -> int:
        # Clients cannot reach a KRaft controller; like Kafka, name a live broker instead (Kafka: a random one).
        # This broker first: it is certainly alive, while another may have died without being fenced yet, and
        # clients send their admin requests to the broker named here.
        unfenced = sorted(self.image.unfenced_broker_ids())
        if self.node_id in unfenced:
            return self.node_id
        return unfenced[0] if unfenced else -1

    async def handle_metadata(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        requested = body.topics
        all_topics = requested is None or (request.api_version == 0 and not requested)
        named_by_id: set[str] = set()
        if all_topics:
            names = sorted(self.image.topics)
        else:
            names = [t.name for t in requested if t.name is not None]
            named_by_id = {
                name for t in requested if t.name is None and (name := self._topic_name(t.topic_id)) is not None
            }
            names += sorted(named_by_id)
        auto_create = getattr(body, "allow_auto_topic_creation", True) and self.config.get_bool(
            "auto.create.topics.enable"
        )
        # Kafka's handleTopicMetadataRequest: a topic the principal may not describe is left out of an all-topics
        # answer and answered TOPIC_AUTHORIZATION_FAILED when named; creating one needs CREATE on the cluster or it.
        describable = self.auth.filter_authorized(AclOperation.DESCRIBE, ResourceType.TOPIC, names)
        creatable: set[str] = set()
        missing = [name for name in names if name in describable and name not in self.image.topics]
        if auto_create and missing:
            if self.auth.authorize_cluster(AclOperation.CREATE):
                creatable = set(missing)
            else:
                creatable = self.auth.filter_authorized(AclOperation.CREATE, ResourceType.TOPIC, missing)
        # v8+ may ask for each topic's authorized operations, v8-v10 for the cluster's too.
        asks_topic = getattr(body, "include_topic_authorized_operations", False)
        asks_cluster = getattr(body, "include_cluster_authorized_operations", False)
        cluster_operations = self._cluster_authorized_operations(asks_cluster)
        live_brokers = set(self.image.unfenced_broker_ids())
        topics = []
        for name in names:
            if name not in describable or (name in missing and auto_create and name not in creatable):
                if all_topics:
                    continue
                by_id = name in named_by_id and name in self.image.topics
                topics.append(
                    s.MetadataResponseTopic(
                        error_code=error_code("TOPIC_AUTHORIZATION_FAILED"),
                        name=None if by_id else name,
                        topic_id=self.image.topics[name].topic_id if by_id else uuid.UUID(int=0),
                        partitions=(),
                        topic_authorized_operations=OMITTED,
                    )
                )
                continue
            topic_operations = self.auth.authorized_operations(ResourceType.TOPIC, name) if asks_topic else OMITTED
            topic = self.image.topics.get(name)
            error = None
            if topic is None and name in creatable:
                topic, error = await self._auto_topic_creation.auto_create(name)
            if topic is None:
                error = error or check_topic_name(name) or "UNKNOWN_TOPIC_OR_PARTITION"
                topics.append(
                    s.MetadataResponseTopic(
                        error_code=error_code(error),
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        partitions=(),
                        topic_authorized_operations=topic_operations,
                    )
                )
                continue
            topics.append(self._topic_metadata(s, topic, live_brokers, topic_operations))
        return s.MetadataResponse(
            throttle_time=NO_THROTTLE,
            brokers=self._broker_entries(s, "MetadataResponseBroker"),
            cluster_id=self.image.cluster_id,
            controller_id=self._controller_id(),
            topics=tuple(topics),
            cluster_authorized_operations=cluster_operations,
        )

    @staticmethod
    def _topic_metadata(
        s: ResponseSchema, topic: TopicMetadata, live_brokers: set[int], authorized_operations: int
    ) -> Any:
        partitions = []
        for index, p in enumerate(topic.partitions):
            offline = [r for r in p.replicas if r not in live_brokers]
            partitions.append(
                s.MetadataResponsePartition(
                    error_code=error_code("LEADER_NOT_AVAILABLE" if p.leader < 0 else None),
                    partition_index=index,
                    leader_id=p.leader,
                    leader_epoch=p.leader_epoch,
                    replica_nodes=tuple(p.replicas),
                    isr_nodes=tuple(p.isr),
                    offline_replicas=tuple(offline),
                )
            )
        return s.MetadataResponseTopic(
            error_code=error_code(None),
            name=topic.name,
            topic_id=topic.topic_id,
            is_internal=topic.is_internal,
            partitions=tuple(partitions),
            topic_authorized_operations=authorized_operations,
        )

    async def handle_describe_cluster(self, request: Request) -> Any:
        s = self._schema(request)
        return s.DescribeClusterResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            error_message=None,
            endpoint_type=1,
            cluster_id=self.image.cluster_id,
            controller_id=self._controller_id(),
            brokers=self._broker_entries(s, "DescribeClusterBroker"),
            cluster_authorized_operations=self._cluster_authorized_operations(
                request.body.include_cluster_authorized_operations
            ),
        )

    def _cluster_authorized_operations(self, asked: bool) -> int:
        """KIP-430's cluster operations: none at all without DESCRIBE on the cluster (Kafka's AuthHelper)."""
        if not asked:
            return OMITTED
        if not self.auth.authorize_cluster(AclOperation.DESCRIBE):
            return 0
        return self.auth.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)

    # SCRAM credentials

    async def handle_describe_user_scram_credentials(self, request: Request) -> Any:
        """DescribeUserScramCredentials (KIP-554), answered from this broker's image as Kafka's ScramImage
        does: each user's mechanisms and iteration counts, never a salt or key; no users (null or empty) means
        every user with a credential (docs/security.md#scram-credentials). It needs DESCRIBE on the cluster:
        without, the request and each user it names get CLUSTER_AUTHORIZATION_FAILED, as in Kafka."""
        s = self._schema(request)
        if not self.auth.authorize_cluster(AclOperation.DESCRIBE):
            refused, message = error_code("CLUSTER_AUTHORIZATION_FAILED"), "Cluster authorization failed."
            return s.DescribeUserScramCredentialsResponse(
                throttle_time=NO_THROTTLE,
                error_code=refused,
                error_message=message,
                results=tuple(
                    s.DescribeUserScramCredentialsResult(
                        user=user.name, error_code=refused, error_message=message, credential_infos=()
                    )
                    for user in request.body.users or ()
                ),
            )
        mechanism_types = {name: mechanism for mechanism, name in SCRAM_MECHANISM_NAMES.items()}
        infos_by_user: dict[str, list[Any]] = {}
        for (user, mechanism), credential in sorted(self.image.scram_credentials.items()):
            infos_by_user.setdefault(user, []).append(
                s.CredentialInfo(mechanism=mechanism_types[mechanism], iterations=credential.iterations)
            )
        named = Counter(user.name for user in request.body.users or ())
        results = []
        for user in named or sorted(infos_by_user):
            infos = tuple(infos_by_user.get(user, ()))
            error, message = None, None
            if named[user] > 1:
                error = "DUPLICATE_RESOURCE"
                message = f"Cannot describe SCRAM credentials for the same user twice in a single request: {user}"
                infos = ()
            elif not infos:
                error = "RESOURCE_NOT_FOUND"
                message = f"Attempt to describe a user credential that does not exist: {user}"
            results.append(
                s.DescribeUserScramCredentialsResult(
                    user=user, error_code=error_code(error), error_message=message, credential_infos=infos
                )
            )
        return s.DescribeUserScramCredentialsResponse(
            throttle_time=NO_THROTTLE, error_code=error_code(None), error_message=None, results=tuple(results)
        )

    # Producer ids

    async def handle_describe_producers(self, request: Request) -> Any:
        """Kafka's DescribeProducers: every active producer of each partition as this replica's log has it
        (producer state is kept by followers too); UNKNOWN_TOPIC_OR_PARTITION for a partition not here. The topic's
        name is checked first, then READ on it."""
        s = self._schema(request)
        topics = []
        for topic in request.body.topics:
            topic_error = check_topic_name(topic.name)
            if topic_error is None and not self.auth.authorize(AclOperation.READ, ResourceType.TOPIC, topic.name):
                topic_error = "TOPIC_AUTHORIZATION_FAILED"
            partitions = []
            for index in topic.partition_indexes:
                if topic_error is not None:
                    producers, error, message = (), topic_error, None
                else:
                    producers, error, message = self._active_producers(s, TopicPartition(topic.name, index))
                partitions.append(
                    s.PartitionResponse(
                        partition_index=index,
                        error_code=error_code(error),
                        error_message=message,
                        active_producers=producers,
                    )
                )
            topics.append(s.TopicResponse(name=topic.name, partitions=tuple(partitions)))
        return s.DescribeProducersResponse(throttle_time=NO_THROTTLE, topics=tuple(topics))

    def _active_producers(
        self, s: ResponseSchema, tp: TopicPartition
    ) -> tuple[tuple[Any, ...], str | None, str | None]:
        """(producer states, error, message) of one partition."""
        try:
            log = self.replica_manager.get_partition(tp).log
        except UnknownTopicOrPartitionError as e:
            return (), error_name_of(e), str(e)
        producers = tuple(
            s.ProducerState(
                producer_id=producer_id,
                producer_epoch=entry.producer_epoch,
                last_sequence=entry.last_seq,
                last_timestamp=entry.last_timestamp,
                coordinator_epoch=entry.coordinator_epoch,
                current_txn_start_offset=(
                    -1 if entry.current_txn_first_offset is None else entry.current_txn_first_offset
                ),
            )
            for producer_id, entry in sorted(log.producer_state_manager.active_producers.items())
        )
        return producers, None, None

    # Produce and Fetch

    async def handle_produce(self, request: Request) -> Any:
        body = request.body
        entries: dict[TopicPartition, bytearray] = {}
        early_errors: dict[TopicPartition, str] = {}
        writable = self.auth.filter_authorized(
            AclOperation.WRITE, ResourceType.TOPIC, (t.name for t in body.topic_data)
        )
        # docs/transactions.md#produce: transactional batches need WRITE on the request's transactional id, or the
        # whole request is refused (Kafka's handleProduceRequest).
        transactional_refused = any(
            _is_transactional(p.records) for t in body.topic_data for p in t.partition_data
        ) and (
            body.transactional_id is None
            or not self.auth.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
        )
        for topic_data in body.topic_data:
            for partition_data in topic_data.partition_data:
                tp = TopicPartition(topic_data.name, partition_data.index)
                if transactional_refused:
                    early_errors[tp] = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
                elif topic_data.name not in writable:
                    early_errors[tp] = "TOPIC_AUTHORIZATION_FAILED"
                elif partition_data.records is None or _holds_several_batches(partition_data.records):
                    # Kafka's ProduceRequest.validateRecords: from v3 on, exactly one batch per partition.
                    early_errors[tp] = "INVALID_RECORD"
                elif topic_data.name in INTERNAL_TOPICS and request.client_id != ADMIN_CLIENT_ID:
                    # Only the coordinators write their state and markers there (docs/transactions.md#produce).
                    early_errors[tp] = "INVALID_TOPIC_EXCEPTION"
                else:
                    # One copy: offsets and epochs are stamped into the batch in place before it is written.
                    entries[tp] = bytearray(partition_data.records)
        results: dict[TopicPartition, AppendResult] = {}
        try:
            results = await self._append(entries, body.acks, int(body.timeout.total_seconds() * 1000))
        except Exception as error:
            early_errors.update(dict.fromkeys(entries, error_name_of(error)))
        if body.acks == 0:
            return None
        s = self._schema(request)
        by_topic: dict[str, list[Any]] = {}
        for tp, name in early_errors.items():
            by_topic.setdefault(tp.topic, []).append(
                s.PartitionProduceResponse(
                    index=tp.partition,
                    error_code=error_code(name),
                    base_offset=-1,
                    log_append_time=None,
                    log_start_offset=-1,
                    record_errors=(),
                    error_message=None,
                )
            )
        for tp, result in results.items():
            info = result.info
            by_topic.setdefault(tp.topic, []).append(
                s.PartitionProduceResponse(
                    index=tp.partition,
                    error_code=error_code(result.error),
                    base_offset=info.first_offset if info else -1,
                    log_append_time=timestamp_or_none(info.log_append_time if info else -1),
                    log_start_offset=result.log_start_offset,
                    record_errors=tuple(
                        s.BatchIndexAndErrorMessage(batch_index=e.batch_index, batch_index_error_message=e.message)
                        for e in result.record_errors
                    ),
                    error_message=result.message,
                )
            )
        return s.ProduceResponse(
            responses=tuple(
                s.TopicProduceResponse(name=name, partition_responses=tuple(parts)) for name, parts in by_topic.items()
            ),
            throttle_time=NO_THROTTLE,
        )

    async def _append(
        self,
        entries: dict[TopicPartition, bytearray],
        acks: int,
        timeout_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> dict[TopicPartition, AppendResult]:
        """Append, then wait (acks=all) in the produce purgatory until the HW passes every batch."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[dict[TopicPartition, AppendResult]] = loop.create_future()

        def respond(results: dict[TopicPartition, AppendResult]) -> None:
            if not answered.done():
                answered.set_result(results)

        delayed = self.replica_manager.append_records(entries, acks, timeout_ms, now_ms(), respond, origin=origin)
        if delayed is not None:
            self._arm_timer(delayed.deadline_ms)
        return await answered

    async def _fetch_on_the_controllers_node(self, request: Request) -> Any:
        """A broker following the metadata log fetches it from the controller; every other Fetch is a broker's."""
        assert self._controller_apis is not None
        if self._controller_apis.is_metadata_fetch(request):
            return await self._controller_apis.handle_metadata_fetch(request)
        return await self.handle_fetch(request)

    async def handle_fetch(self, request: Request) -> Any:
        body = request.body
        uses_topic_ids = request.api_version >= 13
        replica_id = getattr(body, "replica_id", -1)
        replica_state = getattr(body, "replica_state", None)
        if replica_state is not None and replica_state.replica_id >= 0:
            replica_id = replica_state.replica_id
        partitions: list[FetchRequestPartition] = []
        for fetch_topic in body.topics:
            name = (self._topic_name(fetch_topic.topic_id) if uses_topic_ids else fetch_topic.topic) or ""
            topic_id = fetch_topic.topic_id if uses_topic_ids else self._topic_id(name)
            for p in fetch_topic.partitions:
                partitions.append(
                    FetchRequestPartition(
                        topic_partition=TopicPartition(name, p.partition),
                        topic_id=topic_id,
                        fetch_offset=p.fetch_offset,
                        current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                        last_fetched_epoch=getattr(p, "last_fetched_epoch", -1),
                        log_start_offset=getattr(p, "log_start_offset", -1),
                        partition_max_bytes=p.partition_max_bytes,
                    )
                )
        forgotten = tuple(
            (forgotten_topic.topic_id if uses_topic_ids else forgotten_topic.topic, partition)
            for forgotten_topic in getattr(body, "forgotten_topics_data", ())
            for partition in forgotten_topic.partitions
        )
        fetch = FetchRequestData(
            replica_id=replica_id,
            max_wait_ms=int(body.max_wait.total_seconds() * 1000),
            min_bytes=body.min_bytes,
            max_bytes=getattr(body, "max_bytes", 2**31 - 1),
            partitions=partitions,
            isolation_level=getattr(body, "isolation_level", 0),
            session_id=getattr(body, "session_id", INVALID_SESSION_ID),
            session_epoch=getattr(body, "session_epoch", FINAL_EPOCH),
            forgotten=forgotten,
            uses_topic_ids=uses_topic_ids,
        )
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[FetchAnswer] = loop.create_future()

        def respond(answer: FetchAnswer) -> None:
            if not answered.done():
                answered.set_result(answer)

        delayed = fetch_messages_for_request(
            self.replica_manager,
            self.fetch_manager,
            fetch,
            now_ms(),
            respond,
            fetch_max_bytes=self._fetch_max_bytes,
            readable_topics=self._fetch_readable_topics(replica_id),
        )
        # A follower's fetch may have proposed an ISR expansion: send it now, not when this fetch is answered
        # (up to replica.fetch.wait.max.ms later), as Kafka's AlterPartitionManager does.
        self._after_request()
        if delayed is not None:
            self._arm_timer(delayed.deadline_ms)
        return self._fetch_response(request, await answered)

    def _fetch_readable_topics(self, replica_id: int) -> Callable[[set[str]], set[str]]:
        """A follower needs CLUSTER_ACTION on the cluster, a consumer READ on each topic (Kafka's
        handleFetchRequest)."""
        if replica_id >= 0:
            allowed = self.auth.authorize_cluster(AclOperation.CLUSTER_ACTION)
            return lambda names: names if allowed else set()
        return lambda names: set(self.auth.filter_authorized(AclOperation.READ, ResourceType.TOPIC, names))

    def _fetch_response(self, request: Request, answer: FetchAnswer) -> Any:
        s = self._schema(request)
        by_topic: dict[tuple[str, uuid.UUID], list[Any]] = {}
        for requested, result in answer.partitions:
            read = result.read
            by_topic.setdefault((result.topic_partition.topic, requested.topic_id), []).append(
                s.PartitionData(
                    partition_index=result.topic_partition.partition,
                    error_code=error_code(result.error),
                    high_watermark=read.high_watermark if read else -1,
                    last_stable_offset=read.last_stable_offset if read else -1,
                    log_start_offset=read.log_start_offset if read else -1,
                    diverging_epoch=s.EpochEndOffset(
                        epoch=read.diverging_epoch[0] if read and read.diverging_epoch else -1,
                        end_offset=read.diverging_epoch[1] if read and read.diverging_epoch else -1,
                    ),
                    aborted_transactions=self._aborted_transactions(s, read),
                    preferred_read_replica=-1,
                    records=read.records if read and read.records is not None else b"",
                )
            )
        return s.FetchResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(answer.error),
            session_id=answer.session_id,
            responses=tuple(
                s.FetchableTopicResponse(topic=name, topic_id=topic_id, partitions=tuple(parts))
                for (name, topic_id), parts in by_topic.items()
            ),
        )

    @staticmethod
    def _aborted_transactions(s: ResponseSchema, read: LogReadResult | None) -> tuple[Any, ...] | None:
        """A read_committed read's aborted transactions (docs/transactions.md#fetch): None (null) otherwise."""
        if read is None or read.aborted_transactions is None:
            return None
        return tuple(
            s.AbortedTransaction(producer_id=txn.producer_id, first_offset=txn.first_offset)
            for txn in read.aborted_transactions
        )

    def _topic_name(self, topic_id: uuid.UUID | None) -> str | None:
        topic = self.image.topic_by_id(topic_id) if topic_id is not None else None
        return topic.name if topic is not None else None

    def _topic_id(self, name: str) -> uuid.UUID:
        topic = self.image.topics.get(name)
        return topic.topic_id if topic is not None else uuid.UUID(int=0)

    async def handle_list_offsets(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        describable = self.auth.filter_authorized(
            AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in body.topics)
        )
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                if topic.name not in describable:
                    partitions.append(
                        s.ListOffsetsPartitionResponse(
                            partition_index=p.partition_index,
                            error_code=error_code("TOPIC_AUTHORIZATION_FAILED"),
                            timestamp=-1,
                            offset=-1,
                            leader_epoch=-1,
                        )
                    )
                    continue
                try:
                    current_leader_epoch = getattr(p, "current_leader_epoch", -1)
                    remote = await self._remote_offset_for_timestamp(
                        tp, p.timestamp, body.replica_id, current_leader_epoch
                    )
                    found = remote or self.replica_manager.fetch_offset_for_timestamp(
                        tp,
                        p.timestamp,
                        isolation_level=getattr(body, "isolation_level", 0),
                        current_leader_epoch=current_leader_epoch,
                        replica_id=body.replica_id,
                    )
                    error = None
                except Exception as e:
                    found, error = None, error_name_of(e)
                partitions.append(
                    s.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=error_code(error),
                        timestamp=found.timestamp if found else -1,
                        offset=found.offset if found else -1,
                        leader_epoch=found.leader_epoch if found else -1,
                    )
                )
            topics.append(s.ListOffsetsTopicResponse(name=topic.name, partitions=tuple(partitions)))
        return s.ListOffsetsResponse(throttle_time=NO_THROTTLE, topics=tuple(topics))

    async def _remote_offset_for_timestamp(
        self, tp: TopicPartition, timestamp: int, replica_id: int, current_leader_epoch: int
    ) -> OffsetAndEpoch | None:
        """A timestamp may fall in the remote tier, which is searched first (Kafka's UnifiedLog does too), by
        the leader of the requester's epoch only: a fenced or unknown epoch is refused as the local lookup
        would, and a non-leader leaves the refusal to it."""
        if self._remote_log is None or timestamp < 0 or replica_id >= 0:
            return None
        partition = self.replica_manager.get_partition(tp)
        partition.check_leader_epoch(current_leader_epoch)
        if not partition.is_leader or not partition.log.remote_log_enabled:
            return None
        try:
            found = await self._remote_log.find_offset_by_timestamp(partition, timestamp)
        except RemoteStorageError as e:
            raise KafkaStorageError(f"cannot search the remote tier of {tp}: {e}") from e
        if found is None:
            return None
        return OffsetAndEpoch(found.offset, found.timestamp, -1 if found.leader_epoch is None else found.leader_epoch)

    async def handle_offset_for_leader_epoch(self, request: Request) -> Any:
        s = self._schema(request)
        names = [topic.topic for topic in request.body.topics]
        # Followers ask with CLUSTER_ACTION; consumers (KIP-320) need DESCRIBE on the topic.
        if self.auth.authorize_cluster(AclOperation.CLUSTER_ACTION):
            describable = set(names)
        else:
            describable = self.auth.filter_authorized(AclOperation.DESCRIBE, ResourceType.TOPIC, names)
        topics = []
        for topic in request.body.topics:
            partitions = []
            for p in topic.partitions:
                tp = TopicPartition(topic.topic, p.partition)
                error: str | None = None
                if topic.topic not in describable:
                    epoch, end_offset, error = -1, -1, "TOPIC_AUTHORIZATION_FAILED"
                else:
                    try:
                        epoch, end_offset = self.replica_manager.get_partition(tp).last_offset_for_leader_epoch(
                            getattr(p, "current_leader_epoch", -1), p.leader_epoch
                        )
                    except Exception as e:
                        epoch, end_offset, error = -1, -1, error_name_of(e)
                partitions.append(
                    s.EpochEndOffset(
                        error_code=error_code(error),
                        partition=p.partition,
                        leader_epoch=epoch,
                        end_offset=end_offset,
                    )
                )
            topics.append(s.OffsetForLeaderTopicResult(topic=topic.topic, partitions=tuple(partitions)))
        return s.OffsetForLeaderEpochResponse(throttle_time=NO_THROTTLE, topics=tuple(topics))

    async def handle_delete_records(self, request: Request) -> Any:
        s = self._schema(request)
        deletable = self.auth.filter_authorized(
            AclOperation.DELETE, ResourceType.TOPIC, (t.name for t in request.body.topics)
        )
        topics = []
        for topic in request.body.topics:
            partitions = []
            for p in topic.partitions:
                error: str | None = None
                if topic.name not in deletable:
                    low, error = -1, "TOPIC_AUTHORIZATION_FAILED"
                else:
                    try:
                        low = self.replica_manager.delete_records(
                            TopicPartition(topic.name, p.partition_index), p.offset, now_ms()
                        )
                    except Exception as e:
                        low, error = -1, error_name_of(e)
                partitions.append(
                    s.DeleteRecordsPartitionResult(
                        partition_index=p.partition_index, low_watermark=low, error_code=error_code(error)
                    )
                )
            topics.append(s.DeleteRecordsTopicResult(name=topic.name, partitions=tuple(partitions)))
        return s.DeleteRecordsResponse(throttle_time=NO_THROTTLE, topics=tuple(topics))


def _is_transactional(records: bytes | None) -> bool:
    """Whether a partition's first batch is transactional (Kafka's RequestUtils.hasTransactionalRecords)."""
    if records is None or len(records) < RECORD_BATCH_OVERHEAD:
        return False
    return read_header(records).is_transactional


def _holds_several_batches(records: bytes) -> bool:
    first = batch_size_at(records, 0)
    return first is not None and first < len(records)

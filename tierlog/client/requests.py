"""One builder per request a tierlog component sends: pure functions returning the kio request entity of the
version asked for (each API's default is the version tierlog sends), which carries that version to the wire.

Every builder describes its request once with every field it knows; `request_schema` keeps only the fields
the version has, so a builder serves every version (tests send older and newer ones than tierlog does).
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.index import load_payload_module
from kio.static.constants import EntityType

from tierlog.common import TopicPartition
from tierlog.metadata.image import IsrChange
from tierlog.metadata.records import Endpoint
from tierlog.protocol.entities import EntitySchema

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_API_VERSIONS, API_CREATE_TOPICS, API_OFFSET_FOR_LEADER_EPOCH = 18, 19, 23
API_ALTER_PARTITION, API_BROKER_REGISTRATION, API_BROKER_HEARTBEAT, API_ALLOCATE_PRODUCER_IDS = 56, 62, 63, 67
API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 17, 36
API_DESCRIBE_QUORUM, API_DESCRIBE_CLUSTER = 55, 60
API_DESCRIBE_LOG_DIRS, API_ALTER_PARTITION_REASSIGNMENTS, API_LIST_PARTITION_REASSIGNMENTS = 35, 45, 46
API_UNREGISTER_BROKER = 64
API_FIND_COORDINATOR, API_WRITE_TXN_MARKERS, API_DESCRIBE_TRANSACTIONS, API_LIST_TRANSACTIONS = 10, 27, 65, 66

# The versions tierlog sends, and why.
PRODUCE_VERSION = 9
FETCH_VERSION = 12  # topic names, LastFetchedEpoch and DivergingEpoch (KIP-595/KIP-320)
LIST_OFFSETS_VERSION = 8  # EARLIEST_LOCAL_TIMESTAMP (KIP-405)
# v1 with no topics asks for the brokers only; an answer every Kafka broker gives without a client library.
METADATA_VERSION = 1
# v0 (no tagged fields, response header v0) is the request every Kafka broker must answer (KIP-511).
API_VERSIONS_VERSION = 0
CREATE_TOPICS_VERSION = 7
# v1: the SASL tokens follow in SaslAuthenticate requests, which carry the broker's error message (KIP-152).
SASL_HANDSHAKE_VERSION = 1
SASL_AUTHENTICATE_VERSION = 2
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
ALTER_PARTITION_VERSION = 3
BROKER_REGISTRATION_VERSION = 4
BROKER_HEARTBEAT_VERSION = 1
ALLOCATE_PRODUCER_IDS_VERSION = 0
# v2 adds the voters' listeners (Nodes, KIP-853); v1 the replicas' last fetch and caught-up times.
DESCRIBE_QUORUM_VERSION = 2
# v0 answers the cluster id, which is all `tierlog quorum status` asks of it.
DESCRIBE_CLUSTER_VERSION = 0
# v4 adds each log dir's total and usable bytes (KIP-827).
DESCRIBE_LOG_DIRS_VERSION = 4
ALTER_PARTITION_REASSIGNMENTS_VERSION = 0
LIST_PARTITION_REASSIGNMENTS_VERSION = 0
UNREGISTER_BROKER_VERSION = 0
# v4 batches keys (KIP-699); the key type 0 is a group, 1 a transactional id.
FIND_COORDINATOR_VERSION = 4
# v1 is what Kafka 4.0 sends (and kio's oldest); v2 adds the marker's transaction version (KIP-890's TV2).
WRITE_TXN_MARKERS_VERSION = 1
DESCRIBE_TRANSACTIONS_VERSION = 0
# v1 adds the duration filter (KIP-994), which is sent only when asked for.
LIST_TRANSACTIONS_VERSION = 1
COORDINATOR_KEY_GROUP, COORDINATOR_KEY_TRANSACTION = 0, 1

CONSUMER_REPLICA_ID = -1  # not a replica: the leader answers up to the high watermark only
NO_EPOCH = -1  # "unknown" for every epoch field of a request
READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@functools.cache
def request_schema(api_key: int, version: int) -> EntitySchema:
    """The builder over one version's request module (fields the version lacks are dropped)."""
    return EntitySchema(load_payload_module(api_key, version, EntityType.request))


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """One partition of a Fetch request; the epochs and log start are -1 (unknown) unless a replica knows them."""

    topic_partition: TopicPartition
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = NO_EPOCH
    last_fetched_epoch: int = NO_EPOCH
    log_start_offset: int = -1


def fetch_request(
    partitions: Iterable[PartitionFetch],
    *,
    max_wait_ms: int,
    max_bytes: int,
    min_bytes: int = 1,
    replica_id: int = CONSUMER_REPLICA_ID,
    version: int = FETCH_VERSION,
    isolation_level: int = READ_UNCOMMITTED,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: Iterable[TopicPartition] = (),
) -> Any:
    """A Fetch of `partitions`, grouped by topic in the order given; up to v12, the last version that names
    topics rather than their ids. READ_COMMITTED reads up to the last stable offset, with the aborted
    transactions of what it returns. Without a session by default (id 0, epoch -1); a fetch session
    (docs/performance.md#fetch-sessions) starts with id 0 and epoch 0, then sends the leader's session id, its next
    epoch, the partitions added or changed and those to `forget`."""
    s = request_schema(API_FETCH, version)
    forgotten_by_topic: dict[str, list[int]] = {}
    for tp in forgotten:
        forgotten_by_topic.setdefault(tp.topic, []).append(tp.partition)
    by_topic: dict[str, list[Any]] = {}
    for p in partitions:
        by_topic.setdefault(p.topic_partition.topic, []).append(
            s.FetchPartition(
                partition=p.topic_partition.partition,
                current_leader_epoch=p.current_leader_epoch,
                fetch_offset=p.fetch_offset,
                last_fetched_epoch=p.last_fetched_epoch,
                log_start_offset=p.log_start_offset,
                partition_max_bytes=p.partition_max_bytes,
            )
        )
    return s.FetchRequest(
        replica_id=replica_id,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=tuple(s.FetchTopic(topic=name, partitions=tuple(parts)) for name, parts in by_topic.items()),
        forgotten_topics_data=tuple(
            s.ForgottenTopic(topic=name, partitions=tuple(parts)) for name, parts in forgotten_by_topic.items()
        ),
        rack_id="",
    )


def produce_request(
    topic_partition: TopicPartition,
    records: bytes,
    *,
    acks: int,
    timeout_ms: int,
    version: int = PRODUCE_VERSION,
) -> Any:
    """A non-transactional Produce of one partition's record batch (`records`)."""
    s = request_schema(API_PRODUCE, version)
    return s.ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(
            s.TopicProduceData(
                name=topic_partition.topic,
                partition_data=(s.PartitionProduceData(index=topic_partition.partition, records=records),),
            ),
        ),
    )


def list_offsets_request(
    topic_partition: TopicPartition,
    timestamp: int,
    *,
    replica_id: int = CONSUMER_REPLICA_ID,
    version: int = LIST_OFFSETS_VERSION,
) -> Any:
    """ListOffsets (read uncommitted) of one partition at `timestamp`, or one of the special timestamps
    (-1 latest, -2 earliest, -4 earliest local, -5 latest tiered). A replica (replica_id >= 0) is answered
    up to the leader's log end, a consumer up to the high watermark."""
    s = request_schema(API_LIST_OFFSETS, version)
    return s.ListOffsetsRequest(
        replica_id=replica_id,
        isolation_level=READ_UNCOMMITTED,
        topics=(
            s.ListOffsetsTopic(
                name=topic_partition.topic,
                partitions=(
                    s.ListOffsetsPartition(
                        partition_index=topic_partition.partition, current_leader_epoch=NO_EPOCH, timestamp=timestamp
                    ),
                ),
            ),
        ),
    )


def offset_for_leader_epoch_request(
    topic_partition: TopicPartition,
    leader_epoch: int,
    *,
    replica_id: int,
    version: int = OFFSET_FOR_LEADER_EPOCH_VERSION,
) -> Any:
    """Where `leader_epoch` ends in the leader's log of one partition."""
    s = request_schema(API_OFFSET_FOR_LEADER_EPOCH, version)
    return s.OffsetForLeaderEpochRequest(
        replica_id=replica_id,
        topics=(
            s.OffsetForLeaderTopic(
                topic=topic_partition.topic,
                partitions=(
                    s.OffsetForLeaderPartition(
                        partition=topic_partition.partition, current_leader_epoch=NO_EPOCH, leader_epoch=leader_epoch
                    ),
                ),
            ),
        ),
    )


def metadata_request(
    topics: Iterable[str] | None,
    *,
    include_authorized_operations: bool = False,
    version: int = METADATA_VERSION,
) -> Any:
    """Metadata of `topics` (None: every topic; none: the brokers only), never creating a topic."""
    s = request_schema(API_METADATA, version)
    return s.MetadataRequest(
        topics=None if topics is None else tuple(s.MetadataRequestTopic(name=name, topic_id=None) for name in topics),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=include_authorized_operations,
        include_topic_authorized_operations=include_authorized_operations,
    )


def api_versions_request(*, version: int = API_VERSIONS_VERSION) -> Any:
    """ApiVersions; from v3 it names the client software: tierlog and its version (KIP-511)."""
    s = request_schema(API_API_VERSIONS, version)
    return s.ApiVersionsRequest(client_software_name="tierlog", client_software_version=_tierlog_version())


def sasl_handshake_request(mechanism: str) -> Any:
    return request_schema(API_SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION).SaslHandshakeRequest(mechanism=mechanism)


def sasl_authenticate_request(auth_bytes: bytes) -> Any:
    return request_schema(API_SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION).SaslAuthenticateRequest(
        auth_bytes=auth_bytes
    )


def describe_quorum_request(metadata_topic: str, *, version: int = DESCRIBE_QUORUM_VERSION) -> Any:
    """DescribeQuorum of partition 0 of `metadata_topic` (KRaft's `__cluster_metadata`), as
    kafka-metadata-quorum.sh's AdminClient.describeMetadataQuorum asks it."""
    s = request_schema(API_DESCRIBE_QUORUM, version)
    return s.DescribeQuorumRequest(
        topics=(s.TopicData(topic_name=metadata_topic, partitions=(s.PartitionData(partition_index=0),)),)
    )


def describe_cluster_request(*, version: int = DESCRIBE_CLUSTER_VERSION) -> Any:
    s = request_schema(API_DESCRIBE_CLUSTER, version)
    return s.DescribeClusterRequest(include_cluster_authorized_operations=False)


@functools.cache
def _tierlog_version() -> str:
    return importlib.metadata.version("tierlog")


def create_topics_request(
    name: str,
    num_partitions: int,
    replication_factor: int,
    configs: Mapping[str, str],
    *,
    timeout_ms: int,
    version: int = CREATE_TOPICS_VERSION,
) -> Any:
    """CreateTopics of one topic, placed by the controller."""
    s = request_schema(API_CREATE_TOPICS, version)
    return s.CreateTopicsRequest(
        topics=(
            s.CreatableTopic(
                name=name,
                num_partitions=num_partitions,
                replication_factor=replication_factor,
                assignments=(),
                configs=tuple(s.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()),
            ),
        ),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        validate_only=False,
    )


# Scale-out: moving replicas (KIP-455), decommissioning brokers (KIP-500) and what each log dir holds.


def alter_partition_reassignments_request(
    targets: Mapping[TopicPartition, Sequence[int] | None],
    *,
    timeout_ms: int,
    version: int = ALTER_PARTITION_REASSIGNMENTS_VERSION,
) -> Any:
    """Move each partition to its target replicas (the first the preferred leader), or cancel its reassignment
    in progress where the target is None."""
    s = request_schema(API_ALTER_PARTITION_REASSIGNMENTS, version)
    by_topic: dict[str, list[Any]] = {}
    for tp, replicas in targets.items():
        by_topic.setdefault(tp.topic, []).append(
            s.ReassignablePartition(
                partition_index=tp.partition, replicas=None if replicas is None else tuple(replicas)
            )
        )
    return s.AlterPartitionReassignmentsRequest(
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topics=tuple(s.ReassignableTopic(name=topic, partitions=tuple(parts)) for topic, parts in by_topic.items()),
    )


def list_partition_reassignments_request(
    partitions: Iterable[TopicPartition] | None,
    *,
    timeout_ms: int,
    version: int = LIST_PARTITION_REASSIGNMENTS_VERSION,
) -> Any:
    """The reassignments in progress of these partitions, or of every partition when None."""
    s = request_schema(API_LIST_PARTITION_REASSIGNMENTS, version)
    topics = None
    if partitions is not None:
        topics = tuple(
            s.ListPartitionReassignmentsTopics(name=topic, partition_indexes=indexes)
            for topic, indexes in _indexes_by_topic(partitions).items()
        )
    return s.ListPartitionReassignmentsRequest(timeout=datetime.timedelta(milliseconds=timeout_ms), topics=topics)


def _indexes_by_topic(partitions: Iterable[TopicPartition]) -> dict[str, tuple[int, ...]]:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {topic: tuple(indexes) for topic, indexes in by_topic.items()}


def unregister_broker_request(broker_id: int, *, version: int = UNREGISTER_BROKER_VERSION) -> Any:
    """Remove a decommissioned broker's registration (`kafka-cluster.sh unregister`)."""
    return request_schema(API_UNREGISTER_BROKER, version).UnregisterBrokerRequest(broker_id=broker_id)


def describe_log_dirs_request(
    partitions: Iterable[TopicPartition] | None, *, version: int = DESCRIBE_LOG_DIRS_VERSION
) -> Any:
    """What the broker's log dirs hold (sizes and lags) for these partitions, or for all of them when None."""
    s = request_schema(API_DESCRIBE_LOG_DIRS, version)
    topics = None
    if partitions is not None:
        topics = tuple(
            s.DescribableLogDirTopic(topic=topic, partitions=indexes)
            for topic, indexes in _indexes_by_topic(partitions).items()
        )
    return s.DescribeLogDirsRequest(topics=topics)


# The controller's APIs (KRaft), sent by brokers.

_PLAINTEXT = 0  # SecurityProtocol id


def broker_registration_request(
    broker_id: int,
    incarnation_id: uuid.UUID,
    cluster_id: str,
    listeners: Iterable[Endpoint],
    rack: str | None,
    *,
    version: int = BROKER_REGISTRATION_VERSION,
) -> Any:
    s = request_schema(API_BROKER_REGISTRATION, version)
    return s.BrokerRegistrationRequest(
        broker_id=broker_id,
        cluster_id=cluster_id,
        incarnation_id=incarnation_id,
        listeners=tuple(
            s.Listener(name=e.name, host=e.host, port=e.port, security_protocol=_PLAINTEXT) for e in listeners
        ),
        features=(),
        rack=rack,
        is_migrating_zk_broker=False,
        log_dirs=(),
        previous_broker_epoch=-1,
    )


def broker_heartbeat_request(
    broker_id: int,
    broker_epoch: int,
    current_metadata_offset: int,
    *,
    want_fence: bool,
    want_shut_down: bool,
    version: int = BROKER_HEARTBEAT_VERSION,
) -> Any:
    s = request_schema(API_BROKER_HEARTBEAT, version)
    return s.BrokerHeartbeatRequest(
        broker_id=broker_id,
        broker_epoch=broker_epoch,
        current_metadata_offset=current_metadata_offset,
        want_fence=want_fence,
        want_shut_down=want_shut_down,
        offline_log_dirs=(),
    )


def alter_partition_request(
    broker_id: int, broker_epoch: int, proposals: Iterable[IsrChange], *, version: int = ALTER_PARTITION_VERSION
) -> Any:
    """A leader's proposals of new ISRs, grouped by topic (the ISR members' broker epochs unknown)."""
    s = request_schema(API_ALTER_PARTITION, version)
    by_topic: dict[uuid.UUID, list[IsrChange]] = {}
    for proposal in proposals:
        by_topic.setdefault(proposal.topic_id, []).append(proposal)
    return s.AlterPartitionRequest(
        broker_id=broker_id,
        broker_epoch=broker_epoch,
        topics=tuple(
            s.TopicData(
                topic_id=topic_id,
                partitions=tuple(
                    s.PartitionData(
                        partition_index=p.partition,
                        leader_epoch=p.leader_epoch,
                        new_isr_with_epochs=tuple(s.BrokerState(broker_id=b, broker_epoch=-1) for b in p.new_isr),
                        leader_recovery_state=0,
                        partition_epoch=p.partition_epoch,
                    )
                    for p in topic_proposals
                ),
            )
            for topic_id, topic_proposals in by_topic.items()
        ),
    )


def allocate_producer_ids_request(
    broker_id: int, broker_epoch: int, *, version: int = ALLOCATE_PRODUCER_IDS_VERSION
) -> Any:
    s = request_schema(API_ALLOCATE_PRODUCER_IDS, version)
    return s.AllocateProducerIdsRequest(broker_id=broker_id, broker_epoch=broker_epoch)


@dataclass(frozen=True)
class TxnMarker:
    """One transaction's marker for some partitions (WriteTxnMarkers' WritableTxnMarker)."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: Sequence[TopicPartition]


def write_txn_markers_request(markers: Iterable[TxnMarker], *, version: int = WRITE_TXN_MARKERS_VERSION) -> Any:
    s = request_schema(API_WRITE_TXN_MARKERS, version)
    return s.WriteTxnMarkersRequest(
        markers=tuple(
            s.WritableTxnMarker(
                producer_id=marker.producer_id,
                producer_epoch=marker.producer_epoch,
                transaction_result=marker.committed,
                topics=tuple(
                    s.WritableTxnMarkerTopic(name=topic, partition_indexes=indexes)
                    for topic, indexes in _indexes_by_topic(marker.partitions).items()
                ),
                coordinator_epoch=marker.coordinator_epoch,
            )
            for marker in markers
        )
    )


def find_coordinator_request(key: str, key_type: int, *, version: int = FIND_COORDINATOR_VERSION) -> Any:
    s = request_schema(API_FIND_COORDINATOR, version)
    return s.FindCoordinatorRequest(key=key, key_type=key_type, coordinator_keys=(key,))


def describe_transactions_request(
    transactional_ids: Iterable[str], *, version: int = DESCRIBE_TRANSACTIONS_VERSION
) -> Any:
    s = request_schema(API_DESCRIBE_TRANSACTIONS, version)
    return s.DescribeTransactionsRequest(transactional_ids=tuple(transactional_ids))


def list_transactions_request(
    state_filters: Iterable[str] = (),
    producer_id_filters: Iterable[int] = (),
    duration_filter_ms: int = -1,
    *,
    version: int = LIST_TRANSACTIONS_VERSION,
) -> Any:
    """`duration_filter_ms` >= 0 (v1+, KIP-994): only transactions running longer than that."""
    s = request_schema(API_LIST_TRANSACTIONS, version)
    return s.ListTransactionsRequest(
        state_filters=tuple(state_filters),
        producer_id_filters=tuple(producer_id_filters),
        duration_filter=duration_filter_ms,
    )

"""KRaft's quorum messages on the wire: the Raft core's dataclasses (`tierlog.raft.messages`) to and from Kafka's
Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch, FetchSnapshot and DescribeQuorum entities (kio), both ways.

A voter sending (RaftManager): `raft_request` builds the kio request of a core request, `raft_response_of` reads
the kio response back into the core's response. A voter answering (ControllerApis): `raft_request_of` reads a
kio request into the core's request, `raft_response` writes the core's answer as the kio response of the
request's version, `raft_error_response` answers with a top-level error (what Kafka's KafkaRaftClient does for
INCONSISTENT_CLUSTER_ID and INVALID_REQUEST, and Kafka's ControllerApis for CLUSTER_AUTHORIZATION_FAILED).

Every message names one partition, `__cluster_metadata-0` (Fetch v13+ by its id, Uuid.METADATA_TOPIC_ID); a
request naming anything else is INVALID_REQUEST, as in Kafka until it runs several Raft partitions.
docs/quorum.md#the-wire.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Sequence
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.protocol import RequestPayload, ResponsePayload

from tierlog.client.requests import request_schema
from tierlog.protocol.entities import EntitySchema
from tierlog.protocol.errors import error_code
from tierlog.raft.messages import (
    NO_EPOCH,
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    OffsetAndEpoch,
    QuorumInfo,
    RaftFetchRequest,
    RaftFetchResponse,
    RaftRequest,
    RaftResponse,
    ReplicaState,
    VoteRequest,
    VoteResponse,
)
from tierlog.raft.raft_log import METADATA_TOPIC, METADATA_TOPIC_ID

API_FETCH, API_VOTE, API_BEGIN_QUORUM_EPOCH, API_END_QUORUM_EPOCH = 1, 52, 53, 54
API_DESCRIBE_QUORUM, API_FETCH_SNAPSHOT = 55, 59
RAFT_APIS = (API_VOTE, API_BEGIN_QUORUM_EPOCH, API_END_QUORUM_EPOCH, API_FETCH_SNAPSHOT)

# The versions a tierlog voter sends. Vote v2 carries KIP-996's PreVote and BeginQuorumEpoch v1 the VoterId (both
# with KIP-853's directory ids and endpoints left empty: the voters are static); v1 of EndQuorumEpoch and
# FetchSnapshot add only those, so v0. Fetch v16: the metadata topic by id, the fetcher in ReplicaState (v15+).
VOTE_VERSION = 2
BEGIN_QUORUM_EPOCH_VERSION = 1
END_QUORUM_EPOCH_VERSION = 0
RAFT_FETCH_VERSION = 16
FETCH_SNAPSHOT_VERSION = 0

METADATA_PARTITION_INDEX = 0
# Errors Kafka's KafkaRaftClient puts at the top level of a response (the request was not looked at further);
# every other error is the partition's.
TOP_LEVEL_ERRORS = frozenset({"INCONSISTENT_CLUSTER_ID", "INVALID_REQUEST", "CLUSTER_AUTHORIZATION_FAILED"})
NO_THROTTLE = datetime.timedelta(0)
# The core's response type of each API, and the name of kio's response class.
_RESPONSES: dict[int, tuple[type, str]] = {
    API_VOTE: (VoteResponse, "VoteResponse"),
    API_BEGIN_QUORUM_EPOCH: (BeginQuorumEpochResponse, "BeginQuorumEpochResponse"),
    API_END_QUORUM_EPOCH: (EndQuorumEpochResponse, "EndQuorumEpochResponse"),
    API_FETCH: (RaftFetchResponse, "FetchResponse"),
    API_FETCH_SNAPSHOT: (FetchSnapshotResponse, "FetchSnapshotResponse"),
}
_API_KEY_OF_RESPONSE = {response_type: api_key for api_key, (response_type, _) in _RESPONSES.items()}
_API_KEY_OF_REQUEST = {
    VoteRequest: API_VOTE,
    BeginQuorumEpochRequest: API_BEGIN_QUORUM_EPOCH,
    EndQuorumEpochRequest: API_END_QUORUM_EPOCH,
    RaftFetchRequest: API_FETCH,
    FetchSnapshotRequest: API_FETCH_SNAPSHOT,
}


class InvalidRaftMessageError(ValueError):
    """A request or response that does not name exactly `__cluster_metadata-0` (Kafka's INVALID_REQUEST)."""


def _error_name(code: ErrorCode) -> str | None:
    return None if code == ErrorCode.none else code.name.upper()


@functools.cache
def _response_schema(api_key: int, version: int) -> EntitySchema:
    return EntitySchema(load_payload_module(api_key, version, EntityType.response))


# The sending voter: core request -> kio request, kio response -> core response.


def raft_request(request: RaftRequest, version: int | None = None) -> RequestPayload:
    """The kio request a voter sends for the core's `request`, at the version tierlog sends unless `version`
    says otherwise (fields that version lacks are dropped)."""
    if isinstance(request, VoteRequest):
        s = request_schema(API_VOTE, VOTE_VERSION if version is None else version)
        return s.VoteRequest(
            cluster_id=request.cluster_id,
            voter_id=request.voter_id,
            topics=(
                s.TopicData(
                    topic_name=METADATA_TOPIC,
                    partitions=(
                        s.PartitionData(
                            partition_index=METADATA_PARTITION_INDEX,
                            replica_epoch=request.candidate_epoch,
                            replica_id=request.candidate_id,
                            replica_directory_id=None,
                            voter_directory_id=None,
                            last_offset_epoch=request.last_offset_epoch,
                            last_offset=request.last_offset,
                            pre_vote=request.pre_vote,
                        ),
                    ),
                ),
            ),
        )
    if isinstance(request, BeginQuorumEpochRequest):
        s = request_schema(API_BEGIN_QUORUM_EPOCH, BEGIN_QUORUM_EPOCH_VERSION if version is None else version)
        return s.BeginQuorumEpochRequest(
            cluster_id=request.cluster_id,
            voter_id=request.voter_id,
            topics=(
                s.TopicData(
                    topic_name=METADATA_TOPIC,
                    partitions=(
                        s.PartitionData(
                            partition_index=METADATA_PARTITION_INDEX,
                            voter_directory_id=None,
                            leader_id=request.leader_id,
                            leader_epoch=request.leader_epoch,
                        ),
                    ),
                ),
            ),
            leader_endpoints=(),
        )
    if isinstance(request, EndQuorumEpochRequest):
        s = request_schema(API_END_QUORUM_EPOCH, END_QUORUM_EPOCH_VERSION if version is None else version)
        return s.EndQuorumEpochRequest(
            cluster_id=request.cluster_id,
            topics=(
                s.TopicData(
                    topic_name=METADATA_TOPIC,
                    partitions=(
                        s.PartitionData(
                            partition_index=METADATA_PARTITION_INDEX,
                            leader_id=request.leader_id,
                            leader_epoch=request.leader_epoch,
                            preferred_successors=request.preferred_successors,
                            preferred_candidates=tuple(
                                s.ReplicaInfo(candidate_id=voter, candidate_directory_id=None)
                                for voter in request.preferred_successors
                            ),
                        ),
                    ),
                ),
            ),
            leader_endpoints=(),
        )
    if isinstance(request, RaftFetchRequest):
        s = request_schema(API_FETCH, RAFT_FETCH_VERSION if version is None else version)
        return s.FetchRequest(
            cluster_id=request.cluster_id,
            replica_id=request.replica_id,
            replica_state=s.ReplicaState(replica_id=request.replica_id, replica_epoch=-1),
            max_wait=datetime.timedelta(milliseconds=request.max_wait_ms),
            min_bytes=0,
            max_bytes=request.max_bytes,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(
                s.FetchTopic(
                    topic=METADATA_TOPIC,
                    topic_id=METADATA_TOPIC_ID,
                    partitions=(
                        s.FetchPartition(
                            partition=METADATA_PARTITION_INDEX,
                            current_leader_epoch=request.current_leader_epoch,
                            fetch_offset=request.fetch_offset,
                            last_fetched_epoch=request.last_fetched_epoch,
                            log_start_offset=-1,
                            partition_max_bytes=request.max_bytes,
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
    s = request_schema(API_FETCH_SNAPSHOT, FETCH_SNAPSHOT_VERSION if version is None else version)
    return s.FetchSnapshotRequest(
        cluster_id=request.cluster_id,
        replica_id=request.replica_id,
        max_bytes=request.max_bytes,
        topics=(
            s.TopicSnapshot(
                name=METADATA_TOPIC,
                partitions=(
                    s.PartitionSnapshot(
                        partition=METADATA_PARTITION_INDEX,
                        current_leader_epoch=request.current_leader_epoch,
                        snapshot_id=s.SnapshotId(
                            end_offset=request.snapshot_id.offset, epoch=request.snapshot_id.epoch
                        ),
                        position=request.position,
                    ),
                ),
            ),
        ),
    )


def raft_response_of(request: RaftRequest, response: ResponsePayload) -> RaftResponse:
    """The core's reading of the kio `response` to `request`; InvalidRaftMessageError when it answers for
    another partition than `__cluster_metadata-0`."""
    top_level = _error_name(response.error_code)
    if isinstance(request, RaftFetchRequest):
        if top_level is not None:
            return RaftFetchResponse(top_level, NO_LEADER, NO_EPOCH)
        p = _only_partition(response.responses)
        return RaftFetchResponse(
            _error_name(p.error_code),
            p.current_leader.leader_id,
            p.current_leader.leader_epoch,
            high_watermark=p.high_watermark,
            log_start_offset=p.log_start_offset,
            diverging_epoch=(
                None
                if p.diverging_epoch.epoch < 0
                else OffsetAndEpoch(p.diverging_epoch.end_offset, p.diverging_epoch.epoch)
            ),
            snapshot_id=(
                None if p.snapshot_id.end_offset < 0 else OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch)
            ),
            records=bytes(p.records or b""),
        )
    if isinstance(request, FetchSnapshotRequest):
        if top_level is not None:
            return FetchSnapshotResponse(top_level, NO_LEADER, NO_EPOCH)
        p = _only_partition(response.topics)
        return FetchSnapshotResponse(
            _error_name(p.error_code),
            p.current_leader.leader_id,
            p.current_leader.leader_epoch,
            snapshot_id=(
                None if p.snapshot_id.end_offset < 0 else OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch)
            ),
            size=p.size,
            position=p.position,
            data=bytes(p.unaligned_records or b""),
        )
    response_type = _RESPONSES[_API_KEY_OF_REQUEST[type(request)]][0]
    if top_level is not None:
        if response_type is VoteResponse:
            return VoteResponse(top_level, NO_LEADER, NO_EPOCH, vote_granted=False)
        return response_type(top_level, NO_LEADER, NO_EPOCH)
    p = _only_partition(response.topics)
    if response_type is VoteResponse:
        return VoteResponse(_error_name(p.error_code), p.leader_id, p.leader_epoch, vote_granted=p.vote_granted)
    return response_type(_error_name(p.error_code), p.leader_id, p.leader_epoch)


def _is_metadata_topic(topic: Any) -> bool:
    """By id (Fetch v13+) or by name, under whichever field name the message gives it."""
    if getattr(topic, "topic_id", None) == METADATA_TOPIC_ID:
        return True
    return any(getattr(topic, field, None) == METADATA_TOPIC for field in ("topic_name", "topic", "name"))


def _partition_index(partition: Any) -> int | None:
    for field in ("partition_index", "partition", "index"):
        if hasattr(partition, field):
            return int(getattr(partition, field))
    return None


def _only_partition(topics: Sequence[Any]) -> Any:
    """The one partition entry of `topics`, which must be `__cluster_metadata-0`."""
    if len(topics) != 1 or len(topics[0].partitions) != 1:
        raise InvalidRaftMessageError(f"expected only {METADATA_TOPIC}-0, got {len(topics)} topics")
    topic = topics[0]
    if not _is_metadata_topic(topic) or _partition_index(topic.partitions[0]) != METADATA_PARTITION_INDEX:
        raise InvalidRaftMessageError(f"expected only {METADATA_TOPIC}-0")
    return topic.partitions[0]


# The answering voter: kio request -> core request, core response -> kio response.


def raft_request_of(body: RequestPayload) -> RaftRequest:
    """The core's request for the kio request `body` (Vote, BeginQuorumEpoch, EndQuorumEpoch, a Fetch of
    `__cluster_metadata`, FetchSnapshot) of any served version; InvalidRaftMessageError when it names another
    partition."""
    api_key = body.__api_key__
    cluster_id = getattr(body, "cluster_id", None)  # Fetch has it from v12
    if api_key == API_VOTE:
        p = _only_partition(body.topics)
        return VoteRequest(
            candidate_id=p.replica_id,
            candidate_epoch=p.replica_epoch,
            last_offset_epoch=p.last_offset_epoch,
            last_offset=p.last_offset,
            pre_vote=getattr(p, "pre_vote", False),
            voter_id=getattr(body, "voter_id", NO_LEADER),
            cluster_id=cluster_id,
        )
    if api_key == API_BEGIN_QUORUM_EPOCH:
        p = _only_partition(body.topics)
        return BeginQuorumEpochRequest(
            leader_id=p.leader_id,
            leader_epoch=p.leader_epoch,
            voter_id=getattr(body, "voter_id", NO_LEADER),
            cluster_id=cluster_id,
        )
    if api_key == API_END_QUORUM_EPOCH:
        p = _only_partition(body.topics)
        # v1 names the candidates with their directory ids instead of the successors' ids.
        candidates = getattr(p, "preferred_candidates", None)
        successors = (
            tuple(c.candidate_id for c in candidates) if candidates is not None else tuple(p.preferred_successors)
        )
        return EndQuorumEpochRequest(
            leader_id=p.leader_id, leader_epoch=p.leader_epoch, preferred_successors=successors, cluster_id=cluster_id
        )
    if api_key == API_FETCH:
        p = _only_partition(body.topics)
        if not hasattr(p, "last_fetched_epoch"):
            raise InvalidRaftMessageError("a fetch of the metadata log by a voter needs LastFetchedEpoch (Fetch v12+)")
        return RaftFetchRequest(
            replica_id=fetch_replica_id(body),
            current_leader_epoch=p.current_leader_epoch,
            fetch_offset=p.fetch_offset,
            last_fetched_epoch=p.last_fetched_epoch,
            max_wait_ms=round(body.max_wait.total_seconds() * 1000),
            max_bytes=min(body.max_bytes, p.partition_max_bytes),
            cluster_id=cluster_id,
        )
    if api_key == API_FETCH_SNAPSHOT:
        p = _only_partition(body.topics)
        return FetchSnapshotRequest(
            replica_id=body.replica_id,
            current_leader_epoch=p.current_leader_epoch,
            snapshot_id=OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch),
            position=p.position,
            max_bytes=body.max_bytes,
            cluster_id=cluster_id,
        )
    raise InvalidRaftMessageError(f"API key {api_key} is not a request of the Raft quorum")


def fetch_replica_id(body: RequestPayload) -> int:
    """Who sent a Fetch: ReplicaState.ReplicaId from v15, ReplicaId before (Kafka's FetchRequest.replicaId)."""
    replica_state = getattr(body, "replica_state", None)
    if replica_state is not None:
        return int(replica_state.replica_id)
    return int(body.replica_id)


def raft_response(response: RaftResponse, version: int) -> ResponsePayload:
    """The kio response of `version` for the core's answer `response`."""
    api_key = _API_KEY_OF_RESPONSE[type(response)]
    if response.error in TOP_LEVEL_ERRORS:
        return raft_error_response(api_key, version, response.error)
    s = _response_schema(api_key, version)
    error = error_code(response.error)
    if isinstance(response, RaftFetchResponse):
        diverging = response.diverging_epoch
        snapshot = response.snapshot_id
        return s.FetchResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(
                s.FetchableTopicResponse(
                    topic=METADATA_TOPIC,
                    topic_id=METADATA_TOPIC_ID,
                    partitions=(
                        s.PartitionData(
                            partition_index=METADATA_PARTITION_INDEX,
                            error_code=error,
                            high_watermark=response.high_watermark,
                            last_stable_offset=-1,
                            log_start_offset=response.log_start_offset,
                            diverging_epoch=s.EpochEndOffset(
                                epoch=diverging.epoch if diverging else -1,
                                end_offset=diverging.offset if diverging else -1,
                            ),
                            current_leader=s.LeaderIdAndEpoch(
                                leader_id=response.leader_id, leader_epoch=response.leader_epoch
                            ),
                            snapshot_id=s.SnapshotId(
                                end_offset=snapshot.offset if snapshot else -1, epoch=snapshot.epoch if snapshot else -1
                            ),
                            aborted_transactions=None,
                            preferred_read_replica=-1,
                            records=response.records,
                        ),
                    ),
                ),
            ),
        )
    if isinstance(response, FetchSnapshotResponse):
        snapshot = response.snapshot_id
        return s.FetchSnapshotResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            topics=(
                s.TopicSnapshot(
                    name=METADATA_TOPIC,
                    partitions=(
                        s.PartitionSnapshot(
                            index=METADATA_PARTITION_INDEX,
                            error_code=error,
                            snapshot_id=s.SnapshotId(
                                end_offset=snapshot.offset if snapshot else -1, epoch=snapshot.epoch if snapshot else -1
                            ),
                            current_leader=s.LeaderIdAndEpoch(
                                leader_id=response.leader_id, leader_epoch=response.leader_epoch
                            ),
                            size=response.size,
                            position=response.position,
                            unaligned_records=response.data,
                        ),
                    ),
                ),
            ),
        )
    partition_fields: dict[str, Any] = {
        "partition_index": METADATA_PARTITION_INDEX,
        "error_code": error,
        "leader_id": response.leader_id,
        "leader_epoch": response.leader_epoch,
    }
    if isinstance(response, VoteResponse):
        partition_fields["vote_granted"] = response.vote_granted
    topic = s.TopicData(topic_name=METADATA_TOPIC, partitions=(s.PartitionData(**partition_fields),))
    return getattr(s, _RESPONSES[api_key][1])(error_code=ErrorCode.none, topics=(topic,))


def raft_error_response(api_key: int, version: int, error: str) -> ResponsePayload:
    """A response of `api_key` (a Raft API or DescribeQuorum) with only a top-level `error`."""
    s = _response_schema(api_key, version)
    code = error_code(error)
    if api_key == API_FETCH:
        return s.FetchResponse(throttle_time=NO_THROTTLE, error_code=code, session_id=0, responses=())
    if api_key == API_FETCH_SNAPSHOT:
        return s.FetchSnapshotResponse(throttle_time=NO_THROTTLE, error_code=code, topics=())
    if api_key == API_DESCRIBE_QUORUM:
        return s.DescribeQuorumResponse(error_code=code, error_message=None, topics=(), nodes=())
    return getattr(s, _RESPONSES[api_key][1])(error_code=code, topics=())


def describe_quorum_response(
    info: QuorumInfo | None,
    version: int,
    *,
    voter_listeners: dict[int, tuple[str, str, int]],
) -> ResponsePayload:
    """DescribeQuorum's answer (Kafka's RaftUtil.singletonDescribeQuorumResponse): the leader's view of every
    replica, or NOT_LEADER_OR_FOLLOWER from a replica that is not the leader (`info` None). From v1 each
    replica's last fetch and last caught-up times; from v2 the voters' listeners, `voter_listeners` (node id ->
    listener name, host, port)."""
    s = _response_schema(API_DESCRIBE_QUORUM, version)
    if info is None:
        partition = s.PartitionData(
            partition_index=METADATA_PARTITION_INDEX,
            error_code=error_code("NOT_LEADER_OR_FOLLOWER"),
            error_message="This controller is not the leader of the metadata quorum.",
            leader_id=NO_LEADER,
            leader_epoch=NO_EPOCH,
            high_watermark=-1,
            current_voters=(),
            observers=(),
        )
    else:

        def replica(state: ReplicaState) -> Any:
            return s.ReplicaState(
                replica_id=state.replica_id,
                replica_directory_id=None,
                log_end_offset=state.log_end_offset,
                last_fetch_timestamp=state.last_fetch_timestamp,
                last_caught_up_timestamp=state.last_caught_up_timestamp,
            )

        partition = s.PartitionData(
            partition_index=METADATA_PARTITION_INDEX,
            error_code=ErrorCode.none,
            error_message=None,
            leader_id=info.leader_id,
            leader_epoch=info.leader_epoch,
            high_watermark=info.high_watermark,
            current_voters=tuple(replica(state) for state in info.current_voters),
            observers=tuple(replica(state) for state in info.observers),
        )
    nodes = tuple(
        s.Node(node_id=node_id, listeners=(s.Listener(name=name, host=host, port=port),))
        for node_id, (name, host, port) in sorted(voter_listeners.items())
        if info is not None
    )
    return s.DescribeQuorumResponse(
        error_code=ErrorCode.none,
        error_message=None,
        topics=(s.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),),
        nodes=nodes,
    )


def describe_quorum_unknown_partition_response(body: RequestPayload, version: int) -> ResponsePayload | None:
    """Kafka's answer to a DescribeQuorum that asks for anything but `__cluster_metadata-0`: every partition it
    names with UNKNOWN_TOPIC_OR_PARTITION; None for the one it answers."""
    try:
        _only_partition(body.topics)
    except InvalidRaftMessageError:
        pass
    else:
        return None
    s = _response_schema(API_DESCRIBE_QUORUM, version)
    unknown = error_code("UNKNOWN_TOPIC_OR_PARTITION")
    return s.DescribeQuorumResponse(
        error_code=ErrorCode.none,
        error_message=None,
        topics=tuple(
            s.TopicData(
                topic_name=topic.topic_name,
                partitions=tuple(
                    s.PartitionData(
                        partition_index=p.partition_index,
                        error_code=unknown,
                        error_message="This server does not host this topic-partition.",
                        leader_id=NO_LEADER,
                        leader_epoch=NO_EPOCH,
                        high_watermark=-1,
                        current_voters=(),
                        observers=(),
                    )
                    for p in topic.partitions
                ),
            )
            for topic in body.topics
        ),
        nodes=(),
    )

"""The quorum's messages on the wire: a core request written by the sending voter's codec, framed, parsed by the
broker's request parser and read back by the answering voter's codec is the request sent; a core response written
at every served version, encoded by the broker and decoded by the client is the response given (where the
version carries every field). Kafka's older versions (Kafka 3.7 to 3.9 controllers) read too."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from tierlog.client.raft_requests import (
    API_DESCRIBE_QUORUM,
    API_FETCH,
    InvalidRaftMessageError,
    describe_quorum_response,
    describe_quorum_unknown_partition_response,
    raft_error_response,
    raft_request,
    raft_request_of,
    raft_response,
    raft_response_of,
)
from tierlog.client.requests import request_schema
from tierlog.client.wire import decode_response, encode_request
from tierlog.protocol.api_versions import SUPPORTED_APIS
from tierlog.protocol.codec import encode_response, parse_request
from tierlog.protocol.fetch_response import ResponseChunk
from tierlog.raft.messages import (
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
    ReplicaState,
    VoteRequest,
    VoteResponse,
)
from tierlog.raft.raft_log import METADATA_TOPIC, METADATA_TOPIC_ID

REQUESTS_AND_RESPONSES: list[tuple[Any, list[Any]]] = [
    (
        VoteRequest(3, 7, 6, 120, pre_vote=True, voter_id=1, cluster_id="abc"),
        [VoteResponse(None, 2, 7, vote_granted=True), VoteResponse("FENCED_LEADER_EPOCH", 2, 8, vote_granted=False)],
    ),
    (
        BeginQuorumEpochRequest(3, 7, voter_id=1, cluster_id=None),
        [BeginQuorumEpochResponse(None, 3, 7), BeginQuorumEpochResponse("NOT_LEADER_OR_FOLLOWER", -1, 8)],
    ),
    (
        EndQuorumEpochRequest(3, 7, preferred_successors=(2, 1)),
        [EndQuorumEpochResponse(None, 3, 7)],
    ),
    (
        RaftFetchRequest(2, 7, 120, 6, max_wait_ms=500, max_bytes=1 << 20),
        [
            RaftFetchResponse(None, 3, 7, high_watermark=110, log_start_offset=0, records=b"batch" * 1000),
            RaftFetchResponse(None, 3, 7, high_watermark=100, diverging_epoch=OffsetAndEpoch(95, 5)),
            RaftFetchResponse(None, 3, 7, high_watermark=100, log_start_offset=90, snapshot_id=OffsetAndEpoch(90, 4)),
            RaftFetchResponse("FENCED_LEADER_EPOCH", 3, 8),
        ],
    ),
    (
        FetchSnapshotRequest(2, 7, OffsetAndEpoch(90, 4), position=4096, max_bytes=1 << 20),
        [
            FetchSnapshotResponse(None, 3, 7, OffsetAndEpoch(90, 4), size=10_000, position=4096, data=b"snap"),
            FetchSnapshotResponse("SNAPSHOT_NOT_FOUND", 3, 7),
        ],
    ),
]
REQUESTS = [request for request, _ in REQUESTS_AND_RESPONSES]
RESPONSES = [(request, response) for request, responses in REQUESTS_AND_RESPONSES for response in responses]


def through_the_broker_parser(entity: Any) -> Any:
    """The kio request as the answering broker parses it from the frame tierlog's client writes."""
    return parse_request(encode_request(entity, 17, "controller-3")[4:]).body


def through_the_wire(request_entity: Any, response_entity: Any) -> Any:
    """The kio response as the sending voter decodes the frame the answering broker writes."""
    parsed = parse_request(encode_request(request_entity, 17, "controller-3")[4:])
    chunks: list[ResponseChunk] = encode_response(parsed, response_entity)
    frame = b"".join(bytes(chunk) for chunk in chunks)  # type: ignore[arg-type]
    return decode_response(request_entity, 17, frame[4:])


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_a_request_arrives_as_it_was_sent(request_: Any) -> None:
    assert raft_request_of(through_the_broker_parser(raft_request(request_))) == request_


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_served_version_of_a_request_reads_back(request_: Any) -> None:
    api = SUPPORTED_APIS[raft_request(request_).__api_key__]
    low = 12 if api.api_key == API_FETCH else api.min_version  # a raft Fetch needs LastFetchedEpoch (v12+)
    for version in range(low, api.max_version + 1):
        received = raft_request_of(through_the_broker_parser(raft_request(request_, version)))
        expected = request_
        # What older versions cannot carry reads as Kafka's default: no pre-vote, no voter id.
        if isinstance(request_, VoteRequest) and version < 2:
            expected = dataclasses.replace(expected, pre_vote=False)
        if isinstance(request_, VoteRequest | BeginQuorumEpochRequest) and version < 1:
            expected = dataclasses.replace(expected, voter_id=-1)
        assert received == expected, version


def test_the_versions_a_voter_sends() -> None:
    versions = {type(raft_request(r)).__name__: raft_request(r).__version__ for r in REQUESTS}
    assert versions == {
        "VoteRequest": 2,
        "BeginQuorumEpochRequest": 1,
        "EndQuorumEpochRequest": 0,
        "FetchRequest": 16,
        "FetchSnapshotRequest": 0,
    }
    for request in REQUESTS:
        entity = raft_request(request)
        assert SUPPORTED_APIS[entity.__api_key__].serves(entity.__version__)


def test_a_raft_fetch_names_the_metadata_topic_by_id_and_the_fetcher_in_replica_state() -> None:
    entity = raft_request(REQUESTS[3])
    assert entity.topics[0].topic_id == METADATA_TOPIC_ID
    assert entity.replica_state.replica_id == 2
    assert entity.topics[0].partitions[0].last_fetched_epoch == 6


@pytest.mark.parametrize(("request_", "response"), RESPONSES, ids=lambda r: type(r).__name__)
def test_a_response_arrives_as_it_was_given(request_: Any, response: Any) -> None:
    entity = raft_request(request_)
    received = through_the_wire(entity, raft_response(response, entity.__version__))
    assert raft_response_of(request_, received) == response


@pytest.mark.parametrize(("request_", "response"), RESPONSES, ids=lambda r: type(r).__name__)
def test_every_served_version_of_a_response_encodes(request_: Any, response: Any) -> None:
    api = SUPPORTED_APIS[raft_request(request_).__api_key__]
    low = 12 if api.api_key == API_FETCH else api.min_version  # a raft Fetch needs LastFetchedEpoch (v12+)
    for version in range(low, api.max_version + 1):
        entity = raft_response(response, version)
        assert (entity.__api_key__, entity.__version__) == (api.api_key, version)
        received = raft_response_of(request_, through_the_wire(raft_request(request_, version), entity))
        # Fields a version lacks (none of the core's, in these versions) would read as their defaults.
        assert received == response, version


def test_kafka_3_7_requests_read_as_the_core_expects() -> None:
    vote = request_schema(52, 0).VoteRequest(
        cluster_id="abc",
        topics=(
            request_schema(52, 0).TopicData(
                topic_name=METADATA_TOPIC,
                partitions=(
                    request_schema(52, 0).PartitionData(
                        partition_index=0, replica_epoch=4, replica_id=3, last_offset_epoch=3, last_offset=50
                    ),
                ),
            ),
        ),
    )
    assert raft_request_of(through_the_broker_parser(vote)) == VoteRequest(3, 4, 3, 50, cluster_id="abc")
    s = request_schema(API_FETCH, 13)
    fetch = s.FetchRequest(
        replica_id=3,
        max_wait=raft_request(REQUESTS[3]).max_wait,
        min_bytes=0,
        max_bytes=1000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            s.FetchTopic(
                topic_id=METADATA_TOPIC_ID,
                partitions=(
                    s.FetchPartition(
                        partition=0,
                        current_leader_epoch=4,
                        fetch_offset=10,
                        last_fetched_epoch=3,
                        log_start_offset=-1,
                        partition_max_bytes=2000,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    assert raft_request_of(through_the_broker_parser(fetch)) == RaftFetchRequest(3, 4, 10, 3, 500, max_bytes=1000)


def test_a_voter_fetch_without_last_fetched_epoch_is_invalid() -> None:
    with pytest.raises(InvalidRaftMessageError, match="LastFetchedEpoch"):
        raft_request_of(through_the_broker_parser(raft_request(REQUESTS[3], 11)))


def test_end_quorum_epoch_v1_names_its_successors_as_candidates() -> None:
    s = request_schema(54, 1)
    request = s.EndQuorumEpochRequest(
        topics=(
            s.TopicData(
                topic_name=METADATA_TOPIC,
                partitions=(
                    s.PartitionData(
                        partition_index=0,
                        leader_id=1,
                        leader_epoch=9,
                        preferred_candidates=(
                            s.ReplicaInfo(candidate_id=3, candidate_directory_id=uuid.uuid4()),
                            s.ReplicaInfo(candidate_id=2, candidate_directory_id=None),
                        ),
                    ),
                ),
            ),
        ),
        leader_endpoints=(s.LeaderEndpoint(name="CONTROLLER", host="127.0.0.1", port=9093),),
    )
    assert raft_request_of(through_the_broker_parser(request)) == EndQuorumEpochRequest(1, 9, (3, 2))


def test_a_request_for_another_partition_is_invalid() -> None:
    entity = raft_request(REQUESTS[0])
    s = request_schema(52, entity.__version__)
    other = s.VoteRequest(
        cluster_id=None,
        voter_id=1,
        topics=(s.TopicData(topic_name="orders", partitions=entity.topics[0].partitions),),
    )
    with pytest.raises(InvalidRaftMessageError):
        raft_request_of(other)
    two = s.VoteRequest(cluster_id=None, voter_id=1, topics=entity.topics * 2)
    with pytest.raises(InvalidRaftMessageError):
        raft_request_of(two)


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_a_top_level_error_reads_as_the_error_with_no_leader(request_: Any) -> None:
    entity = raft_request(request_)
    answer = raft_error_response(entity.__api_key__, entity.__version__, "INCONSISTENT_CLUSTER_ID")
    received = raft_response_of(request_, through_the_wire(entity, answer))
    assert (received.error, received.leader_id, received.leader_epoch) == ("INCONSISTENT_CLUSTER_ID", -1, -1)
    # The core's answer with such an error goes to the top level too, as Kafka's KafkaRaftClient puts it.
    response_type = type(RESPONSES[[r for r, _ in RESPONSES].index(request_)][1])
    fields = {"vote_granted": False} if response_type is VoteResponse else {}
    core_answer = raft_response(response_type("INCONSISTENT_CLUSTER_ID", -1, -1, **fields), entity.__version__)
    assert core_answer.error_code == answer.error_code


INFO = QuorumInfo(
    leader_id=1,
    leader_epoch=7,
    high_watermark=120,
    current_voters=(
        ReplicaState(1, 130, last_fetch_timestamp=5_000, last_caught_up_timestamp=5_000),
        ReplicaState(2, 120, last_fetch_timestamp=1_000, last_caught_up_timestamp=900),
        ReplicaState(3, -1),
    ),
    observers=(ReplicaState(4, 100, last_fetch_timestamp=1_100, last_caught_up_timestamp=800),),
)
LISTENERS = {1: ("CONTROLLER", "127.0.0.1", 9093), 2: ("CONTROLLER", "127.0.0.1", 9094)}


def _describe_quorum_request(version: int, topic: str = METADATA_TOPIC, partition: int = 0) -> Any:
    s = request_schema(API_DESCRIBE_QUORUM, version)
    return s.DescribeQuorumRequest(
        topics=(s.TopicData(topic_name=topic, partitions=(s.PartitionData(partition_index=partition),)),)
    )


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_quorum_answers_what_kafka_metadata_quorum_reads(version: int) -> None:
    request = _describe_quorum_request(version)
    response = through_the_wire(request, describe_quorum_response(INFO, version, voter_listeners=LISTENERS))
    (partition,) = response.topics[0].partitions
    assert (response.topics[0].topic_name, partition.error_code) == (METADATA_TOPIC, 0)
    assert (partition.leader_id, partition.leader_epoch, partition.high_watermark) == (1, 7, 120)
    assert [(r.replica_id, r.log_end_offset) for r in partition.current_voters] == [(1, 130), (2, 120), (3, -1)]
    assert [(r.replica_id, r.log_end_offset) for r in partition.observers] == [(4, 100)]
    if version >= 1:
        times = [(r.last_fetch_timestamp, r.last_caught_up_timestamp) for r in partition.current_voters]
        assert times == [(5_000, 5_000), (1_000, 900), (-1, -1)]
    if version >= 2:
        assert [(n.node_id, [(lst.name, lst.host, lst.port) for lst in n.listeners]) for n in response.nodes] == [
            (1, [("CONTROLLER", "127.0.0.1", 9093)]),
            (2, [("CONTROLLER", "127.0.0.1", 9094)]),
        ]


def test_describe_quorum_on_a_replica_that_is_not_the_leader() -> None:
    request = _describe_quorum_request(2)
    response = through_the_wire(request, describe_quorum_response(None, 2, voter_listeners=LISTENERS))
    (partition,) = response.topics[0].partitions
    assert partition.error_code.name == "not_leader_or_follower"
    assert response.error_code == 0


def test_describe_quorum_of_another_partition_is_unknown() -> None:
    assert describe_quorum_unknown_partition_response(_describe_quorum_request(1), 1) is None
    request = _describe_quorum_request(1, topic="orders", partition=3)
    response = through_the_wire(request, describe_quorum_unknown_partition_response(request, 1))
    (partition,) = response.topics[0].partitions
    assert (response.topics[0].topic_name, partition.partition_index) == ("orders", 3)
    assert partition.error_code.name == "unknown_topic_or_partition"

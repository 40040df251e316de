"""The probes the CLI and the local cluster wait with: a broker answers ApiVersions v0 and Metadata v1 (its
broker ids); a free port, a silent peer, a peer that is not a Kafka broker and an error answer do not."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
from client_helpers import HOST, Answer, scripted_peer

from tierlog.client.probes import answers_api_versions, api_versions_answered, metadata_broker_ids, quorum_leadership
from tierlog.client.raft_requests import describe_quorum_response
from tierlog.protocol.codec import encode_response, parse_request
from tierlog.raft.messages import QuorumInfo, ReplicaState
from tierlog.testing.local_cluster import BrokerProcess, free_port


@pytest.fixture
def fake_peer() -> Iterator[Callable[[Answer], int]]:
    """Starts one-connection peers answering with an `Answer`; the port of each. All end with the test."""
    with ExitStack() as peers:
        yield lambda answer: peers.enter_context(scripted_peer(answer))


def header_of(frame: bytes) -> tuple[int, int, int]:
    """(api key, version, correlation id) of a request frame."""
    api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
    return api_key, version, correlation_id


def metadata_v1_answer(correlation_id: int, brokers: list[tuple[int, str, int, str | None]]) -> bytes:
    body = struct.pack(">ii", correlation_id, len(brokers))
    for node_id, host, port, rack in brokers:
        body += struct.pack(">ih", node_id, len(host)) + host.encode() + struct.pack(">i", port)
        body += struct.pack(">h", -1) if rack is None else struct.pack(">h", len(rack)) + rack.encode()
    body += struct.pack(">ii", 1, 0)  # controller id, no topics
    return struct.pack(">i", len(body)) + body


def api_versions_v0_answer(correlation_id: int, error_code: int) -> bytes:
    body = struct.pack(">ihi", correlation_id, error_code, 1) + struct.pack(">hhh", 18, 0, 4)
    return struct.pack(">i", len(body)) + body


def describe_quorum_answer(frame: bytes, info: QuorumInfo | None) -> bytes:
    """A voter's DescribeQuorum answer to the request `frame`: the leader's view `info`, or (None) a voter's that
    does not lead, NOT_LEADER_OR_FOLLOWER."""
    request = parse_request(frame)
    assert (request.api_key, request.api_version) == (55, 0)
    return b"".join(
        bytes(chunk)
        for chunk in encode_response(request, describe_quorum_response(info, request.api_version, voter_listeners={}))
    )


def test_the_quorum_probe_reads_the_leader_and_epoch_from_the_leader(fake_peer: Callable[[Answer], int]) -> None:
    voters = (ReplicaState(2, 40), ReplicaState(1, 38), ReplicaState(3, 40))
    leader = QuorumInfo(leader_id=2, leader_epoch=7, high_watermark=40, current_voters=voters, observers=())
    port = fake_peer(lambda frame: describe_quorum_answer(frame, leader))
    assert quorum_leadership(HOST, port, timeout_s=5) == (2, 7)


def test_the_quorum_probe_finds_no_leadership_at_a_follower_a_silent_voter_or_none(
    fake_peer: Callable[[Answer], int],
) -> None:
    assert quorum_leadership(HOST, fake_peer(lambda frame: describe_quorum_answer(frame, None)), timeout_s=5) is None
    assert quorum_leadership(HOST, fake_peer(lambda _: None), timeout_s=0.3) is None
    assert quorum_leadership(HOST, free_port(), timeout_s=1) is None


def test_a_broker_answers_both_probes(shared_broker: BrokerProcess) -> None:
    assert api_versions_answered(HOST, shared_broker.port, timeout_s=5)
    assert metadata_broker_ids(HOST, shared_broker.port, timeout_s=5) == {shared_broker.node_id}


def test_the_metadata_probe_reads_the_broker_ids(fake_peer: Callable[[Answer], int]) -> None:
    requests: list[tuple[int, int, int]] = []

    def answer(frame: bytes) -> bytes:
        requests.append(header_of(frame))
        brokers = [(1, "127.0.0.1", 9092, None), (3, "broker-3.local", 9094, "rack-b")]
        return metadata_v1_answer(header_of(frame)[2], brokers)

    assert metadata_broker_ids(HOST, fake_peer(answer), timeout_s=5) == {1, 3}
    assert [(api_key, version) for api_key, version, _ in requests] == [(3, 1)]


def test_an_api_versions_answer_counts_only_without_error(fake_peer: Callable[[Answer], int]) -> None:
    assert api_versions_answered(HOST, fake_peer(lambda f: api_versions_v0_answer(header_of(f)[2], 0)), timeout_s=5)
    unsupported = fake_peer(lambda f: api_versions_v0_answer(header_of(f)[2], 35))  # UNSUPPORTED_VERSION
    assert not api_versions_answered(HOST, unsupported, timeout_s=5)


def test_a_peer_that_is_not_a_kafka_broker_answers_no_probe(fake_peer: Callable[[Answer], int]) -> None:
    def http(_frame: bytes) -> bytes:
        return b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"

    assert not api_versions_answered(HOST, fake_peer(http), timeout_s=5)
    assert metadata_broker_ids(HOST, fake_peer(http), timeout_s=5) is None


def test_a_silent_peer_answers_no_probe_within_the_timeout(fake_peer: Callable[[Answer], int]) -> None:
    assert not api_versions_answered(HOST, fake_peer(lambda _frame: None), timeout_s=0.3)
    assert metadata_broker_ids(HOST, fake_peer(lambda _frame: None), timeout_s=0.3) is None


def test_answers_api_versions_uses_the_callers_connection(fake_peer: Callable[[Answer], int]) -> None:
    port = fake_peer(lambda f: api_versions_v0_answer(header_of(f)[2], 0))
    with socket.create_connection((HOST, port), timeout=5) as sock:
        assert answers_api_versions(sock)


def test_nothing_answers_on_a_free_port() -> None:
    assert not api_versions_answered(HOST, free_port(), timeout_s=0.5)
    assert metadata_broker_ids(HOST, free_port(), timeout_s=0.5) is None

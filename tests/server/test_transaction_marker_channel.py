"""The marker channel: markers grouped by partition leader, retried, dropped for deleted topics, stopped when
fenced, and the core told once every partition has its marker (docs/transactions.md#marker-channel)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from tierlog.client.requests import TxnMarker
from tierlog.client.security import PLAINTEXT
from tierlog.common import TopicPartition
from tierlog.coordinator.transaction.transaction_coordinator import TxnMarkerRequest
from tierlog.metadata.image import BrokerRegistration, ClusterMetadata, PartitionRegistration, TopicMetadata
from tierlog.metadata.records import Endpoint
from tierlog.protocol.errors import error_code
from tierlog.server.entities import response_schema
from tierlog.server.transaction_marker_channel import TransactionMarkerChannel
from tierlog.server.txn_marker_apis import MarkerResults

API_WRITE_TXN_MARKERS = 27


def image(leaders: dict[str, list[int]]) -> ClusterMetadata:
    metadata = ClusterMetadata()
    for broker in (1, 2):
        metadata.brokers[broker] = BrokerRegistration(
            broker, "x", 1, [Endpoint("PLAINTEXT", "127.0.0.1", 9000 + broker)], None, fenced=False
        )
    for name, partition_leaders in leaders.items():
        metadata.topics[name] = TopicMetadata(
            name, uuid.uuid4(), [PartitionRegistration([1, 2], [1, 2], leader) for leader in partition_leaders]
        )
    return metadata


def response(request: Any, errors: dict[TopicPartition, str | None]) -> Any:
    """The WriteTxnMarkers answer of a leader: `errors` per partition, the others written."""
    s = response_schema(API_WRITE_TXN_MARKERS, 1)
    return s.WriteTxnMarkersResponse(
        markers=tuple(
            s.WritableTxnMarkerResult(
                producer_id=marker.producer_id,
                topics=tuple(
                    s.WritableTxnMarkerTopicResult(
                        name=topic.name,
                        partitions=tuple(
                            s.WritableTxnMarkerPartitionResult(
                                partition_index=p, error_code=error_code(errors.get(TopicPartition(topic.name, p)))
                            )
                            for p in topic.partition_indexes
                        ),
                    )
                    for topic in marker.topics
                ),
            )
            for marker in request.markers
        )
    )


class Harness:
    def __init__(self, metadata: ClusterMetadata, node_id: int = 0) -> None:
        self.metadata = metadata
        self.owned = True
        self.completed: list[Any] = []
        self.sent: list[tuple[int, Any]] = []
        # Answers per broker, in order; the default is success.
        self.answers: dict[int, list[dict[TopicPartition, str | None] | Exception]] = {}
        self.written_locally: list[Any] = []
        self.channel = TransactionMarkerChannel(
            node_id,
            lambda: self.metadata,
            lambda: "PLAINTEXT",
            PLAINTEXT,
            1000,
            lambda _id, _epoch: self.owned,
            self.completed.append,
            self._write_local,
        )
        self.channel._request = self._request  # type: ignore[method-assign]

    async def _write_local(self, markers: Sequence[TxnMarker]) -> MarkerResults:
        self.written_locally.extend(markers)
        return {m.producer_id: dict.fromkeys(m.partitions, None) for m in markers}

    async def _request(self, broker_id: int, body: Any) -> Any:
        self.sent.append((broker_id, body))
        queued = self.answers.get(broker_id, [])
        answer = queued.pop(0) if queued else {}
        if isinstance(answer, Exception):
            raise answer
        return response(body, answer)


async def settle(seconds: float = 0.5) -> None:
    await asyncio.sleep(seconds)


def sent_partitions(body: Any) -> set[TopicPartition]:
    return {TopicPartition(t.name, p) for m in body.markers for t in m.topics for p in t.partition_indexes}


def test_markers_go_to_each_partitions_leader_and_complete_once_all_are_written() -> None:
    async def main() -> None:
        harness = Harness(image({"a": [1, 2], "b": [2]}))
        partitions = frozenset({TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)})
        request = TxnMarkerRequest("t1", 7, 3, 5, True, partitions)
        harness.channel.add(request)
        await settle(0.05)
        by_broker = {broker: sent_partitions(body) for broker, body in harness.sent}
        assert by_broker == {1: {TopicPartition("a", 0)}, 2: {TopicPartition("a", 1), TopicPartition("b", 0)}}
        marker = harness.sent[0][1].markers[0]
        assert (marker.producer_id, marker.producer_epoch, marker.transaction_result, marker.coordinator_epoch) == (
            7,
            3,
            True,
            5,
        )
        assert harness.completed == [request]
        await harness.channel.stop()

    asyncio.run(main())


def test_a_retriable_error_or_no_answer_sends_again_to_the_new_leader_and_a_deleted_topic_is_dropped() -> None:
    async def main() -> None:
        harness = Harness(image({"a": [1], "gone": [1]}))
        harness.answers[1] = [{TopicPartition("a", 0): "NOT_LEADER_OR_FOLLOWER"}]
        request = TxnMarkerRequest("t1", 7, 0, 1, False, frozenset({TopicPartition("a", 0), TopicPartition("gone", 0)}))
        harness.channel.add(request)
        await settle(0.02)
        assert harness.completed == []
        # Leadership moved to broker 2, which does not answer the first time; the topic "gone" was deleted.
        harness.metadata = image({"a": [2]})
        harness.answers[2] = [ConnectionError("reset")]
        await settle(0.5)
        assert [broker for broker, _ in harness.sent] == [1, 2, 2]
        assert sent_partitions(harness.sent[-1][1]) == {TopicPartition("a", 0)}
        assert harness.completed == [request]
        await harness.channel.stop()

    asyncio.run(main())


def test_fenced_markers_and_markers_of_a_lost_coordinator_are_never_completed() -> None:
    async def main() -> None:
        harness = Harness(image({"a": [1]}))
        harness.answers[1] = [{TopicPartition("a", 0): "TRANSACTION_COORDINATOR_FENCED"}]
        harness.channel.add(TxnMarkerRequest("t1", 7, 0, 1, True, frozenset({TopicPartition("a", 0)})))
        await settle(0.3)
        assert harness.completed == [] and len(harness.sent) == 1
        assert harness.channel.pending_transactions == 0
        harness.owned = False
        harness.channel.add(TxnMarkerRequest("t2", 8, 0, 1, True, frozenset({TopicPartition("a", 0)})))
        await settle(0.05)
        assert harness.completed == [] and len(harness.sent) == 1
        await harness.channel.stop()

    asyncio.run(main())


def test_the_partitions_this_broker_leads_are_written_by_its_own_handler() -> None:
    async def main() -> None:
        harness = Harness(image({"a": [1, 2]}), node_id=1)
        request = TxnMarkerRequest("t1", 7, 2, 4, True, frozenset({TopicPartition("a", 0), TopicPartition("a", 1)}))
        harness.channel.add(request)
        await settle(0.05)
        assert [(broker, sent_partitions(body)) for broker, body in harness.sent] == [(2, {TopicPartition("a", 1)})]
        assert harness.written_locally == [
            TxnMarker(
                producer_id=7,
                producer_epoch=2,
                committed=True,
                coordinator_epoch=4,
                partitions=(TopicPartition("a", 0),),
            )
        ]
        assert harness.completed == [request]
        await harness.channel.stop()

    asyncio.run(main())

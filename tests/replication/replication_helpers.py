"""A replicated partition on several brokers' ReplicaManagers over real logs in tmp dirs, with the controller
and the network played by hand: metadata is built here and published to every live broker, and each Fetch
is carried from a follower's ReplicaFetcher to the leader's ReplicaManager.fetch_messages and back."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tierlog.common import TopicPartition
from tierlog.metadata.image import BrokerRegistration, ClusterMetadata, PartitionRegistration, TopicMetadata
from tierlog.records.codec import build_batch
from tierlog.replication.fetcher import FetchResponsePartition, ReplicaFetcher
from tierlog.replication.partition import Partition
from tierlog.replication.replica_manager import (
    AppendResult,
    DelayedProduce,
    FetchParams,
    FetchPartitionResult,
    PartitionFetchInfo,
    ReplicaManager,
)
from tierlog.replication.trace import TraceEvent
from tierlog.storage.log import Log
from tierlog.storage.log_manager import LogManager

NOW = 1_700_000_000_000
TOPIC = "events"
TP = TopicPartition(TOPIC, 0)
TOPIC_ID = uuid.UUID("6d2bd2a4-5a47-4d0c-9d8c-3f1f6e0b9a11")


def live_broker(broker_id: int) -> BrokerRegistration:
    """A registered, unfenced broker (the controller's image after its first heartbeat)."""
    return BrokerRegistration(broker_id, f"incarnation-{broker_id}", 0, [], None, fenced=False)


def batch(*values: bytes, timestamp: int = NOW) -> bytearray:
    return bytearray(build_batch([(None, v, [], timestamp) for v in values]))


def single_topic_image(registration: PartitionRegistration, configs: dict[str, str] | None = None) -> ClusterMetadata:
    return ClusterMetadata(
        topics={TOPIC: TopicMetadata(TOPIC, TOPIC_ID, [registration], dict(configs or {}))},
        brokers={b: live_broker(b) for b in registration.replicas},
    )


@dataclass(slots=True)
class InFlightFetch:
    """A follower's Fetch sent to the leader; `answer` is set once the leader responded."""

    cluster: Cluster
    follower: int
    fetcher: ReplicaFetcher
    answers: list[list[FetchPartitionResult]]

    @property
    def answered(self) -> bool:
        return bool(self.answers)

    def deliver(self) -> list[FetchResponsePartition]:
        """Hand the leader's answer to the follower's fetcher."""
        assert self.answers, "the leader has not answered yet"
        responses = [to_response(result) for result in self.answers[0]]
        self.fetcher.process_fetch_response(responses, self.cluster.now)
        return responses


def to_response(result: FetchPartitionResult) -> FetchResponsePartition:
    read = result.read
    if read is None:
        return FetchResponsePartition(result.topic_partition, result.error, -1, -1, None, None)
    records = read.records.read_bytes() if read.records is not None else None
    return FetchResponsePartition(
        result.topic_partition, None, read.high_watermark, read.log_start_offset, read.diverging_epoch, records
    )


class Cluster:
    """Brokers sharing one partition `events-0`; `registration` is the controller's current state of it."""

    def __init__(
        self,
        root: Path,
        broker_ids: list[int],
        *,
        leader: int | None = None,
        isr: list[int] | None = None,
        configs: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.now = NOW
        self.events: list[TraceEvent] = []
        self.configs = dict(configs or {})
        self.brokers = {b: live_broker(b) for b in broker_ids}
        self.managers: dict[int, ReplicaManager] = {}
        for broker_id in broker_ids:
            self.start(broker_id)
        self.registration = PartitionRegistration(
            list(broker_ids), list(broker_ids if isr is None else isr), broker_ids[0] if leader is None else leader
        )

    def start(self, broker_id: int) -> ReplicaManager:
        """(Re)start a broker: its logs are loaded from disk (recovered, as after a crash)."""
        log_manager = LogManager([self.root / f"broker-{broker_id}"], {})
        log_manager.startup({TOPIC: self.configs}, self.now)
        manager = ReplicaManager(broker_id, log_manager, trace=self.events.append)
        self.managers[broker_id] = manager
        self.brokers[broker_id].fenced = False
        return manager

    def crash(self, broker_id: int) -> None:
        """The broker stops without a clean shutdown (its last HW checkpoint survives) and is fenced."""
        self.managers[broker_id].log_manager.checkpoint_high_watermarks()
        del self.managers[broker_id]
        self.brokers[broker_id].fenced = True

    def image(self) -> ClusterMetadata:
        return ClusterMetadata(
            topics={TOPIC: TopicMetadata(TOPIC, TOPIC_ID, [self.registration], dict(self.configs))},
            brokers=dict(self.brokers),
        )

    def publish(self) -> None:
        for manager in self.managers.values():
            manager.apply_metadata(self.image(), self.now)

    def elect(self, leader: int, isr: list[int]) -> None:
        """The controller's election: a new leader epoch, a new partition epoch."""
        r = self.registration
        self.registration = PartitionRegistration(r.replicas, isr, leader, r.leader_epoch + 1, r.partition_epoch + 1)
        self.publish()

    def log(self, broker_id: int) -> Log:
        return self.managers[broker_id].get_partition(TP).log

    def produce(
        self, broker_id: int, *values: bytes, acks: int = -1, timeout_ms: int = 30_000
    ) -> tuple[list[dict[TopicPartition, AppendResult]], DelayedProduce | None]:
        answers: list[dict[TopicPartition, AppendResult]] = []
        delayed = self.managers[broker_id].append_records(
            {TP: batch(*values)}, acks, timeout_ms, self.now, answers.append
        )
        return answers, delayed

    def send_fetch(self, follower: int) -> InFlightFetch:
        manager = self.managers[follower]
        ((leader_id, fetcher),) = manager.fetchers.items()
        request = fetcher.build_fetch_request(self.now)
        assert request is not None, f"broker {follower} has nothing to fetch"
        params = FetchParams(request.replica_id, request.max_wait_ms, request.min_bytes, request.max_bytes, 0)
        infos = [
            (
                p.topic_partition,
                PartitionFetchInfo(
                    p.fetch_offset,
                    p.partition_max_bytes,
                    p.current_leader_epoch,
                    p.last_fetched_epoch,
                    p.log_start_offset,
                ),
            )
            for p in request.partitions
        ]
        answers: list[list[FetchPartitionResult]] = []
        self.managers[leader_id].fetch_messages(params, infos, self.now, answers.append)
        return InFlightFetch(self, follower, fetcher, answers)

    def fetch(self, follower: int) -> list[FetchResponsePartition]:
        """One whole Fetch round trip; a fetch parked on the leader is answered when its wait ends."""
        in_flight = self.send_fetch(follower)
        if not in_flight.answered:
            self.advance(in_flight.fetcher.config.max_wait_ms)
        return in_flight.deliver()

    def advance(self, ms: int) -> None:
        """Time passes: expire what is due in every purgatory."""
        self.now += ms
        for manager in self.managers.values():
            manager.fetch_purgatory.expire(self.now)
            manager.produce_purgatory.expire(self.now)

    def commit_alter_partition(self, leader: int) -> None:
        """Play the controller for the leader's pending ISR change: accept it (compare-and-set) and publish."""
        manager = self.managers[leader]
        (proposal,) = manager.take_alter_partition_proposals()
        r = self.registration
        assert (proposal.leader_epoch, proposal.partition_epoch) == (r.leader_epoch, r.partition_epoch)
        self.registration = PartitionRegistration(
            r.replicas, proposal.new_isr, r.leader, r.leader_epoch, r.partition_epoch + 1
        )
        manager.on_alter_partition_response(TP, self.registration, None, self.now)
        self.publish()

    def trace(self) -> list[tuple[str, str, int | list[int], int | list[int]]]:
        return [(e.attribute, e.phase, e.old, e.new) for e in self.events]


def caught_up_pair(root: Path, first: bytes = b"m0", *, configs: dict[str, str] | None = None) -> Cluster:
    """Leader 1 and follower 2 in the ISR; `first` is committed on both (LEO = HW = 1 on each)."""
    cluster = Cluster(root, [1, 2], configs=configs)
    cluster.publish()
    cluster.produce(1, first, acks=1)
    cluster.fetch(2)
    cluster.fetch(2)
    assert [(cluster.log(b).log_end_offset, cluster.log(b).high_watermark) for b in (1, 2)] == [(1, 1), (1, 1)]
    return cluster


def count_reads(partition: Partition, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(replica id, fetch offset) of every read of the leader's `partition`, call by call."""
    reads: list[tuple[int, int]] = []
    read_records = partition.read_records

    def counting_read(fetch_offset: int, *args: Any, **kwargs: Any) -> Any:
        reads.append((kwargs.get("replica_id", -1), fetch_offset))
        return read_records(fetch_offset, *args, **kwargs)

    monkeypatch.setattr(partition, "read_records", counting_read)
    return reads

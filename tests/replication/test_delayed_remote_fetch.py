"""A consumer's fetch below the local log start (Kafka's DelayedRemoteFetch): the ReplicaManager starts the
remote read of the first such partition and parks the fetch until the read answers or remote.fetch.max.wait.ms
passes, on real tiered logs with the remote read played by hand. A read_committed fetch's remote read is asked for
the aborted transactions of what it reads, and the answer carries them (docs/transactions.md#fetch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from replication_helpers import NOW, TOPIC, TOPIC_ID, batch, live_broker

from tierlog.common import TopicPartition
from tierlog.metadata.image import ClusterMetadata, PartitionRegistration, TopicMetadata
from tierlog.replication.partition import READ_COMMITTED, READ_UNCOMMITTED, RemoteFetchInfo
from tierlog.replication.replica_manager import (
    FetchParams,
    FetchPartitionResult,
    PartitionFetchInfo,
    RemoteLogReadResult,
    ReplicaManager,
)
from tierlog.storage.log_manager import LogManager
from tierlog.storage.transaction_index import AbortedTxn

TP0 = TopicPartition(TOPIC, 0)
TP1 = TopicPartition(TOPIC, 1)
BATCHES = 3
COPIED_UP_TO = 1  # offsets 0 and 1 are only in the remote tier once local retention ran


@dataclass
class HandPlayedRemoteTier:
    """The shell's remote reads, started by the ReplicaManager and answered by the test."""

    reads: list[tuple[TopicPartition, RemoteFetchInfo, Callable[[RemoteLogReadResult], None]]] = field(
        default_factory=list
    )
    cancelled: list[TopicPartition] = field(default_factory=list)
    # When set, every read answers this at once, before the ReplicaManager parks the fetch.
    answer_at_once: RemoteLogReadResult | None = None

    def read(
        self, tp: TopicPartition, info: RemoteFetchInfo, on_done: Callable[[RemoteLogReadResult], None]
    ) -> Callable[[], None]:
        self.reads.append((tp, info, on_done))
        if self.answer_at_once is not None:
            on_done(self.answer_at_once)
        return lambda: self.cancelled.append(tp)


@dataclass
class Tiered:
    replica_manager: ReplicaManager
    remote: HandPlayedRemoteTier


@pytest.fixture
def tiered(tmp_path: Path) -> Tiered:
    """One broker leading two tiered partitions of one batch per segment, offsets 0..2 each, of which 0 and 1
    were copied and then deleted locally (local log start 2)."""
    log_manager = LogManager([tmp_path], {}, remote_storage_system_enable=True)
    log_manager.startup({}, NOW)
    remote = HandPlayedRemoteTier()
    replica_manager = ReplicaManager(1, log_manager, remote_read=remote.read, remote_fetch_max_wait_ms=500)
    configs = {"remote.storage.enable": "true", "segment.bytes": str(len(batch(b"v"))), "local.retention.bytes": "1"}
    registrations = [PartitionRegistration(replicas=[1], isr=[1], leader=1) for _ in range(2)]
    image = ClusterMetadata(
        topics={TOPIC: TopicMetadata(TOPIC, TOPIC_ID, registrations, configs)}, brokers={1: live_broker(1)}
    )
    replica_manager.apply_metadata(image, NOW)
    for tp in (TP0, TP1):
        for _ in range(BATCHES):
            replica_manager.append_records({tp: batch(b"v")}, 1, 30_000, NOW, lambda _: None)
        log = replica_manager.get_partition(tp).log
        log.update_highest_offset_in_remote_storage(COPIED_UP_TO)
        log.delete_old_segments(NOW)
        assert log.local_log_start_offset == COPIED_UP_TO + 1
    return Tiered(replica_manager, remote)


def fetch(
    replica_manager: ReplicaManager,
    partitions: list[TopicPartition],
    *,
    max_wait_ms: int = 100,
    isolation_level: int = READ_UNCOMMITTED,
) -> tuple[list[list[FetchPartitionResult]], object]:
    answers: list[list[FetchPartitionResult]] = []
    params = FetchParams(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, isolation_level=isolation_level
    )
    infos = [(tp, PartitionFetchInfo(0, 1 << 20)) for tp in partitions]
    delayed = replica_manager.fetch_messages(params, infos, NOW, answers.append)
    return answers, delayed


def test_a_fetch_below_the_local_log_start_waits_for_the_remote_read_and_answers_its_records(tiered: Tiered) -> None:
    answers, delayed = fetch(tiered.replica_manager, [TP0])
    assert answers == []
    # Bounded by remote.fetch.max.wait.ms, not by the fetch's own wait.
    assert delayed is not None and delayed.deadline_ms == NOW + 500  # type: ignore[attr-defined]
    ((tp, info, on_done),) = tiered.remote.reads
    assert (tp, info.topic_id, info.fetch_offset, info.leader_epoch) == (TP0, TOPIC_ID, 0, 0)
    on_done(RemoteLogReadResult(b"remote records"))
    ((answer,),) = answers
    assert answer.error is None and answer.read is not None
    assert (answer.read.records, answer.read.remote_fetch) == (b"remote records", None)
    assert tiered.replica_manager.remote_fetch_purgatory.expire(NOW + 500) == 0
    assert tiered.remote.cancelled == []


def test_a_remote_read_still_running_at_remote_fetch_max_wait_is_cancelled_and_answered_empty(
    tiered: Tiered,
) -> None:
    tiered.replica_manager.remote_fetch_max_wait_ms = 200  # a dynamic config: the next fetch takes it
    answers, _ = fetch(tiered.replica_manager, [TP0])
    assert tiered.replica_manager.remote_fetch_purgatory.expire(NOW + 199) == 0
    assert tiered.replica_manager.remote_fetch_purgatory.expire(NOW + 200) == 1
    ((answer,),) = answers
    assert answer.error is None and answer.read is not None
    assert (answer.read.size, answer.read.remote_fetch) == (0, None)
    assert tiered.remote.cancelled == [TP0]
    # A read that answers after all changes nothing: the fetch was answered once.
    ((_, _, on_done),) = tiered.remote.reads
    on_done(RemoteLogReadResult(b"too late"))
    assert len(answers) == 1


def test_a_failed_remote_read_answers_its_error_for_that_partition(tiered: Tiered) -> None:
    answers, _ = fetch(tiered.replica_manager, [TP0])
    ((_, _, on_done),) = tiered.remote.reads
    on_done(RemoteLogReadResult(None, "KAFKA_STORAGE_ERROR"))
    ((answer,),) = answers
    assert (answer.topic_partition, answer.error, answer.read) == (TP0, "KAFKA_STORAGE_ERROR", None)


def test_only_the_first_remote_partition_of_a_fetch_is_read_and_the_others_answer_empty(tiered: Tiered) -> None:
    answers, _ = fetch(tiered.replica_manager, [TP0, TP1])
    ((tp, _, on_done),) = tiered.remote.reads
    assert tp == TP0
    on_done(RemoteLogReadResult(b"remote records"))
    ((first, second),) = answers
    assert first.read is not None and first.read.records == b"remote records"
    assert second.topic_partition == TP1 and second.error is None and second.read is not None
    assert (second.read.size, second.read.remote_fetch) == (0, None)


def test_a_remote_read_that_answers_at_once_answers_the_fetch_without_parking_it(tiered: Tiered) -> None:
    tiered.remote.answer_at_once = RemoteLogReadResult(b"remote records")
    answers, delayed = fetch(tiered.replica_manager, [TP0])
    assert delayed is None
    ((answer,),) = answers
    assert answer.read is not None and answer.read.records == b"remote records"
    assert tiered.replica_manager.remote_fetch_purgatory.watched() == 0


def test_a_read_committed_remote_read_answers_the_aborted_transactions_it_found(tiered: Tiered) -> None:
    answers, _ = fetch(tiered.replica_manager, [TP0], isolation_level=READ_COMMITTED)
    ((_, info, on_done),) = tiered.remote.reads
    assert info.read_committed
    aborted = AbortedTxn(producer_id=8, first_offset=0, last_offset=1, last_stable_offset=2)
    on_done(RemoteLogReadResult(b"remote records", aborted_transactions=[aborted]))
    ((answer,),) = answers
    assert answer.read is not None and answer.read.aborted_transactions == (aborted,)


@pytest.mark.parametrize(("isolation_level", "listed"), [(READ_COMMITTED, ()), (READ_UNCOMMITTED, None)])
def test_a_remote_answer_lists_aborted_transactions_only_for_read_committed(
    tiered: Tiered, isolation_level: int, listed: tuple[AbortedTxn, ...] | None
) -> None:
    answers, _ = fetch(tiered.replica_manager, [TP0], isolation_level=isolation_level)
    ((_, info, on_done),) = tiered.remote.reads
    assert info.read_committed == (isolation_level == READ_COMMITTED)
    on_done(RemoteLogReadResult(b"remote records"))
    ((answer,),) = answers
    assert answer.read is not None and answer.read.aborted_transactions == listed

"""Idempotent produce across replicas: an acks=all retry of a batch the leader already has waits, like the
original, until the HW passes the original records, and a follower that becomes leader recognises a retry
of a batch it only replicated."""

from __future__ import annotations

from pathlib import Path

from replication_helpers import NOW, TP, Cluster, caught_up_pair

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.replication.replica_manager import AppendResult

PID = 9000


def idempotent_batch(sequence: int, records: int = 2, epoch: int = 0) -> bytearray:
    return bytearray(
        build_batch(
            [(None, b"v%d" % (sequence + i), [], NOW) for i in range(records)],
            producer_id=PID,
            producer_epoch=epoch,
            base_sequence=sequence,
        )
    )


def produce(
    cluster: Cluster, broker_id: int, data: bytearray, acks: int = -1
) -> list[dict[TopicPartition, AppendResult]]:
    answers: list[dict[TopicPartition, AppendResult]] = []
    cluster.managers[broker_id].append_records({TP: data}, acks, 30_000, cluster.now, answers.append)
    return answers


def test_an_acks_all_retry_waits_until_the_hw_passes_the_original_records(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    original = produce(cluster, 1, idempotent_batch(0))
    retry = produce(cluster, 1, idempotent_batch(0))
    # Neither is answered: the follower has not fetched the original records yet.
    assert (original, retry) == ([], [])
    assert cluster.log(1).log_end_offset == 3
    cluster.fetch(2)
    cluster.fetch(2)
    assert cluster.log(1).high_watermark == 3
    for (answer,) in (original, retry):
        result = answer[TP]
        assert (result.error, result.info.first_offset, result.info.last_offset) == (None, 1, 2)  # type: ignore[union-attr]


def test_a_follower_that_becomes_leader_recognises_a_retry_of_what_it_replicated(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    produce(cluster, 1, idempotent_batch(0), acks=1)
    produce(cluster, 1, idempotent_batch(2), acks=1)
    cluster.fetch(2)
    assert cluster.log(2).log_end_offset == 5
    # The leader dies before its answer reaches the producer, which retries against the new leader.
    cluster.crash(1)
    cluster.elect(2, [2])
    (answer,) = produce(cluster, 2, idempotent_batch(2))
    result = answer[TP]
    assert (result.error, result.info.first_offset) == (None, 3)  # type: ignore[union-attr]
    assert cluster.log(2).log_end_offset == 5
    # A gap is refused and the next batch in sequence is appended.
    (gap,) = produce(cluster, 2, idempotent_batch(9))
    assert gap[TP].error == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    (following,) = produce(cluster, 2, idempotent_batch(4))
    assert following[TP].info.first_offset == 5  # type: ignore[union-attr]


def test_an_older_producer_epoch_is_fenced_on_the_new_leader_too(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    produce(cluster, 1, idempotent_batch(0, epoch=5), acks=1)
    cluster.fetch(2)
    cluster.crash(1)
    cluster.elect(2, [2])
    (answer,) = produce(cluster, 2, idempotent_batch(2, epoch=4))
    assert answer[TP].error == "INVALID_PRODUCER_EPOCH"
    assert cluster.log(2).log_end_offset == 3

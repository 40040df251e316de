"""The data path of transactions through ReplicaManager and Partition on real logs (docs/transactions.md#data-path):
read_committed fetches stop at the LSO and carry the aborted transactions of what they read, a parked
read_committed fetch wakes when the LSO moves, ListOffsets LATEST is the LSO for read_committed, and markers are
appended with origin COORDINATOR only."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_helpers import NOW, batch, caught_up_pair, single_topic_image

from tierlog.common import TopicPartition
from tierlog.metadata.image import PartitionRegistration
from tierlog.records.codec import build_batch, decode_batches
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.replication.partition import READ_COMMITTED, READ_UNCOMMITTED, LogReadResult
from tierlog.replication.replica_manager import (
    AppendResult,
    DelayedFetch,
    FetchParams,
    FetchPartitionResult,
    PartitionFetchInfo,
    ReplicaManager,
)
from tierlog.storage.log_manager import LogManager
from tierlog.storage.producer_state import AppendOrigin

TP = TopicPartition("events", 0)
PRODUCER = 4000
OTHER_PRODUCER = 4001
EPOCH = 0
COORDINATOR_EPOCH = 3


@pytest.fixture
def replica_manager(tmp_path: Path) -> ReplicaManager:
    """The only replica of `events-0`: its HW follows every append."""
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    manager = ReplicaManager(1, log_manager)
    manager.apply_metadata(single_topic_image(PartitionRegistration(replicas=[1], isr=[1], leader=1)), NOW)
    return manager


def txn_batch(producer_id: int, sequence: int, *values: bytes) -> bytearray:
    records = [(None, value, [], NOW) for value in values]
    return bytearray(
        build_batch(records, producer_id=producer_id, producer_epoch=EPOCH, base_sequence=sequence, transactional=True)
    )


def append(
    replica_manager: ReplicaManager, records: bytearray, origin: AppendOrigin = AppendOrigin.CLIENT
) -> AppendResult:
    answers: list[dict[TopicPartition, AppendResult]] = []
    replica_manager.append_records({TP: records}, 1, 30_000, NOW, answers.append, origin=origin)
    (answer,) = answers
    return answer[TP]


def end_txn(replica_manager: ReplicaManager, producer_id: int, *, committed: bool) -> int:
    """The marker's offset."""
    control = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
    marker = build_end_txn_marker_batch(producer_id, EPOCH, EndTxnMarker(control, COORDINATOR_EPOCH), NOW)
    result = append(replica_manager, marker, AppendOrigin.COORDINATOR)
    assert result.error is None and result.info is not None
    return result.info.first_offset


def fetch(
    replica_manager: ReplicaManager,
    offset: int,
    isolation_level: int,
    *,
    max_bytes: int = 1 << 20,
    min_bytes: int = 1,
    max_wait_ms: int = 0,
) -> tuple[list[list[FetchPartitionResult]], DelayedFetch | None]:
    answers: list[list[FetchPartitionResult]] = []
    params = FetchParams(-1, max_wait_ms, min_bytes, max_bytes, isolation_level)
    delayed = replica_manager.fetch_messages(params, [(TP, PartitionFetchInfo(offset, max_bytes))], NOW, answers.append)
    assert delayed is None or isinstance(delayed, DelayedFetch)
    return answers, delayed


def read(replica_manager: ReplicaManager, offset: int, isolation_level: int, max_bytes: int = 1 << 20) -> LogReadResult:
    answers, _ = fetch(replica_manager, offset, isolation_level, max_bytes=max_bytes)
    ((result,),) = answers
    assert result.error is None and result.read is not None
    return result.read


def offsets(result: LogReadResult) -> list[int]:
    if result.records is None:
        return []
    return [record.offset for b in decode_batches(result.records.read_bytes()) for record in b.records]


def aborted(result: LogReadResult) -> list[tuple[int, int, int]]:
    """(producer id, first offset, marker offset) of each aborted transaction listed."""
    assert result.aborted_transactions is not None
    return [(txn.producer_id, txn.first_offset, txn.last_offset) for txn in result.aborted_transactions]


def latest(replica_manager: ReplicaManager, isolation_level: int) -> int:
    found = replica_manager.fetch_offset_for_timestamp(
        TP, -1, isolation_level=isolation_level, current_leader_epoch=-1, replica_id=-1
    )
    assert found is not None
    return found.offset


def test_read_committed_stops_at_the_first_open_transaction_and_read_uncommitted_does_not(
    replica_manager: ReplicaManager,
) -> None:
    append(replica_manager, batch(b"before"))
    append(replica_manager, txn_batch(PRODUCER, 0, b"t1", b"t2"))
    append(replica_manager, batch(b"after"))
    committed = read(replica_manager, 0, READ_COMMITTED)
    assert offsets(committed) == [0]
    assert (committed.high_watermark, committed.last_stable_offset) == (4, 1)
    assert committed.aborted_transactions == ()
    uncommitted = read(replica_manager, 0, READ_UNCOMMITTED)
    assert offsets(uncommitted) == [0, 1, 2, 3]
    # Every answer carries the real LSO; only read_committed ones carry a list of aborted transactions.
    assert (uncommitted.last_stable_offset, uncommitted.aborted_transactions) == (1, None)
    assert offsets(read(replica_manager, 1, READ_COMMITTED)) == []


def test_a_commit_marker_moves_the_lso_to_the_hw_and_nothing_is_listed_as_aborted(
    replica_manager: ReplicaManager,
) -> None:
    append(replica_manager, txn_batch(PRODUCER, 0, b"t1"))
    append(replica_manager, batch(b"plain"))
    assert end_txn(replica_manager, PRODUCER, committed=True) == 2
    result = read(replica_manager, 0, READ_COMMITTED)
    assert offsets(result) == [0, 1, 2]
    assert (result.high_watermark, result.last_stable_offset, result.aborted_transactions) == (3, 3, ())


def test_read_committed_lists_the_aborted_transactions_overlapping_what_it_read(
    replica_manager: ReplicaManager,
) -> None:
    append(replica_manager, batch(b"plain"))  # 0
    append(replica_manager, txn_batch(PRODUCER, 0, b"a1"))  # 1
    append(replica_manager, txn_batch(OTHER_PRODUCER, 0, b"c1"))  # 2
    end_txn(replica_manager, PRODUCER, committed=False)  # 3
    end_txn(replica_manager, OTHER_PRODUCER, committed=True)  # 4
    append(replica_manager, txn_batch(PRODUCER, 1, b"a2"))  # 5
    end_txn(replica_manager, PRODUCER, committed=False)  # 6
    result = read(replica_manager, 0, READ_COMMITTED)
    assert offsets(result) == list(range(7))
    assert aborted(result) == [(PRODUCER, 1, 3), (PRODUCER, 5, 6)]
    # A fetch from past the first abort marker is told only of the second transaction.
    assert aborted(read(replica_manager, 4, READ_COMMITTED)) == [(PRODUCER, 5, 6)]


def test_an_aborted_transaction_past_the_records_read_is_not_listed(replica_manager: ReplicaManager) -> None:
    first = batch(b"x" * 100)
    append(replica_manager, first)  # 0
    append(replica_manager, txn_batch(PRODUCER, 0, b"a1"))  # 1
    end_txn(replica_manager, PRODUCER, committed=False)  # 2
    # Room for the first batch only: the aborted transaction starts after what the consumer gets.
    result = read(replica_manager, 0, READ_COMMITTED, max_bytes=len(first))
    assert offsets(result) == [0]
    assert result.aborted_transactions == ()
    assert aborted(read(replica_manager, 0, READ_COMMITTED)) == [(PRODUCER, 1, 2)]


def test_a_parked_read_committed_fetch_waits_for_the_lso_not_the_hw(replica_manager: ReplicaManager) -> None:
    append(replica_manager, txn_batch(PRODUCER, 0, b"t1"))
    answers, delayed = fetch(replica_manager, 0, READ_COMMITTED, max_wait_ms=500)
    assert answers == [] and delayed is not None
    # The HW moves past a record of another producer; the LSO stays at the open transaction.
    append(replica_manager, batch(b"plain"))
    assert answers == []
    end_txn(replica_manager, PRODUCER, committed=True)
    ((result,),) = answers
    assert result.read is not None and offsets(result.read) == [0, 1, 2]
    assert replica_manager.fetch_purgatory.expire(NOW + 10_000) == 0


def test_list_offsets_latest_is_the_lso_for_read_committed_and_the_hw_otherwise(
    replica_manager: ReplicaManager,
) -> None:
    append(replica_manager, batch(b"plain"))
    append(replica_manager, txn_batch(PRODUCER, 0, b"t1", b"t2"))
    assert (latest(replica_manager, READ_COMMITTED), latest(replica_manager, READ_UNCOMMITTED)) == (1, 3)
    # A timestamp lookup does not answer an offset a read_committed consumer may not read yet.
    found = replica_manager.fetch_offset_for_timestamp(
        TP, NOW, isolation_level=READ_COMMITTED, current_leader_epoch=-1, replica_id=-1
    )
    assert found is not None and found.offset == 0
    end_txn(replica_manager, PRODUCER, committed=False)
    assert (latest(replica_manager, READ_COMMITTED), latest(replica_manager, READ_UNCOMMITTED)) == (4, 4)


def test_only_a_coordinator_may_append_a_marker(replica_manager: ReplicaManager) -> None:
    append(replica_manager, txn_batch(PRODUCER, 0, b"t1"))
    marker = build_end_txn_marker_batch(PRODUCER, EPOCH, EndTxnMarker(ControlRecordType.COMMIT, 0), NOW)
    assert append(replica_manager, marker).error == "INVALID_RECORD"
    assert replica_manager.get_partition(TP).log.last_stable_offset == 0


def test_the_lso_passes_a_marker_only_once_the_followers_have_it(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)  # offset 0 committed on leader 1 and follower 2
    leader = cluster.managers[1]
    assert append(leader, txn_batch(PRODUCER, 0, b"t1")).error is None  # offset 1
    cluster.send_fetch(2).deliver()
    cluster.send_fetch(2)  # the follower has offset 1: the HW moves to 2, the LSO stays at 1
    assert (cluster.log(1).high_watermark, cluster.log(1).last_stable_offset) == (2, 1)
    waiting, _ = fetch(leader, 1, READ_COMMITTED, max_wait_ms=500)
    marker = build_end_txn_marker_batch(PRODUCER, EPOCH, EndTxnMarker(ControlRecordType.COMMIT, 0), NOW)
    acknowledged: list[dict[TopicPartition, AppendResult]] = []
    leader.append_records({TP: marker}, -1, 30_000, NOW, acknowledged.append, origin=AppendOrigin.COORDINATOR)
    # The marker (offset 2) is only on the leader: the transaction is decided but not yet stable.
    assert (cluster.log(1).last_stable_offset, waiting, acknowledged) == (1, [], [])
    cluster.send_fetch(2).deliver()
    assert waiting == []
    cluster.send_fetch(2)  # the follower has the marker: HW and LSO move past it, the parked consumer reads
    ((result,),) = waiting
    assert result.read is not None and offsets(result.read) == [1, 2]
    assert result.read.last_stable_offset == 3 and acknowledged[0][TP].error is None
    # The follower learns of the HW past the marker with its next answer: until then its LSO stays at 1.
    assert (cluster.log(2).high_watermark, cluster.log(2).last_stable_offset) == (2, 1)

"""Transactions in the log (docs/transactions.md#storage): producer state's ongoing transactions, the first unstable
offset and the LSO step by step, ABORT markers written to the segment's `.txnindex` byte for byte, the marker
checks, and the state and indexes rebuilt after a clean restart, an unclean one without snapshots, a torn segment
and a truncation."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from storage_helpers import T0, TP, log_config, make_batch, open_log

from tierlog.records.codec import build_batch
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.records.record_batch import (
    CompressionType,
    InvalidRecordError,
    iter_batches,
    set_base_offset,
    set_partition_leader_epoch,
)
from tierlog.storage.errors import InvalidProducerEpochError, InvalidTxnStateError, TransactionCoordinatorFencedError
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig
from tierlog.storage.producer_state import (
    AppendOrigin,
    BatchMetadata,
    ProducerStateEntry,
    ProducerStateManager,
    read_snapshot,
    write_snapshot,
)
from tierlog.storage.segment import txn_index_file_path
from tierlog.storage.transaction_index import AbortedTxn

ABORTER = 100  # its transaction is aborted
COMMITTER = 200  # its transaction is committed
COORDINATOR_EPOCH = 5


def txn_batch(producer_id: int, sequence: int, records: int = 1, *, epoch: int = 0) -> bytearray:
    return bytearray(
        build_batch(
            [(None, b"txn-%d-%d" % (producer_id, sequence + i), [], T0) for i in range(records)],
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
            transactional=True,
        )
    )


def idempotent_batch(producer_id: int, sequence: int, *, epoch: int = 0) -> bytearray:
    return bytearray(
        build_batch([(None, b"plain", [], T0)], producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)
    )


def marker(
    producer_id: int, committed: bool, *, epoch: int = 0, coordinator_epoch: int = COORDINATOR_EPOCH
) -> bytearray:
    control_type = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
    return build_end_txn_marker_batch(producer_id, epoch, EndTxnMarker(control_type, coordinator_epoch), T0)


def write_marker(log: Log, producer_id: int, committed: bool, **kwargs: int) -> int:
    return log.append_as_leader(marker(producer_id, committed, **kwargs), 0, T0, AppendOrigin.COORDINATOR).first_offset


def replicate(log: Log) -> int:
    """The HW catches up with the LEO; returns the LSO."""
    log.update_high_watermark(log.log_end_offset)
    return log.last_stable_offset


def entry_bytes(producer_id: int, first_offset: int, last_offset: int, last_stable_offset: int) -> bytes:
    return struct.pack(">hqqqq", 0, producer_id, first_offset, last_offset, last_stable_offset)


def interleaved(log: Log) -> list[tuple[int | None, int, int]]:
    """An aborted and a committed transaction interleaved with non-transactional writes; after each write
    (first unstable offset, LSO with the HW where it was, LSO once the HW reaches the LEO)."""
    steps = []

    def step(records: bytearray, origin: AppendOrigin = AppendOrigin.CLIENT) -> None:
        log.append_as_leader(records, 0, T0, origin)
        before = log.last_stable_offset
        steps.append((log.first_unstable_offset, before, replicate(log)))

    step(make_batch())  # 0
    step(txn_batch(ABORTER, 0, records=2))  # 1-2: the aborter's transaction begins at 1
    step(txn_batch(COMMITTER, 0))  # 3: the committer's begins at 3
    step(make_batch())  # 4
    step(txn_batch(ABORTER, 2))  # 5
    step(marker(ABORTER, committed=False), AppendOrigin.COORDINATOR)  # 6: ABORT
    step(txn_batch(COMMITTER, 1))  # 7
    step(marker(COMMITTER, committed=True), AppendOrigin.COORDINATOR)  # 8: COMMIT
    step(make_batch())  # 9
    return steps


def test_lso_step_by_step_and_the_abort_in_the_txn_index(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.first_unstable_offset is None and log.last_stable_offset == 0
    steps = interleaved(log)
    assert steps == [
        (None, 0, 1),  # plain write: LSO = HW
        (1, 1, 1),  # the aborter's transaction pins the LSO at its first offset
        (1, 1, 1),
        (1, 1, 1),
        (1, 1, 1),
        # The ABORT marker is written, but until the HW passes it the aborted transaction is still unstable;
        # then the committer's, open since 3, is the first unstable one.
        (1, 1, 3),
        (3, 3, 3),
        (3, 3, 9),  # the COMMIT marker: stable once replicated
        (None, 9, 10),
    ]
    # Kafka's entry: the aborter's transaction [1, 6], and the LSO once it completed: the committer's start.
    assert log.active_segment.txn_index.all_aborted_txns() == [AbortedTxn(ABORTER, 1, 6, 3)]
    path = txn_index_file_path(tmp_path, 0)
    assert path.read_bytes() == entry_bytes(ABORTER, 1, 6, 3)
    assert path.read_bytes().hex() == "00000000000000000064000000000000000100000000000000060000000000000003"
    assert log.collect_aborted_transactions(0, 10) == [AbortedTxn(ABORTER, 1, 6, 3)]
    assert log.collect_aborted_transactions(6, 7) == [AbortedTxn(ABORTER, 1, 6, 3)]
    assert log.collect_aborted_transactions(7, 10) == []
    assert log.collect_aborted_transactions(0, 1) == []
    producers = log.producer_state_manager.active_producers
    assert producers[ABORTER].current_txn_first_offset is None
    assert producers[ABORTER].coordinator_epoch == COORDINATOR_EPOCH
    assert producers[COMMITTER].current_txn_first_offset is None


def test_lso_never_passes_the_high_watermark(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(make_batch(3), 0, T0)
    log.append_as_leader(txn_batch(ABORTER, 0), 0, T0)
    assert (log.high_watermark, log.first_unstable_offset, log.last_stable_offset) == (0, 3, 0)
    log.update_high_watermark(2)
    assert log.last_stable_offset == 2
    assert replicate(log) == 3


def test_an_ongoing_transaction_shows_in_the_producer_entry(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(make_batch(2), 0, T0)
    log.append_as_leader(txn_batch(COMMITTER, 0), 0, T0)
    log.append_as_leader(txn_batch(COMMITTER, 1), 0, T0)
    entry = log.producer_state_manager.last_entry(COMMITTER)
    assert entry is not None and entry.current_txn_first_offset == 2
    assert [(t.producer_id, t.first_offset) for t in log.producer_state_manager.ongoing_transactions] == [
        (COMMITTER, 2)
    ]


def test_a_marker_without_data_completes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(make_batch(), 0, T0)
    write_marker(log, ABORTER, committed=False, coordinator_epoch=7)
    assert replicate(log) == 2
    assert log.first_unstable_offset is None
    assert log.active_segment.txn_index.all_aborted_txns() == []
    assert not txn_index_file_path(tmp_path, 0).exists()
    entry = log.producer_state_manager.last_entry(ABORTER)
    assert entry is not None and entry.coordinator_epoch == 7 and entry.current_txn_first_offset is None


def test_marker_checks(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(ABORTER, 0, epoch=3), 0, T0)
    write_marker(log, ABORTER, committed=True, epoch=3, coordinator_epoch=5)
    log.append_as_leader(txn_batch(ABORTER, 1, epoch=3), 0, T0)
    end = log.log_end_offset
    # A client may not write a marker.
    with pytest.raises(InvalidRecordError, match="Clients are not allowed to write control records"):
        log.append_as_leader(marker(ABORTER, committed=False, epoch=3), 0, T0)
    # A coordinator older than the last one that wrote a marker for this producer is a zombie.
    with pytest.raises(TransactionCoordinatorFencedError, match=r"4 \(zombie\), 5 \(current\)"):
        write_marker(log, ABORTER, committed=False, epoch=3, coordinator_epoch=4)
    # A marker of an older producer epoch than the producer's.
    with pytest.raises(InvalidProducerEpochError, match="smaller than the last seen epoch 3"):
        write_marker(log, ABORTER, committed=False, epoch=2)
    # A non-transactional write by a producer in a transaction.
    with pytest.raises(InvalidTxnStateError, match="Expected transactional write"):
        log.append_as_leader(idempotent_batch(ABORTER, 2, epoch=3), 0, T0)
    assert log.log_end_offset == end
    assert log.producer_state_manager.last_entry(ABORTER).current_txn_first_offset == 2  # type: ignore[union-attr]
    # The coordinator aborts with a bumped epoch (a timed-out transaction): accepted, no sequence checks.
    offset = write_marker(log, ABORTER, committed=False, epoch=4, coordinator_epoch=6)
    assert log.active_segment.txn_index.all_aborted_txns() == [AbortedTxn(ABORTER, 2, offset, offset + 1)]
    entry = log.producer_state_manager.last_entry(ABORTER)
    assert entry is not None and (entry.producer_epoch, entry.coordinator_epoch) == (4, 6)


def test_a_follower_builds_the_same_index_and_tolerates_an_old_coordinator_epoch(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    interleaved(leader)
    follower = open_log(tmp_path / "follower")
    data = leader.read(0, 1 << 20, None, False).records
    assert data is not None
    follower.append_as_follower(data.read_bytes(), T0)
    assert txn_index_file_path(follower.dir, 0).read_bytes() == txn_index_file_path(leader.dir, 0).read_bytes()
    # The leader accepted it, so a follower writes what it is given (Kafka logs the old coordinator epoch).
    follower.append_as_follower(_stamped(txn_batch(ABORTER, 3), follower.log_end_offset), T0)
    follower.append_as_follower(_stamped(marker(ABORTER, False, coordinator_epoch=1), follower.log_end_offset), T0)
    assert follower.active_segment.txn_index.all_aborted_txns()[-1] == AbortedTxn(ABORTER, 10, 11, 12)


def _stamped(records: bytearray, base_offset: int) -> bytes:
    set_base_offset(records, 0, base_offset)
    set_partition_leader_epoch(records, 0, 0)
    return bytes(records)


def test_a_clean_restart_loads_ongoing_transactions_from_the_snapshot(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(make_batch(), 0, T0)
    log.append_as_leader(txn_batch(COMMITTER, 0), 0, T0)
    log.append_as_leader(make_batch(), 0, T0)
    replicate(log)
    log.close()
    entries = read_snapshot(tmp_path / f"{3:020d}.snapshot")
    assert [(e.producer_id, e.current_txn_first_offset) for e in entries] == [(COMMITTER, 1)]
    reopened = open_log(tmp_path, high_watermark=3)
    assert (reopened.first_unstable_offset, reopened.last_stable_offset) == (1, 1)
    write_marker(reopened, COMMITTER, committed=True)
    assert replicate(reopened) == 4


def crash(log: Log) -> None:
    log.close_handlers()


def reopen_unclean(directory: Path, config: LogConfig | None = None, high_watermark: int = 0) -> Log:
    return open_log(directory, config, had_clean_shutdown=False, recovery_point=0, high_watermark=high_watermark)


def test_recovery_without_snapshots_rebuilds_the_txn_index_and_ongoing_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    interleaved(log)
    log.append_as_leader(txn_batch(COMMITTER, 2), 0, T0)  # 10: a new transaction, open at the crash
    expected_index = txn_index_file_path(tmp_path, 0).read_bytes()
    crash(log)
    for path in tmp_path.glob("*.snapshot"):
        path.unlink()
    txn_index_file_path(tmp_path, 0).unlink()
    recovered = reopen_unclean(tmp_path, high_watermark=11)
    assert txn_index_file_path(tmp_path, 0).read_bytes() == expected_index
    assert recovered.first_unstable_offset == 10
    assert recovered.last_stable_offset == 10
    assert recovered.producer_state_manager.last_entry(COMMITTER).current_txn_first_offset == 10  # type: ignore[union-attr]
    assert recovered.producer_state_manager.last_entry(ABORTER).coordinator_epoch == COORDINATOR_EPOCH  # type: ignore[union-attr]


def test_recovery_of_a_torn_segment_reopens_the_transactions_its_lost_markers_ended(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    interleaved(log)
    position = log.active_segment.translate_offset(6)
    assert position is not None
    crash(log)
    # The crash tore the ABORT marker at offset 6: it and everything after it is lost.
    log_path = tmp_path / f"{0:020d}.log"
    os.truncate(log_path, position.position + 10)
    recovered = reopen_unclean(tmp_path, high_watermark=6)
    assert recovered.log_end_offset == 6
    assert txn_index_file_path(tmp_path, 0).read_bytes() == b""
    assert recovered.first_unstable_offset == 1
    assert [(t.producer_id, t.first_offset) for t in recovered.producer_state_manager.ongoing_transactions] == [
        (ABORTER, 1),
        (COMMITTER, 3),
    ]
    # The coordinator writes its marker again: the same index entry as before the crash.
    write_marker(recovered, ABORTER, committed=False)
    assert txn_index_file_path(tmp_path, 0).read_bytes() == entry_bytes(ABORTER, 1, 6, 3)


@pytest.mark.parametrize("clean", [True, False])
def test_a_transaction_spanning_segments_is_indexed_where_its_marker_is(tmp_path: Path, clean: bool) -> None:
    config = log_config(segment_bytes=300)
    log = open_log(tmp_path, config)
    log.append_as_leader(txn_batch(ABORTER, 0), 0, T0)  # 0
    sequence = 1
    while len(log.segments) < 3:
        log.append_as_leader(make_batch(value_size=40), 0, T0)
        log.append_as_leader(txn_batch(ABORTER, sequence), 0, T0)
        sequence += 1
    offset = write_marker(log, ABORTER, committed=False)
    marker_segment = log.active_segment
    assert marker_segment.base_offset > 0
    assert marker_segment.txn_index.all_aborted_txns() == [AbortedTxn(ABORTER, 0, offset, offset + 1)]
    assert log.collect_aborted_transactions(0, offset + 1) == [AbortedTxn(ABORTER, 0, offset, offset + 1)]
    # A fetch of the first segment only is not complete there; the search goes on to the marker's segment.
    assert log.segments[0].txn_index.collect_aborted_txns(0, 2).is_complete is False
    assert log.collect_aborted_transactions(0, 2) == [AbortedTxn(ABORTER, 0, offset, offset + 1)]
    expected = txn_index_file_path(tmp_path, marker_segment.base_offset).read_bytes()
    crash(log)
    # Recovering the marker's segment needs the transaction's first offset from the earlier segments: without
    # snapshots they are replayed. A torn index is found corrupt on loading (even after a clean shutdown); an
    # unclean shutdown recovers from the recovery point, here the marker segment's base.
    for path in tmp_path.glob("*.snapshot"):
        path.unlink()
    txn_index_file_path(tmp_path, marker_segment.base_offset).write_bytes(b"garbage")
    recovered = open_log(
        tmp_path,
        config,
        had_clean_shutdown=clean,
        recovery_point=marker_segment.base_offset,
        high_watermark=offset + 1,
    )
    assert txn_index_file_path(tmp_path, marker_segment.base_offset).read_bytes() == expected
    assert recovered.producer_state_manager.ongoing_transactions == []
    assert recovered.last_stable_offset == offset + 1


def test_truncation_removes_index_entries_and_reopens_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    interleaved(log)
    log.update_high_watermark(4)
    assert log.truncate_to(8)  # the COMMIT marker goes: the committer's transaction is open again
    assert txn_index_file_path(tmp_path, 0).read_bytes() == entry_bytes(ABORTER, 1, 6, 3)
    assert [(t.producer_id, t.first_offset) for t in log.producer_state_manager.ongoing_transactions] == [
        (COMMITTER, 3)
    ]
    assert log.truncate_to(6)  # the ABORT marker goes: both are open again
    assert txn_index_file_path(tmp_path, 0).read_bytes() == b""
    assert [(t.producer_id, t.first_offset) for t in log.producer_state_manager.ongoing_transactions] == [
        (ABORTER, 1),
        (COMMITTER, 3),
    ]
    assert (log.first_unstable_offset, log.last_stable_offset) == (1, 1)
    assert log.producer_state_manager.last_entry(ABORTER).current_txn_first_offset == 1  # type: ignore[union-attr]


def test_deleted_segments_take_their_txn_index_with_them(tmp_path: Path) -> None:
    config = log_config(segment_bytes=300, retention_bytes=1, file_delete_delay_ms=0)
    log = open_log(tmp_path, config)
    log.append_as_leader(txn_batch(ABORTER, 0), 0, T0)
    write_marker(log, ABORTER, committed=False)
    first = txn_index_file_path(tmp_path, 0)
    assert first.exists()
    while len(log.segments) < 3:
        log.append_as_leader(make_batch(value_size=40), 0, T0)
    replicate(log)
    assert log.delete_old_segments(T0) >= 1
    log.remove_deleted_segments(T0)
    assert not first.exists()
    assert not list(tmp_path.glob("*.txnindex*"))


def test_producers_in_a_transaction_do_not_expire(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(ABORTER, 0), 0, T0)
    log.append_as_leader(idempotent_batch(COMMITTER, 0), 0, T0)
    assert log.remove_expired_producers(T0 + 10 * 86_400_000) == 1
    assert list(log.producer_state_manager.active_producers) == [ABORTER]


def test_snapshot_round_trip_with_the_transaction_fields(tmp_path: Path) -> None:
    entries = [
        ProducerStateEntry(ABORTER, 2, 7, T0, [BatchMetadata(4, 41, 1, T0)], current_txn_first_offset=37),
        ProducerStateEntry(COMMITTER, 0, 3, T0 + 1, [], current_txn_first_offset=None),
    ]
    path = tmp_path / f"{42:020d}.snapshot"
    write_snapshot(path, entries)
    data = path.read_bytes()
    # ProducerSnapshot v1: version | crc | count | entries of ProducerId, Epoch, LastSequence, LastOffset,
    # OffsetDelta, Timestamp, CoordinatorEpoch, CurrentTxnFirstOffset.
    assert struct.unpack_from(">hIi", data)[::2] == (1, 2)
    assert struct.unpack_from(">qhiqiqiq", data, 10) == (ABORTER, 2, 4, 41, 1, T0, 7, 37)
    assert struct.unpack_from(">qhiqiqiq", data, 10 + 46) == (COMMITTER, 0, -1, -1, 0, T0 + 1, 3, -1)
    assert read_snapshot(path) == entries
    manager = ProducerStateManager(TP, tmp_path)
    manager.truncate_and_reload(0, 42, T0)
    assert manager.map_end_offset == 42
    assert manager.first_unstable_offset == 37
    assert [(t.producer_id, t.first_offset) for t in manager.ongoing_transactions] == [(ABORTER, 37)]


def test_batches_of_a_marker_append_are_control_batches_with_the_coordinator_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(COMMITTER, 0), 0, T0)
    write_marker(log, COMMITTER, committed=True, coordinator_epoch=9)
    data = log.read(1, 1 << 20, None, False).records
    assert data is not None
    header = next(iter_batches(data.read_bytes()))
    assert header.is_control and header.is_transactional and header.base_offset == 1


def test_a_marker_stays_uncompressed_on_a_compressed_topic(tmp_path: Path) -> None:
    log = open_log(tmp_path, log_config(compression_type="gzip"))
    log.append_as_leader(txn_batch(ABORTER, 0), 0, T0)
    write_marker(log, ABORTER, committed=False)
    data = log.read(0, 1 << 20, None, False).records
    assert data is not None
    first, second = iter_batches(data.read_bytes())
    assert first.compression_type == CompressionType.GZIP
    assert second.is_control and second.compression_type == CompressionType.NONE
    assert log.active_segment.txn_index.all_aborted_txns() == [AbortedTxn(ABORTER, 0, 1, 2)]


def test_after_a_truncation_transactions_whose_markers_are_below_the_hw_are_stable(tmp_path: Path) -> None:
    # Found by the model test: the replay after the truncation completes the transaction again, and its marker
    # (offset 1) is below the HW (2), so nothing is unstable.
    log = open_log(tmp_path)
    log.append_as_leader(txn_batch(COMMITTER, 0), 0, T0)
    write_marker(log, COMMITTER, committed=True)
    log.append_as_leader(make_batch(), 0, T0)
    assert replicate(log) == 3
    log.truncate_to(2)
    assert (log.high_watermark, log.first_unstable_offset, log.last_stable_offset) == (2, None, 2)


def test_a_follower_appending_many_batches_at_once_records_the_leaders_lso(tmp_path: Path) -> None:
    # Found by the model test: with the whole set appended at once, the committer's transaction begun at 6 (after
    # the ABORT at 4) is already ongoing; counted, it would make the first entry claim LSO 6, and a search of
    # [3, 6) would stop there without the aborter's second transaction, begun at 5.
    leader = open_log(tmp_path / "leader")
    leader.append_as_leader(txn_batch(COMMITTER, 0), 0, T0)  # 0
    leader.append_as_leader(txn_batch(COMMITTER, 1), 0, T0)  # 1
    leader.append_as_leader(txn_batch(ABORTER, 0), 0, T0)  # 2
    write_marker(leader, COMMITTER, committed=True)  # 3
    write_marker(leader, ABORTER, committed=False)  # 4
    leader.append_as_leader(txn_batch(ABORTER, 1), 0, T0)  # 5
    leader.append_as_leader(txn_batch(COMMITTER, 2), 0, T0)  # 6
    write_marker(leader, ABORTER, committed=False)  # 7
    expected = [AbortedTxn(ABORTER, 2, 4, 5), AbortedTxn(ABORTER, 5, 7, 6)]
    assert leader.active_segment.txn_index.all_aborted_txns() == expected
    follower = open_log(tmp_path / "follower")
    data = leader.read(0, 1 << 20, None, False).records
    assert data is not None
    follower.append_as_follower(data.read_bytes(), T0)
    assert follower.active_segment.txn_index.all_aborted_txns() == expected
    assert follower.collect_aborted_transactions(3, 6) == expected

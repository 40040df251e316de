"""The log's producer state: duplicates answered with their original offsets and not written again, sequence and
epoch errors raised before anything is written, snapshots at roll and close, and the state rebuilt after an
unclean shutdown, a corrupt snapshot and a truncation; a follower builds the leader's state from its batches."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import T0, log_config, open_log

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.records.record_batch import iter_batches
from tierlog.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from tierlog.storage.log import Log
from tierlog.storage.log_manager import LogManager
from tierlog.storage.producer_state import ProducerStateManagerConfig, producer_snapshot_file, read_snapshot

PID = 4000


def batch(sequence: int, records: int = 1, *, producer_id: int = PID, epoch: int = 0, ts: int = T0) -> bytearray:
    return bytearray(
        build_batch(
            [(None, b"value-%d" % (sequence + i), [], ts + i) for i in range(records)],
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
        )
    )


def projection(log: Log) -> dict[int, tuple[int, int, int, int, int]]:
    """What a snapshot keeps of each producer: epoch, last sequence, last offset, offset delta, timestamp."""
    return {
        pid: (e.producer_epoch, e.last_seq, e.last_data_offset, e.last_offset_delta, e.last_timestamp)
        for pid, e in log.producer_state_manager.active_producers.items()
    }


def crash(log: Log) -> None:
    """A kill -9: files are closed without the snapshot a clean close takes."""
    log.close_handlers()


def snapshot_offsets(directory: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in directory.glob("*.snapshot"))


def test_duplicate_batch_is_answered_with_its_original_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0, 2), 0, T0)
    first = log.append_as_leader(batch(2, 3), 0, T0)
    log.append_as_leader(batch(5, 1), 0, T0)
    retry = log.append_as_leader(batch(2, 3), 0, T0)
    assert (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset) == (2, 4)
    assert (retry.records_count, retry.valid_bytes) == (0, 0)
    assert log.log_end_offset == 6
    assert len(list(iter_batches(log.read(0, 1 << 20, None, True).records.read_bytes()))) == 3  # type: ignore[union-attr]


def test_each_of_the_last_five_batches_is_deduplicated_after_a_leader_epoch_change(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    originals = [log.append_as_leader(batch(i), 0, T0) for i in range(8)]
    for i in range(3, 8):
        # A new leader epoch (a failover back to this replica) changes nothing about the producer's state.
        assert log.append_as_leader(batch(i), 1, T0).first_offset == originals[i].first_offset
    assert log.log_end_offset == 8
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(2), 1, T0)


def test_a_sequence_gap_writes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0), 0, T0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(2), 0, T0)
    assert log.log_end_offset == 1
    assert log.append_as_leader(batch(1), 0, T0).first_offset == 1


def test_an_older_producer_epoch_writes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0, epoch=3), 0, T0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(batch(1, epoch=2), 0, T0)
    assert log.log_end_offset == 1


def test_batches_without_a_producer_id_are_never_deduplicated(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    plain = bytearray(build_batch([(None, b"v", [], T0)]))
    log.append_as_leader(bytearray(plain), 0, T0)
    assert log.append_as_leader(bytearray(plain), 0, T0).first_offset == 1
    assert log.producer_state_manager.is_empty


def test_roll_takes_a_snapshot_at_the_new_segment_and_close_at_the_log_end(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0, 3), 0, T0)
    log.roll(T0)
    log.append_as_leader(batch(3, 2), 0, T0)
    assert snapshot_offsets(tmp_path) == [3]
    log.close()
    assert snapshot_offsets(tmp_path) == [3, 5]


def test_a_clean_restart_loads_the_snapshot_and_deduplicates_the_last_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(4):
        log.append_as_leader(batch(2 * i, 2), 0, T0)
    before = projection(log)
    log.close()
    reopened = open_log(tmp_path, had_clean_shutdown=True)
    assert projection(reopened) == before
    assert reopened.append_as_leader(batch(6, 2), 0, T0).first_offset == 6
    assert reopened.log_end_offset == 8


def test_recovery_after_an_unclean_shutdown_rebuilds_the_state_from_the_log(tmp_path: Path) -> None:
    config = log_config(segment_bytes=400)
    log = open_log(tmp_path, config)
    for i in range(30):
        log.append_as_leader(batch(i // 3, producer_id=PID + i % 3), 0, T0 + i)
    assert len(log.segments) > 3
    before = projection(log)
    crash(log)
    # Without snapshots the whole log is replayed. As Kafka's LogLoader, each recovered segment ends in a
    # snapshot, and the state is loaded from the last one: each producer's last batch, epoch and timestamp.
    for path in tmp_path.glob("*.snapshot"):
        path.unlink()
    recovered = open_log(tmp_path, config, had_clean_shutdown=False)
    assert projection(recovered) == before
    assert snapshot_offsets(tmp_path)[-1] == recovered.log_end_offset


def test_recovery_from_a_roll_snapshot_replays_the_batches_after_it(tmp_path: Path) -> None:
    config = log_config(segment_bytes=400)
    log = open_log(tmp_path, config)
    for i in range(30):
        log.append_as_leader(batch(i // 3, producer_id=PID + i % 3), 0, T0 + i)
    before = projection(log)
    crash(log)
    recovered = open_log(tmp_path, config, had_clean_shutdown=False)
    assert projection(recovered) == before
    last = log.producer_state_manager.last_entry(PID + 29 % 3)
    assert last is not None
    retry = recovered.append_as_leader(batch(29 // 3, producer_id=PID + 29 % 3), 0, T0)
    assert (retry.first_offset, recovered.log_end_offset) == (last.last_data_offset, 30)


def test_a_corrupt_snapshot_is_ignored_and_the_state_rebuilt_from_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(5):
        log.append_as_leader(batch(i), 0, T0)
    before = projection(log)
    log.close()
    snapshot = producer_snapshot_file(tmp_path, 5)
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    reopened = open_log(tmp_path, had_clean_shutdown=True)
    assert projection(reopened) == before
    # The corrupt file was replaced by one written from the rebuilt state.
    assert [e.last_seq for e in read_snapshot(snapshot)] == [4]


def test_an_unclean_shutdown_deletes_snapshots_above_the_recovered_log_end(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(4):
        log.append_as_leader(batch(i), 0, T0)
    log.close()
    assert snapshot_offsets(tmp_path) == [4]
    # The tail was never written back before power went out: the last batch is torn.
    log_file = tmp_path / f"{0:020d}.log"
    os.truncate(log_file, log_file.stat().st_size - 5)
    recovered = open_log(tmp_path, had_clean_shutdown=False)
    assert recovered.log_end_offset == 3
    assert snapshot_offsets(tmp_path) == [3]
    assert recovered.producer_state_manager.last_entry(PID).last_seq == 2  # type: ignore[union-attr]
    assert recovered.append_as_leader(batch(3), 0, T0).first_offset == 3


def test_truncation_reloads_the_state_as_of_the_truncation_point(tmp_path: Path) -> None:
    config = log_config(segment_bytes=400)
    log = open_log(tmp_path, config)
    for i in range(20):
        log.append_as_leader(batch(i), 0, T0)
    log.truncate_to(7)
    entry = log.producer_state_manager.last_entry(PID)
    assert entry is not None and (entry.last_seq, entry.last_data_offset) == (6, 6)
    assert all(offset <= 7 for offset in snapshot_offsets(tmp_path))
    # The producer's retry of sequence 7 is now new data, not a duplicate.
    assert log.append_as_leader(batch(7), 0, T0).first_offset == 7


def test_truncating_fully_forgets_every_producer(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(0), 0, T0)
    log.roll(T0)
    log.truncate_fully_and_start_at(100)
    assert log.producer_state_manager.is_empty
    assert snapshot_offsets(tmp_path) == []
    assert log.append_as_leader(batch(57), 0, T0).first_offset == 100


def test_retention_deletes_the_snapshots_of_deleted_segments_but_not_the_producers(tmp_path: Path) -> None:
    config = log_config(segment_bytes=400, retention_ms=1000)
    log = open_log(tmp_path, config)
    for i in range(12):
        log.append_as_leader(batch(i, ts=T0), 0, T0)
    log.update_high_watermark(log.log_end_offset)
    bases = [s.base_offset for s in log.segments]
    assert snapshot_offsets(tmp_path) == bases[1:]
    log.append_as_leader(batch(12, ts=T0 + 10_000), 0, T0 + 10_000)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(T0 + 10_000) > 0
    kept = snapshot_offsets(tmp_path)
    assert kept and min(kept) >= log.segments[0].base_offset
    # KIP-360: the producer outlives its deleted batches and goes on in sequence.
    assert log.append_as_leader(batch(13), 0, T0 + 10_000).first_offset == 13


def test_snapshots_below_the_last_two_segments_and_the_recovery_point_are_deleted(tmp_path: Path) -> None:
    config = log_config(segment_bytes=400)
    log = open_log(tmp_path, config)
    for i in range(30):
        log.append_as_leader(batch(i), 0, T0)
    bases = [s.base_offset for s in log.segments]
    log.flush()
    assert log.delete_snapshots_after_recovery_point_checkpoint() == bases[-2]
    assert snapshot_offsets(tmp_path) == bases[-2:]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 4), st.booleans(), st.booleans()),
        min_size=1,
        max_size=25,
    )
)
def test_a_follower_builds_the_leaders_producer_state(tmp_path_factory: pytest.TempPathFactory, steps) -> None:  # type: ignore[no-untyped-def]
    """Random producers, batch sizes, retries and epoch bumps on the leader; the follower appends what the
    leader wrote and ends with exactly the leader's entries, last five batches included."""
    root = tmp_path_factory.mktemp("follower")
    config = log_config(segment_bytes=600)
    leader, follower = open_log(root / "leader", config), open_log(root / "follower", config)
    sequences: dict[int, int] = {}
    epochs: dict[int, int] = {}
    last_batch: dict[int, bytearray] = {}
    for producer, records, retry, bump in steps:
        pid = PID + producer
        if retry and pid in last_batch:
            leader.append_as_leader(bytearray(last_batch[pid]), 0, T0)
            continue
        if bump:
            epochs[pid] = epochs.get(pid, 0) + 1
            sequences[pid] = 0
        sequence = sequences.get(pid, 0)
        data = batch(sequence, records, producer_id=pid, epoch=epochs.get(pid, 0))
        last_batch[pid] = bytearray(data)
        leader.append_as_leader(data, 0, T0)
        sequences[pid] = sequence + records
    offset = 0
    while offset < leader.log_end_offset:
        info = leader.read(offset, 1 << 20, None, True)
        assert info.records is not None
        data = info.records.read_bytes()
        follower.append_as_follower(data, T0)
        offset = follower.log_end_offset
    assert follower.producer_state_manager.active_producers == leader.producer_state_manager.active_producers


def test_the_log_manager_expires_idle_producers_of_every_log(tmp_path: Path) -> None:
    manager = LogManager(
        [tmp_path], {}, producer_state_config=ProducerStateManagerConfig(producer_id_expiration_ms=1000)
    )
    manager.startup({}, T0)
    logs = [manager.get_or_create_log(TopicPartition("topic", p), uuid.UUID(int=1), {}, T0) for p in range(2)]
    logs[0].append_as_leader(batch(0, ts=T0), 0, T0)
    logs[1].append_as_leader(batch(0, producer_id=PID + 1, ts=T0 + 500), 0, T0 + 500)
    assert manager.remove_expired_producers(T0 + 999) == 0
    assert manager.remove_expired_producers(T0 + 1000) == 1
    assert manager.remove_expired_producers(T0 + 1500) == 1
    assert all(log.producer_state_manager.is_empty for log in logs)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5), st.booleans()), min_size=1, max_size=40),
    st.booleans(),
)
def test_any_crash_recovers_the_producer_state_the_log_implies(  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory, steps, clean
) -> None:
    """Random producers and retries over several segments, then a crash (or a clean close): the reopened log
    knows every producer's epoch, last sequence and offset, whether it starts from snapshots or the log."""
    root = tmp_path_factory.mktemp("recovery")
    config = log_config(segment_bytes=500)
    log = open_log(root, config)
    sequences: dict[int, int] = {}
    last: dict[int, bytearray] = {}
    for producer, records, retry in steps:
        pid = PID + producer
        if retry and pid in last:
            log.append_as_leader(bytearray(last[pid]), 0, T0)
            continue
        data = batch(sequences.get(pid, 0), records, producer_id=pid)
        last[pid] = bytearray(data)
        log.append_as_leader(data, 0, T0)
        sequences[pid] = sequences.get(pid, 0) + records
    before = projection(log)
    if clean:
        log.close()
    else:
        crash(log)
    reopened = open_log(root, config, had_clean_shutdown=clean)
    assert projection(reopened) == before
    reopened.close()
    for path in root.glob("*.snapshot"):
        path.unlink()
    replayed = open_log(root, config, had_clean_shutdown=False)
    assert projection(replayed) == before
    replayed.close()

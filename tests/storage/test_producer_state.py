"""ProducerStateManager on its own: Kafka's sequence and epoch rules (ProducerAppendInfo.checkSequence and
checkProducerEpoch), duplicate detection among the last five batches, the snapshot file format, expiration."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.records.record_batch import read_header
from tierlog.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from tierlog.storage.producer_state import (
    INT32_MAX,
    NUM_BATCHES_TO_RETAIN,
    AppendOrigin,
    BatchMetadata,
    CorruptSnapshotError,
    ProducerStateEntry,
    ProducerStateManager,
    ProducerStateManagerConfig,
    decode_snapshot,
    encode_snapshot,
    producer_snapshot_file,
)

TP = TopicPartition("topic", 0)
T0 = 1_700_000_000_000
PID = 1000


def header(producer_id: int, epoch: int, sequence: int, records: int = 1, timestamp: int = T0):
    batch = build_batch(
        [(None, b"v", [], timestamp + i) for i in range(records)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )
    return read_header(batch)


class Appender:
    """Appends batches of one partition to a ProducerStateManager as the log does, offsets in order."""

    def __init__(self, manager: ProducerStateManager, origin: AppendOrigin = AppendOrigin.CLIENT) -> None:
        self.manager = manager
        self.origin = origin
        self.next_offset = 0

    def append(
        self, epoch: int, sequence: int, records: int = 1, producer_id: int = PID, timestamp: int = T0
    ) -> tuple[int, int]:
        first = self.next_offset
        last = first + records - 1
        info = self.manager.prepare_update(producer_id, self.origin)
        info.append(header(producer_id, epoch, sequence, records, timestamp), first, last)
        self.manager.update(info)
        self.next_offset = last + 1
        self.manager.update_map_end_offset(self.next_offset)
        return first, last


@pytest.fixture
def appender(tmp_path: Path) -> Appender:
    return Appender(ProducerStateManager(TP, tmp_path))


def test_sequences_in_order_are_accepted(appender: Appender) -> None:
    appender.append(0, 0, records=3)
    appender.append(0, 3, records=2)
    entry = appender.manager.last_entry(PID)
    assert entry is not None
    assert (entry.producer_epoch, entry.first_seq, entry.last_seq, entry.last_data_offset) == (0, 0, 4, 4)


def test_an_unknown_producer_may_start_at_any_sequence(appender: Appender) -> None:
    # Its state may have expired, or its batches been deleted: Kafka accepts and carries on from there.
    appender.append(3, 17)
    appender.append(3, 18)
    assert appender.manager.last_entry(PID).last_seq == 18  # type: ignore[union-attr]


def test_a_sequence_gap_is_out_of_order(appender: Appender) -> None:
    appender.append(0, 0)
    with pytest.raises(OutOfOrderSequenceError, match=r"2 \(incoming seq. number\), 0 \(current end sequence number\)"):
        appender.append(0, 2)
    # The failed batch changed nothing: the next in-order batch is still 1.
    appender.append(0, 1)


def test_a_sequence_going_back_that_is_no_duplicate_is_out_of_order(appender: Appender) -> None:
    appender.append(0, 0, records=2)
    appender.append(0, 2, records=2)
    with pytest.raises(OutOfOrderSequenceError):
        appender.append(0, 1, records=2)


@pytest.mark.parametrize("which", range(NUM_BATCHES_TO_RETAIN))
def test_a_retry_of_each_of_the_last_five_batches_is_found_with_its_original_offsets(
    appender: Appender, which: int
) -> None:
    written = [appender.append(0, 2 * i, records=2) for i in range(7)]
    entry = appender.manager.last_entry(PID)
    assert entry is not None
    index = len(written) - NUM_BATCHES_TO_RETAIN + which
    duplicate = entry.find_duplicate_batch(header(PID, 0, 2 * index, records=2))
    assert duplicate is not None
    assert (duplicate.first_offset, duplicate.last_offset) == written[index]


def test_a_retry_older_than_the_last_five_batches_is_no_duplicate(appender: Appender) -> None:
    for i in range(NUM_BATCHES_TO_RETAIN + 1):
        appender.append(0, i)
    entry = appender.manager.last_entry(PID)
    assert entry is not None
    assert entry.find_duplicate_batch(header(PID, 0, 0)) is None
    with pytest.raises(OutOfOrderSequenceError):
        appender.append(0, 0)


def test_a_batch_with_a_different_sequence_range_is_no_duplicate(appender: Appender) -> None:
    appender.append(0, 0, records=3)
    entry = appender.manager.last_entry(PID)
    assert entry is not None
    assert entry.find_duplicate_batch(header(PID, 0, 0, records=2)) is None
    assert entry.find_duplicate_batch(header(PID, 1, 0, records=3)) is None


def test_an_older_epoch_is_fenced(appender: Appender) -> None:
    appender.append(2, 0)
    with pytest.raises(InvalidProducerEpochError, match="smaller than the last seen epoch 2"):
        appender.append(1, 1)


def test_a_new_epoch_must_start_at_sequence_zero(appender: Appender) -> None:
    appender.append(0, 0)
    appender.append(0, 1)
    with pytest.raises(OutOfOrderSequenceError, match="new epoch"):
        appender.append(1, 5)
    appender.append(1, 0)
    entry = appender.manager.last_entry(PID)
    assert entry is not None
    # A new epoch starts a new sequence space: the old epoch's batches are gone.
    assert (entry.producer_epoch, [b.last_seq for b in entry.batch_metadata]) == (1, [0])


def test_sequences_wrap_from_int32_max_to_zero(appender: Appender) -> None:
    appender.append(0, INT32_MAX - 1, records=2)
    appender.append(0, 0)
    assert appender.manager.last_entry(PID).last_seq == 0  # type: ignore[union-attr]


def test_a_batch_across_the_wrap_continues_at_its_small_last_sequence_and_is_found_again(appender: Appender) -> None:
    written = appender.append(0, INT32_MAX - 1, records=3)
    entry = appender.manager.last_entry(PID)
    assert entry is not None
    assert (entry.first_seq, entry.last_seq) == (INT32_MAX - 1, 0)
    duplicate = entry.find_duplicate_batch(header(PID, 0, INT32_MAX - 1, records=3))
    assert duplicate is not None and (duplicate.first_offset, duplicate.last_offset) == written
    appender.append(0, 1)


def test_replication_checks_only_the_epoch_and_never_raises(tmp_path: Path) -> None:
    follower = Appender(ProducerStateManager(TP, tmp_path), AppendOrigin.REPLICATION)
    follower.append(1, 0)
    follower.append(1, 7)  # a gap the leader accepted (its state had expired): copied as it is
    follower.append(0, 0)  # an older epoch: only logged
    assert follower.manager.last_entry(PID).producer_epoch == 0  # type: ignore[union-attr]


def test_snapshot_bytes_are_kafkas_layout_with_a_crc32c_over_the_entries() -> None:
    entry = ProducerStateEntry(7, 3, -1, T0 + 5, [BatchMetadata(41, 1234, 4, T0 + 5)])
    data = encode_snapshot([entry])
    version, crc, count = struct.unpack_from(">hIi", data)
    fields = struct.unpack_from(">qhiqiqiq", data, 10)
    assert (version, count, len(data)) == (1, 1, 10 + 46)
    assert crc == crc32c(data[6:])
    assert fields == (7, 3, 41, 1234, 4, T0 + 5, -1, -1)
    assert encode_snapshot(decode_snapshot(data)) == data


def test_snapshot_round_trip_keeps_the_last_batch_of_every_producer(tmp_path: Path) -> None:
    appender = Appender(ProducerStateManager(TP, tmp_path))
    for pid in (5, 6, 7):
        for sequence in range(3):
            appender.append(1, 2 * sequence, records=2, producer_id=pid, timestamp=T0 + pid)
    manager = appender.manager
    path = manager.take_snapshot()
    assert path == producer_snapshot_file(tmp_path, appender.next_offset)
    assert path.name == f"{appender.next_offset:020d}.snapshot"
    reloaded = ProducerStateManager(TP, tmp_path)
    reloaded.truncate_and_reload(0, appender.next_offset, T0)
    assert reloaded.map_end_offset == appender.next_offset
    for pid, entry in manager.active_producers.items():
        loaded = reloaded.last_entry(pid)
        assert loaded is not None
        assert list(loaded.batch_metadata) == [entry.batch_metadata[-1]]
        assert (loaded.producer_epoch, loaded.last_timestamp) == (entry.producer_epoch, entry.last_timestamp)
    # Byte for byte: a snapshot of the reloaded state is the same file.
    assert encode_snapshot(reloaded.active_producers.values()) == path.read_bytes()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],
        lambda data: data[:3],
        lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:],
        lambda data: struct.pack(">h", 2) + data[2:],
    ],
    ids=["truncated", "no-header", "flipped-bit", "unknown-version"],
)
def test_a_corrupt_snapshot_is_rejected(damage) -> None:  # type: ignore[no-untyped-def]
    data = encode_snapshot([ProducerStateEntry(7, 3, -1, T0, [BatchMetadata(41, 1234, 4, T0)])])
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(damage(data))


def test_a_corrupt_latest_snapshot_is_deleted_and_the_previous_one_loaded(tmp_path: Path) -> None:
    appender = Appender(ProducerStateManager(TP, tmp_path))
    appender.append(0, 0)
    appender.manager.take_snapshot()
    appender.append(0, 1)
    latest = appender.manager.take_snapshot()
    assert latest is not None
    latest.write_bytes(b"garbage")
    reloaded = ProducerStateManager(TP, tmp_path)
    reloaded.truncate_and_reload(0, 2, T0)
    assert not latest.exists()
    assert (reloaded.map_end_offset, reloaded.last_entry(PID).last_seq) == (1, 0)  # type: ignore[union-attr]


def test_truncate_and_reload_drops_snapshots_outside_the_log(tmp_path: Path) -> None:
    appender = Appender(ProducerStateManager(TP, tmp_path))
    for sequence in range(4):
        appender.append(0, sequence)
        appender.manager.take_snapshot()
    manager = appender.manager
    assert manager.snapshot_offsets == [1, 2, 3, 4]
    manager.truncate_and_reload(1, 3, T0)
    # Kafka keeps only snapshots in (log start, log end].
    assert manager.snapshot_offsets == [2, 3]
    assert (manager.map_end_offset, manager.last_entry(PID).last_seq) == (3, 2)  # type: ignore[union-attr]


def test_producers_expire_after_producer_id_expiration_ms(tmp_path: Path) -> None:
    appender = Appender(ProducerStateManager(TP, tmp_path, ProducerStateManagerConfig(producer_id_expiration_ms=1000)))
    appender.append(0, 0, producer_id=1, timestamp=T0)
    appender.append(0, 0, producer_id=2, timestamp=T0 + 500)
    assert appender.manager.remove_expired_producers(T0 + 999) == 0
    assert appender.manager.remove_expired_producers(T0 + 1000) == 1
    assert set(appender.manager.active_producers) == {2}
    # An expired producer is unknown again: it may go on at any sequence.
    appender.append(0, 9, producer_id=1, timestamp=T0 + 1000)


def test_expired_producers_are_not_loaded_from_a_snapshot(tmp_path: Path) -> None:
    appender = Appender(ProducerStateManager(TP, tmp_path))
    appender.append(0, 0, producer_id=1, timestamp=T0)
    appender.append(0, 0, producer_id=2, timestamp=T0 + 500)
    appender.manager.take_snapshot()
    reloaded = ProducerStateManager(TP, tmp_path, ProducerStateManagerConfig(producer_id_expiration_ms=1000))
    reloaded.truncate_and_reload(0, 2, T0 + 1200)
    assert set(reloaded.active_producers) == {2}


def test_stray_snapshots_are_removed_except_the_latest_past_every_segment(tmp_path: Path) -> None:
    manager = ProducerStateManager(TP, tmp_path)
    for offset in (0, 10, 15, 20, 30, 35):
        producer_snapshot_file(tmp_path, offset).write_bytes(encode_snapshot([]))
    manager.remove_stray_snapshots([0, 10, 20])
    assert manager.snapshot_offsets == [0, 10, 20, 35]


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**15 - 1),
            st.integers(0, INT32_MAX),
            st.integers(0, 2**40),
            st.integers(0, 1000),
            st.integers(-1, 2**45),
        ),
        max_size=20,
        unique_by=lambda t: t[0],
    )
)
def test_any_snapshot_decodes_to_what_was_encoded(fields: list[tuple[int, int, int, int, int, int]]) -> None:
    entries = [
        ProducerStateEntry(pid, epoch, -1, timestamp, [BatchMetadata(seq, offset, min(delta, offset), timestamp)])
        for pid, epoch, seq, offset, delta, timestamp in fields
    ]
    data = encode_snapshot(entries)
    assert decode_snapshot(data) == entries
    assert encode_snapshot(decode_snapshot(data)) == data

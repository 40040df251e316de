"""dump_log prints what Kafka 3.9's kafka-dump-log.sh prints for the same files.

The golden lines come from dumps of real Kafka brokers published in blog posts; rebuilding the same
records with build_batch reproduces their sizes and CRCs exactly.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from cli_helpers import tierlog
from crc32c import crc32c

from tierlog.cli.dump_log import dump_log
from tierlog.raft.messages import OffsetAndEpoch
from tierlog.raft.snapshot import SnapshotStore
from tierlog.records.codec import RecordSpec, build_batch
from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    LENGTH_OFFSET,
    MAGIC_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    CompressionType,
    set_log_append_time,
)

SEGMENT = "00000000000000000000.log"
T0 = 1_700_000_000_000


def dump(path: Path, *, print_data_log: bool = True) -> list[str]:
    out = io.StringIO()
    dump_log(path, print_data_log=print_data_log, out=out)
    return out.getvalue().splitlines()


def write_segment(tmp_path: Path, *batches: bytes, name: str = SEGMENT) -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(batches))
    return path


def set_attribute_bits(batch: bytes, mask: int) -> bytes:
    data = bytearray(batch)
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes | mask)
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(bytes(data[ATTRIBUTES_OFFSET:])))
    return bytes(data)


# --- golden output from Kafka ---------------------------------------------------------------------


def test_matches_kafka_for_an_idempotent_producer_record(tmp_path: Path) -> None:
    batch = build_batch(
        [(b"1", b"hello", [], 1662649069768)],
        producer_id=0,
        producer_epoch=0,
        base_sequence=0,
        partition_leader_epoch=0,
    )
    path = write_segment(tmp_path, batch)
    assert dump(path) == [
        f"Dumping {path}",
        "Log starting offset: 0",
        "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: 0 lastSequence: 0 producerId: 0 producerEpoch: 0 "
        "partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty "
        "position: 0 CreateTime: 1662649069768 size: 74 magic: 2 compresscodec: none crc: 3775885203 "
        "isvalid: true",
        "| offset: 0 CreateTime: 1662649069768 keySize: 1 valueSize: 5 sequence: 0 headerKeys: [] key: 1 "
        "payload: hello",
    ]


def test_matches_kafka_for_a_transaction_and_its_commit_marker(tmp_path: Path) -> None:
    data = build_batch(
        [(None, b"tset a si siht", [], 1742739702864)],
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        partition_leader_epoch=0,
    )
    marker = build_batch(
        # Control key: version 0, type COMMIT (1); value: version 0, coordinator epoch 0.
        [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [], 1742739703234)],
        base_offset=1,
        producer_id=1,
        producer_epoch=0,
        partition_leader_epoch=0,
    )
    path = write_segment(
        tmp_path,
        set_attribute_bits(data, TRANSACTIONAL_FLAG_MASK),
        set_attribute_bits(marker, TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK),
    )
    assert dump(path)[2:] == [
        "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: 0 lastSequence: 0 producerId: 1 producerEpoch: 0 "
        "partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty "
        "position: 0 CreateTime: 1742739702864 size: 82 magic: 2 compresscodec: none crc: 758896000 "
        "isvalid: true",
        "| offset: 0 CreateTime: 1742739702864 keySize: -1 valueSize: 14 sequence: 0 headerKeys: [] "
        "payload: tset a si siht",
        "baseOffset: 1 lastOffset: 1 count: 1 baseSequence: -1 lastSequence: -1 producerId: 1 producerEpoch: 0 "
        "partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty "
        "position: 82 CreateTime: 1742739703234 size: 78 magic: 2 compresscodec: none crc: 2557578104 "
        "isvalid: true",
        "| offset: 1 CreateTime: 1742739703234 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 0",
    ]


# --- segments -------------------------------------------------------------------------------------

THREE: list[RecordSpec] = [
    (b"k", b"hello", [], T0),
    (None, b"world", [("trace", b"1"), ("null", None)], T0 + 2),
    (b"gone", None, [], T0 + 1),
]


def test_batches_and_records(tmp_path: Path) -> None:
    first = build_batch(THREE, partition_leader_epoch=0)
    second = build_batch(
        [(b"x", b"y" * 30, [], T0 + 10)],
        base_offset=3,
        compression=CompressionType.ZSTD,
        producer_id=7,
        producer_epoch=1,
        base_sequence=5,
        partition_leader_epoch=2,
    )
    path = write_segment(tmp_path, first, second)
    lines = dump(path)
    assert lines[2].startswith(
        "baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: {T0 + 2} size: {len(first)} magic: 2 "
        "compresscodec: none crc: "
    )
    assert lines[2].endswith(" isvalid: true")
    assert lines[3:6] == [
        f"| offset: 0 CreateTime: {T0} keySize: 1 valueSize: 5 sequence: -1 headerKeys: [] key: k payload: hello",
        f"| offset: 1 CreateTime: {T0 + 2} keySize: -1 valueSize: 5 sequence: -1 headerKeys: [trace,null] "
        "payload: world",
        f"| offset: 2 CreateTime: {T0 + 1} keySize: 4 valueSize: -1 sequence: -1 headerKeys: [] key: gone",
    ]
    assert lines[6].startswith(
        "baseOffset: 3 lastOffset: 3 count: 1 baseSequence: 5 lastSequence: 5 producerId: 7 producerEpoch: 1 "
        f"partitionLeaderEpoch: 2 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty "
        f"position: {len(first)} CreateTime: {T0 + 10} size: {len(second)} magic: 2 compresscodec: zstd crc: "
    )
    assert lines[7] == (
        f"| offset: 3 CreateTime: {T0 + 10} keySize: 1 valueSize: 30 sequence: 5 headerKeys: [] key: x "
        f"payload: {'y' * 30}"
    )
    assert len(lines) == 8


def test_without_print_data_log_only_batches_are_shown(tmp_path: Path) -> None:
    path = write_segment(tmp_path, build_batch(THREE), build_batch(THREE, base_offset=3))
    lines = dump(path, print_data_log=False)
    assert len(lines) == 4
    assert [line.split()[1] for line in lines[2:]] == ["0", "3"]


def test_records_are_not_decoded_without_print_data_log(tmp_path: Path) -> None:
    data = bytearray(build_batch(THREE, compression=CompressionType.GZIP))
    data[-3] ^= 0xFF  # the gzip trailer: only a decoder notices
    path = write_segment(tmp_path, bytes(data))
    assert "isvalid: false" in dump(path, print_data_log=False)[2]
    assert len(dump(path, print_data_log=False)) == 3


def test_each_codec_is_named_like_kafka(tmp_path: Path) -> None:
    batches = [build_batch(THREE, base_offset=3 * i, compression=c) for i, c in enumerate(CompressionType)]
    lines = dump(write_segment(tmp_path, *batches), print_data_log=False)[2:]
    assert [line.split(" compresscodec: ")[1].split()[0] for line in lines] == [
        "none",
        "gzip",
        "snappy",
        "lz4",
        "zstd",
    ]


def test_log_append_time_batch(tmp_path: Path) -> None:
    data = bytearray(build_batch(THREE))
    set_log_append_time(data, 0, T0 + 99)
    lines = dump(write_segment(tmp_path, bytes(data)))
    assert f" LogAppendTime: {T0 + 99} size: " in lines[2]
    assert all(line.startswith(f"| offset: {i} LogAppendTime: {T0 + 99} ") for i, line in enumerate(lines[3:]))


def test_log_starting_offset_comes_from_the_file_name(tmp_path: Path) -> None:
    path = write_segment(tmp_path, build_batch(THREE, base_offset=170), name="00000000000000000170.log")
    assert dump(path)[1] == "Log starting offset: 170"


def test_delete_horizon_is_shown_when_set(tmp_path: Path) -> None:
    path = write_segment(tmp_path, set_attribute_bits(build_batch(THREE), 0x40))
    assert f" deleteHorizonMs: OptionalLong[{T0}] " in dump(path)[2]


def test_sequence_wraps_like_kafka(tmp_path: Path) -> None:
    batch = build_batch(THREE, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2)
    lines = dump(write_segment(tmp_path, batch))
    assert f" baseSequence: {2**31 - 2} lastSequence: 0 " in lines[2]
    assert [line.split(" sequence: ")[1].split()[0] for line in lines[3:]] == [str(2**31 - 2), str(2**31 - 1), "0"]


def test_empty_segment(tmp_path: Path) -> None:
    path = write_segment(tmp_path)
    assert dump(path) == [f"Dumping {path}", "Log starting offset: 0"]


# --- damaged segments -----------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 11, 12, 17, 18, 61, -1])
def test_partial_batch_at_the_end_is_reported_as_invalid_bytes(tmp_path: Path, cut: int) -> None:
    whole = build_batch(THREE)
    tail = whole[:cut]
    path = write_segment(tmp_path, whole, tail)
    lines = dump(path)
    assert len(lines) == 7
    assert lines[-1] == f"Found {len(tail)} invalid bytes at the end of {SEGMENT}"


def test_crc_mismatch_is_shown_as_invalid_and_the_walk_goes_on(tmp_path: Path) -> None:
    bad = bytearray(build_batch(THREE))
    bad[-1] ^= 0xFF
    path = write_segment(tmp_path, bytes(bad), build_batch(THREE, base_offset=3))
    lines = dump(path, print_data_log=False)
    assert lines[2].endswith(" isvalid: false")
    assert lines[3].endswith(" isvalid: true")
    assert lines[3].startswith("baseOffset: 3 ")


def test_records_of_a_batch_with_a_bad_crc_are_still_printed(tmp_path: Path) -> None:
    bad = bytearray(build_batch(THREE))
    struct.pack_into(">I", bad, CRC_OFFSET, 1)
    lines = dump(write_segment(tmp_path, bytes(bad)))
    assert lines[2].endswith(" crc: 1 isvalid: false")
    assert len(lines) == 6


def test_undecodable_records_get_one_line_and_the_walk_goes_on(tmp_path: Path) -> None:
    data = bytearray(build_batch(THREE, compression=CompressionType.GZIP))
    data[-3] ^= 0xFF
    path = write_segment(tmp_path, bytes(data), build_batch(THREE, base_offset=3))
    lines = dump(path)
    assert lines[3].startswith("| batch at 0 has undecodable records")
    assert lines[4].startswith("baseOffset: 3 ")
    assert len(lines) == 8


@pytest.mark.parametrize("length", [0, 13, 48, -7])
def test_impossible_length_ends_the_walk_instead_of_crashing(tmp_path: Path, length: int) -> None:
    good = build_batch(THREE)
    bad = bytearray(build_batch(THREE, base_offset=3))
    struct.pack_into(">i", bad, LENGTH_OFFSET, length)
    path = write_segment(tmp_path, good, bytes(bad))
    lines = dump(path, print_data_log=False)
    assert lines[2:] == [lines[2], f"Found {len(bad)} invalid bytes at the end of {SEGMENT}"]


def test_other_magic_ends_the_walk(tmp_path: Path) -> None:
    bad = bytearray(build_batch(THREE))
    bad[MAGIC_OFFSET] = 1
    lines = dump(write_segment(tmp_path, bytes(bad)))
    assert lines[2:] == [f"Found {len(bad)} invalid bytes at the end of {SEGMENT}"]


def test_zero_filled_tail_is_invalid_bytes(tmp_path: Path) -> None:
    path = write_segment(tmp_path, build_batch(THREE), b"\x00" * 100)
    assert dump(path)[-1] == f"Found 100 invalid bytes at the end of {SEGMENT}"


# --- indexes and other files ----------------------------------------------------------------------


def test_offset_index(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    path.write_bytes(struct.pack(">iiiiii", 0, 0, 40, 4096, 85, 8250) + b"\x00\x00\x00")
    assert dump(path) == [
        f"Dumping {path}",
        "offset: 100 position: 0",
        "offset: 140 position: 4096",
        "offset: 185 position: 8250",
    ]


def test_preallocated_offset_index_stops_at_the_first_zero_entry(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    path.write_bytes(struct.pack(">iiii", 3, 0, 9, 500) + b"\x00" * 80)
    assert dump(path)[1:] == ["offset: 3 position: 0", "offset: 9 position: 500"]


def test_empty_offset_index(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    path.write_bytes(b"")
    assert dump(path) == [f"Dumping {path}", f"{path} is empty."]


def test_time_index(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.timeindex"
    path.write_bytes(struct.pack(">qiqi", T0, 0, T0 + 50, 40) + b"\x00" * 12 + b"\x01")
    assert dump(path) == [
        f"Dumping {path}",
        f"timestamp: {T0} offset: 100",
        f"timestamp: {T0 + 50} offset: 140",
    ]


def test_empty_time_index(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.timeindex"
    path.write_bytes(b"")
    assert dump(path) == [f"Dumping {path}"]


def test_unknown_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "partition.metadata"
    path.write_text("version: 0\ntopic_id: AAECAwQFBgcICQoLDA0ODw")
    assert dump(path) == [f"Dumping {path}", f"Ignoring unknown file {path}"]


def test_leader_epoch_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n2\n0 0\n3 120\n")
    assert dump(path) == [f"Dumping {path}", "epoch: 0 startOffset: 0", "epoch: 3 startOffset: 120"]


def test_segment_not_named_after_an_offset_is_an_error(tmp_path: Path) -> None:
    path = write_segment(tmp_path, build_batch(THREE), name="segment.log")
    with pytest.raises(ValueError, match="base offset"):
        dump(path)


def test_a_metadata_snapshot_is_dumped_with_its_id_header_and_footer_as_kafka_does(tmp_path: Path) -> None:
    snapshot_id = OffsetAndEpoch(42, 3)
    path = SnapshotStore(tmp_path).write(snapshot_id, [b'{"type":"ClusterIdRecord"}'], 1234, T0)
    lines = dump(path)
    assert lines[:2] == [f"Dumping {path}", "Snapshot end offset: 42, epoch: 3"]
    assert lines[2].startswith("baseOffset: 0 lastOffset: 0 count: 1 ") and "isControl: true" in lines[2]
    assert lines[3].endswith(' SnapshotHeader {"version":0,"lastContainedLogTimestamp":1234}')
    assert lines[5].endswith(' payload: {"type":"ClusterIdRecord"}')
    assert lines[7].endswith(' SnapshotFooter {"version":0}')
    assert len(lines) == 8


def test_dump_log_command_prints_a_metadata_snapshot(tmp_path: Path) -> None:
    path = SnapshotStore(tmp_path).write(OffsetAndEpoch(7, 1), [b"v"], 0, T0)
    ran = tierlog("dump-log", "--files", str(path))
    assert ran.code == 0, ran.stderr
    assert ran.first_line == f"Dumping {path}"
    assert "Snapshot end offset: 7, epoch: 1" in ran.stdout


def test_a_checkpoint_not_named_like_a_snapshot_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "latest.checkpoint"
    path.write_bytes(b"")
    ran = tierlog("dump-log", "--files", str(path))
    assert ran.code != 0
    assert ran.first_error_line.startswith(f"Error: cannot dump {path}: latest.checkpoint is not named like a snapshot")

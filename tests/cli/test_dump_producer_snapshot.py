"""dump_log prints a producer snapshot file as Kafka's DumpLogSegments.dumpProducerIdSnapshot does, and a
transaction index as its dumpTxnIndex."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tierlog.cli.dump_log import dump_log
from tierlog.storage.producer_state import BatchMetadata, ProducerStateEntry, encode_snapshot
from tierlog.storage.transaction_index import AbortedTxn, TransactionIndex

T0 = 1_700_000_000_000


def test_each_producer_is_one_line_with_its_last_batch(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000042.snapshot"
    path.write_bytes(
        encode_snapshot(
            [
                ProducerStateEntry(1000, 2, -1, T0 + 9, [BatchMetadata(9, 41, 4, T0 + 9)]),
                ProducerStateEntry(1001, 0, 3, T0, current_txn_first_offset=37),
            ]
        )
    )
    out = io.StringIO()
    dump_log(path, print_data_log=False, out=out)
    assert out.getvalue().splitlines() == [
        f"Dumping {path}",
        "producerId: 1000 producerEpoch: 2 coordinatorEpoch: -1 currentTxnFirstOffset: OptionalLong.empty "
        f"lastTimestamp: {T0 + 9} firstSequence: 5 lastSequence: 9 lastOffset: 41 offsetDelta: 4 timestamp: {T0 + 9}",
        "producerId: 1001 producerEpoch: 0 coordinatorEpoch: 3 currentTxnFirstOffset: OptionalLong[37] "
        f"lastTimestamp: {T0} ",
    ]


def test_a_corrupt_snapshot_says_why_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "00000000000000000042.snapshot"
    path.write_bytes(encode_snapshot([ProducerStateEntry(1000, 2, -1, T0, [BatchMetadata(9, 41, 4, T0)])])[:-3])
    out = io.StringIO()
    dump_log(path, print_data_log=False, out=out)
    assert out.getvalue().splitlines() == [f"Dumping {path}"]
    assert "CRC is no longer valid" in capsys.readouterr().err


def test_a_txn_index_is_one_line_per_aborted_transaction(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path)
    index.append(AbortedTxn(100, 1, 6, 3))
    index.append(AbortedTxn(200, 3, 9, 10))
    index.close()
    out = io.StringIO()
    dump_log(path, print_data_log=False, out=out)
    assert out.getvalue().splitlines() == [
        f"Dumping {path}",
        "version: 0 producerId: 100 firstOffset: 1 lastOffset: 6 lastStableOffset: 3",
        "version: 0 producerId: 200 firstOffset: 3 lastOffset: 9 lastStableOffset: 10",
    ]

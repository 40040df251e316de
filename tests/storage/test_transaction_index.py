"""TransactionIndex: Kafka's 34-byte AbortedTxn entries, the search a read_committed fetch makes, truncation,
lazy creation and sanity checks (docs/transactions.md#txn-index)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tierlog.storage.errors import CorruptIndexError
from tierlog.storage.transaction_index import (
    ABORTED_TXN_SIZE,
    AbortedTxn,
    TransactionIndex,
    TxnIndexSearchResult,
    parse_aborted_txns,
)

# Kafka's TransactionIndexTest.testCollectAbortedTransactions
KAFKA_TXNS = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13), AbortedTxn(2, 18, 35, 25), AbortedTxn(3, 32, 50, 40)]


def _index(tmp_path: Path, base: int = 0) -> TransactionIndex:
    return TransactionIndex(tmp_path / f"{base:020d}.txnindex")


def test_entry_is_version_then_four_big_endian_longs(tmp_path: Path) -> None:
    index = _index(tmp_path)
    index.append(AbortedTxn(producer_id=7, first_offset=3, last_offset=9, last_stable_offset=3))
    index.append(AbortedTxn(producer_id=-2, first_offset=10, last_offset=12, last_stable_offset=13))
    index.close()
    data = index.path.read_bytes()
    assert ABORTED_TXN_SIZE == 34
    assert data == struct.pack(">hqqqq", 0, 7, 3, 9, 3) + struct.pack(">hqqqq", 0, -2, 10, 12, 13)
    assert data[:34].hex() == "0000" + "0000000000000007" + "0000000000000003" + "0000000000000009" + "0000000000000003"


def test_file_is_created_by_the_first_entry_only(tmp_path: Path) -> None:
    index = _index(tmp_path)
    index.reset()
    index.truncate_to(0)
    assert not index.path.exists()
    assert index.collect_aborted_txns(0, 100) == TxnIndexSearchResult([], False)
    index.append(AbortedTxn(1, 0, 5, 6))
    assert index.path.exists()


def test_collect_aborted_txns_as_kafka(tmp_path: Path) -> None:
    index = _index(tmp_path)
    for txn in KAFKA_TXNS:
        index.append(txn)
    assert index.collect_aborted_txns(0, 100) == TxnIndexSearchResult(KAFKA_TXNS, False)
    assert index.collect_aborted_txns(0, 32) == TxnIndexSearchResult(KAFKA_TXNS[:3], True)
    assert index.collect_aborted_txns(0, 35) == TxnIndexSearchResult(KAFKA_TXNS, True)
    assert index.collect_aborted_txns(10, 35) == TxnIndexSearchResult(KAFKA_TXNS, True)
    assert index.collect_aborted_txns(11, 35) == TxnIndexSearchResult(KAFKA_TXNS[1:], True)
    assert index.collect_aborted_txns(20, 41) == TxnIndexSearchResult(KAFKA_TXNS[2:], False)


def test_reopened_index_reads_its_entries(tmp_path: Path) -> None:
    index = _index(tmp_path)
    for txn in KAFKA_TXNS:
        index.append(txn)
    index.close()
    reopened = _index(tmp_path)
    assert reopened.all_aborted_txns() == KAFKA_TXNS
    reopened.append(AbortedTxn(4, 51, 60, 61))
    assert parse_aborted_txns(reopened.path.read_bytes()) == [*KAFKA_TXNS, AbortedTxn(4, 51, 60, 61)]


def test_last_offset_must_increase(tmp_path: Path) -> None:
    index = _index(tmp_path)
    index.append(AbortedTxn(1, 5, 15, 13))
    with pytest.raises(ValueError, match="must increase"):
        index.append(AbortedTxn(0, 0, 15, 11))


def test_truncate_to_removes_entries_whose_marker_is_at_or_after_the_offset(tmp_path: Path) -> None:
    index = _index(tmp_path)
    for txn in KAFKA_TXNS:
        index.append(txn)
    index.truncate_to(51)
    assert index.all_aborted_txns() == KAFKA_TXNS
    index.truncate_to(35)
    assert index.all_aborted_txns() == KAFKA_TXNS[:2]
    assert index.path.stat().st_size == 2 * ABORTED_TXN_SIZE
    index.append(AbortedTxn(5, 20, 30, 31))
    index.close()
    assert _index(tmp_path).all_aborted_txns() == [*KAFKA_TXNS[:2], AbortedTxn(5, 20, 30, 31)]


def test_reset_empties_the_file(tmp_path: Path) -> None:
    index = _index(tmp_path)
    index.append(AbortedTxn(1, 0, 5, 6))
    index.reset()
    assert index.all_aborted_txns() == []
    assert index.path.read_bytes() == b""


def test_sanity_check_rejects_entries_before_the_segment_and_torn_entries(tmp_path: Path) -> None:
    index = _index(tmp_path, base=10)
    index.append(AbortedTxn(1, 0, 9, 10))
    index.close()
    with pytest.raises(CorruptIndexError, match="less than start offset 10"):
        _index(tmp_path, base=10).sanity_check()
    index.path.write_bytes(AbortedTxn(1, 10, 12, 13).to_bytes() + b"\x00\x00")
    torn = _index(tmp_path, base=10)
    assert torn.all_aborted_txns() == [AbortedTxn(1, 10, 12, 13)]
    with pytest.raises(CorruptIndexError, match="not a multiple"):
        torn.sanity_check()


def test_newer_entry_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / f"{0:020d}.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 1, 1, 0, 5, 6))
    with pytest.raises(CorruptIndexError, match="Unexpected aborted transaction version 1"):
        TransactionIndex(path)


def test_rename_and_delete_follow_the_file(tmp_path: Path) -> None:
    index = _index(tmp_path)
    index.append(AbortedTxn(1, 0, 5, 6))
    target = tmp_path / f"{0:020d}.txnindex.deleted"
    index.rename_to(target)
    assert target.exists() and index.path == target
    index.delete()
    assert not target.exists()


def test_flush_closes_the_file_and_a_later_append_reopens_it(tmp_path: Path) -> None:
    index = _index(tmp_path)
    index.append(AbortedTxn(1, 0, 5, 6))
    index.flush()
    index.append(AbortedTxn(2, 6, 8, 9))
    index.close()
    assert _index(tmp_path).all_aborted_txns() == [AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 6, 8, 9)]

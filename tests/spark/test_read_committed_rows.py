"""kafka.isolation.level=read_committed in the converter: hand-built transactional batches and markers read as
Kafka's consumer reads them (CompletedFetch: aborted transactions from the Fetch answer, control batches skipped).
No broker and no Spark: the bytes are the ones a read_committed Fetch answer would carry."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tierlog.records.codec import build_batch
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.records.record_batch import CompressionType, set_base_offset
from tierlog.spark.arrow import record_batches_to_arrow
from tierlog.spark.options import parse_batch_options
from tierlog.spark.remote_tier import chunk_aborted_transactions
from tierlog.storage.transaction_index import AbortedTxn

NOW_MS = 1_700_000_000_000


@dataclass(frozen=True)
class Aborted:
    """A Fetch answer's AbortedTransaction (producer_id, first_offset)."""

    producer_id: int
    first_offset: int


def _data(
    base_offset: int,
    count: int,
    producer_id: int = -1,
    transactional: bool = False,
    compression: CompressionType = CompressionType.NONE,
) -> bytes:
    records = [(f"k{base_offset + i}".encode(), f"v{base_offset + i}".encode(), (), NOW_MS) for i in range(count)]
    return build_batch(
        records,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        transactional=transactional,
        compression=compression,
    )


def _marker(offset: int, producer_id: int, committed: bool) -> bytes:
    kind = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
    batch = build_end_txn_marker_batch(producer_id, 0, EndTxnMarker(kind, coordinator_epoch=3), NOW_MS)
    set_base_offset(batch, 0, offset)
    return bytes(batch)


def _offsets(data: bytes, aborted: list[Aborted] | None, start: int = 0, end: int = 1_000) -> list[int]:
    return record_batches_to_arrow(data, "t", 0, start, end, False, aborted).column("offset").to_pylist()


# offsets: 0-1 plain; 2-3 producer 5's transaction (aborted, marker 6); 4-5 producer 6's (committed, marker 7);
# 8-9 producer 5's next transaction (committed, marker 10); 11-12 producer 5 again (aborted, marker 13); 14 an
# idempotent, non-transactional batch of producer 5.
LOG = (
    _data(0, 2)
    + _data(2, 2, producer_id=5, transactional=True)
    + _data(4, 2, producer_id=6, transactional=True)
    + _marker(6, 5, committed=False)
    + _marker(7, 6, committed=True)
    + _data(8, 2, producer_id=5, transactional=True)
    + _marker(10, 5, committed=True)
    + _data(11, 2, producer_id=5, transactional=True)
    + _marker(13, 5, committed=False)
    + _data(14, 1, producer_id=5)
)
ABORTED = [Aborted(5, 11), Aborted(5, 2)]  # in any order: the consumer sorts them by first offset


def test_read_uncommitted_sees_every_data_record_and_no_marker() -> None:
    assert _offsets(LOG, None) == [0, 1, 2, 3, 4, 5, 8, 9, 11, 12, 14]


def test_read_committed_drops_the_aborted_transactions_and_keeps_the_producers_committed_ones() -> None:
    # Producer 5's ABORT marker at 6 ends its first aborted transaction, so its committed one at 8-9 is seen;
    # its second aborted transaction (first offset 11) is dropped; its idempotent batch at 14 is not transactional.
    assert _offsets(LOG, ABORTED) == [0, 1, 4, 5, 8, 9, 14]


def test_read_committed_without_aborted_transactions_keeps_every_data_record() -> None:
    assert _offsets(LOG, []) == [0, 1, 2, 3, 4, 5, 8, 9, 11, 12, 14]


def test_an_aborted_transaction_that_began_before_the_fetch_offset_is_still_dropped() -> None:
    # A fetch at 3 starts inside the batch at 2; the answer names the transaction by its first offset 2.
    assert _offsets(LOG[len(_data(0, 2)) :], [Aborted(5, 2)], start=3) == [4, 5, 8, 9, 11, 12, 14]


def test_an_aborted_transaction_interleaved_with_a_committed_one_of_another_producer() -> None:
    log = (
        _data(0, 1, producer_id=7, transactional=True)
        + _data(1, 1, producer_id=8, transactional=True)
        + _data(2, 1, producer_id=7, transactional=True)
        + _marker(3, 8, committed=True)
        + _marker(4, 7, committed=False)
    )
    assert _offsets(log, [Aborted(7, 0)]) == [1]


@pytest.mark.parametrize("codec", [CompressionType.GZIP, CompressionType.ZSTD, CompressionType.LZ4])
def test_compressed_transactional_batches_are_filtered_the_same(codec: CompressionType) -> None:
    log = (
        _data(0, 3, producer_id=5, transactional=True, compression=codec)
        + _data(3, 3, producer_id=6, transactional=True, compression=codec)
        + _marker(6, 5, committed=False)
        + _marker(7, 6, committed=True)
    )
    rows = record_batches_to_arrow(log, "t", 0, 0, 8, False, [Aborted(5, 0)]).to_pylist()
    assert [(r["offset"], r["value"]) for r in rows] == [(3, b"v3"), (4, b"v4"), (5, b"v5")]


def test_isolation_level_option_defaults_to_spark_kafka_sources_read_uncommitted() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
    default = parse_batch_options(base)
    assert not default.read_committed
    assert ("isolation.level", "read_uncommitted") in default.client_settings
    committed = parse_batch_options({**base, "kafka.isolation.level": "READ_COMMITTED"})
    assert committed.read_committed
    assert ("isolation.level", "read_committed") in committed.client_settings
    with pytest.raises(ValueError, match=r"kafka\.isolation\.level. must be read_committed or read_uncommitted"):
        parse_batch_options({**base, "kafka.isolation.level": "serializable"})


def test_a_remote_slice_read_in_chunks_applies_each_aborted_transaction_only_to_the_chunks_it_reaches() -> None:
    """The direct remote-tier path reads a slice in chunks with the slice's aborted transactions: a transaction
    aborted in the first chunk must not drop its producer's committed transaction in the second, as a Fetch
    answer starting at the second chunk would not list it."""
    first = _data(0, 2, producer_id=5, transactional=True) + _marker(2, 5, committed=False)
    second = _data(3, 2, producer_id=5, transactional=True) + _marker(5, 5, committed=True)
    aborted = (AbortedTxn(producer_id=5, first_offset=0, last_offset=2, last_stable_offset=0),)
    assert _offsets(first, chunk_aborted_transactions(aborted, 0)) == []
    assert _offsets(second, chunk_aborted_transactions(aborted, 3)) == [3, 4]
    assert chunk_aborted_transactions(None, 3) is None

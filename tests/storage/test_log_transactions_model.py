"""Transactions in the log against a model (docs/transactions.md#storage): random interleavings of transactional
and plain writes, commits, aborts, replication, truncations and clean or unclean restarts (with or without the
snapshots); after each step the ongoing transactions, the LSO and every segment's txn index are what the log's
contents say they must be."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import T0, log_config, make_batch, open_log

from tierlog.records.codec import build_batch
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.records.record_batch import iter_batches
from tierlog.storage.log import Log
from tierlog.storage.producer_state import AppendOrigin
from tierlog.storage.transaction_index import AbortedTxn

PRODUCERS = (11, 12, 13)
CONFIG = log_config(segment_bytes=400)


@dataclass
class Model:
    """What the log holds, batch by batch: (offset, producer id or None, kind) with kind 'data', 'txn', 'commit' or
    'abort'; the rules derive everything else from it."""

    batches: list[tuple[int, int | None, str]] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.batches[-1][0] + 1 if self.batches else 0

    def replay(self) -> tuple[dict[int, int], list[AbortedTxn]]:
        """(producer -> first offset of its open transaction, the aborted transactions' index entries)."""
        open_txns: dict[int, int] = {}
        aborted = []
        for offset, producer, kind in self.batches:
            if producer is None:
                continue
            if kind == "txn":
                open_txns.setdefault(producer, offset)
            elif kind in ("commit", "abort") and producer in open_txns:
                first = open_txns.pop(producer)
                if kind == "abort":
                    others = [start for other, start in open_txns.items() if other != producer]
                    aborted.append(AbortedTxn(producer, first, offset, min(others, default=offset + 1)))
        return open_txns, aborted

    def spans(self, offset: int) -> bool:
        """Whether a transaction has records below `offset` and its marker (or none yet) at or above it."""
        open_txns: dict[int, int] = {}
        for batch_offset, producer, kind in self.batches:
            if producer is None:
                continue
            if kind == "txn":
                open_txns.setdefault(producer, batch_offset)
            elif producer in open_txns and open_txns.pop(producer) < offset <= batch_offset:
                return True
        return any(start < offset for start in open_txns.values())

    def next_sequence(self, producer: int) -> int:
        return sum(1 for _, p, kind in self.batches if p == producer and kind == "txn")

    def truncate(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b[0] < offset]


def txn_batch(producer: int, sequence: int) -> bytearray:
    return bytearray(
        build_batch(
            [(None, b"x" * 30, [], T0)],
            producer_id=producer,
            producer_epoch=0,
            base_sequence=sequence,
            transactional=True,
        )
    )


def marker(producer: int, committed: bool) -> bytearray:
    control = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
    return build_end_txn_marker_batch(producer, 0, EndTxnMarker(control, 3), T0)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("txn"), st.sampled_from(PRODUCERS)),
        st.tuples(st.just("commit"), st.sampled_from(PRODUCERS)),
        st.tuples(st.just("abort"), st.sampled_from(PRODUCERS)),
        st.tuples(st.just("data"), st.just(0)),
        st.tuples(st.just("replicate"), st.just(0)),
        st.tuples(st.just("truncate"), st.integers(1, 4)),
        st.tuples(st.just("delete records"), st.integers(0, 3)),
        st.tuples(st.just("restart"), st.sampled_from(["clean", "unclean", "unclean without snapshots"])),
    ),
    min_size=1,
    max_size=40,
)


def check(log: Log, model: Model) -> None:
    """A transaction wholly below the log start may be forgotten by a reload (Kafka's too): only what begins at or
    above the log start is compared."""
    open_txns, aborted = model.replay()
    log_start = log.log_start_offset
    assert log.log_end_offset == model.end
    ongoing = log.producer_state_manager.ongoing_transactions
    assert sorted((t.producer_id, t.first_offset) for t in ongoing) == sorted(open_txns.items())
    indexed = []
    segments = log.segments
    for index, segment in enumerate(segments):
        end = segments[index + 1].base_offset if index + 1 < len(segments) else log.log_end_offset
        entries = segment.txn_index.all_aborted_txns()
        assert all(segment.base_offset <= entry.last_offset < end for entry in entries)
        indexed.extend(entries)
    assert [entry for entry in indexed if entry.first_offset >= log_start] == [
        entry for entry in aborted if entry.first_offset >= log_start
    ]
    assert log.collect_aborted_transactions(0, log.log_end_offset) == indexed
    # Never past the HW nor an open transaction's start; markers not yet below the HW may hold it lower.
    starts = list(open_txns.values())
    assert log.last_stable_offset <= min([*starts, log.high_watermark])
    if log.high_watermark == log.log_end_offset:
        # Every marker is replicated: only open transactions are unstable.
        assert log.last_stable_offset == min([*starts, log.high_watermark])


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_the_log_agrees_with_the_model(ops: list[tuple[str, object]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory)
        log = open_log(path, CONFIG)
        model = Model()
        for op, arg in ops:
            if op == "txn":
                assert isinstance(arg, int)
                offset = log.append_as_leader(txn_batch(arg, model.next_sequence(arg)), 0, T0).first_offset
                model.batches.append((offset, arg, "txn"))
            elif op in ("commit", "abort"):
                assert isinstance(arg, int)
                records = marker(arg, committed=op == "commit")
                offset = log.append_as_leader(records, 0, T0, AppendOrigin.COORDINATOR).first_offset
                model.batches.append((offset, arg, op))
            elif op == "data":
                offset = log.append_as_leader(make_batch(value_size=30), 0, T0).first_offset
                model.batches.append((offset, None, "data"))
            elif op == "delete records":
                assert isinstance(arg, int)
                # DeleteRecords moves the log start up to at most the HW; the segments stay until retention. As
                # Kafka's, a reload of producer state (a truncation, a recovery) starts at the log start and may
                # forget or cut a transaction that began below it; the model does not follow that, so the log
                # start never lands inside a transaction.
                target = min(log.log_start_offset + arg, log.high_watermark)
                if not model.spans(target):
                    log.maybe_increment_log_start_offset(target)
            elif op == "replicate":
                log.update_high_watermark(log.log_end_offset)
            elif op == "truncate":
                assert isinstance(arg, int)
                # Truncation goes to batch boundaries (a follower's, to its leader's epoch end), not below the log
                # start (which would put the log start inside a transaction again, see "delete records").
                target = max(model.end - arg, log.log_start_offset)
                log.truncate_to(target)
                model.truncate(target)
            else:
                high_watermark = log.high_watermark
                if arg == "clean":
                    log.close()
                else:
                    log.close_handlers()
                    if arg == "unclean without snapshots":
                        for snapshot in path.glob("*.snapshot"):
                            snapshot.unlink()
                log = open_log(
                    path,
                    CONFIG,
                    had_clean_shutdown=arg == "clean",
                    recovery_point=0,
                    high_watermark=high_watermark,
                    log_start_offset=log.log_start_offset,
                )
            check(log, model)
        # A follower copying the log from its start, a fetch at a time, builds the same index entries.
        chunks = []
        offset = log.local_log_start_offset
        while offset < log.log_end_offset:
            data = log.read(offset, 1 << 30, None, True).records
            assert data is not None
            chunks.append(data.read_bytes())
            offset = [header.last_offset for header in iter_batches(chunks[-1])][-1] + 1
        start = next(iter_batches(chunks[0])).base_offset if chunks else log.log_end_offset
        follower = open_log(path / "follower", CONFIG, log_start_offset=start)
        for chunk in chunks:
            follower.append_as_follower(chunk, T0)
        entries = [entry for segment in log.segments for entry in segment.txn_index.all_aborted_txns()]
        copied = [entry for segment in follower.segments for entry in segment.txn_index.all_aborted_txns()]
        assert copied == [entry for entry in entries if entry.first_offset >= start]
        follower.close()
        log.close()

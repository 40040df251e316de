"""A Log against an in-memory model: random appends, reads, HW and log start moves, truncations, rolls,
retention of segments below the log start, and reopens after clean shutdowns and crashes (torn tails)."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from storage_helpers import T0, log_config, make_batch, open_log

from tierlog.records.record_batch import iter_batches
from tierlog.storage.log import Log

CONFIG = log_config(segment_bytes=2000, index_interval_bytes=64, retention_ms=-1)


class LogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="log-model-"))
        self.now = T0
        self.log = self._open(recovery_point=0, log_start=0, high_watermark=0, clean=True)
        # The model: every batch as stored (bytes after stamping), plus the offsets the log must report.
        self.batches: list[tuple[int, int, int, bytes]] = []  # (base offset, last offset, epoch, bytes)
        self.log_end_offset = 0
        self.log_start_offset = 0
        self.high_watermark = 0
        self.epoch = 0

    def _open(self, *, recovery_point: int, log_start: int, high_watermark: int, clean: bool) -> Log:
        return open_log(
            self.root / "topic-0",
            CONFIG,
            recovery_point=recovery_point,
            log_start_offset=log_start,
            high_watermark=high_watermark,
            had_clean_shutdown=clean,
            now_ms=self.now,
        )

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        batches=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 60)), min_size=1, max_size=3),
        new_epoch=st.booleans(),
    )
    def append(self, batches: list[tuple[int, int]], new_epoch: bool) -> None:
        self.now += 7
        if new_epoch:
            self.epoch += 1
        records = bytearray()
        for count, value_size in batches:
            records += make_batch(count, value_size=value_size, timestamp=self.now)
        info = self.log.append_as_leader(records, self.epoch, self.now)
        assert info.first_offset == self.log_end_offset
        for header in iter_batches(records):
            data = bytes(records[header.position : header.position + header.size_in_bytes])
            self.batches.append((header.base_offset, header.last_offset, self.epoch, data))
        self.log_end_offset = info.last_offset + 1

    @rule(data=st.data(), min_one_message=st.booleans())
    def read(self, data: st.DataObject, min_one_message: bool) -> None:
        offset = data.draw(st.integers(self.log_start_offset, self.log_end_offset))
        max_bytes = data.draw(st.integers(0, 2500))
        upper = data.draw(st.one_of(st.none(), st.integers(0, self.log_end_offset + 2)))
        result = self.log.read(offset, max_bytes, upper, min_one_message)
        got = b"" if result.records is None else result.records.read_bytes()
        bound = self.log_end_offset if upper is None else min(upper, self.log_end_offset)
        expected = [b for b in self.batches if b[1] >= offset and b[1] < bound]
        returned = []
        position = 0
        for header in iter_batches(got) if got else ():
            returned.append(got[position : position + header.size_in_bytes])
            position += header.size_in_bytes
        # Whole batches, in order, from the one holding the offset, never one reaching the bound; a read
        # may stop early at a segment's end.
        assert returned == [b[3] for b in expected[: len(returned)]]
        if len(returned) > 1 or not min_one_message:
            assert len(got) <= max_bytes
        if expected and offset < bound and (min_one_message or len(expected[0][3]) <= max_bytes):
            assert returned, f"nothing read from {offset} although batch {expected[0][:2]} is there"

    @rule(data=st.data())
    def move_high_watermark(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(0, self.log_end_offset + 3))
        self.high_watermark = min(max(target, self.log_start_offset), self.log_end_offset)
        assert self.log.update_high_watermark(target) == self.high_watermark

    @precondition(lambda self: self.high_watermark > self.log_start_offset)
    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.log_start_offset + 1, self.high_watermark))
        assert self.log.maybe_increment_log_start_offset(target)
        self.log_start_offset = target

    @rule()
    def retention(self) -> None:
        self.now += 7
        self.log.delete_old_segments(self.now)
        self.log.remove_deleted_segments(self.now + CONFIG.file_delete_delay_ms)
        # Only segments wholly below the log start may go: nothing visible changes.
        assert self.log.segments[0].base_offset <= self.log_start_offset

    @precondition(lambda self: bool(self.batches))
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        candidates = [b[0] for b in self.batches if b[0] >= self.log_start_offset] + [self.log_end_offset]
        target = data.draw(st.sampled_from(candidates))
        changed = self.log.truncate_to(target)
        assert changed == (target < self.log_end_offset)
        if changed:
            self.batches = [b for b in self.batches if b[0] < target]
            self.log_end_offset = target
            self.high_watermark = min(self.high_watermark, target)

    @rule()
    def roll(self) -> None:
        self.now += 7
        self.log.roll(self.now)

    @rule(flush=st.booleans())
    def clean_restart(self, flush: bool) -> None:
        if flush:
            self.log.flush()
        recovery_point = self.log.recovery_point
        self.log.close()
        self.log = self._open(
            recovery_point=recovery_point,
            log_start=self.log_start_offset,
            high_watermark=self.high_watermark,
            clean=True,
        )

    @rule(flush=st.booleans(), tear=st.integers(0, 40))
    def crash_and_recover(self, flush: bool, tear: int) -> None:
        if flush:
            self.log.flush()
        recovery_point = self.log.recovery_point
        active = self.log.active_segment
        self.log.close_handlers()
        last = self.batches[-1] if self.batches else None
        # A crash can only tear bytes that were never flushed: the tail of the last batch above the
        # recovery point.
        if tear and last is not None and last[0] >= recovery_point and active.base_offset <= last[0]:
            cut = min(tear, len(last[3]) - 1)
            os.truncate(active.log_path, os.path.getsize(active.log_path) - cut)
            self.batches.pop()
            self.log_end_offset = last[0]
            if self.log_start_offset > self.log_end_offset:
                # Kafka starts the log over at the checkpointed log start.
                self.batches = []
                self.log_end_offset = self.log_start_offset
            self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.log = self._open(
            recovery_point=recovery_point,
            log_start=self.log_start_offset,
            high_watermark=self.high_watermark,
            clean=False,
        )

    @invariant()
    def offsets_agree_with_the_model(self) -> None:
        log = self.log
        assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (
            self.log_start_offset,
            self.high_watermark,
            self.log_end_offset,
        )
        bases = [s.base_offset for s in log.segments]
        assert bases == sorted(set(bases))
        assert bases[0] <= self.log_start_offset
        assert log.recovery_point <= log.log_end_offset

    @invariant()
    def epoch_cache_describes_the_log(self) -> None:
        entries = self.log.leader_epoch_cache.epoch_entries()
        assert all(a.epoch < b.epoch and a.start_offset < b.start_offset for a, b in itertools.pairwise(entries))
        assert all(self.log_start_offset <= e.start_offset <= self.log_end_offset for e in entries)
        if self.batches and self.batches[-1][0] >= self.log_start_offset:
            assert self.log.latest_epoch == self.batches[-1][2]


TestLogModel = LogModel.TestCase
TestLogModel.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

"""LeaderEpochFileCache against docs/replication.md#epoch-cache and #end-offset-for, and Kafka 3.9's
LeaderEpochFileCacheTest."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.storage.checkpoints import LEADER_EPOCH_CHECKPOINT_FILENAME, LeaderEpochCheckpointFile
from tierlog.storage.epoch_entry import EpochEntry
from tierlog.storage.leader_epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    LeaderEpochFileCache,
)

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def cache_with(*entries: tuple[int, int]) -> LeaderEpochFileCache:
    cache = LeaderEpochFileCache(None)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def pairs(cache: LeaderEpochFileCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.epoch_entries()]


@pytest.fixture
def checkpoint(tmp_path: Path) -> LeaderEpochCheckpointFile:
    return LeaderEpochCheckpointFile(tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME)


# --- assign -----------------------------------------------------------------------------------------


def test_assign_to_empty_cache_adds_the_entry() -> None:
    cache = cache_with((2, 10))
    assert pairs(cache) == [(2, 10)]
    assert cache.latest_epoch == 2
    assert cache.latest_entry == EpochEntry(2, 10)
    assert cache.earliest_entry == EpochEntry(2, 10)


def test_assign_same_epoch_at_higher_offset_is_a_no_op() -> None:
    # The common case: every later batch of the current epoch.
    cache = cache_with((2, 10), (2, 11), (2, 500))
    assert pairs(cache) == [(2, 10)]


def test_assign_same_epoch_at_same_offset_is_a_no_op() -> None:
    assert pairs(cache_with((2, 10), (2, 10))) == [(2, 10)]


def test_assign_same_epoch_at_lower_offset_replaces_the_entry() -> None:
    assert pairs(cache_with((1, 0), (2, 10), (2, 5))) == [(1, 0), (2, 5)]


def test_assign_new_epoch_appends() -> None:
    assert pairs(cache_with((1, 0), (2, 10), (4, 20))) == [(1, 0), (2, 10), (4, 20)]


def test_assign_new_epoch_at_same_offset_replaces_the_empty_epoch() -> None:
    # Epoch 2 never got a record before epoch 3 began at the same offset.
    assert pairs(cache_with((1, 0), (2, 10), (3, 10))) == [(1, 0), (3, 10)]


def test_assign_new_epoch_at_lower_offset_drops_entries_starting_at_or_after_it() -> None:
    assert pairs(cache_with((1, 0), (2, 10), (3, 20), (4, 15))) == [(1, 0), (2, 10), (4, 15)]
    assert pairs(cache_with((1, 0), (2, 10), (3, 20), (4, 10))) == [(1, 0), (4, 10)]


def test_assign_lower_epoch_drops_tail_entries_with_higher_or_equal_epoch() -> None:
    assert pairs(cache_with((1, 0), (2, 10), (4, 20), (3, 25))) == [(1, 0), (2, 10), (3, 25)]
    assert pairs(cache_with((1, 0), (2, 10), (4, 20), (2, 30))) == [(1, 0), (2, 30)]


def test_assign_lower_epoch_and_lower_offset_drops_by_both_rules() -> None:
    assert pairs(cache_with((1, 0), (3, 10), (5, 20), (2, 5))) == [(1, 0), (2, 5)]


def test_assign_older_epoch_at_earlier_offset_than_everything_leaves_only_it() -> None:
    assert pairs(cache_with((3, 10), (4, 20), (1, 0))) == [(1, 0)]


@pytest.mark.parametrize(("epoch", "start"), [(-1, 0), (0, -1), (-5, -5)])
def test_assign_negative_values_raise(epoch: int, start: int) -> None:
    cache = cache_with((1, 0))
    with pytest.raises(ValueError):
        cache.assign(epoch, start)
    assert pairs(cache) == [(1, 0)]


def test_assign_epoch_zero_at_offset_zero_is_valid() -> None:
    assert pairs(cache_with((0, 0))) == [(0, 0)]


def test_assign_sequence_mixing_every_rule() -> None:
    cache = cache_with((0, 0), (1, 5), (3, 9), (2, 7), (6, 20), (6, 12), (7, 12))
    assert pairs(cache) == [(0, 0), (1, 5), (2, 7), (7, 12)]


_operation = st.one_of(
    st.tuples(st.just("assign"), st.integers(0, 8), st.integers(0, 60)),
    st.tuples(st.just("truncate_from_end"), st.integers(-1, 60)),
    st.tuples(st.just("truncate_from_start"), st.integers(0, 60)),
)


@given(st.lists(_operation, max_size=30))
def test_entries_stay_strictly_increasing_in_epoch_and_offset(operations: list[tuple[Any, ...]]) -> None:
    cache = LeaderEpochFileCache(None)
    for name, *args in operations:
        getattr(cache, name)(*args)
        entries = cache.epoch_entries()
        for a, b in itertools.pairwise(entries):
            assert a.epoch < b.epoch
            assert a.start_offset < b.start_offset


def test_epoch_entries_is_a_copy() -> None:
    cache = cache_with((1, 0))
    cache.epoch_entries().append(EpochEntry(9, 9))
    assert pairs(cache) == [(1, 0)]


def test_empty_cache_accessors() -> None:
    cache = LeaderEpochFileCache(None)
    assert cache.latest_epoch is None
    assert cache.latest_entry is None
    assert cache.earliest_entry is None
    assert cache.previous_epoch() is None
    assert cache.epoch_entries() == []
    assert cache.epoch_for_offset(0) is None


def test_previous_epoch() -> None:
    assert cache_with((1, 0)).previous_epoch() is None
    assert cache_with((1, 0), (4, 10)).previous_epoch() == 1
    assert cache_with((1, 0), (4, 10), (7, 20)).previous_epoch() == 4


# --- end_offset_for -------------------------------------------------------------------------------


def seed_002_leader() -> LeaderEpochFileCache:
    # The example of docs/replication.md#end-offset-for: epoch 2 -> 30, 3 -> 50, 4 -> 70.
    return cache_with((2, 30), (3, 50), (4, 70))


def test_seed_002_undefined_epoch() -> None:
    assert seed_002_leader().end_offset_for(UNDEFINED_EPOCH, 90) == UNDEFINED


def test_seed_002_requested_equals_latest_epoch_returns_log_end_offset() -> None:
    assert seed_002_leader().end_offset_for(4, 90) == (4, 90)


def test_seed_002_follower_asks_for_epoch_2_gets_start_of_epoch_3() -> None:
    assert seed_002_leader().end_offset_for(2, 90) == (2, 50)


def test_seed_002_requested_smaller_than_every_epoch() -> None:
    assert seed_002_leader().end_offset_for(1, 90) == (1, 30)
    assert seed_002_leader().end_offset_for(0, 90) == (0, 30)


def test_seed_002_requested_larger_than_every_epoch() -> None:
    assert seed_002_leader().end_offset_for(5, 90) == UNDEFINED


def test_end_offset_for_missing_epoch_between_known_ones_uses_floor_epoch() -> None:
    cache = cache_with((1, 0), (3, 10), (6, 25))
    assert cache.end_offset_for(2, 40) == (1, 10)
    assert cache.end_offset_for(4, 40) == (3, 25)
    assert cache.end_offset_for(5, 40) == (3, 25)
    assert cache.end_offset_for(3, 40) == (3, 25)
    assert cache.end_offset_for(1, 40) == (1, 10)


def test_end_offset_for_empty_cache_is_undefined() -> None:
    cache = LeaderEpochFileCache(None)
    assert cache.end_offset_for(0, 10) == UNDEFINED
    assert cache.end_offset_for(3, 10) == UNDEFINED
    assert cache.end_offset_for(UNDEFINED_EPOCH, 10) == UNDEFINED


def test_end_offset_for_single_entry() -> None:
    cache = cache_with((5, 100))
    assert cache.end_offset_for(5, 120) == (5, 120)
    assert cache.end_offset_for(4, 120) == (4, 100)
    assert cache.end_offset_for(6, 120) == UNDEFINED


def test_end_offset_for_latest_epoch_follows_the_given_log_end_offset() -> None:
    cache = cache_with((1, 0), (2, 10))
    assert cache.end_offset_for(2, 10) == (2, 10)
    assert cache.end_offset_for(2, 11) == (2, 11)


# --- epoch_for_offset -----------------------------------------------------------------------------


def test_epoch_for_offset() -> None:
    cache = cache_with((1, 5), (3, 10), (6, 25))
    assert cache.epoch_for_offset(0) is None
    assert cache.epoch_for_offset(4) is None
    assert cache.epoch_for_offset(5) == 1
    assert cache.epoch_for_offset(9) == 1
    assert cache.epoch_for_offset(10) == 3
    assert cache.epoch_for_offset(24) == 3
    assert cache.epoch_for_offset(25) == 6
    assert cache.epoch_for_offset(10_000) == 6


# --- truncate_from_end ----------------------------------------------------------------------------


def test_truncate_from_end_drops_entries_starting_at_or_after_end() -> None:
    cache = cache_with((1, 0), (2, 10), (3, 20), (4, 30))
    cache.truncate_from_end(20)
    assert pairs(cache) == [(1, 0), (2, 10)]


def test_truncate_from_end_inside_the_latest_epoch_keeps_it() -> None:
    cache = cache_with((1, 0), (2, 10), (3, 20))
    cache.truncate_from_end(25)
    assert pairs(cache) == [(1, 0), (2, 10), (3, 20)]


def test_truncate_from_end_just_after_latest_start_keeps_it() -> None:
    cache = cache_with((1, 0), (2, 10))
    cache.truncate_from_end(11)
    assert pairs(cache) == [(1, 0), (2, 10)]


def test_truncate_from_end_between_entries() -> None:
    cache = cache_with((1, 0), (2, 10), (3, 20), (4, 30))
    cache.truncate_from_end(15)
    assert pairs(cache) == [(1, 0), (2, 10)]


def test_truncate_from_end_to_zero_clears_everything() -> None:
    cache = cache_with((1, 0), (2, 10))
    cache.truncate_from_end(0)
    assert pairs(cache) == []


def test_truncate_from_end_negative_offset_is_ignored() -> None:
    cache = cache_with((1, 0), (2, 10))
    cache.truncate_from_end(-1)
    assert pairs(cache) == [(1, 0), (2, 10)]


def test_truncate_from_end_on_empty_cache_is_a_no_op() -> None:
    cache = LeaderEpochFileCache(None)
    cache.truncate_from_end(5)
    assert pairs(cache) == []


# --- truncate_from_start --------------------------------------------------------------------------


def test_truncate_from_start_moves_the_covering_entry_to_the_new_start() -> None:
    cache = cache_with((1, 0), (2, 10), (3, 20))
    cache.truncate_from_start(15)
    assert pairs(cache) == [(2, 15), (3, 20)]


def test_truncate_from_start_exactly_at_an_entry_start() -> None:
    cache = cache_with((1, 0), (2, 10), (3, 20))
    cache.truncate_from_start(10)
    assert pairs(cache) == [(2, 10), (3, 20)]


def test_truncate_from_start_before_first_entry_is_a_no_op() -> None:
    cache = cache_with((1, 5), (2, 10))
    cache.truncate_from_start(3)
    assert pairs(cache) == [(1, 5), (2, 10)]


def test_truncate_from_start_inside_first_epoch() -> None:
    cache = cache_with((1, 0), (2, 10))
    cache.truncate_from_start(4)
    assert pairs(cache) == [(1, 4), (2, 10)]


def test_truncate_from_start_past_latest_start_keeps_latest_epoch() -> None:
    cache = cache_with((1, 0), (2, 10), (3, 20))
    cache.truncate_from_start(50)
    assert pairs(cache) == [(3, 50)]


def test_truncate_from_start_on_empty_cache_is_a_no_op() -> None:
    cache = LeaderEpochFileCache(None)
    cache.truncate_from_start(5)
    assert pairs(cache) == []


# --- clear and persistence ------------------------------------------------------------------------


def test_clear_and_flush(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache = LeaderEpochFileCache(checkpoint)
    cache.assign(1, 0)
    cache.clear_and_flush()
    assert pairs(cache) == []
    assert checkpoint.path.read_text() == "0\n0\n"
    assert pairs(LeaderEpochFileCache(checkpoint)) == []


def test_new_cache_on_missing_file_is_empty_and_does_not_create_it(
    checkpoint: LeaderEpochCheckpointFile,
) -> None:
    cache = LeaderEpochFileCache(checkpoint)
    assert pairs(cache) == []
    assert not checkpoint.path.exists()


def test_checkpoint_text_is_kafka_format(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache = LeaderEpochFileCache(checkpoint)
    cache.assign(0, 0)
    cache.assign(1, 100)
    cache.assign(3, 250)
    assert checkpoint.path.read_bytes() == b"0\n3\n0 0\n1 100\n3 250\n"


def test_every_change_is_persisted_and_survives_reload(checkpoint: LeaderEpochCheckpointFile) -> None:
    def reloaded() -> list[tuple[int, int]]:
        return pairs(LeaderEpochFileCache(checkpoint))

    cache = LeaderEpochFileCache(checkpoint)
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(3, 20)
    assert reloaded() == [(1, 0), (2, 10), (3, 20)]
    cache.assign(4, 15)
    assert reloaded() == [(1, 0), (2, 10), (4, 15)]
    cache.truncate_from_end(12)
    assert reloaded() == [(1, 0), (2, 10)]
    cache.truncate_from_start(5)
    assert reloaded() == [(1, 5), (2, 10)]
    reopened = LeaderEpochFileCache(checkpoint)
    assert reopened.end_offset_for(1, 30) == (1, 10)
    assert reopened.end_offset_for(2, 30) == (2, 30)


def test_no_op_assign_does_not_rewrite_the_file(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache = LeaderEpochFileCache(checkpoint)
    cache.assign(1, 0)
    # Each write renames a new file into place, so an unchanged inode means no write happened.
    inode = checkpoint.path.stat().st_ino
    cache.assign(1, 7)
    assert checkpoint.path.stat().st_ino == inode


def test_no_op_truncations_do_not_rewrite_the_file(checkpoint: LeaderEpochCheckpointFile) -> None:
    cache = LeaderEpochFileCache(checkpoint)
    cache.assign(1, 5)
    inode = checkpoint.path.stat().st_ino
    cache.truncate_from_end(10)
    cache.truncate_from_start(2)
    assert checkpoint.path.stat().st_ino == inode


def test_loading_a_non_monotonic_file_applies_the_assign_rule(
    checkpoint: LeaderEpochCheckpointFile,
) -> None:
    checkpoint.path.write_text("0\n3\n1 0\n3 20\n2 10\n")
    assert pairs(LeaderEpochFileCache(checkpoint)) == [(1, 0), (2, 10)]


def test_loading_a_file_written_by_kafka(checkpoint: LeaderEpochCheckpointFile) -> None:
    checkpoint.path.write_bytes(b"0\n2\n0 0\n5 1234\n")
    cache = LeaderEpochFileCache(checkpoint)
    assert cache.latest_entry == EpochEntry(5, 1234)
    assert cache.end_offset_for(0, 2000) == (0, 1234)

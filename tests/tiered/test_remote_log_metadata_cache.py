"""RemoteLogMetadataCache and RemoteLogMetadataStore against Kafka's RemoteLogMetadataCacheTest and
RemoteLogSegmentLifecycleTest, docs/tiered-storage.md#story-layout and the overlapping copies a leader change
leaves behind."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.common import TopicPartition
from tierlog.tiered.remote_log_metadata_cache import (
    IllegalStateTransitionError,
    RemoteLogMetadataCache,
    RemoteLogMetadataStore,
    UnknownRemoteSegmentError,
    metadata_partition_for,
)
from tierlog.tiered.segment_metadata import (
    RemoteLogMetadataEvent,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
    decode_event,
    encode_event,
    is_valid_transition,
)

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
COPIED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETING = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

TP = TopicPartition("foo", 0)
TIP = TopicIdPartition(uuid.UUID(int=0xF00), TP)
RECREATED_TIP = TopicIdPartition(uuid.UUID(int=0xF01), TP)
SEGMENT_SIZE = 1000

_ids = itertools.count(1)


def segment(
    start: int,
    end: int,
    epochs: Mapping[int, int],
    *,
    tip: TopicIdPartition = TIP,
    event_ms: int = 0,
    state: RemoteLogSegmentState = STARTED,
    id_int: int | None = None,
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, uuid.UUID(int=id_int if id_int is not None else next(_ids))),
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=-1,
        broker_id=0,
        event_timestamp_ms=event_ms,
        segment_size_in_bytes=SEGMENT_SIZE,
        segment_leader_epochs=tuple(sorted(epochs.items())),
        state=state,
    )


def update(
    metadata: RemoteLogSegmentMetadata, state: RemoteLogSegmentState, event_ms: int = 1
) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(metadata.segment_id, event_ms, state, broker_id=1)


def moved(cache: RemoteLogMetadataCache, metadata: RemoteLogSegmentMetadata, *states: RemoteLogSegmentState) -> None:
    for state in states:
        cache.update_remote_log_segment_metadata(update(metadata, state))


def copied(
    cache: RemoteLogMetadataCache, start: int, end: int, epochs: Mapping[int, int], **kwargs: int
) -> RemoteLogSegmentMetadata:
    """A segment added and moved to COPY_SEGMENT_FINISHED, as the cache now holds it."""
    metadata = segment(start, end, epochs, **kwargs)
    cache.add_copy_in_progress_segment(metadata)
    moved(cache, metadata, COPIED)
    stored = cache.segment(metadata.segment_id)
    assert stored is not None
    return stored


def ids(segments: Sequence[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentId]:
    return [s.segment_id for s in segments]


# --- the state machine (RemoteLogMetadataCacheTest) ---------------------------------------------------


@pytest.mark.parametrize("state", [COPIED, DELETING, DELETED])
def test_a_new_segment_must_be_copy_started(state: RemoteLogSegmentState) -> None:
    cache = RemoteLogMetadataCache()
    with pytest.raises(ValueError, match="COPY_SEGMENT_STARTED"):
        cache.add_copy_in_progress_segment(segment(0, 100, {0: 0}, state=state))
    assert cache.list_remote_log_segments() == []


def test_adding_a_known_segment_again_is_an_illegal_transition() -> None:
    cache = RemoteLogMetadataCache()
    metadata = copied(cache, 0, 100, {0: 0})
    with pytest.raises(IllegalStateTransitionError, match="already known, in state COPY_SEGMENT_FINISHED"):
        cache.add_copy_in_progress_segment(segment(0, 100, {0: 0}, id_int=metadata.segment_id.id.int))
    assert cache.list_remote_log_segments() == [metadata]


@pytest.mark.parametrize("state", [COPIED, DELETING, DELETED])
def test_updating_an_unknown_segment_raises_unknown_remote_segment_error(state: RemoteLogSegmentState) -> None:
    cache = RemoteLogMetadataCache()
    with pytest.raises(UnknownRemoteSegmentError) as raised:
        cache.update_remote_log_segment_metadata(update(segment(0, 100, {0: 0}), state))
    assert isinstance(raised.value, KeyError)
    assert str(raised.value).startswith("No remote log segment metadata found for")


def test_illegal_transitions_are_refused_and_leave_the_state_alone() -> None:
    """Kafka's testDropEventOnInvalidStateTransition, step by step."""
    cache = RemoteLogMetadataCache()
    metadata = segment(10, 100, {5: 10})
    cache.add_copy_in_progress_segment(metadata)
    steps = [
        (DELETED, False, STARTED),
        (COPIED, True, COPIED),
        (DELETED, False, COPIED),
        (STARTED, False, COPIED),
        (DELETING, True, DELETING),
        (COPIED, False, DELETING),
        (STARTED, False, DELETING),
        (DELETED, True, None),
    ]
    for target, valid, expected_state in steps:
        if valid:
            cache.update_remote_log_segment_metadata(update(metadata, target))
        else:
            with pytest.raises(IllegalStateTransitionError, match=f"to {target.name}"):
                cache.update_remote_log_segment_metadata(update(metadata, target))
        listed = cache.list_remote_log_segments_for_epoch(5)
        assert [s.state for s in listed] == ([expected_state] if expected_state is not None else [])


def test_an_update_takes_its_state_event_time_and_broker() -> None:
    cache = RemoteLogMetadataCache()
    metadata = segment(0, 100, {0: 0}, event_ms=5)
    cache.add_copy_in_progress_segment(metadata)
    cache.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(metadata.segment_id, 9, COPIED, 3))
    stored = cache.segment(metadata.segment_id)
    assert stored is not None
    assert (stored.state, stored.event_timestamp_ms, stored.broker_id) == (COPIED, 9, 3)
    assert (stored.start_offset, stored.end_offset, stored.segment_leader_epochs) == (0, 100, ((0, 0),))


def test_an_abandoned_copy_is_listed_until_its_deletion_finishes() -> None:
    cache = RemoteLogMetadataCache()
    metadata = segment(0, 100, {0: 0})
    cache.add_copy_in_progress_segment(metadata)
    moved(cache, metadata, DELETING)
    assert [s.state for s in cache.list_remote_log_segments()] == [DELETING]
    moved(cache, metadata, DELETED)
    assert cache.list_remote_log_segments() == []
    assert cache.segment(metadata.segment_id) is None


@pytest.mark.parametrize(
    "epochs",
    [
        {0: 1},  # the first epoch must start at the segment's start
        {0: 0, 1: 101},  # an epoch starting past the segment's end
        {3: 0, 1: 50},  # epochs going backwards (sorted by epoch below, so offsets descend)
    ],
)
def test_a_segment_whose_epochs_do_not_fit_it_is_refused(epochs: dict[int, int]) -> None:
    cache = RemoteLogMetadataCache()
    with pytest.raises(ValueError, match="leader epochs"):
        cache.add_copy_in_progress_segment(segment(0, 100, epochs))
    assert cache.list_remote_log_segments() == []


def test_a_segment_of_another_partition_is_refused() -> None:
    cache = RemoteLogMetadataCache()
    copied(cache, 0, 100, {0: 0})
    with pytest.raises(ValueError, match="added to"):
        cache.add_copy_in_progress_segment(segment(101, 200, {0: 101}, tip=RECREATED_TIP))


# --- lookups across epochs (RemoteLogSegmentLifecycleTest) ----------------------------------------------


@pytest.fixture
def lifecycle() -> tuple[RemoteLogMetadataCache, list[RemoteLogSegmentMetadata]]:
    """Four copied segments; the last two overlap in epoch 3 (offsets 250-299)."""
    cache = RemoteLogMetadataCache()
    segments = [
        copied(cache, 0, 99, {0: 0, 1: 20, 2: 80}),
        copied(cache, 100, 199, {2: 100}),
        copied(cache, 200, 299, {2: 200, 3: 240}),
        copied(cache, 250, 399, {3: 250, 4: 370}),
    ]
    return cache, segments


@pytest.mark.parametrize(
    ("epoch", "offset", "expected"),
    [
        (0, 0, 0),
        (0, 19, 0),
        (1, 40, 0),
        (2, 80, 0),
        (2, 99, 0),
        (2, 100, 1),
        (2, 110, 1),
        (2, 239, 2),
        (3, 240, 2),
        (3, 250, 3),  # both hold it: the range starting last wins
        (3, 299, 3),
        (4, 375, 3),
        (0, 20, None),  # offset 20 belongs to epoch 1
        (1, 110, None),  # epoch 1 ended at 79
        (2, 240, None),  # epoch 2 ended at 239
        (4, 400, None),  # past the end of the remote tier
        (5, 301, None),  # an epoch no segment holds
    ],
)
def test_lookup_finds_the_copied_segment_holding_the_offset_in_that_epoch(
    lifecycle: tuple[RemoteLogMetadataCache, list[RemoteLogSegmentMetadata]],
    epoch: int,
    offset: int,
    expected: int | None,
) -> None:
    cache, segments = lifecycle
    assert cache.remote_log_segment_metadata(epoch, offset) == (segments[expected] if expected is not None else None)


def test_highest_offset_for_epoch_is_the_epochs_last_copied_offset(
    lifecycle: tuple[RemoteLogMetadataCache, list[RemoteLogSegmentMetadata]],
) -> None:
    cache, _ = lifecycle
    assert {epoch: cache.highest_offset_for_epoch(epoch) for epoch in range(6)} == {
        0: 19,
        1: 79,
        2: 239,
        3: 369,
        4: 399,
        5: None,
    }


def test_a_deleted_segment_leaves_lookups_and_the_highest_offsets(
    lifecycle: tuple[RemoteLogMetadataCache, list[RemoteLogSegmentMetadata]],
) -> None:
    """Unlike Kafka, whose highest offset never goes down: the local tier may only drop what remote still has."""
    cache, segments = lifecycle
    moved(cache, segments[0], DELETING)
    assert cache.remote_log_segment_metadata(0, 10) is None
    assert cache.remote_log_segment_metadata(2, 90) is None
    assert [cache.highest_offset_for_epoch(epoch) for epoch in range(3)] == [None, None, 239]
    assert segments[0].segment_id in ids(cache.list_remote_log_segments_for_epoch(0))
    moved(cache, segments[0], DELETED)
    assert cache.remote_log_segment_metadata(0, 10) is None
    assert cache.list_remote_log_segments_for_epoch(0) == []
    assert ids(cache.list_remote_log_segments()) == ids(segments[1:])


def test_an_offset_in_a_gap_between_segments_is_in_none() -> None:
    cache = RemoteLogMetadataCache()
    first = copied(cache, 0, 99, {0: 0})
    second = copied(cache, 150, 199, {0: 150})
    assert cache.remote_log_segment_metadata(0, 99) == first
    assert [cache.remote_log_segment_metadata(0, offset) for offset in (100, 120, 149)] == [None, None, None]
    assert cache.remote_log_segment_metadata(0, 150) == second
    assert cache.remote_log_segment_metadata(0, 200) is None


def test_an_offset_after_an_epochs_end_and_before_the_next_segment_is_in_none() -> None:
    """Epoch 1 ends at 79 inside the first segment; the next segment, from 100, is all epoch 2."""
    cache = RemoteLogMetadataCache()
    copied(cache, 0, 99, {0: 0, 1: 20, 2: 80})
    copied(cache, 100, 199, {2: 100})
    assert [cache.remote_log_segment_metadata(1, offset) for offset in (80, 99, 100, 150)] == [None] * 4


def test_an_epoch_no_segment_holds() -> None:
    cache = RemoteLogMetadataCache()
    copied(cache, 0, 99, {1: 0})
    assert cache.remote_log_segment_metadata(0, 10) is None
    assert cache.remote_log_segment_metadata(2, 10) is None
    assert cache.highest_offset_for_epoch(0) is None
    assert cache.list_remote_log_segments_for_epoch(0) == []


def test_a_copy_in_progress_is_listed_but_not_served() -> None:
    """Kafka's testCacheSegmentWithCopySegmentStartedState, and no highest offset for its epochs yet."""
    cache = RemoteLogMetadataCache()
    metadata = segment(0, 100, {0: 0, 1: 20, 2: 80})
    cache.add_copy_in_progress_segment(metadata)
    assert cache.remote_log_segment_metadata(1, 40) is None
    assert [cache.highest_offset_for_epoch(epoch) for epoch in range(3)] == [None, None, None]
    assert cache.list_remote_log_segments() == [metadata]
    assert [cache.list_remote_log_segments_for_epoch(epoch) for epoch in range(3)] == [[metadata]] * 3
    assert cache.remote_size_in_bytes == 0


def test_a_copied_segment_is_served_and_listed() -> None:
    cache = RemoteLogMetadataCache()
    metadata = copied(cache, 101, 200, {0: 101})
    assert cache.remote_log_segment_metadata(0, 150) == metadata
    assert cache.list_remote_log_segments_for_epoch(0) == [metadata]
    assert cache.list_remote_log_segments() == [metadata]


def test_a_segment_being_deleted_is_listed_but_not_served() -> None:
    cache = RemoteLogMetadataCache()
    metadata = copied(cache, 201, 300, {0: 201})
    moved(cache, metadata, DELETING)
    assert cache.remote_log_segment_metadata(0, 250) is None
    assert [s.state for s in cache.list_remote_log_segments_for_epoch(0)] == [DELETING]
    assert [s.state for s in cache.list_remote_log_segments()] == [DELETING]


def test_listings_order_by_start_offset_and_by_the_epochs_start() -> None:
    """Kafka's testCacheListSegments, with segments added out of order and one still being copied."""
    cache = RemoteLogMetadataCache()
    third = copied(cache, 201, 400, {0: 201, 1: 301})
    first = copied(cache, 0, 100, {0: 0})
    second = segment(101, 200, {0: 101})
    cache.add_copy_in_progress_segment(second)
    assert ids(cache.list_remote_log_segments_for_epoch(0)) == ids([first, second, third])
    assert ids(cache.list_remote_log_segments_for_epoch(1)) == ids([third])
    assert ids(cache.list_remote_log_segments()) == ids([first, second, third])


def test_segments_with_one_start_offset_are_listed_by_event_time() -> None:
    """The time of a segment's latest event: the COPY_FINISHED update stamps it again (at 1 ms here)."""
    cache = RemoteLogMetadataCache()
    at_3_ms = segment(0, 99, {0: 0}, event_ms=3)
    cache.add_copy_in_progress_segment(at_3_ms)
    at_1_ms = copied(cache, 0, 99, {0: 0}, event_ms=7)
    at_0_ms = segment(0, 50, {0: 0}, event_ms=0)
    cache.add_copy_in_progress_segment(at_0_ms)
    assert ids(cache.list_remote_log_segments()) == ids([at_0_ms, at_1_ms, at_3_ms])


def test_remote_size_counts_only_copied_segments() -> None:
    cache = RemoteLogMetadataCache()
    first = copied(cache, 0, 99, {0: 0})
    copied(cache, 100, 199, {0: 100})
    cache.add_copy_in_progress_segment(segment(200, 299, {0: 200}))
    assert cache.remote_size_in_bytes == 2 * SEGMENT_SIZE
    moved(cache, first, DELETING)
    assert cache.remote_size_in_bytes == SEGMENT_SIZE


# --- overlapping copies -------------------------------------------------------------------------------


def copy_both(
    cache: RemoteLogMetadataCache,
    first: RemoteLogSegmentMetadata,
    second: RemoteLogSegmentMetadata,
    *,
    second_finishes_first: bool,
) -> None:
    """Two copies in flight at once: `first` starts, then `second`, and they finish in the order given."""
    for metadata in (first, second):
        cache.add_copy_in_progress_segment(metadata)
    for metadata in (second, first) if second_finishes_first else (first, second):
        moved(cache, metadata, COPIED)


@pytest.mark.parametrize("longer_finishes_first", [True, False])
def test_copies_from_one_start_offset_serve_from_the_longer(longer_finishes_first: bool) -> None:
    """Kafka's case 1: L0 copied 0-100, L1 re-copied 0-200. Either order, both are kept and the longer serves."""
    cache = RemoteLogMetadataCache()
    shorter, longer = segment(0, 100, {0: 0}), segment(0, 200, {0: 0})
    copy_both(cache, shorter, longer, second_finishes_first=longer_finishes_first)
    assert len(cache.list_remote_log_segments()) == 2
    for offset in (0, 50, 100, 150, 200):
        found = cache.remote_log_segment_metadata(0, offset)
        assert found is not None and found.segment_id == longer.segment_id
    assert cache.highest_offset_for_epoch(0) == 200
    assert cache.remote_size_in_bytes == 2 * SEGMENT_SIZE


@pytest.mark.parametrize("wider_finishes_first", [True, False])
def test_a_shorter_copy_inside_a_wider_one_never_hides_its_tail(wider_finishes_first: bool) -> None:
    """Kafka's case 2: S0 10-90 and S1 5-100. Kafka loses offset 95 if S0 finishes last; here it never does."""
    cache = RemoteLogMetadataCache()
    inner, wider = segment(10, 90, {0: 10}), segment(5, 100, {0: 5})
    copy_both(cache, inner, wider, second_finishes_first=wider_finishes_first)
    for offset, expected in [(5, wider), (9, wider), (10, inner), (90, inner), (91, wider), (95, wider), (100, wider)]:
        found = cache.remote_log_segment_metadata(0, offset)
        assert found is not None and found.segment_id == expected.segment_id, offset
    assert cache.remote_log_segment_metadata(0, 101) is None


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_two_leaders_copying_the_same_offsets_are_both_kept(order: tuple[int, int]) -> None:
    """A leader change mid-copy: the deposed leader's copy finished too. Either serves, always the same one,
    and the other still serves once one is deleted."""
    cache = RemoteLogMetadataCache()
    copies = [segment(100, 199, {1: 100, 2: 150}, id_int=10), segment(100, 199, {1: 100, 2: 150}, id_int=20)]
    for index in order:
        cache.add_copy_in_progress_segment(copies[index])
        moved(cache, copies[index], COPIED)
    found = cache.remote_log_segment_metadata(2, 170)
    assert found is not None and found.segment_id == copies[1].segment_id
    assert ids(cache.list_remote_log_segments_for_epoch(1)) == ids(copies)
    moved(cache, copies[1], DELETING, DELETED)
    found = cache.remote_log_segment_metadata(2, 170)
    assert found is not None and found.segment_id == copies[0].segment_id
    assert cache.highest_offset_for_epoch(2) == 199


def test_a_copied_segment_serves_while_an_overlapping_copy_is_still_in_progress() -> None:
    cache = RemoteLogMetadataCache()
    finished = copied(cache, 0, 99, {0: 0})
    cache.add_copy_in_progress_segment(segment(0, 199, {0: 0}))
    assert cache.remote_log_segment_metadata(0, 50) == finished
    assert cache.remote_log_segment_metadata(0, 150) is None
    assert cache.highest_offset_for_epoch(0) == 99


# --- docs/tiered-storage.md#story-layout -----------------------------------------------------------


def test_seed_001_layout() -> None:
    cache = RemoteLogMetadataCache()
    seg_0_2 = copied(cache, 0, 2, {0: 0})
    seg_3_5 = copied(cache, 3, 5, {1: 3, 2: 5})
    seg_6_8 = copied(cache, 6, 8, {2: 6, 3: 7})
    assert cache.remote_log_segment_metadata(1, 4) == seg_3_5
    assert cache.remote_log_segment_metadata(2, 6) == seg_6_8
    assert cache.remote_log_segment_metadata(2, 5) == seg_3_5
    assert cache.remote_log_segment_metadata(0, 2) == seg_0_2
    assert cache.remote_log_segment_metadata(3, 6) is None
    assert [cache.highest_offset_for_epoch(epoch) for epoch in range(4)] == [2, 4, 6, 8]
    assert ids(cache.list_remote_log_segments_for_epoch(2)) == ids([seg_3_5, seg_6_8])


# --- the store ----------------------------------------------------------------------------------------


def test_the_store_ignores_invalid_events_and_keeps_replaying() -> None:
    store = RemoteLogMetadataStore()
    a, b = segment(0, 99, {0: 0}), segment(100, 199, {0: 100})
    events: list[RemoteLogMetadataEvent] = [
        update(a, COPIED),  # before its add: unknown partition
        a,
        a,  # duplicate add
        update(a, DELETED),  # illegal: COPY_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED
        update(a, COPIED),
        update(b, COPIED),  # unknown segment of a known partition
        segment(200, 299, {0: 200}, state=COPIED),  # an add must be COPY_SEGMENT_STARTED
        segment(300, 399, {0: 301}),  # epochs that do not fit the segment
        b,
        update(b, COPIED),
    ]
    for event in events:
        store.apply(event)
    assert store.ignored_events == 6
    cache = store.cache(TIP)
    assert cache is not None
    assert [(s.segment_id, s.state) for s in cache.list_remote_log_segments()] == [
        (a.segment_id, COPIED),
        (b.segment_id, COPIED),
    ]
    assert cache.highest_offset_for_epoch(0) == 199


def test_the_tail_of_a_copy_a_successor_already_cleaned_up_is_ignored() -> None:
    """A deposed leader's copy: its successor deleted the leftover, then the deposed leader's COPY_FINISHED,
    published late, lands after the deletion in the topic."""
    store = RemoteLogMetadataStore()
    abandoned = segment(0, 99, {0: 0})
    for event in [abandoned, update(abandoned, DELETING), update(abandoned, DELETED), update(abandoned, COPIED)]:
        store.apply(event)
    assert store.ignored_events == 1
    cache = store.cache(TIP)
    assert cache is not None
    assert cache.list_remote_log_segments() == []
    assert cache.remote_log_segment_metadata(0, 50) is None


def test_a_topic_created_again_under_the_same_name_does_not_see_its_predecessors_segments() -> None:
    store = RemoteLogMetadataStore()
    old = segment(0, 99, {0: 0}, tip=TIP)
    new = segment(0, 9, {0: 0}, tip=RECREATED_TIP)
    for event in [old, update(old, COPIED), new, update(new, COPIED)]:
        store.apply(event)
    old_cache, new_cache = store.cache(TIP), store.cache(RECREATED_TIP)
    assert old_cache is not None and new_cache is not None
    assert new_cache.highest_offset_for_epoch(0) == 9
    assert new_cache.remote_log_segment_metadata(0, 50) is None
    assert old_cache.highest_offset_for_epoch(0) == 99
    assert store.partitions() == [TIP, RECREATED_TIP]


def test_removing_a_partition_forgets_it_and_its_later_updates() -> None:
    store = RemoteLogMetadataStore()
    other = TopicIdPartition(uuid.UUID(int=7), TopicPartition("bar", 3))
    a, b = segment(0, 99, {0: 0}), segment(0, 99, {0: 0}, tip=other)
    for event in [a, b]:
        store.apply(event)
    assert store.partitions() == [other, TIP]
    store.remove_partition(TIP)
    store.remove_partition(RECREATED_TIP)  # never known: nothing to do
    assert store.partitions() == [other]
    assert store.cache(TIP) is None
    store.apply(update(a, DELETING))
    assert store.ignored_events == 1
    assert store.cache(TIP) is None


def test_the_store_replays_encoded_events_to_the_same_state() -> None:
    segments = [
        segment(index * 100, index * 100 + 99, epochs, event_ms=index)
        for index, epochs in enumerate([{0: 0, 1: 50}, {1: 100}, {1: 200, 2: 250}])
    ]
    events: list[RemoteLogMetadataEvent] = [*segments]
    events += [update(metadata, COPIED, event_ms=10 + index) for index, metadata in enumerate(segments)]
    events.append(update(segments[0], DELETING, event_ms=20))
    direct, replayed = RemoteLogMetadataStore(), RemoteLogMetadataStore()
    for event in events:
        direct.apply(event)
        replayed.apply(decode_event(encode_event(event)))
    direct_cache, replayed_cache = direct.cache(TIP), replayed.cache(TIP)
    assert direct_cache is not None and replayed_cache is not None
    assert replayed_cache.list_remote_log_segments() == direct_cache.list_remote_log_segments()
    assert replayed.ignored_events == direct.ignored_events == 0


# --- encoding and routing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        segment(3, 8, {1: 3, 2: 5, 4: 7}, event_ms=1234),
        RemoteLogSegmentMetadataUpdate(segment(0, 1, {0: 0}).segment_id, 99, DELETING, 2),
    ],
    ids=["segment", "update"],
)
def test_events_round_trip_through_their_record_encoding(event: RemoteLogMetadataEvent) -> None:
    assert decode_event(encode_event(event)) == event


def test_metadata_partition_is_a_stable_hash_of_topic_id_and_partition() -> None:
    # Pinned: every broker of a cluster, across restarts and upgrades, must route a partition alike.
    partitions = [TopicIdPartition(TIP.topic_id, TopicPartition("foo", p)) for p in range(5)]
    assert [metadata_partition_for(tip, 50) for tip in partitions] == [26, 14, 26, 46, 27]
    assert metadata_partition_for(RECREATED_TIP, 50) == 49
    assert all(0 <= metadata_partition_for(TopicIdPartition(uuid.UUID(int=i), TP), 7) < 7 for i in range(100))
    assert metadata_partition_for(TIP, 1) == 0
    with pytest.raises(ValueError):
        metadata_partition_for(TIP, 0)


# --- properties ---------------------------------------------------------------------------------------

# Few epochs and offsets, so that segments overlap within an epoch often.
MAX_EPOCH = 2
MAX_OFFSET = 24
PATHS = [(COPIED, DELETING, DELETED), (DELETING, DELETED)]


@st.composite
def segment_lifecycles(
    draw: st.DrawFn, tips: Sequence[TopicIdPartition] = (TIP,)
) -> list[list[RemoteLogMetadataEvent]]:
    """Each segment's events, in the order its copier publishes them: an add, then a prefix of a valid path."""
    lifecycles = []
    for index in range(draw(st.integers(1, 6))):
        start = draw(st.integers(0, MAX_OFFSET - 8))
        end = start + draw(st.integers(0, 8))
        count = draw(st.integers(1, min(3, end - start + 1)))
        epochs = sorted(draw(st.sets(st.integers(0, MAX_EPOCH), min_size=count, max_size=count)))
        later_starts = st.sets(st.integers(start + 1, end), min_size=count - 1, max_size=count - 1)
        starts = [start, *sorted(draw(later_starts) if count > 1 else ())]
        metadata = segment(
            start, end, dict(zip(epochs, starts, strict=True)), tip=draw(st.sampled_from(tips)), id_int=index + 1
        )
        path = draw(st.sampled_from(PATHS))
        states = path[: draw(st.integers(0, len(path)))]
        lifecycles.append([metadata, *(update(metadata, state) for state in states)])
    return lifecycles


def interleave(
    lifecycles: list[list[RemoteLogMetadataEvent]], schedule: Sequence[int]
) -> Iterator[RemoteLogMetadataEvent]:
    """Each segment's events in its own order, segments interleaved as `schedule` picks them."""
    positions = [0] * len(lifecycles)
    for pick in schedule:
        index = pick % len(lifecycles)
        if positions[index] < len(lifecycles[index]):
            yield lifecycles[index][positions[index]]
            positions[index] += 1


def model_apply(model: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata], event: RemoteLogMetadataEvent) -> bool:
    """The events' meaning, spelled out with no index: False if the event is invalid."""
    existing = model.get(event.segment_id)
    if isinstance(event, RemoteLogSegmentMetadata):
        if existing is not None or event.state != STARTED:
            return False
        model[event.segment_id] = event
    elif existing is None or not is_valid_transition(existing.state, event.state):
        return False
    elif event.state == DELETED:
        del model[event.segment_id]
    else:
        model[event.segment_id] = existing.with_update(event)
    return True


def assert_matches_model(
    cache: RemoteLogMetadataCache, model: Mapping[RemoteLogSegmentId, RemoteLogSegmentMetadata]
) -> None:
    copied_segments = [m for m in model.values() if m.state == COPIED]
    for epoch in range(MAX_EPOCH + 2):
        ranges = [
            (start, end, m)
            for m in copied_segments
            for e, start in m.segment_leader_epochs
            if e == epoch and (end := m.epoch_end_offset(epoch)) is not None
        ]
        for offset in range(MAX_OFFSET + 2):
            holders = [(start, end) for start, end, _ in ranges if start <= offset <= end]
            found = cache.remote_log_segment_metadata(epoch, offset)
            if not holders:
                assert found is None, (epoch, offset)
                continue
            assert found is not None and found.state == COPIED, (epoch, offset)
            found_range = (dict(found.segment_leader_epochs)[epoch], found.epoch_end_offset(epoch))
            assert found_range == max(holders), (epoch, offset)
            assert model[found.segment_id] == found
        assert cache.highest_offset_for_epoch(epoch) == max((end for _, end, _ in ranges), default=None)
        holding = [m for m in model.values() if epoch in m.leader_epochs]
        listed = cache.list_remote_log_segments_for_epoch(epoch)
        assert sorted(ids(listed), key=lambda i: i.id.int) == sorted(ids(holding), key=lambda i: i.id.int)
        epoch_starts = [dict(m.segment_leader_epochs)[epoch] for m in listed]
        assert epoch_starts == sorted(epoch_starts)
    assert cache.list_remote_log_segments() == sorted(
        model.values(), key=lambda m: (m.start_offset, m.event_timestamp_ms, m.segment_id.id.int)
    )
    assert cache.remote_size_in_bytes == sum(m.segment_size_in_bytes for m in copied_segments)


@settings(max_examples=150, deadline=None)
@given(lifecycles=segment_lifecycles(), schedule=st.lists(st.integers(0, 5), max_size=30))
def test_any_valid_history_only_serves_copied_segments_holding_the_offset(
    lifecycles: list[list[RemoteLogMetadataEvent]], schedule: list[int]
) -> None:
    cache = RemoteLogMetadataCache()
    model: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
    for event in interleave(lifecycles, schedule):
        assert model_apply(model, event)
        if isinstance(event, RemoteLogSegmentMetadata):
            cache.add_copy_in_progress_segment(event)
        else:
            cache.update_remote_log_segment_metadata(event)
        assert_matches_model(cache, model)


@st.composite
def noisy_replays(draw: st.DrawFn) -> list[RemoteLogMetadataEvent]:
    """Valid histories of two incarnations of one partition, with stray events mixed in: duplicate adds,
    adds in a later state, and updates of any state for any segment, known or not."""
    lifecycles = draw(segment_lifecycles(tips=(TIP, RECREATED_TIP)))
    events = list(interleave(lifecycles, draw(st.lists(st.integers(0, 5), max_size=30))))
    adds = [lifecycle[0] for lifecycle in lifecycles]
    assert all(isinstance(add, RemoteLogSegmentMetadata) for add in adds)
    strays = st.one_of(
        st.sampled_from(adds),
        st.builds(
            RemoteLogSegmentMetadataUpdate,
            st.sampled_from([add.segment_id for add in adds] + [segment(0, 0, {0: 0}, id_int=999).segment_id]),
            st.just(2),
            st.sampled_from(list(RemoteLogSegmentState)),
            st.just(1),
        ),
    )
    for position, stray in draw(st.lists(st.tuples(st.integers(0, len(events)), strays), max_size=10)):
        events.insert(position, stray)
    return events


@settings(max_examples=150, deadline=None)
@given(events=noisy_replays())
def test_replaying_any_record_sequence_never_fails_and_ignores_exactly_the_invalid_events(
    events: list[RemoteLogMetadataEvent],
) -> None:
    store = RemoteLogMetadataStore()
    # A partition's model exists from its first valid add on, as its cache does.
    models: dict[TopicIdPartition, dict[RemoteLogSegmentId, RemoteLogSegmentMetadata]] = {}
    invalid = 0
    for event in events:
        store.apply(event)
        tip = event.segment_id.topic_id_partition
        model = models.get(tip, {})
        if model_apply(model, event):
            models[tip] = model
        else:
            invalid += 1
    assert store.ignored_events == invalid
    assert store.partitions() == sorted(models, key=lambda tip: (tip.topic_partition, tip.topic_id.int))
    for tip in models:
        cache = store.cache(tip)
        assert cache is not None
        assert_matches_model(cache, models[tip])

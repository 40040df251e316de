"""Fetch sessions (KIP-227, docs/performance.md#fetch-sessions): the leader's session cache and what an incremental
fetch reads and answers, the fetcher's side of a session, and a follower fetching through a session."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from replication_helpers import TP, Cluster, to_response

from tierlog.common import TopicPartition
from tierlog.replication.fetch_request import FetchAnswer, fetch_messages_for_request
from tierlog.replication.fetch_session import (
    FETCH_SESSION_ID_NOT_FOUND,
    FETCH_SESSION_TOPIC_ID_ERROR,
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_FETCH_SESSION_EPOCH,
    INVALID_SESSION_ID,
    FetchContext,
    FetchManager,
    FetchRequestPartition,
    FetchSessionCache,
    FetchSessionHandler,
    FullFetchContext,
    IncrementalFetchContext,
    PartitionAnswer,
    SessionErrorContext,
    SessionlessFetchContext,
    next_epoch,
)

NOW = 1_000_000
EVICTION_MS = 120_000
TOPIC_ID = uuid.UUID(int=7)
QUIET = PartitionAnswer(0, 10, 0, None, diverging=False)


def partition(index: int, offset: int = 10, topic: str = "t") -> FetchRequestPartition:
    return FetchRequestPartition(TopicPartition(topic, index), TOPIC_ID, offset, 3, 3, 0, 1 << 20)


def manager(slots: int = 10) -> FetchManager:
    return FetchManager(FetchSessionCache(slots, EVICTION_MS, random.Random(1)), lambda _: None)


def context(
    fetches: FetchManager,
    partitions: list[FetchRequestPartition],
    *,
    session_id: int = INVALID_SESSION_ID,
    epoch: int = INITIAL_EPOCH,
    forgotten: tuple[tuple[str, int], ...] = (),
    follower: bool = False,
    uses_topic_ids: bool = False,
    now_ms: int = NOW,
) -> FetchContext:
    return fetches.new_context(
        uses_topic_ids=uses_topic_ids,
        session_id=session_id,
        session_epoch=epoch,
        is_follower=follower,
        fetch_data=partitions,
        forgotten=forgotten,
        now_ms=now_ms,
    )


def create_session(
    fetches: FetchManager, partitions: list[FetchRequestPartition], *, follower: bool = False, now_ms: int = NOW
) -> int:
    full = context(fetches, partitions, follower=follower, now_ms=now_ms)
    answer, sent = full.answer([(p, QUIET) for p in full.partitions()], now_ms)
    assert answer.error is None and all(sent)
    return answer.session_id


def test_a_full_fetch_with_epoch_0_creates_a_session_and_answers_every_partition() -> None:
    fetches = manager()
    full = context(fetches, [partition(0), partition(1)])
    assert isinstance(full, FullFetchContext)
    answer, sent = full.answer([(p, QUIET) for p in full.partitions()], NOW)
    assert answer.error is None and answer.session_id != INVALID_SESSION_ID
    assert sent == [True, True]
    session = fetches.cache.get(answer.session_id)
    assert session is not None and session.epoch == 1 and len(session.partitions) == 2


def test_a_sessionless_fetch_creates_no_session_and_answers_every_partition() -> None:
    fetches = manager()
    sessionless = context(fetches, [partition(0)], epoch=FINAL_EPOCH)
    assert isinstance(sessionless, SessionlessFetchContext)
    answer, sent = sessionless.answer([(partition(0), QUIET)], NOW)
    assert (answer.error, answer.session_id, sent) == (None, INVALID_SESSION_ID, [True])
    assert fetches.cache.sessions == {}


def test_an_incremental_fetch_reads_every_partition_of_the_session_and_answers_only_the_changed_ones() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0), partition(1), partition(2)])
    incremental = context(fetches, [], session_id=session_id, epoch=1)
    assert isinstance(incremental, IncrementalFetchContext)
    assert [p.topic_partition.partition for p in incremental.partitions()] == [0, 1, 2]
    answers = [
        (partition(0), QUIET),
        (partition(1), PartitionAnswer(100, 11, 0, None, diverging=False)),  # records and a new HW
        (partition(2), PartitionAnswer(0, 10, 5, None, diverging=False)),  # a new log start offset
    ]
    answer, sent = incremental.answer(answers, NOW)
    assert (answer.error, answer.session_id) == (None, session_id)
    assert sent == [False, True, True]
    # What was answered is what the session now compares with: the next quiet answer is left out.
    again = context(fetches, [], session_id=session_id, epoch=2)
    _, sent = again.answer(
        [
            (partition(0), QUIET),
            (partition(1), PartitionAnswer(0, 11, 0, None, diverging=False)),
            (partition(2), PartitionAnswer(0, 10, 5, None, diverging=False)),
        ],
        NOW,
    )
    assert sent == [False, False, False]


def test_errors_and_diverging_epochs_are_always_answered_and_an_error_is_answered_again_once_gone() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0), partition(1)])
    incremental = context(fetches, [], session_id=session_id, epoch=1)
    _, sent = incremental.answer(
        [
            (partition(0), PartitionAnswer(0, -1, -1, "NOT_LEADER_OR_FOLLOWER", diverging=False)),
            (partition(1), PartitionAnswer(0, 10, 0, None, diverging=True)),
        ],
        NOW,
    )
    assert sent == [True, True]
    # The error reset the cached HW: the partition's first answer without the error goes out even if its HW is
    # the one it had before the error.
    _, sent = context(fetches, [], session_id=session_id, epoch=2).answer([(partition(0), QUIET)], NOW)
    assert sent == [True]


def test_an_incremental_fetch_adds_changes_and_forgets_partitions() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0), partition(1)])
    incremental = context(
        fetches, [partition(1, offset=42), partition(2)], session_id=session_id, epoch=1, forgotten=(("t", 0),)
    )
    read = {p.topic_partition.partition: p.fetch_offset for p in incremental.partitions()}
    assert read == {1: 42, 2: 10}


def test_forgetting_every_partition_closes_the_session() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0)])
    closing = context(fetches, [], session_id=session_id, epoch=1, forgotten=(("t", 0),))
    assert isinstance(closing, SessionlessFetchContext)
    assert fetches.cache.get(session_id) is None


def test_a_full_fetch_closes_the_session_it_names() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0)])
    assert isinstance(context(fetches, [partition(0)], session_id=session_id, epoch=FINAL_EPOCH), FetchContext)
    assert fetches.cache.get(session_id) is None


def test_an_unknown_session_id_answers_fetch_session_id_not_found() -> None:
    fetches = manager()
    refused = context(fetches, [partition(0)], session_id=12345, epoch=1)
    assert isinstance(refused, SessionErrorContext) and refused.partitions() == []
    answer, sent = refused.answer([], NOW)
    assert (answer.error, answer.session_id, sent) == (FETCH_SESSION_ID_NOT_FOUND, INVALID_SESSION_ID, [])


def test_a_wrong_epoch_answers_invalid_fetch_session_epoch_and_leaves_the_session_as_it_was() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0)])
    for wrong in (2, 7):
        refused = context(fetches, [partition(0, offset=99)], session_id=session_id, epoch=wrong)
        assert isinstance(refused, SessionErrorContext) and refused.error == INVALID_FETCH_SESSION_EPOCH
    session = fetches.cache.get(session_id)
    assert session is not None and session.epoch == 1
    assert [c.request.fetch_offset for c in session.partitions.values()] == [10]


def test_a_duplicate_of_a_parked_fetch_makes_the_first_answer_invalid_fetch_session_epoch() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0)])
    parked = context(fetches, [], session_id=session_id, epoch=1)
    context(fetches, [], session_id=session_id, epoch=2)  # the next fetch came before the parked one answered
    answer, sent = parked.answer([(partition(0), QUIET)], NOW)
    assert (answer.error, answer.session_id, sent) == (INVALID_FETCH_SESSION_EPOCH, session_id, [False])


def test_a_session_of_names_refuses_a_fetch_by_topic_ids() -> None:
    fetches = manager()
    session_id = create_session(fetches, [partition(0)])
    refused = context(fetches, [], session_id=session_id, epoch=1, uses_topic_ids=True)
    assert isinstance(refused, SessionErrorContext) and refused.error == FETCH_SESSION_TOPIC_ID_ERROR


def test_the_epoch_wraps_to_1_and_final_stays_final() -> None:
    assert next_epoch(0) == 1
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_a_full_cache_creates_no_session_while_every_session_is_young_and_as_valuable() -> None:
    fetches = manager(slots=1)
    first = create_session(fetches, [partition(0)])
    # A consumer cannot evict a session younger than min.incremental.fetch.session.eviction.ms.
    assert create_session(fetches, [partition(0), partition(1)], now_ms=NOW + 1) == INVALID_SESSION_ID
    assert list(fetches.cache.sessions) == [first]


def test_a_follower_evicts_a_young_consumer_session_but_not_a_young_follower_session() -> None:
    fetches = manager(slots=1)
    consumer = create_session(fetches, [partition(0), partition(1)])
    follower = create_session(fetches, [partition(0)], follower=True, now_ms=NOW + 1)
    assert follower != INVALID_SESSION_ID and list(fetches.cache.sessions) == [follower]
    assert fetches.cache.evictions == 1 and consumer not in fetches.cache.sessions
    assert create_session(fetches, [partition(0)] * 1, follower=True, now_ms=NOW + 2) == INVALID_SESSION_ID


def test_once_old_enough_the_smaller_session_gives_way_to_a_larger_one() -> None:
    fetches = manager(slots=2)
    small = create_session(fetches, [partition(0)])
    large = create_session(fetches, [partition(0), partition(1), partition(2)])
    later = NOW + EVICTION_MS + 1
    for session_id in (small, large):  # both used just now: neither is stale
        context(fetches, [], session_id=session_id, epoch=1, now_ms=later)
    # A consumer session of 2 partitions evicts the 1-partition one, not the 3-partition one.
    medium = create_session(fetches, [partition(0), partition(1)], now_ms=later)
    assert set(fetches.cache.sessions) == {large, medium}
    # One of 1 partition is worth less than both: no session.
    assert create_session(fetches, [partition(0)], now_ms=later) == INVALID_SESSION_ID


def test_a_stale_session_is_evicted_by_anyone() -> None:
    fetches = manager(slots=1)
    follower = create_session(fetches, [partition(0), partition(1)], follower=True)
    consumer = create_session(fetches, [partition(0)], now_ms=NOW + EVICTION_MS + 1)
    assert list(fetches.cache.sessions) == [consumer] and follower not in fetches.cache.sessions


def test_the_fetchers_side_sends_everything_first_then_only_what_changed() -> None:
    handler = FetchSessionHandler()
    full = handler.build([partition(0), partition(1), partition(2)])
    assert full is not None and (full.session_id, full.session_epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)
    assert len(full.partitions) == 3
    handler.handle_response(77)
    quiet = handler.build([partition(0), partition(1), partition(2)])
    assert quiet is not None and (quiet.session_id, quiet.session_epoch, quiet.partitions, quiet.forgotten) == (
        77,
        1,
        [],
        [],
    )
    handler.handle_response(77)
    changed = handler.build([partition(0), partition(1, offset=11), partition(3)])
    assert changed is not None and changed.session_epoch == 2
    assert [p.topic_partition.partition for p in changed.partitions] == [3, 1]
    assert changed.forgotten == [TopicPartition("t", 2)]


def test_the_fetchers_side_falls_back_to_a_full_fetch_after_a_session_error_or_a_lost_answer() -> None:
    handler = FetchSessionHandler()
    handler.build([partition(0)])
    handler.handle_response(77)
    handler.handle_session_error(INVALID_FETCH_SESSION_EPOCH)
    closing = handler.build([partition(0)])
    assert closing is not None and (closing.session_id, closing.session_epoch) == (77, INITIAL_EPOCH)
    assert len(closing.partitions) == 1
    handler.handle_response(78)
    handler.handle_session_error(FETCH_SESSION_ID_NOT_FOUND)
    fresh = handler.build([partition(0)])
    assert fresh is not None and (fresh.session_id, fresh.session_epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)
    handler.handle_response(79)
    handler.handle_error()
    after_loss = handler.build([partition(0)])
    assert after_loss is not None and (after_loss.session_id, after_loss.session_epoch) == (79, INITIAL_EPOCH)


def test_the_leader_closing_the_session_makes_the_next_fetch_full() -> None:
    handler = FetchSessionHandler()
    handler.build([partition(0)])
    handler.handle_response(77)
    handler.build([partition(0)])
    handler.handle_response(INVALID_SESSION_ID)
    nxt = handler.build([partition(0)])
    assert nxt is not None and (nxt.session_id, nxt.session_epoch, len(nxt.partitions)) == (0, 0, 1)


def send(cluster: Cluster, fetches: FetchManager) -> list[FetchAnswer]:
    """One follower Fetch from broker 2 to the leader 1, through the leader's session cache."""
    request = cluster.managers[2].fetchers[1].build_fetch_request(cluster.now)
    assert request is not None
    answers: list[FetchAnswer] = []
    fetch_messages_for_request(
        cluster.managers[1], fetches, request, cluster.now, answers.append, fetch_max_bytes=1 << 30
    )
    return answers


def deliver(cluster: Cluster, answer: FetchAnswer) -> None:
    cluster.managers[2].fetchers[1].process_fetch_response(
        [to_response(r) for _, r in answer.partitions], cluster.now, session_id=answer.session_id
    )


def test_a_follower_replicates_through_a_session_and_its_parked_incremental_fetch_wakes_on_an_append(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    fetches = manager()
    fetcher = cluster.managers[2].fetchers[1]
    cluster.produce(1, b"a", acks=1)
    (full,) = send(cluster, fetches)
    assert full.session_id != INVALID_SESSION_ID and len(full.partitions) == 1
    deliver(cluster, full)
    assert cluster.log(2).log_end_offset == 1
    # The follower's fetch offset moved, so the next fetch sends the partition; the leader's HW follows it and the
    # new HW is answered when the parked fetch's wait ends.
    answers = send(cluster, fetches)
    assert answers == []
    cluster.advance(fetcher.config.max_wait_ms)
    (moved,) = answers
    assert [r.read.high_watermark for _, r in moved.partitions if r.read is not None] == [1]
    deliver(cluster, moved)
    assert cluster.log(2).high_watermark == 1
    # Nothing changed since: the incremental fetch sends no partition, reads the session's one and parks until
    # an append wakes it.
    request = fetcher.build_fetch_request(cluster.now)
    assert request is not None and request.partitions == [] and request.session_epoch == 2
    answers = send(cluster, fetches)
    assert answers == []
    cluster.produce(1, b"b", acks=1)
    (woken,) = answers
    assert woken.error is None and [r.topic_partition for _, r in woken.partitions] == [TP]
    deliver(cluster, woken)
    assert cluster.log(2).log_end_offset == 2


def test_a_wrong_epoch_from_a_follower_is_answered_71_and_the_follower_fetches_in_full_next(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    fetches = manager()
    cluster.produce(1, b"a", acks=1)
    deliver(cluster, send(cluster, fetches)[0])
    fetcher = cluster.managers[2].fetchers[1]
    fetcher.session.epoch = 5  # out of step with the leader's session (epoch 1)
    (refused,) = send(cluster, fetches)
    assert (refused.error, refused.partitions) == (INVALID_FETCH_SESSION_EPOCH, [])
    fetcher.on_fetch_session_error(refused.error, cluster.now)
    request = fetcher.build_fetch_request(cluster.now)
    assert request is not None and request.session_epoch == INITIAL_EPOCH and len(request.partitions) == 1


def test_a_follower_that_discards_an_answer_fetches_in_full_next(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    fetches = manager()
    fetcher = cluster.managers[2].fetchers[1]
    cluster.produce(1, b"a", acks=1)
    deliver(cluster, send(cluster, fetches)[0])
    answers = send(cluster, fetches)
    cluster.advance(fetcher.config.max_wait_ms)
    # The partition is re-added (a new leader epoch) while the answer is on its way: the answer is discarded,
    # though the leader's session took its HW as delivered.
    fetcher.add_partition(TP, uuid.UUID(int=0), 5, cluster.now)
    deliver(cluster, answers[0])
    request = fetcher.build_fetch_request(cluster.now)
    assert request is not None and request.session_epoch == INITIAL_EPOCH
    assert [p.topic_partition for p in request.partitions] == [TP]

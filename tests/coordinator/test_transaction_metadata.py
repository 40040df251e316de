"""TransactionMetadata's transitions, as Kafka's TransactionMetadata: the valid previous states of each state, the
pending state that blocks a second transition, the epoch rules of InitProducerId (KIP-360) and fencing."""

from __future__ import annotations

import pytest

from tierlog.common import TopicPartition
from tierlog.coordinator.transaction.transaction_metadata import (
    MAX_PRODUCER_EPOCH,
    IllegalTransitionError,
    TransactionMetadata,
    TransactionState,
    is_epoch_exhausted,
)

S = TransactionState
TP = TopicPartition("t", 0)
TP_B = TopicPartition("t", 1)


def metadata(
    state: TransactionState = S.EMPTY, epoch: int = 0, last_epoch: int = -1, **kw: object
) -> TransactionMetadata:
    partitions = set() if state is S.EMPTY else {TP}
    fields: dict = dict(
        transactional_id="tx",
        producer_id=10,
        previous_producer_id=-1,
        producer_epoch=epoch,
        last_producer_epoch=last_epoch,
        txn_timeout_ms=1000,
        state=state,
        txn_last_update_timestamp=100,
        topic_partitions=partitions,
        txn_start_timestamp=-1 if state is S.EMPTY else 50,
    )
    fields.update(kw)
    return TransactionMetadata(**fields)


def test_valid_previous_states_are_kafkas() -> None:
    expected = {
        S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_COMMIT: {S.ONGOING},
        S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE},
        S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
        S.COMPLETE_ABORT: {S.PREPARE_ABORT},
        S.DEAD: {S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT},
        S.PREPARE_EPOCH_FENCE: {S.ONGOING},
    }
    assert {s: set(s.valid_previous_states) for s in S} == expected
    assert {s for s in S if s.is_expiration_allowed} == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}


# Each prepare_* method and the state it moves to.
PREPARES = {
    S.EMPTY: lambda m: m.prepare_increment_producer_epoch(1000, None, 200),
    S.ONGOING: lambda m: m.prepare_add_partitions(frozenset({TP_B}), 200),
    S.PREPARE_COMMIT: lambda m: m.prepare_abort_or_commit(S.PREPARE_COMMIT, 200),
    S.PREPARE_ABORT: lambda m: m.prepare_abort_or_commit(S.PREPARE_ABORT, 200),
    S.DEAD: lambda m: m.prepare_dead(),
    S.PREPARE_EPOCH_FENCE: lambda m: m.prepare_fence_producer_epoch(),
}
STORED_STATES = [S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.COMPLETE_COMMIT, S.COMPLETE_ABORT]


@pytest.mark.parametrize("target", list(PREPARES), ids=lambda s: s.state_name)
@pytest.mark.parametrize("current", STORED_STATES, ids=lambda s: s.state_name)
def test_every_transition_is_allowed_exactly_from_its_valid_previous_states(
    current: TransactionState, target: TransactionState
) -> None:
    m = metadata(current)
    if current in target.valid_previous_states:
        transit = PREPARES[target](m)
        assert transit.txn_state is target
        assert m.pending_state is target
    else:
        with pytest.raises(IllegalTransitionError):
            PREPARES[target](m)
        assert m.pending_state is None


@pytest.mark.parametrize("current", [S.PREPARE_COMMIT, S.PREPARE_ABORT])
def test_complete_follows_prepare(current: TransactionState) -> None:
    m = metadata(current, epoch=3)
    transit = m.prepare_complete(300)
    assert transit.txn_state is (S.COMPLETE_COMMIT if current is S.PREPARE_COMMIT else S.COMPLETE_ABORT)
    assert (transit.producer_epoch, transit.last_producer_epoch, transit.topic_partitions) == (3, 3, frozenset())
    m.complete_transition_to(transit)
    assert (m.state, m.topic_partitions, m.txn_last_update_timestamp, m.txn_start_timestamp) == (
        transit.txn_state,
        set(),
        300,
        50,
    )


def test_a_pending_transition_blocks_another() -> None:
    m = metadata(S.ONGOING)
    m.prepare_abort_or_commit(S.PREPARE_COMMIT, 200)
    with pytest.raises(IllegalTransitionError):
        m.prepare_abort_or_commit(S.PREPARE_ABORT, 200)
    with pytest.raises(IllegalTransitionError):
        m.prepare_add_partitions(frozenset({TP}), 200)


def test_completing_needs_the_pending_state_it_prepared() -> None:
    m = metadata(S.ONGOING)
    transit = m.prepare_abort_or_commit(S.PREPARE_COMMIT, 200)
    m.pending_state = S.PREPARE_ABORT
    with pytest.raises(IllegalTransitionError):
        m.complete_transition_to(transit)
    m.pending_state = None
    with pytest.raises(IllegalTransitionError):
        m.complete_transition_to(transit)


def test_completing_checks_the_producer_and_the_partitions() -> None:
    m = metadata(S.ONGOING, epoch=2)
    transit = m.prepare_add_partitions(frozenset({TP_B}), 200)
    m.producer_epoch = 3  # changed under the pending write: Kafka's "this should not happen"
    with pytest.raises(IllegalTransitionError):
        m.complete_transition_to(transit)


def test_add_partitions_starts_a_transaction_or_extends_it() -> None:
    m = metadata(S.EMPTY)
    transit = m.prepare_add_partitions(frozenset({TP}), 200)
    m.complete_transition_to(transit)
    assert (m.state, m.txn_start_timestamp, m.topic_partitions) == (S.ONGOING, 200, {TP})
    transit = m.prepare_add_partitions(frozenset({TP_B}), 300)
    m.complete_transition_to(transit)
    assert (m.txn_start_timestamp, m.txn_last_update_timestamp, m.topic_partitions) == (200, 300, {TP, TP_B})
    m = metadata(S.COMPLETE_ABORT)
    m.topic_partitions.clear()
    m.complete_transition_to(m.prepare_add_partitions(frozenset({TP_B}), 400))
    assert (m.txn_start_timestamp, m.topic_partitions) == (400, {TP_B})


def test_init_epoch_rules() -> None:
    # No expected epoch (a new producer): bump, forget the last epoch.
    m = metadata(S.COMPLETE_COMMIT, epoch=4, last_epoch=3)
    m.topic_partitions.clear()
    transit = m.prepare_increment_producer_epoch(2000, None, 500)
    assert not isinstance(transit, str)
    assert (transit.producer_epoch, transit.last_producer_epoch, transit.txn_timeout_ms) == (5, -1, 2000)
    m.complete_transition_to(transit)
    # As Kafka's, the in-memory start time stays (only the log says -1) until the next transaction starts.
    assert (m.state, m.producer_epoch, m.txn_timeout_ms, m.txn_start_timestamp) == (S.EMPTY, 5, 2000, 50)
    # The current producer after an abortable error (KIP-360): bump, remember the epoch it had.
    transit = m.prepare_increment_producer_epoch(2000, 5, 600)
    assert not isinstance(transit, str)
    assert (transit.producer_epoch, transit.last_producer_epoch) == (6, 5)
    m.complete_transition_to(transit)
    # Its retry (the answer was lost): the same epoch again, no bump.
    transit = m.prepare_increment_producer_epoch(2000, 5, 700)
    assert not isinstance(transit, str)
    assert (transit.producer_epoch, transit.last_producer_epoch) == (6, 5)
    m.complete_transition_to(transit)
    # Anything older is a zombie.
    assert m.prepare_increment_producer_epoch(2000, 4, 800) == "PRODUCER_FENCED"
    assert m.prepare_increment_producer_epoch(2000, 7, 800) == "PRODUCER_FENCED"
    assert m.pending_state is None


def test_a_just_created_id_starts_at_epoch_0_whatever_is_expected() -> None:
    m = metadata(S.EMPTY, epoch=-1)
    transit = m.prepare_increment_producer_epoch(1000, 9, 100)
    assert not isinstance(transit, str)
    assert (transit.producer_epoch, transit.last_producer_epoch) == (0, -1)


def test_fence_bumps_once_even_when_its_write_failed() -> None:
    m = metadata(S.ONGOING, epoch=7)
    transit = m.prepare_fence_producer_epoch()
    assert (transit.txn_state, transit.producer_epoch, transit.last_producer_epoch) == (S.PREPARE_EPOCH_FENCE, 8, -1)
    m.pending_state = None
    m.producer_epoch = 8
    m.has_failed_epoch_fence = True
    assert m.prepare_fence_producer_epoch().producer_epoch == 8
    m = metadata(S.ONGOING, epoch=MAX_PRODUCER_EPOCH)
    with pytest.raises(IllegalTransitionError):
        m.prepare_fence_producer_epoch()


def test_completion_clears_a_failed_fence() -> None:
    m = metadata(S.PREPARE_ABORT, epoch=8, has_failed_epoch_fence=True)
    m.prepare_complete(100)
    assert not m.has_failed_epoch_fence


def test_epoch_exhaustion_and_producer_id_rotation() -> None:
    assert not is_epoch_exhausted(MAX_PRODUCER_EPOCH - 2)
    assert is_epoch_exhausted(MAX_PRODUCER_EPOCH - 1)
    m = metadata(S.COMPLETE_ABORT, epoch=MAX_PRODUCER_EPOCH - 1)
    m.topic_partitions.clear()
    assert m.is_producer_epoch_exhausted
    transit = m.prepare_producer_id_rotation(11, 1000, 100, record_last_epoch=True)
    assert (transit.producer_id, transit.previous_producer_id, transit.producer_epoch) == (11, 10, 0)
    assert transit.last_producer_epoch == MAX_PRODUCER_EPOCH - 1
    m.complete_transition_to(transit)
    assert (m.producer_id, m.previous_producer_id, m.producer_epoch) == (11, 10, 0)
    with pytest.raises(IllegalTransitionError):
        metadata(S.ONGOING).prepare_producer_id_rotation(12, 1000, 100, record_last_epoch=False)


def test_empty_is_written_without_partitions() -> None:
    m = metadata(S.EMPTY)
    transit = m.prepare_increment_producer_epoch(1000, None, 100)
    assert not isinstance(transit, str)
    assert transit.to_log_value().transaction_partitions is None
    ongoing = metadata(S.ONGOING).prepare_add_partitions(frozenset({TP_B, TopicPartition("a", 3)}), 100)
    assert ongoing.to_log_value().transaction_partitions == (("a", (3,)), ("t", (0, 1)))

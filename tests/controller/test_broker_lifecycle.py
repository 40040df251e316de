"""Broker registration, heartbeats and sessions: a broker is fenced until it has caught up with the metadata
log, while its heartbeats keep coming, and until it asks to shut down."""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_helpers import (
    SESSION_TIMEOUT_MS,
    endpoints,
    heartbeat,
    incarnation,
    new_controller,
    open_controller,
    restart,
    state,
)

from tierlog.controller.controller import HeartbeatResult
from tierlog.controller.errors import BrokerIdNotRegisteredError, InconsistentClusterIdError, StaleBrokerEpochError
from tierlog.metadata.image import BrokerRegistration
from tierlog.metadata.records import BrokerRegistrationChangeRecord, Endpoint, RegisterBrokerRecord


def test_a_registration_is_fenced_until_the_broker_has_caught_up(tmp_path: Path) -> None:
    controller = open_controller(tmp_path)
    broker_epoch = controller.register_broker(1, incarnation(1), "", endpoints(1), "rack-a", 0)
    # The log holds the one voter's LeaderChangeMessage (offset 0), then the ClusterIdRecord.
    assert broker_epoch == 2, "the offset of the RegisterBrokerRecord, after the ClusterIdRecord"
    assert controller.metadata_log.records_from(2) == [
        (2, RegisterBrokerRecord(1, incarnation(1), 2, (Endpoint("PLAINTEXT", "localhost", 9093),), "rack-a", True))
    ]
    assert controller.metadata.brokers[1] == BrokerRegistration(
        1, incarnation(1), 2, [Endpoint("PLAINTEXT", "localhost", 9093)], "rack-a", fenced=True
    )
    assert controller.metadata.unfenced_broker_ids() == []

    assert controller.heartbeat(1, broker_epoch, 1, False, False, 10) == HeartbeatResult(False, True, False)
    assert controller.metadata_log.end_offset == 3
    assert controller.heartbeat(1, broker_epoch, 2, False, False, 20) == HeartbeatResult(True, False, False)
    assert controller.metadata_log.records_from(3) == [(3, BrokerRegistrationChangeRecord(1, 2, False, None))]
    assert controller.metadata.unfenced_broker_ids() == [1]
    assert controller.metadata.endpoint_of(1, "PLAINTEXT") == Endpoint("PLAINTEXT", "localhost", 9093)
    assert controller.metadata.endpoint_of(1, "CONTROLLER") is None
    assert controller.metadata.endpoint_of(2, "PLAINTEXT") is None


def test_a_broker_asking_to_stay_fenced_is_not_unfenced(tmp_path: Path) -> None:
    controller = open_controller(tmp_path)
    broker_epoch = controller.register_broker(1, incarnation(1), "", endpoints(1), None, 0)
    assert controller.heartbeat(1, broker_epoch, 5, True, False, 0) == HeartbeatResult(True, True, False)
    assert controller.metadata.brokers[1].fenced


def test_want_fence_fences_an_unfenced_broker(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    controller.create_topic("events", 1, 2, {})
    assert heartbeat(controller, 1, 0, want_fence=True) == HeartbeatResult(True, True, False)
    assert state(controller) == (2, [2], 1, 1)


def test_the_same_incarnation_registering_again_keeps_its_epoch(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1,))
    broker_epoch = controller.metadata.brokers[1].broker_epoch
    end = controller.metadata_log.end_offset
    assert controller.register_broker(1, incarnation(1), "", endpoints(1), None, 50) == broker_epoch
    assert controller.metadata_log.end_offset == end
    assert controller.metadata.unfenced_broker_ids() == [1]


def test_a_restarted_broker_fences_its_previous_incarnation_first(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    controller.create_topic("events", 1, 2, {})
    old_epoch = controller.metadata.brokers[1].broker_epoch
    end = controller.metadata_log.end_offset
    new_epoch = controller.register_broker(1, incarnation(1, run=1), "", endpoints(1), None, 100)
    # The fence record and the partition's new leader come first, in the same batch.
    assert new_epoch == end + 2
    assert [type(r).__name__ for _, r in controller.metadata_log.records_from(end)] == [
        "BrokerRegistrationChangeRecord",
        "PartitionRecord",
        "RegisterBrokerRecord",
    ]
    assert state(controller) == (2, [2], 1, 1)
    assert controller.metadata.brokers[1].fenced
    assert controller.metadata.brokers[1].broker_epoch == new_epoch
    with pytest.raises(StaleBrokerEpochError):
        controller.heartbeat(1, old_epoch, controller.metadata.offset, False, False, 100)
    assert heartbeat(controller, 1, 100) == HeartbeatResult(True, False, False)


def test_registration_from_another_cluster_is_refused(tmp_path: Path) -> None:
    controller = open_controller(tmp_path)
    with pytest.raises(InconsistentClusterIdError) as refused:
        controller.register_broker(1, incarnation(1), "AAAAAAAAAAAAAAAAAAAAAA", endpoints(1), None, 0)
    assert refused.value.error_name == "INCONSISTENT_CLUSTER_ID"
    # The offset of its RegisterBrokerRecord: the one voter's LeaderChangeMessage and the ClusterIdRecord come first.
    assert controller.register_broker(1, incarnation(1), controller.metadata.cluster_id, endpoints(1), None, 0) == 2


def test_heartbeats_from_unknown_or_stale_registrations_are_refused(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1,))
    broker_epoch = controller.metadata.brokers[1].broker_epoch
    with pytest.raises(BrokerIdNotRegisteredError) as unknown:
        controller.heartbeat(2, broker_epoch, 10, False, False, 0)
    assert unknown.value.error_name == "BROKER_ID_NOT_REGISTERED"
    with pytest.raises(StaleBrokerEpochError) as stale:
        controller.heartbeat(1, broker_epoch - 1, 10, False, False, 0)
    assert stale.value.error_name == "STALE_BROKER_EPOCH"


def test_an_expired_session_fences_the_broker_and_moves_its_leadership(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    controller.create_topic("events", 1, 3, {})
    assert state(controller) == (1, [1, 2, 3], 0, 0)
    heartbeat(controller, 2, 5000)
    heartbeat(controller, 3, 5000)
    assert controller.next_session_deadline_ms() == SESSION_TIMEOUT_MS
    assert controller.fence_stale_brokers(SESSION_TIMEOUT_MS - 1) == []
    assert controller.fence_stale_brokers(SESSION_TIMEOUT_MS) == [1]
    assert state(controller) == (2, [2, 3], 1, 1)
    assert controller.metadata.unfenced_broker_ids() == [2, 3]
    assert controller.next_session_deadline_ms() == 5000 + SESSION_TIMEOUT_MS
    # Its heartbeats resume: unfenced, but leadership stays where it went.
    assert heartbeat(controller, 1, 9500) == HeartbeatResult(True, False, False)
    assert state(controller) == (2, [2, 3], 1, 1)


def test_several_expired_sessions_are_fenced_one_after_another(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    controller.create_topic("events", 1, 3, {})
    heartbeat(controller, 3, 5000)
    assert controller.fence_stale_brokers(SESSION_TIMEOUT_MS) == [1, 2]
    assert state(controller) == (3, [3], 2, 2)
    assert controller.next_session_deadline_ms() == 5000 + SESSION_TIMEOUT_MS
    assert controller.fence_stale_brokers(5000 + SESSION_TIMEOUT_MS) == [3]
    assert state(controller) == (-1, [3], 3, 3)
    assert controller.next_session_deadline_ms() is None


def test_a_restarted_controller_gives_every_broker_a_fresh_session(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    restarted = restart(controller, tmp_path, now_ms=60_000)
    assert restarted.next_session_deadline_ms() == 60_000 + SESSION_TIMEOUT_MS
    assert restarted.fence_stale_brokers(60_000 + SESSION_TIMEOUT_MS - 1) == []
    assert restarted.fence_stale_brokers(60_000 + SESSION_TIMEOUT_MS) == [1, 2]


def test_controlled_shutdown_moves_leadership_at_once(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    controller.create_topic("events", 2, 2, {})
    assert heartbeat(controller, 1, 10, want_shut_down=True) == HeartbeatResult(True, True, True)
    assert controller.metadata.brokers[1].fenced
    assert controller.metadata.brokers[1].in_controlled_shutdown
    assert state(controller, "events", 0) == (2, [2], 1, 1)
    assert state(controller, "events", 1) == (2, [2], 0, 1)
    end = controller.metadata_log.end_offset
    # Retried, or heartbeating on while it stops: nothing more to do, and it is never unfenced again.
    assert heartbeat(controller, 1, 20, want_shut_down=True) == HeartbeatResult(True, True, True)
    assert heartbeat(controller, 1, 30) == HeartbeatResult(True, True, False)
    assert controller.metadata_log.end_offset == end
    # The next process registers afresh and can be unfenced.
    controller.register_broker(1, incarnation(1, run=1), "", endpoints(1), None, 40)
    assert not controller.metadata.brokers[1].in_controlled_shutdown
    assert heartbeat(controller, 1, 50) == HeartbeatResult(True, False, False)

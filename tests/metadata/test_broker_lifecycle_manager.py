"""The broker's lifecycle as a state machine: register, heartbeat (quickly while fenced), register again when the
controller no longer knows the registration, back off when it cannot be reached."""

from __future__ import annotations

import uuid

from tierlog.common import Idle
from tierlog.metadata.lifecycle import (
    FENCED_HEARTBEAT_INTERVAL_MS,
    REGISTRATION_REFUSED_BACKOFF_MS,
    RETRY_BACKOFF_MS,
    BrokerHeartbeatRequest,
    BrokerLifecycleManager,
    BrokerRegistrationRequest,
)
from tierlog.metadata.loader import MetadataBatches, MetadataLoader
from tierlog.metadata.records import Endpoint, ProducerIdsRecord

NOW = 1_700_000_000_000
HEARTBEAT_INTERVAL_MS = 2000
INCARNATION = uuid.UUID(int=7)
ENDPOINTS = (Endpoint("PLAINTEXT", "127.0.0.1", 9092),)


def lifecycle(loader: MetadataLoader | None = None) -> BrokerLifecycleManager:
    return BrokerLifecycleManager(
        1, INCARNATION, "", ENDPOINTS, None, loader or MetadataLoader(), heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS
    )


def registered(epoch: int = 10) -> BrokerLifecycleManager:
    manager = lifecycle()
    manager.poll(NOW)
    manager.on_registration_response(epoch, NOW)
    return manager


def test_a_broker_registers_first_with_its_incarnation() -> None:
    assert lifecycle().poll(NOW) == BrokerRegistrationRequest(1, INCARNATION, "", ENDPOINTS, None)


def test_once_registered_it_heartbeats_at_once_with_its_metadata_offset() -> None:
    loader = MetadataLoader()
    loader.on_records(MetadataBatches([(0, ProducerIdsRecord(1, 0)), (1, ProducerIdsRecord(1, 1000))], 2, 1), 2)
    manager = lifecycle(loader)
    manager.on_registration_response(10, NOW)
    assert manager.poll(NOW) == BrokerHeartbeatRequest(1, 10, 1)


def test_a_fenced_broker_heartbeats_quickly_an_unfenced_one_at_its_interval() -> None:
    manager = registered()
    manager.on_heartbeat_response(True, NOW)
    assert manager.poll(NOW) == Idle(NOW + FENCED_HEARTBEAT_INTERVAL_MS)
    manager.on_heartbeat_response(False, NOW)
    assert not manager.fenced
    assert manager.poll(NOW) == Idle(NOW + HEARTBEAT_INTERVAL_MS)
    assert isinstance(manager.poll(NOW + HEARTBEAT_INTERVAL_MS), BrokerHeartbeatRequest)


def test_a_registration_the_controller_forgot_is_made_again_at_once_with_the_same_incarnation() -> None:
    manager = registered()
    manager.on_heartbeat_refused("STALE_BROKER_EPOCH", NOW)
    assert manager.broker_epoch == -1
    assert manager.poll(NOW) == BrokerRegistrationRequest(1, INCARNATION, "", ENDPOINTS, None)


def test_other_heartbeat_refusals_are_retried_after_a_pause_without_registering_again() -> None:
    manager = registered()
    manager.on_heartbeat_refused("UNKNOWN_SERVER_ERROR", NOW)
    assert manager.poll(NOW) == Idle(NOW + RETRY_BACKOFF_MS)
    assert manager.poll(NOW + RETRY_BACKOFF_MS) == BrokerHeartbeatRequest(1, 10, -1)


def test_an_unreachable_controller_is_asked_again_after_a_pause() -> None:
    manager = lifecycle()
    manager.on_request_failed("connection refused", NOW)
    assert manager.poll(NOW) == Idle(NOW + RETRY_BACKOFF_MS)
    manager = registered()
    manager.on_request_failed("timed out", NOW)
    assert manager.poll(NOW) == Idle(NOW + RETRY_BACKOFF_MS)


def test_a_refused_registration_is_retried_after_a_longer_pause() -> None:
    manager = lifecycle()
    manager.on_registration_refused("INCONSISTENT_CLUSTER_ID", NOW)
    assert manager.poll(NOW) == Idle(NOW + REGISTRATION_REFUSED_BACKOFF_MS)


def test_the_registration_lets_the_loader_publish_an_image_past_it() -> None:
    loader = MetadataLoader()
    loader.on_records(MetadataBatches([(offset, ProducerIdsRecord(1, offset)) for offset in range(4)], 4, 1), 4)
    assert not lifecycle(loader).on_registration_response(5, NOW)
    assert lifecycle(loader).on_registration_response(3, NOW)


def test_controlled_shutdown_is_a_heartbeat_asking_to_shut_down_once_registered() -> None:
    assert lifecycle().controlled_shutdown_request() is None
    assert registered().controlled_shutdown_request() == BrokerHeartbeatRequest(1, 10, -1, want_shut_down=True)

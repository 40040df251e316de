"""Kafka's BrokerLifecycleManager without I/O: a broker registers with the controller, heartbeats, and learns
from the answers whether it is fenced.

A broker registers with a new incarnation id on every process start, which tells the controller that whatever
the previous process held is gone. It stays fenced (no leaderships, not eligible for any ISR) until its metadata
image has caught up with its own registration; heartbeats say how far it has read. While fenced it heartbeats
quickly so it is unfenced soon after it catches up. A registration also tells the broker's `MetadataLoader` from
which offset on its image may be published.

The world around it asks `poll(now_ms)` for the next request (a registration, a heartbeat, or how long to wait),
sends it to the controller and hands the answer to the matching `on_...` method, or reports with
`on_request_failed` that none came. The asyncio shell (server/lifecycle.py) does that over the controller
channel, the simulator over its network.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from tierlog.common import Idle
from tierlog.metadata.loader import MetadataLoader
from tierlog.metadata.records import Endpoint

logger = logging.getLogger(__name__)

FENCED_HEARTBEAT_INTERVAL_MS = 100
RETRY_BACKOFF_MS = 500
REGISTRATION_REFUSED_BACKOFF_MS = 4 * RETRY_BACKOFF_MS
# Errors that mean the controller no longer knows this registration: register again.
REREGISTER_ERRORS = frozenset({"STALE_BROKER_EPOCH", "BROKER_ID_NOT_REGISTERED"})


@dataclass(frozen=True, slots=True)
class BrokerRegistrationRequest:
    broker_id: int
    incarnation_id: uuid.UUID
    # The cluster the broker's log dirs belong to; "" for fresh log dirs (it joins whichever cluster this is).
    cluster_id: str
    endpoints: tuple[Endpoint, ...]
    rack: str | None


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatRequest:
    broker_id: int
    broker_epoch: int
    # The offset of the last record the broker's metadata image holds.
    current_metadata_offset: int
    want_fence: bool = False
    want_shut_down: bool = False


class BrokerLifecycleManager:
    def __init__(
        self,
        broker_id: int,
        incarnation_id: uuid.UUID,
        cluster_id: str,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        loader: MetadataLoader,
        *,
        heartbeat_interval_ms: int,
        fenced_heartbeat_interval_ms: int = FENCED_HEARTBEAT_INTERVAL_MS,
        retry_backoff_ms: int = RETRY_BACKOFF_MS,
        registration_refused_backoff_ms: int = REGISTRATION_REFUSED_BACKOFF_MS,
    ) -> None:
        self.broker_id = broker_id
        self.incarnation_id = incarnation_id
        # The offset of our registration record while the controller knows it; -1 while (re)registering.
        self.broker_epoch = -1
        self.fenced = True
        self._cluster_id = cluster_id
        self._endpoints = tuple(endpoints)
        self._rack = rack
        self._loader = loader
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._fenced_heartbeat_interval_ms = fenced_heartbeat_interval_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._registration_refused_backoff_ms = registration_refused_backoff_ms
        self._next_request_ms = 0

    def poll(self, now_ms: int) -> BrokerRegistrationRequest | BrokerHeartbeatRequest | Idle:
        """The next request to the controller, or until when to wait. One request at a time."""
        if now_ms < self._next_request_ms:
            return Idle(self._next_request_ms)
        if self.broker_epoch < 0:
            return BrokerRegistrationRequest(
                self.broker_id, self.incarnation_id, self._cluster_id, self._endpoints, self._rack
            )
        return BrokerHeartbeatRequest(self.broker_id, self.broker_epoch, self._loader.image.offset)

    def on_registration_response(self, broker_epoch: int, now_ms: int) -> bool:
        """Registered: heartbeat at once. True if the metadata image is to be published now (it has caught up
        with the registration already)."""
        logger.info("[Broker id=%d] registered with broker epoch %d", self.broker_id, broker_epoch)
        self.broker_epoch = broker_epoch
        self._next_request_ms = now_ms
        return self._loader.allow_publishing_from(broker_epoch)

    def on_registration_refused(self, error: str, now_ms: int) -> None:
        logger.error("[Broker id=%d] the controller refused the registration: %s; retrying", self.broker_id, error)
        self._next_request_ms = now_ms + self._registration_refused_backoff_ms

    def on_heartbeat_response(self, is_fenced: bool, now_ms: int) -> None:
        if is_fenced != self.fenced:
            self.fenced = is_fenced
            logger.info("[Broker id=%d] %s by the controller", self.broker_id, "fenced" if is_fenced else "unfenced")
        interval = self._fenced_heartbeat_interval_ms if self.fenced else self._heartbeat_interval_ms
        self._next_request_ms = now_ms + interval

    def on_heartbeat_refused(self, error: str, now_ms: int) -> None:
        if error in REREGISTER_ERRORS:
            logger.warning(
                "[Broker id=%d] the controller refused the heartbeat: %s: registering again", self.broker_id, error
            )
            self.broker_epoch = -1
            self._next_request_ms = now_ms
        else:
            logger.warning("[Broker id=%d] the controller refused the heartbeat: %s; retrying", self.broker_id, error)
            self._next_request_ms = now_ms + self._retry_backoff_ms

    def on_request_failed(self, reason: str, now_ms: int) -> None:
        """No answer came (the controller is unreachable or did not answer in time): try again after a pause."""
        if self.broker_epoch < 0:
            logger.info("[Broker id=%d] waiting for the controller: %s", self.broker_id, reason)
        else:
            logger.debug("[Broker id=%d] heartbeat failed: %s", self.broker_id, reason)
        self._next_request_ms = now_ms + self._retry_backoff_ms

    def controlled_shutdown_request(self) -> BrokerHeartbeatRequest | None:
        """The heartbeat that asks the controller to move our leaderships away before we stop; None if we are
        not registered."""
        if self.broker_epoch < 0:
            return None
        return BrokerHeartbeatRequest(self.broker_id, self.broker_epoch, self._loader.image.offset, want_shut_down=True)

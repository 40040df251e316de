"""Kafka's AlterPartitionManager without I/O: the ISR changes this broker's leaders propose go to the controller one
request at a time (docs/replication.md#alter-partition), and each answer, or its failure, goes back to the
ReplicaManager.

The world around it asks `poll(broker_epoch)` for the next request after anything that may have proposed an ISR
change (a follower's fetch, the ISR expiration timer, new metadata, an answer), sends it and hands the answer to
`on_response`, or reports with `on_request_failed` that none came. The asyncio shell (server/broker.py) does that
over the controller channel, the simulator over its network.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from tierlog.metadata.image import PartitionRegistration
from tierlog.replication.partition import AlterPartitionProposal
from tierlog.replication.replica_manager import ReplicaManager

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    broker_id: int
    broker_epoch: int
    proposal: AlterPartitionProposal


class AlterPartitionManager:
    def __init__(self, broker_id: int, replica_manager: ReplicaManager) -> None:
        self._broker_id = broker_id
        self._replica_manager = replica_manager
        self._pending: deque[AlterPartitionProposal] = deque()
        self._in_flight: AlterPartitionRequest | None = None

    def poll(self, broker_epoch: int) -> AlterPartitionRequest | None:
        """The next ISR change to send (the broker's current registration is its sender), or None while one is
        in flight or none is proposed."""
        if self._in_flight is not None:
            return None
        self._pending.extend(self._replica_manager.take_alter_partition_proposals())
        if not self._pending:
            return None
        self._in_flight = AlterPartitionRequest(self._broker_id, broker_epoch, self._pending.popleft())
        return self._in_flight

    def on_response(self, registration: PartitionRegistration | None, error: str | None, now_ms: int) -> None:
        """The controller's answer to the request in flight: the committed registration, or the error."""
        request, self._in_flight = self._in_flight, None
        if request is None:
            return
        proposal = request.proposal
        if error is not None:
            logger.info(
                "[Broker id=%d] AlterPartition %s ISR %s refused: %s",
                self._broker_id,
                proposal.topic_partition,
                proposal.new_isr,
                error,
            )
        self._replica_manager.on_alter_partition_response(proposal.topic_partition, registration, error, now_ms)

    def on_request_failed(self, reason: str, now_ms: int) -> None:
        """No answer came, so whether the controller committed the change is unknown: the same proposal goes
        again first (Kafka's AlterPartitionManager retries it). The partition keeps it in flight meanwhile, so the
        HW keeps waiting for a replica it adds, which the controller may have put in the ISR already; a retry of
        what was committed is answered INVALID_UPDATE_VERSION, and the partition then waits for the metadata
        (docs/replication.md#alter-partition)."""
        request, self._in_flight = self._in_flight, None
        if request is None:
            return
        logger.info(
            "[Broker id=%d] AlterPartition for %s failed, sent again: %s",
            self._broker_id,
            request.proposal.topic_partition,
            reason,
        )
        self._pending.appendleft(request.proposal)

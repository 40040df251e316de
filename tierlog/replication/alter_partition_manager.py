"""Kafka's AlterPartitionManager without I/O: the ISR changes this broker's leaders propose go to the controller in
one request holding every change pending, one request at a time (docs/replication.md#alter-partition), and each
partition's answer, or the request's failure, goes back to the ReplicaManager.

The world around it asks `poll(broker_epoch)` for the next request after anything that may have proposed an ISR
change (a follower's fetch, the ISR expiration timer, new metadata, an answer), sends it and hands the answers to
`on_response`, or reports with `on_request_failed` that none came. The asyncio shell (server/broker.py) does that
over the controller channel, the simulator over its network.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.metadata.image import PartitionRegistration
from tierlog.replication.partition import AlterPartitionProposal
from tierlog.replication.replica_manager import ReplicaManager

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    broker_id: int
    broker_epoch: int
    proposals: tuple[AlterPartitionProposal, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionAnswer:
    """The controller's answer for one partition: the committed registration, or the error."""

    registration: PartitionRegistration | None
    error: str | None


class AlterPartitionManager:
    def __init__(self, broker_id: int, replica_manager: ReplicaManager) -> None:
        self._broker_id = broker_id
        self._replica_manager = replica_manager
        # In the order proposed; one sent again after a failure goes back ahead of newer ones.
        self._pending: list[AlterPartitionProposal] = []
        self._in_flight: AlterPartitionRequest | None = None

    def poll(self, broker_epoch: int) -> AlterPartitionRequest | None:
        """The next request, holding every ISR change pending (the broker's current registration is its sender),
        or None while one is in flight or none is proposed."""
        if self._in_flight is not None:
            return None
        self._pending.extend(self._replica_manager.take_alter_partition_proposals())
        if not self._pending:
            return None
        # One change per partition in a request: a partition's newer change (proposed after new metadata cleared
        # the one in flight) goes in the next, after the answer to the older one, as it did one at a time.
        batch: dict[TopicPartition, AlterPartitionProposal] = {}
        later: list[AlterPartitionProposal] = []
        for proposal in self._pending:
            if proposal.topic_partition in batch:
                later.append(proposal)
            else:
                batch[proposal.topic_partition] = proposal
        self._pending = later
        self._in_flight = AlterPartitionRequest(self._broker_id, broker_epoch, tuple(batch.values()))
        return self._in_flight

    def on_response(self, answers: Mapping[TopicPartition, AlterPartitionAnswer], now_ms: int) -> None:
        """The controller's answers to the request in flight, by partition. A partition the response left out is
        sent again, as Kafka's AlterPartitionManager does: its outcome is unknown."""
        request, self._in_flight = self._in_flight, None
        if request is None:
            return
        unanswered = [p for p in request.proposals if p.topic_partition not in answers]
        if unanswered:
            logger.warning(
                "[Broker id=%d] AlterPartition response left out %s, sent again",
                self._broker_id,
                [p.topic_partition for p in unanswered],
            )
            self._requeue_first(unanswered)
        for proposal in request.proposals:
            answer = answers.get(proposal.topic_partition)
            if answer is None:
                continue
            if answer.error is not None:
                logger.info(
                    "[Broker id=%d] AlterPartition %s ISR %s refused: %s",
                    self._broker_id,
                    proposal.topic_partition,
                    proposal.new_isr,
                    answer.error,
                )
            self._replica_manager.on_alter_partition_response(
                proposal.topic_partition, answer.registration, answer.error, now_ms
            )

    def on_request_failed(self, reason: str, now_ms: int) -> None:
        """No answer came, so whether the controller committed the changes is unknown: the same proposals go
        again first (Kafka's AlterPartitionManager retries them). The partitions keep them in flight meanwhile, so
        the HW keeps waiting for a replica they add, which the controller may have put in the ISR already; a retry
        of what was committed is answered INVALID_UPDATE_VERSION, and the partition then waits for the metadata
        (docs/replication.md#alter-partition)."""
        request, self._in_flight = self._in_flight, None
        if request is None:
            return
        logger.info(
            "[Broker id=%d] AlterPartition for %d partition(s) failed, sent again: %s",
            self._broker_id,
            len(request.proposals),
            reason,
        )
        self._requeue_first(request.proposals)

    def _requeue_first(self, proposals: tuple[AlterPartitionProposal, ...] | list[AlterPartitionProposal]) -> None:
        self._pending[:0] = proposals

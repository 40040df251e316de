"""The transaction coordinator's marker channel: WriteTxnMarkers to the leaders of a transaction's partitions.

As Kafka's TransactionMarkerChannelManager (docs/transactions.md#marker-channel):
- each transaction's partitions are grouped by their leader in the metadata image, and one WriteTxnMarkers
  request a broker carries the markers of every transaction waiting for it, sent over the inter-broker
  listener; the partitions this broker leads go to its own WriteTxnMarkers appends directly (Kafka sends those
  over the network too: the outcome is the same, one hop less);
- a partition whose topic no longer exists needs no marker and is dropped; one without a leader waits;
- a partition answered NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS(_AFTER_APPEND),
  REQUEST_TIMED_OUT or KAFKA_STORAGE_ERROR, and every partition of a request that got no answer, is sent again
  after `RETRY_BACKOFF_MS` to whoever leads it then; UNSUPPORTED_FOR_MESSAGE_FORMAT is dropped (Kafka's
  handler does the same);
- INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED means a newer coordinator or producer epoch owns
  the transaction: this coordinator stops sending its markers and does not complete it;
- a transaction whose `__transaction_state` partition this broker no longer leads at the coordinator epoch of the
  request is dropped too: the new coordinator sends the markers again when it loads the partition;
- once every partition has its marker, `on_complete` is called (the core then writes COMPLETE_COMMIT/ABORT).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tierlog.client.connection import ConnectionPool, KafkaConnectionError
from tierlog.client.requests import TxnMarker, write_txn_markers_request
from tierlog.client.security import ClientSecurity
from tierlog.common import TopicPartition
from tierlog.coordinator.transaction.transaction_coordinator import TxnMarkerRequest
from tierlog.metadata.image import ClusterMetadata
from tierlog.protocol.errors import error_code
from tierlog.server.txn_marker_apis import MarkerResults

logger = logging.getLogger(__name__)

# Kafka's retry.backoff.ms default, which its channel's NetworkClient waits before sending again.
RETRY_BACKOFF_MS = 100
CONNECT_TIMEOUT_S = 5.0

RETRIABLE_ERRORS = frozenset(
    {
        "UNKNOWN_TOPIC_OR_PARTITION",
        "NOT_LEADER_OR_FOLLOWER",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "REQUEST_TIMED_OUT",
        "KAFKA_STORAGE_ERROR",
    }
)
FENCED_ERRORS = frozenset({"INVALID_PRODUCER_EPOCH", "TRANSACTION_COORDINATOR_FENCED"})
DROPPED_ERRORS = frozenset({"UNSUPPORTED_FOR_MESSAGE_FORMAT"})


@dataclass
class _PendingTxn:
    request: TxnMarkerRequest
    remaining: set[TopicPartition]
    in_flight: set[TopicPartition] = field(default_factory=set)


# (transactional id, coordinator epoch) -> still this broker's to complete
StillOwned = Callable[[str, int], bool]
OnComplete = Callable[[TxnMarkerRequest], None]
# This broker's WriteTxnMarkers appends (TxnMarkerApis.write_markers).
WriteLocal = Callable[[Sequence[TxnMarker]], Awaitable[MarkerResults]]


class TransactionMarkerChannel:
    def __init__(
        self,
        node_id: int,
        image: Callable[[], ClusterMetadata],
        listener_name: Callable[[], str],
        security: ClientSecurity,
        request_timeout_ms: int,
        still_owned: StillOwned,
        on_complete: OnComplete,
        write_local: WriteLocal,
    ) -> None:
        self._node_id = node_id
        self._image = image
        self._listener_name = listener_name
        self._request_timeout_s = request_timeout_ms / 1000
        self._still_owned = still_owned
        self._on_complete = on_complete
        self._write_local = write_local
        self._pending: dict[str, _PendingTxn] = {}
        self._connections = ConnectionPool(
            client_id=f"broker-{node_id}-txn-marker-sender", security=security, connect_timeout_s=CONNECT_TIMEOUT_S
        )
        self._wakeup = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._retry: asyncio.TimerHandle | None = None

    def add(self, request: TxnMarkerRequest) -> None:
        """Send `request`'s markers (replacing any this channel still had for the same transactional id, which
        the core has moved past)."""
        self._pending[request.transactional_id] = _PendingTxn(request, set(request.partitions))
        self._wake()

    def remove(self, transactional_id: str) -> None:
        self._pending.pop(transactional_id, None)

    @property
    def pending_transactions(self) -> int:
        return len(self._pending)

    def _wake(self) -> None:
        self._wakeup.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="txn-marker-channel")

    def _wake_later(self) -> None:
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(RETRY_BACKOFF_MS / 1000, self._retry_now)

    def _retry_now(self) -> None:
        self._retry = None
        self._wake()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                self._dispatch()
            except Exception:
                logger.exception("sending transaction markers failed")
                self._wake_later()

    def _dispatch(self) -> None:
        image = self._image()
        by_leader: dict[int, list[tuple[_PendingTxn, list[TopicPartition]]]] = {}
        waiting = False
        for txn_id, txn in list(self._pending.items()):
            request = txn.request
            if not self._still_owned(txn_id, request.coordinator_epoch):
                logger.info(
                    "no longer the coordinator of %r at epoch %d: its markers are left to the new one",
                    txn_id,
                    request.coordinator_epoch,
                )
                del self._pending[txn_id]
                continue
            to_send: dict[int, list[TopicPartition]] = {}
            for tp in sorted(txn.remaining - txn.in_flight):
                topic = image.topics.get(tp.topic)
                if topic is None or tp.partition >= len(topic.partitions):
                    # Deleted: no reader will ever need its marker (Kafka's channel drops it too).
                    txn.remaining.discard(tp)
                    continue
                leader = topic.partitions[tp.partition].leader
                if leader < 0 or image.endpoint_of(leader, self._listener_name()) is None:
                    waiting = True
                    continue
                to_send.setdefault(leader, []).append(tp)
            for leader, tps in to_send.items():
                txn.in_flight.update(tps)
                by_leader.setdefault(leader, []).append((txn, tps))
            self._maybe_complete(txn)
        for leader, items in by_leader.items():
            task = asyncio.get_running_loop().create_task(self._send(leader, items), name=f"txn-markers-{leader}")
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
        if waiting:
            self._wake_later()

    def _maybe_complete(self, txn: _PendingTxn) -> None:
        request = txn.request
        if txn.remaining or self._pending.get(request.transactional_id) is not txn:
            return
        del self._pending[request.transactional_id]
        self._on_complete(request)

    async def _send(self, leader: int, items: list[tuple[_PendingTxn, list[TopicPartition]]]) -> None:
        try:
            if leader == self._node_id:
                errors = await self._write_locally(items)
            else:
                errors = await self._write_remotely(leader, items)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.info("WriteTxnMarkers to broker %d failed, sending again: %s", leader, e)
            for txn, tps in items:
                txn.in_flight.difference_update(tps)
            self._wake_later()
            return
        self._handle_errors(items, errors)

    async def _write_locally(
        self, items: list[tuple[_PendingTxn, list[TopicPartition]]]
    ) -> dict[tuple[int, TopicPartition], str | None]:
        """This broker leads the partitions: its WriteTxnMarkers appends, without the network."""
        results = await self._write_local(_markers(items))
        return {(producer_id, tp): error for producer_id, errors in results.items() for tp, error in errors.items()}

    async def _write_remotely(
        self, leader: int, items: list[tuple[_PendingTxn, list[TopicPartition]]]
    ) -> dict[tuple[int, TopicPartition], str | None]:
        response = await self._request(leader, write_txn_markers_request(_markers(items)))
        errors: dict[tuple[int, TopicPartition], str | None] = {}
        for marker in response.markers:
            for topic in marker.topics:
                for p in topic.partitions:
                    code = p.error_code
                    name = None if code == error_code(None) else code.name.upper()
                    errors[(int(marker.producer_id), TopicPartition(str(topic.name), int(p.partition_index)))] = name
        return errors

    def _handle_errors(
        self,
        items: list[tuple[_PendingTxn, list[TopicPartition]]],
        errors: dict[tuple[int, TopicPartition], str | None],
    ) -> None:
        """Kafka's TransactionTxnMarkerRequestCompletionHandler: written or dropped partitions are done, retriable ones
        go again, a fenced transaction is abandoned."""
        retry = False
        for txn, tps in items:
            request = txn.request
            txn.in_flight.difference_update(tps)
            fenced = False
            for tp in tps:
                error = errors.get((request.producer_id, tp), "UNKNOWN_TOPIC_OR_PARTITION")
                if error is None or error in DROPPED_ERRORS:
                    txn.remaining.discard(tp)
                elif error in FENCED_ERRORS:
                    fenced = True
                else:
                    if error not in RETRIABLE_ERRORS:
                        logger.warning(
                            "unexpected %s writing the marker of %r to %s; sending again",
                            error,
                            request.transactional_id,
                            tp,
                        )
                    retry = True
            if fenced:
                logger.info(
                    "the markers of %r are fenced (a newer coordinator or producer epoch): stopped",
                    request.transactional_id,
                )
                if self._pending.get(request.transactional_id) is txn:
                    del self._pending[request.transactional_id]
                continue
            self._maybe_complete(txn)
        if retry:
            self._wake_later()

    async def _request(self, broker_id: int, body: Any) -> Any:
        endpoint = self._image().endpoint_of(broker_id, self._listener_name())
        if endpoint is None:
            raise KafkaConnectionError(f"broker {broker_id} has no endpoint")
        return await self._connections.send(endpoint.host, endpoint.port, body, timeout_s=self._request_timeout_s)

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        tasks = [*self._sends, *([self._runner] if self._runner is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._connections.close()
        self._pending.clear()


def _markers(items: list[tuple[_PendingTxn, list[TopicPartition]]]) -> list[TxnMarker]:
    """The WriteTxnMarkers entries of `items`, whether appended here or sent to their leader."""
    return [
        TxnMarker(
            producer_id=txn.request.producer_id,
            producer_epoch=txn.request.producer_epoch,
            committed=txn.request.committed,
            coordinator_epoch=txn.request.coordinator_epoch,
            partitions=tuple(tps),
        )
        for txn, tps in items
    ]

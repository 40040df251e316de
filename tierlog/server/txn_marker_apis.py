"""WriteTxnMarkers (API 27): the transaction coordinator has each partition leader end a transaction with a marker
(docs/transactions.md#write-txn-markers), as Kafka's KafkaApis.handleWriteTxnMarkersRequest.

Each marker of a request (one producer's transaction) is one acks=all append of a COMMIT or ABORT control batch
to each of its partitions, with origin COORDINATOR (no sequence checks; the partition checks the producer epoch and
the coordinator epoch). Every error is the append's, per partition (UNKNOWN_TOPIC_OR_PARTITION for one this broker
does not host). Once a marker is in a `__consumer_offsets` partition, the group
coordinator is told, so the transaction's offset commits become visible (or are dropped).

The coordinator of this broker's own `__transaction_state` partitions calls `write_markers` directly; other brokers'
coordinators send the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tierlog.client.requests import TxnMarker
from tierlog.common import TopicPartition
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.replication.replica_manager import AppendResult
from tierlog.security.acl import AclOperation
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.clock import now_ms
from tierlog.server.entities import response_schema
from tierlog.server.group_coordinator import GROUP_METADATA_TOPIC
from tierlog.storage.producer_state import AppendOrigin

API_WRITE_TXN_MARKERS = 27
logger = logging.getLogger(__name__)


# Per producer id, each partition's error name (None: the marker is written), as Kafka's WriteTxnMarkersResponse.
MarkerResults = dict[int, dict[TopicPartition, str | None]]
# KafkaApis' append: (entries, required acks, timeout ms, origin) -> each partition's result once acknowledged.
Append = Callable[
    [dict[TopicPartition, bytearray], int, int, AppendOrigin], Awaitable[dict[TopicPartition, AppendResult]]
]
# GroupCoordinatorService.complete_transaction(offsets partition, producer id, committed).
OffsetsTransactionCompleted = Callable[[int, int, bool], None]


class TxnMarkerApis:
    def __init__(
        self,
        auth: AuthHelper,
        append: Append,
        request_timeout_ms: int,
        offsets_transaction_completed: OffsetsTransactionCompleted | None,
    ) -> None:
        self._auth = auth
        self._append = append
        self._request_timeout_ms = request_timeout_ms
        self._offsets_transaction_completed = offsets_transaction_completed
        self.handlers = {API_WRITE_TXN_MARKERS: self.handle_write_txn_markers}

    async def write_markers(self, markers: Sequence[TxnMarker]) -> MarkerResults:
        """Append every marker (all at once, each waiting for acks=all) and answer each partition's outcome."""
        results: MarkerResults = {}
        appends: list[tuple[TxnMarker, dict[TopicPartition, bytearray]]] = []
        timestamp = now_ms()
        for marker in markers:
            control = EndTxnMarker(
                ControlRecordType.COMMIT if marker.committed else ControlRecordType.ABORT, marker.coordinator_epoch
            )
            # A partition not hosted here is answered UNKNOWN_TOPIC_OR_PARTITION by the append itself (Kafka's
            # getMagic finds no local log): the coordinator looks the leader up again and retries.
            entries = {
                tp: build_end_txn_marker_batch(marker.producer_id, marker.producer_epoch, control, timestamp)
                for tp in marker.partitions
            }
            appends.append((marker, entries))
        appended = await asyncio.gather(
            *(self._append(entries, -1, self._request_timeout_ms, AppendOrigin.COORDINATOR) for _, entries in appends)
        )
        for (marker, _), outcome in zip(appends, appended, strict=True):
            errors = {tp: result.error for tp, result in outcome.items()}
            self._complete_offsets_transaction(marker, errors)
            results.setdefault(marker.producer_id, {}).update(errors)
        return results

    def _complete_offsets_transaction(self, marker: TxnMarker, errors: dict[TopicPartition, str | None]) -> None:
        """Tell the group coordinator about each `__consumer_offsets` partition whose marker is written; a failure
        there answers that partition UNKNOWN_SERVER_ERROR (Kafka's onTransactionCompleted), so the coordinator
        writes the marker again."""
        if self._offsets_transaction_completed is None:
            return
        for tp, error in errors.items():
            if tp.topic != GROUP_METADATA_TOPIC or error is not None:
                continue
            try:
                self._offsets_transaction_completed(tp.partition, marker.producer_id, marker.committed)
            except Exception:
                logger.exception("completing the offsets of producer %d in %s failed", marker.producer_id, tp)
                errors[tp] = "UNKNOWN_SERVER_ERROR"

    async def handle_write_txn_markers(self, request: Request) -> Any:
        """Only brokers send it: ALTER or CLUSTER_ACTION on the cluster, as Kafka; without, every partition is
        answered CLUSTER_AUTHORIZATION_FAILED."""
        markers = [
            TxnMarker(
                producer_id=m.producer_id,
                producer_epoch=m.producer_epoch,
                coordinator_epoch=m.coordinator_epoch,
                committed=m.transaction_result,
                partitions=tuple(TopicPartition(t.name, index) for t in m.topics for index in t.partition_indexes),
            )
            for m in request.body.markers
        ]
        if self._auth.authorize_cluster(AclOperation.ALTER) or self._auth.authorize_cluster(
            AclOperation.CLUSTER_ACTION
        ):
            results = await self.write_markers(markers)
        else:
            results = {}
            for marker in markers:
                results.setdefault(marker.producer_id, {}).update(
                    dict.fromkeys(marker.partitions, "CLUSTER_AUTHORIZATION_FAILED")
                )
        s = response_schema(request.api_key, request.api_version)
        answers = []
        for producer_id, errors in results.items():
            by_topic: dict[str, list[Any]] = {}
            for tp, error in errors.items():
                by_topic.setdefault(tp.topic, []).append(
                    s.WritableTxnMarkerPartitionResult(partition_index=tp.partition, error_code=error_code(error))
                )
            answers.append(
                s.WritableTxnMarkerResult(
                    producer_id=producer_id,
                    topics=tuple(
                        s.WritableTxnMarkerTopicResult(name=name, partitions=tuple(partitions))
                        for name, partitions in by_topic.items()
                    ),
                )
            )
        return s.WriteTxnMarkersResponse(markers=tuple(answers))

"""Handlers of the transaction APIs (KIP-98, KIP-664): FindCoordinator for transactional ids, InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions and ListTransactions
(docs/transactions.md#txn-apis).

Each turns a request entity (any version the broker advertises) into a call on the TransactionCoordinator core
and its answer back into the response of that version. They first check what Kafka's KafkaApis checks: WRITE on
the transactional id for the producer's requests, WRITE on each topic added (internal topics never), READ on the
group of AddOffsetsToTxn, DESCRIBE on the transactional id to find its coordinator, describe it or list it
(docs/security.md#api-checks). InitProducerId without a transactional id is the idempotent producer's: a fresh id
from the shared ProducerIdManager (docs/transactions.md#producer-ids).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.coordinator.transaction.transaction_coordinator import (
    InitProducerIdResult,
    ProducerIdAndEpoch,
    error_for_version,
)
from tierlog.metadata.image import ClusterMetadata
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.security.acl import AclOperation, ResourceType
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.clock import now_ms
from tierlog.server.controller_channel import ControllerUnavailableError
from tierlog.server.coordinator_runtime import parked
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema
from tierlog.server.group_apis import CoordinatorLookup, coordinator_of, find_coordinator_response
from tierlog.server.group_coordinator import GROUP_METADATA_TOPIC
from tierlog.server.producer_id_manager import ProducerIdManager
from tierlog.server.transaction_coordinator import TRANSACTION_STATE_TOPIC, TransactionCoordinatorService

API_FIND_COORDINATOR = 10
API_INIT_PRODUCER_ID = 22
API_ADD_PARTITIONS_TO_TXN = 24
API_ADD_OFFSETS_TO_TXN = 25
API_END_TXN = 26
API_DESCRIBE_TRANSACTIONS = 65
API_LIST_TRANSACTIONS = 66

COORDINATOR_KEY_TRANSACTION = 1
# Kafka's Topic.INTERNAL_TOPICS, the coordinators' own topics: never added to a transaction by a client.
INTERNAL_TOPICS = frozenset({GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC})
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

T = TypeVar("T")
Handler = Callable[[Request], Awaitable[Any]]


def _ms(value: Any) -> int:
    return round(value.total_seconds() * 1000)


def _instant(epoch_ms: int) -> datetime.datetime:
    """A non-nullable int64 timestamp field's value: -1 (none) stays -1 on the wire, as Kafka sends it."""
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)


class TransactionApis:
    def __init__(
        self,
        config: KafkaConfig,
        service: TransactionCoordinatorService,
        producer_ids: ProducerIdManager,
        image: Callable[[], ClusterMetadata],
        offsets_partition_for: Callable[[str], int],
        find_group_coordinator: Handler,
        auth: AuthHelper,
    ) -> None:
        self._config = config
        self.service = service
        self.coordinator = service.coordinator
        self._producer_ids = producer_ids
        self._image = image
        self._offsets_partition_for = offsets_partition_for
        self._find_group_coordinator = find_group_coordinator
        self.auth = auth
        self._id_timeout_s = config.get_int("request.timeout.ms") / 1000
        self.handlers: dict[int, Handler] = {
            API_FIND_COORDINATOR: self.handle_find_coordinator,
            API_INIT_PRODUCER_ID: self.handle_init_producer_id,
            API_ADD_PARTITIONS_TO_TXN: self.handle_add_partitions_to_txn,
            API_ADD_OFFSETS_TO_TXN: self.handle_add_offsets_to_txn,
            API_END_TXN: self.handle_end_txn,
            API_DESCRIBE_TRANSACTIONS: self.handle_describe_transactions,
            API_LIST_TRANSACTIONS: self.handle_list_transactions,
        }

    @staticmethod
    def _schema(request: Request) -> ResponseSchema:
        return response_schema(request.api_key, request.api_version)

    def _may_write(self, transactional_id: str) -> bool:
        return self.auth.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)

    async def _parked(self, call: Callable[[Callable[[T], None]], None]) -> T:
        return await parked(call, self.service.after_call)

    # FindCoordinator

    async def handle_find_coordinator(self, request: Request) -> Any:
        """Key type 1 (a transactional id) is answered here, every other by the group APIs."""
        body = request.body
        if getattr(body, "key_type", 0) != COORDINATOR_KEY_TRANSACTION:
            return await self._find_group_coordinator(request)
        return find_coordinator_response(request, self._find)

    def _find(self, transactional_id: str) -> CoordinatorLookup:
        """(error, message, node id, host, port): the leader of the transactional id's __transaction_state
        partition, once the principal may DESCRIBE the id (Kafka's handleFindCoordinatorRequest)."""
        if not self.auth.authorize(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            return "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", None, -1, "", -1
        return coordinator_of(
            self.service,
            transactional_id,
            self._config,
            self._image(),
            "the transactional id's __transaction_state partition has no leader",
        )

    # InitProducerId

    async def handle_init_producer_id(self, request: Request) -> Any:
        """A transactional producer needs WRITE on its transactional id; an idempotent one IDEMPOTENT_WRITE on
        the cluster or WRITE on some topic (KIP-679). A producer id without an epoch (or the reverse) is
        INVALID_REQUEST (KIP-360's v3+ fields)."""
        s = self._schema(request)
        body = request.body
        transactional_id = body.transactional_id

        def answer(error: str | None, producer_id: int = NO_PRODUCER_ID, epoch: int = NO_PRODUCER_EPOCH) -> Any:
            return s.InitProducerIdResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code(error_for_version(error, "InitProducerId", request.api_version)),
                producer_id=producer_id,
                producer_epoch=epoch,
            )

        if transactional_id is None:
            if not (
                self.auth.authorize_cluster(AclOperation.IDEMPOTENT_WRITE)
                or self.auth.authorize_by_resource_type(AclOperation.WRITE, ResourceType.TOPIC)
            ):
                return answer("CLUSTER_AUTHORIZATION_FAILED")
            try:
                return answer(None, await self._producer_ids.generate(self._id_timeout_s), 0)
            except (ControllerUnavailableError, TimeoutError):
                # Retriable for the client, as Kafka's RPCProducerIdManager answers while it has no block.
                return answer("COORDINATOR_LOAD_IN_PROGRESS")
        if not self._may_write(transactional_id):
            return answer("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
        producer_id = getattr(body, "producer_id", NO_PRODUCER_ID)
        producer_epoch = getattr(body, "producer_epoch", NO_PRODUCER_EPOCH)
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            return answer("INVALID_REQUEST")
        expected = None if producer_id == NO_PRODUCER_ID else ProducerIdAndEpoch(producer_id, producer_epoch)
        result: InitProducerIdResult = await self._parked(
            lambda respond: self.coordinator.handle_init_producer_id(
                transactional_id, _ms(body.transaction_timeout), expected, now_ms(), respond
            )
        )
        return answer(result.error, result.producer_id, result.producer_epoch)

    # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn

    async def handle_add_partitions_to_txn(self, request: Request) -> Any:
        """v0-v3 (a client's; v4+ are KIP-890's broker-to-broker verification, not served). Any partition the
        principal may not WRITE (internal topics never) or that does not exist fails the whole request, the
        others answered OPERATION_NOT_ATTEMPTED (Kafka's handleAddPartitionsToTxnRequest)."""
        s = self._schema(request)
        body = request.body
        transactional_id = body.v3_and_below_transactional_id
        partitions = [TopicPartition(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
        errors: dict[TopicPartition, str | None]
        if not self._may_write(transactional_id):
            errors = dict.fromkeys(partitions, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
        else:
            writable = self.auth.filter_authorized(
                AclOperation.WRITE, ResourceType.TOPIC, {tp.topic for tp in partitions} - INTERNAL_TOPICS
            )
            refused = {tp: "TOPIC_AUTHORIZATION_FAILED" for tp in partitions if tp.topic not in writable}
            refused.update(
                {tp: "UNKNOWN_TOPIC_OR_PARTITION" for tp in partitions if tp not in refused and not self._exists(tp)}
            )
            if refused:
                errors = {tp: refused.get(tp, "OPERATION_NOT_ATTEMPTED") for tp in partitions}
            else:
                errors = await self._parked(
                    lambda respond: self.coordinator.handle_add_partitions(
                        transactional_id,
                        body.v3_and_below_producer_id,
                        body.v3_and_below_producer_epoch,
                        partitions,
                        now_ms(),
                        respond,
                    )
                )
        by_topic: dict[str, list[Any]] = {}
        for tp in partitions:
            error = error_for_version(errors.get(tp), "AddPartitionsToTxn", request.api_version)
            by_topic.setdefault(tp.topic, []).append(
                s.AddPartitionsToTxnPartitionResult(
                    partition_index=tp.partition, partition_error_code=error_code(error)
                )
            )
        return s.AddPartitionsToTxnResponse(
            throttle_time=NO_THROTTLE,
            results_by_topic_v3_and_below=tuple(
                s.AddPartitionsToTxnTopicResult(name=topic, results_by_partition=tuple(results))
                for topic, results in by_topic.items()
            ),
        )

    def _exists(self, tp: TopicPartition) -> bool:
        topic = self._image().topics.get(tp.topic)
        return topic is not None and 0 <= tp.partition < len(topic.partitions)

    async def handle_add_offsets_to_txn(self, request: Request) -> Any:
        """The group's __consumer_offsets partition joins the transaction (its TxnOffsetCommit is written there
        and gets the transaction's marker): WRITE on the transactional id, then READ on the group."""
        s = self._schema(request)
        body = request.body
        if not self._may_write(body.transactional_id):
            error: str | None = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
        elif not self.auth.authorize(AclOperation.READ, ResourceType.GROUP, body.group_id):
            error = "GROUP_AUTHORIZATION_FAILED"
        else:
            tp = TopicPartition(GROUP_METADATA_TOPIC, self._offsets_partition_for(body.group_id))
            errors: dict[TopicPartition, str | None] = await self._parked(
                lambda respond: self.coordinator.handle_add_partitions(
                    body.transactional_id, body.producer_id, body.producer_epoch, [tp], now_ms(), respond
                )
            )
            error = next(iter(errors.values()), None)
        return s.AddOffsetsToTxnResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(error_for_version(error, "AddOffsetsToTxn", request.api_version)),
        )

    async def handle_end_txn(self, request: Request) -> Any:
        s = self._schema(request)
        body = request.body
        if not self._may_write(body.transactional_id):
            error: str | None = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
        else:
            error = await self._parked(
                lambda respond: self.coordinator.handle_end_txn(
                    body.transactional_id, body.producer_id, body.producer_epoch, body.committed, now_ms(), respond
                )
            )
        return s.EndTxnResponse(
            throttle_time=NO_THROTTLE, error_code=error_code(error_for_version(error, "EndTxn", request.api_version))
        )

    # DescribeTransactions, ListTransactions (KIP-664)

    async def handle_describe_transactions(self, request: Request) -> Any:
        """Each id needs DESCRIBE on it; the partitions of topics the principal may not DESCRIBE are left out."""
        s = self._schema(request)
        states = []
        for transactional_id in request.body.transactional_ids:
            if not self.auth.authorize(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
                states.append(self._described(s, transactional_id, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"))
                continue
            d = self.coordinator.describe_transaction(transactional_id)
            if d.error is not None:
                states.append(self._described(s, transactional_id, d.error))
                continue
            describable = self.auth.filter_authorized(
                AclOperation.DESCRIBE, ResourceType.TOPIC, (topic for topic, _ in d.topics)
            )
            states.append(
                s.TransactionState(
                    error_code=error_code(None),
                    transactional_id=transactional_id,
                    transaction_state=d.state,
                    transaction_timeout=datetime.timedelta(milliseconds=d.transaction_timeout_ms),
                    transaction_start_time=_instant(d.transaction_start_time_ms),
                    producer_id=d.producer_id,
                    producer_epoch=d.producer_epoch,
                    topics=tuple(s.TopicData(topic=t, partitions=ps) for t, ps in d.topics if t in describable),
                )
            )
        return s.DescribeTransactionsResponse(throttle_time=NO_THROTTLE, transaction_states=tuple(states))

    @staticmethod
    def _described(s: ResponseSchema, transactional_id: str, error: str) -> Any:
        return s.TransactionState(
            error_code=error_code(error),
            transactional_id=transactional_id,
            transaction_state="",
            transaction_timeout=NO_THROTTLE,
            transaction_start_time=_instant(-1),
            producer_id=NO_PRODUCER_ID,
            producer_epoch=NO_PRODUCER_EPOCH,
            topics=(),
        )

    async def handle_list_transactions(self, request: Request) -> Any:
        """Only the transactional ids the principal may DESCRIBE are listed."""
        s = self._schema(request)
        body = request.body
        listing = self.coordinator.list_transactions(
            set(body.state_filters), set(body.producer_id_filters), getattr(body, "duration_filter", -1), now_ms()
        )
        describable = self.auth.filter_authorized(
            AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, (t.transactional_id for t in listing.transactions)
        )
        return s.ListTransactionsResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(listing.error),
            unknown_state_filters=tuple(listing.unknown_state_filters),
            transaction_states=tuple(
                s.TransactionState(
                    transactional_id=t.transactional_id, producer_id=t.producer_id, transaction_state=t.state
                )
                for t in listing.transactions
                if t.transactional_id in describable
            ),
        )

"""The Kafka transaction requests the exactly-once sink sends, over tierlog's own client (blocking calls).

A transactional producer library keeps its producer id and epoch to itself and aborts (or leaves to time out) a
transaction it did not commit; the sink needs the opposite: a task writes inside a transaction and hands the
producer id and epoch to the driver, which ends the transaction later, possibly after a restart (as Flink's
Kafka sink resumes one). So the sink speaks the protocol itself: FindCoordinator (key type 1), InitProducerId,
AddPartitionsToTxn, transactional Produce, EndTxn and ListTransactions, with Kafka's client retries
(docs/transactions.md#spark-sink).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import (
    API_PRODUCE,
    COORDINATOR_KEY_TRANSACTION,
    find_coordinator_request,
    list_transactions_request,
    metadata_request,
    request_schema,
)
from tierlog.client.security import ClientSecurity
from tierlog.common import TopicPartition

API_INIT_PRODUCER_ID, API_ADD_PARTITIONS_TO_TXN, API_END_TXN = 22, 24, 26
# v3: one key per request, answered with one host and port (v4 batches keys).
FIND_COORDINATOR_VERSION = 3
# v3: producer id and epoch in the request (KIP-360); v4 and below of AddPartitionsToTxn/EndTxn are the
# client's (v4+ of AddPartitionsToTxn is KIP-890's broker verification; EndTxn v5 bumps the epoch).
INIT_PRODUCER_ID_VERSION = 3
ADD_PARTITIONS_TO_TXN_VERSION = 3
END_TXN_VERSION = 3
PRODUCE_VERSION = 9
METADATA_VERSION = 1
LIST_TRANSACTIONS_VERSION = 0

CLIENT_ID = "tierlog-spark-sink"
REQUEST_TIMEOUT_S = 30.0
RETRY_BACKOFF_S = 0.1
MAX_RETRY_BACKOFF_S = 1.0
# Errors after which Kafka's client finds the coordinator again and retries.
COORDINATOR_MOVED = frozenset({"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE"})
# Errors Kafka's client retries against the same coordinator after a backoff.
RETRY_LATER = frozenset({"COORDINATOR_LOAD_IN_PROGRESS", "CONCURRENT_TRANSACTIONS"})
# Produce errors after which the partition's leader is looked up again and the same batch sent again (the
# same sequence number: the leader appends it once).
LEADER_MOVED = frozenset(
    {"NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PARTITION", "NOT_ENOUGH_REPLICAS"}
)


class TransactionError(RuntimeError):
    """A transaction request the coordinator or a leader refused; `error` is Kafka's error name."""

    def __init__(self, what: str, error: str) -> None:
        super().__init__(f"{what}: {error}")
        self.error = error


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    state: str


def _error(code: Any) -> str | None:
    name = code.name.upper()
    return None if name == "NONE" else name


class TxnClient:
    """Blocking transaction requests to a cluster reached through `bootstrap_servers`, each retried as Kafka's
    client retries it until `timeout_s` has passed. Not thread-safe; close() when done."""

    def __init__(self, bootstrap_servers: str, security: ClientSecurity, timeout_s: float = 120.0) -> None:
        self._bootstrap = [address.strip() for address in bootstrap_servers.split(",") if address.strip()]
        self._security = security
        self._timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._connections: dict[str, KafkaConnection] = {}
        self._coordinators: dict[str, str] = {}
        self._leaders: dict[TopicPartition, str] = {}
        self._partition_counts: dict[str, int] = {}

    def close(self) -> None:
        for connection in self._connections.values():
            self._loop.run_until_complete(connection.close())
        self._connections.clear()
        self._loop.close()

    def __enter__(self) -> TxnClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- plumbing -----------------------------------------------------------------------------------------

    def _send(self, address: str, request: Any) -> Any:
        connection = self._connections.get(address)
        if connection is None or connection.closed:
            host, _, port = address.rpartition(":")
            connection = self._loop.run_until_complete(
                KafkaConnection.open(
                    host, int(port), client_id=CLIENT_ID, timeout_s=REQUEST_TIMEOUT_S, security=self._security
                )
            )
            self._connections[address] = connection
        try:
            return self._loop.run_until_complete(connection.send(request, timeout_s=REQUEST_TIMEOUT_S))
        except KafkaConnectionError:
            self._connections.pop(address, None)
            raise

    def _send_to_any(self, request: Any) -> Any:
        """`request` to the first bootstrap server that answers."""
        failures = []
        for address in self._bootstrap:
            try:
                return self._send(address, request)
            except KafkaConnectionError as e:
                failures.append(str(e))
        raise KafkaConnectionError("; ".join(failures) or "no bootstrap servers")

    def _retrying(self, what: str, attempt: Any) -> Any:
        """attempt() until it returns something other than None (its retriable outcome), with Kafka's capped
        exponential backoff, for up to the client's timeout."""
        deadline = time.monotonic() + self._timeout_s
        backoff = RETRY_BACKOFF_S
        last = "no answer"
        while True:
            try:
                result = attempt()
                if result is not None:
                    return result
            except KafkaConnectionError as e:
                last = str(e)
            except _Retry as e:
                last = e.reason
            if time.monotonic() + backoff > deadline:
                raise TransactionError(what, f"gave up after {self._timeout_s:.0f}s (last: {last})")
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_RETRY_BACKOFF_S)

    def _coordinator(self, transactional_id: str) -> str:
        address = self._coordinators.get(transactional_id)
        if address is not None:
            return address
        answer = self._send_to_any(
            find_coordinator_request(transactional_id, COORDINATOR_KEY_TRANSACTION, version=FIND_COORDINATOR_VERSION)
        )
        error = _error(answer.error_code)
        if error is not None:
            if error in COORDINATOR_MOVED | RETRY_LATER:
                raise _Retry(f"FindCoordinator: {error}")
            raise TransactionError(f"FindCoordinator({transactional_id})", error)
        address = f"{answer.host}:{int(answer.port)}"
        self._coordinators[transactional_id] = address
        return address

    def _to_coordinator(
        self, transactional_id: str, what: str, request: Any, errors_of: Callable[[Any], set[str]] | None = None
    ) -> Any:
        """`request`'s answer from the transaction's coordinator, found again when it moved, and retried while
        the coordinator is loading or the transaction is completing. `errors_of(answer)`: the answer's error
        names (by default its error_code's); OPERATION_NOT_ATTEMPTED marks partitions another's error held back."""

        def attempt() -> Any:
            address = self._coordinator(transactional_id)
            try:
                answer = self._send(address, request)
            except KafkaConnectionError:
                self._coordinators.pop(transactional_id, None)
                raise
            errors = errors_of(answer) if errors_of is not None else {_error(answer.error_code)} - {None}
            if errors & COORDINATOR_MOVED:
                self._coordinators.pop(transactional_id, None)
            if errors and errors <= COORDINATOR_MOVED | RETRY_LATER | {"OPERATION_NOT_ATTEMPTED"}:
                raise _Retry(f"{what}: {', '.join(sorted(errors))}")
            return answer

        return self._retrying(what, attempt)

    # --- the coordinator's requests -----------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, transaction_timeout_ms: int) -> ProducerIdAndEpoch:
        """The transactional id's producer id and a new epoch: any transaction an earlier epoch left open is
        aborted, and that epoch is fenced (Kafka's InitProducerId)."""
        s = request_schema(API_INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION)
        request = s.InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(milliseconds=transaction_timeout_ms),
            producer_id=-1,
            producer_epoch=-1,
        )
        what = f"InitProducerId({transactional_id})"
        answer = self._to_coordinator(transactional_id, what, request)
        error = _error(answer.error_code)
        if error is not None:
            raise TransactionError(what, error)
        return ProducerIdAndEpoch(int(answer.producer_id), int(answer.producer_epoch))

    def add_partitions(
        self, transactional_id: str, producer: ProducerIdAndEpoch, partitions: Iterable[TopicPartition]
    ) -> None:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        if not by_topic:
            return
        s = request_schema(API_ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS_TO_TXN_VERSION)
        request = s.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=producer.producer_id,
            v3_and_below_producer_epoch=producer.producer_epoch,
            v3_and_below_topics=tuple(
                s.AddPartitionsToTxnTopic(name=topic, partitions=tuple(sorted(parts)))
                for topic, parts in sorted(by_topic.items())
            ),
        )
        what = f"AddPartitionsToTxn({transactional_id})"

        def errors_of(answer: Any) -> set[str]:
            return {
                error
                for t in answer.results_by_topic_v3_and_below
                for p in t.results_by_partition
                if (error := _error(p.partition_error_code)) is not None
            }

        errors = errors_of(self._to_coordinator(transactional_id, what, request, errors_of))
        if errors:
            raise TransactionError(what, ", ".join(sorted(errors - {"OPERATION_NOT_ATTEMPTED"})))

    def end_txn(self, transactional_id: str, producer: ProducerIdAndEpoch, commit: bool) -> str | None:
        """EndTxn: None once the coordinator has decided (a retried commit of a committed transaction is
        answered without error, as Kafka's coordinator answers it); else Kafka's error (PRODUCER_FENCED,
        INVALID_TXN_STATE, ...)."""
        s = request_schema(API_END_TXN, END_TXN_VERSION)
        request = s.EndTxnRequest(
            transactional_id=transactional_id,
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            committed=commit,
        )
        what = f"EndTxn({transactional_id}, {'commit' if commit else 'abort'})"
        return _error(self._to_coordinator(transactional_id, what, request).error_code)

    def list_transactions(self, states: Iterable[str] = ()) -> list[ListedTransaction]:
        """Every broker's transactions in `states` (all when empty), as kafka-transactions.sh list asks."""
        request = list_transactions_request(states, version=LIST_TRANSACTIONS_VERSION)
        listed = []
        for address in self._brokers().values():
            answer = self._send(address, request)
            error = _error(answer.error_code)
            if error is not None:
                raise TransactionError(f"ListTransactions at {address}", error)
            listed.extend(
                ListedTransaction(t.transactional_id, int(t.producer_id), t.transaction_state)
                for t in answer.transaction_states
            )
        return listed

    # --- metadata and Produce -----------------------------------------------------------------------------

    def _brokers(self) -> dict[int, str]:
        answer = self._send_to_any(metadata_request((), version=METADATA_VERSION))
        return {int(b.node_id): f"{b.host}:{int(b.port)}" for b in answer.brokers}

    def refresh_metadata(self, topics: Iterable[str]) -> None:
        s_answer = self._send_to_any(metadata_request(sorted(set(topics)), version=METADATA_VERSION))
        brokers = {int(b.node_id): f"{b.host}:{int(b.port)}" for b in s_answer.brokers}
        for topic in s_answer.topics:
            error = _error(topic.error_code)
            if error is not None:
                raise TransactionError(f"metadata of topic {topic.name!r}", error)
            self._partition_counts[topic.name] = len(topic.partitions)
            for p in topic.partitions:
                leader = brokers.get(int(p.leader_id))
                tp = TopicPartition(topic.name, int(p.partition_index))
                if leader is None:
                    self._leaders.pop(tp, None)
                else:
                    self._leaders[tp] = leader

    def partition_count(self, topic: str) -> int:
        if topic not in self._partition_counts:
            self.refresh_metadata([topic])
        return self._partition_counts[topic]

    def produce(
        self, transactional_id: str, batches: Mapping[TopicPartition, bytes], acks: int, timeout_ms: int
    ) -> None:
        """Each partition's transactional batch, acknowledged by its leader (sent again, unchanged, to a new
        leader: the same producer epoch and sequence make the leaders append it once)."""
        pending = dict(batches)
        what = f"Produce({transactional_id})"

        def attempt() -> bool | None:
            by_leader: dict[str, dict[TopicPartition, bytes]] = {}
            for tp, batch in pending.items():
                leader = self._leaders.get(tp)
                if leader is None:
                    self.refresh_metadata([tp.topic])
                    leader = self._leaders.get(tp)
                    if leader is None:
                        raise _Retry(f"{what}: {tp.topic}-{tp.partition} has no leader")
                by_leader.setdefault(leader, {})[tp] = batch
            moved = []
            for leader, those in by_leader.items():
                try:
                    answer = self._send(leader, _produce_request(transactional_id, those, acks, timeout_ms))
                except KafkaConnectionError:
                    moved.extend(those)
                    continue
                for topic in answer.responses:
                    for p in topic.partition_responses:
                        tp = TopicPartition(topic.name, int(p.index))
                        error = _error(p.error_code)
                        if error is None or error == "DUPLICATE_SEQUENCE_NUMBER":
                            pending.pop(tp, None)
                        elif error in LEADER_MOVED:
                            moved.append(tp)
                        else:
                            raise TransactionError(f"{what} to {tp.topic}-{tp.partition}", error)
            if not pending:
                return True
            for tp in moved:
                self._leaders.pop(tp, None)
            raise _Retry(f"{what}: leaders moved for {len(pending)} partitions")

        self._retrying(what, attempt)


class _Retry(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _produce_request(transactional_id: str, batches: Mapping[TopicPartition, bytes], acks: int, timeout_ms: int) -> Any:
    s = request_schema(API_PRODUCE, PRODUCE_VERSION)
    by_topic: dict[str, list[Any]] = {}
    for tp, batch in batches.items():
        by_topic.setdefault(tp.topic, []).append(s.PartitionProduceData(index=tp.partition, records=batch))
    return s.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(
            s.TopicProduceData(name=name, partition_data=tuple(parts)) for name, parts in by_topic.items()
        ),
    )

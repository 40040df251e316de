"""Simulated Kafka clients: producers that send unique values with acks=all and retry the way a client does
(refresh metadata, send again), and consumers that read every partition from offset 0 at the leader.

Both keep partition leaders as Kafka's clients do since KIP-320 (the Java client's Metadata, librdkafka): with
their leader epochs, never taking a leader from metadata older than the newest epoch seen. A consumer fetches
with the leader epoch it knows, so a broker that is not the leader of that epoch refuses (FENCED_LEADER_EPOCH:
refresh metadata; UNKNOWN_LEADER_EPOCH: the broker has not heard yet, try again), and after a leader change
it validates its position with OffsetsForLeaderEpoch before fetching on.

An idempotent producer (enable.idempotence) takes a producer id from the active controller (the voter it takes
for it, another after NOT_CONTROLLER or a timeout), numbers its batches per
partition and sends the very same batch again until it is acknowledged, so every value must end up in the
log exactly once; a plain producer gives a value up after `DELIVERY_ATTEMPTS` and may write it twice.

A transactional writer (`SimTransactionalWriter`) is a transactional producer and its coordinator's marker channel
in one: sequenced transactional batches to every partition, then a COMMIT or ABORT marker appended to each
partition's leader (origin COORDINATOR), retried until acknowledged. A read_committed consumer
(`SimReadCommittedConsumer`) fetches with isolation level 1 and drops aborted records and control batches as Kafka's
consumer does (`read_committed_records`).

They record what they were told (acknowledgements with their offsets, records read with the HW they came
with) in the run's `History`; the invariants judge the cluster by it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch, decode_batches
from tierlog.records.control_batch import (
    ControlRecordType,
    EndTxnMarker,
    build_end_txn_marker_batch,
    control_record_type,
)
from tierlog.replication.fetcher import FetchRequestData, FetchRequestPartition, FetchResponsePartition
from tierlog.replication.replica_manager import AppendResult
from tierlog.sim.broker_node import ConsumerFetchResponse, FetchReply, PartitionLeader, SimBroker
from tierlog.sim.controller_node import NOT_CONTROLLER, ControllerGuess, SimController, active_controller
from tierlog.sim.invariants import History
from tierlog.sim.world import Network, Node, Respond, Simulation
from tierlog.storage.transaction_index import AbortedTxn

REQUEST_TIMEOUT_MS = 30_000
DELIVERY_ATTEMPTS = 20
RETRY_BACKOFF_MS = 100
READ_COMMITTED = 1
# The share of transactions the writer aborts.
ABORT_RATIO = 0.3
# Errors after which Kafka's marker channel (TransactionMarkerRequestCompletionHandler) sends the marker again; any
# other answer to a marker from a coordinator whose epochs never change is a bug.
MARKER_RETRIABLE = frozenset(
    {
        "NOT_LEADER_OR_FOLLOWER",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "REQUEST_TIMED_OUT",
        "KAFKA_STORAGE_ERROR",
    }
)
# Answers to a transactional batch that only a bug explains: the writer's epoch never changes and it starts a
# transaction only after every marker of the previous one was acknowledged.
TXN_BATCH_REFUSALS = frozenset({"INVALID_TXN_STATE", "INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED"})


class SimClient(Node):
    """What both kinds of client share: a cache of partition leaders, refreshed from any broker."""

    def __init__(self, sim: Simulation, network: Network, name: str, brokers: dict[int, SimBroker]) -> None:
        super().__init__(sim, name)
        self._network = network
        self._brokers = brokers
        self.leaders: dict[TopicPartition, PartitionLeader] = {}
        self.last_seen_epochs: dict[TopicPartition, int] = {}
        self.running = True

    def refresh_metadata(self) -> None:
        broker = self._brokers[self.sim.rng.choice(sorted(self._brokers))]

        def on_reply(reply: object) -> None:
            self.update_leaders(reply)  # type: ignore[arg-type]

        self._network.call(self, broker, broker.handle_metadata, on_reply, lambda: None, REQUEST_TIMEOUT_MS)

    def update_leaders(self, answer: Mapping[TopicPartition, PartitionLeader]) -> None:
        """Kafka's Metadata.updateLatestMetadata: a partition's leader is taken from an answer whose leader epoch
        is at least the newest seen; an older one comes from a broker that has not heard of the latest election
        (a deposed leader cut off from the controller among them), so the cached leader stays. A partition the
        answer lacks has no known leader until an answer names one."""
        leaders: dict[TopicPartition, PartitionLeader] = {}
        for tp, leader in answer.items():
            seen = self.last_seen_epochs.get(tp)
            if seen is None or leader.leader_epoch >= seen:
                self.last_seen_epochs[tp] = leader.leader_epoch
                leaders[tp] = leader
            elif tp in self.leaders:
                leaders[tp] = self.leaders[tp]
        self.leaders = leaders

    def leader_of(self, tp: TopicPartition) -> SimBroker | None:
        leader = self.leaders.get(tp)
        return self._brokers.get(leader.leader_id) if leader is not None else None


class SimProducer(SimClient):
    def __init__(
        self,
        sim: Simulation,
        network: Network,
        name: str,
        brokers: dict[int, SimBroker],
        partitions: list[TopicPartition],
        history: History,
        controllers: dict[int, SimController] | None = None,
    ) -> None:
        """With `controllers`, the producer is idempotent: it asks the active controller for its producer id."""
        super().__init__(sim, network, name, brokers)
        self._partitions = partitions
        self._history = history
        self._controllers = controllers
        self._controller_guess = ControllerGuess(list(controllers)) if controllers is not None else None
        self._sequence = 0
        self.producer_id = -1
        self._next_sequence = dict.fromkeys(partitions, 0)

    @property
    def idempotent(self) -> bool:
        return self._controllers is not None

    def on_start(self) -> None:
        self.refresh_metadata()
        if self.idempotent:
            self._init_producer_id()
        else:
            self.after(50, self._send_next)

    def _init_producer_id(self) -> None:
        assert self._controllers is not None and self._controller_guess is not None
        guess = self._controller_guess
        tried = guess.current
        controller = self._controllers[tried]

        def on_reply(reply: object) -> None:
            if reply == NOT_CONTROLLER:
                retry()
                return
            self.producer_id = int(reply)  # type: ignore[call-overload]
            self._send_next()

        def retry() -> None:
            guess.failed(tried)
            self.after(RETRY_BACKOFF_MS, self._init_producer_id)

        self._network.call(self, controller, controller.allocate_producer_id, on_reply, retry, REQUEST_TIMEOUT_MS)

    def _send_next(self) -> None:
        if not self.running:
            return
        tp = self._partitions[self.sim.rng.randrange(len(self._partitions))]
        value = f"{self.name}-{self._sequence}"
        self._sequence += 1
        self._history.invoked(value, idempotent=self.idempotent)
        if self.idempotent:
            batch = build_batch(
                [(None, value.encode(), [], self.sim.now)],
                producer_id=self.producer_id,
                producer_epoch=0,
                base_sequence=self._next_sequence[tp],
            )
        else:
            batch = build_batch([(None, value.encode(), [], self.sim.now)])
        self._send(tp, value, batch, 1)

    def _send(self, tp: TopicPartition, value: str, batch: bytes, attempt: int) -> None:
        leader = self.leader_of(tp)
        if leader is None:
            self._retry(tp, value, batch, attempt)
            return

        def on_reply(reply: object) -> None:
            assert isinstance(reply, AppendResult)
            if reply.error is None:
                assert reply.info is not None
                self._history.acknowledged(tp, reply.info.first_offset, value, self.sim.now)
                self._next_sequence[tp] += 1
                self.after(self.sim.rng.randint(0, 20), self._send_next)
            elif reply.error == "OUT_OF_ORDER_SEQUENCE_NUMBER" and self._is_current_leader(leader, tp):
                # Every batch is retried until acknowledged, so the rightful leader must know the previous one.
                # (A deposed leader that has not heard yet may refuse, as Kafka's would: the retry goes on.)
                self._history.violation(
                    "idempotent producer refused",
                    f"{self.name} {tp} sequence {self._next_sequence[tp]}: {reply.error} {reply.message}",
                )
            else:
                self._retry(tp, value, batch, attempt)

        self._network.call(
            self,
            leader,
            lambda respond: leader.handle_produce(tp, batch, -1, REQUEST_TIMEOUT_MS, respond),
            on_reply,
            lambda: self._retry(tp, value, batch, attempt),
            REQUEST_TIMEOUT_MS + 2000,
        )

    def _is_current_leader(self, broker: SimBroker, tp: TopicPartition) -> bool:
        """The simulator's truth, not the client's view: whether `broker` leads `tp` in the controller's image,
        in the epoch it holds itself. Unknown (no active controller) counts as no."""
        node = active_controller(self._controllers) if self._controllers is not None else None
        if node is None or node.controller is None:
            return False
        topic = node.controller.metadata.topics.get(tp.topic)
        rm = broker.replica_manager
        partition = rm.partitions.get(tp) if rm is not None else None
        if topic is None or partition is None:
            return False
        registration = topic.partitions[tp.partition]
        return registration.leader == broker.broker_id and partition.leader_epoch == registration.leader_epoch

    def _retry(self, tp: TopicPartition, value: str, batch: bytes, attempt: int) -> None:
        """Send the same batch again. A plain producer may then write the value twice, and gives it up after
        `DELIVERY_ATTEMPTS` (its fate stays unknown); an idempotent one keeps trying while it runs."""
        self.refresh_metadata()
        if not self.running:
            return
        if attempt >= DELIVERY_ATTEMPTS and not self.idempotent:
            self.after(RETRY_BACKOFF_MS, self._send_next)
            return
        self.after(RETRY_BACKOFF_MS, lambda: self._send(tp, value, batch, attempt + 1))


@dataclass(slots=True)
class FetchPosition:
    """Kafka's SubscriptionState for one partition: the next offset, the leader epoch of the last record read
    (None before the first), the leader the position belongs to, and whether it awaits validation."""

    offset: int = 0
    offset_epoch: int | None = None
    current_leader: PartitionLeader | None = None
    awaiting_validation: bool = False

    def maybe_validate(self, leader: PartitionLeader) -> None:
        """SubscriptionState.maybeValidatePosition: under a new leader or leader epoch, what was read must be
        checked against the new leader's history before fetching on (nothing read yet: nothing to check)."""
        if leader != self.current_leader:
            self.current_leader = leader
            self.awaiting_validation = self.offset_epoch is not None


class SimConsumer(SimClient):
    """Reads each partition from offset 0, one request at a time, round robin."""

    isolation_level = 0

    def __init__(
        self,
        sim: Simulation,
        network: Network,
        name: str,
        brokers: dict[int, SimBroker],
        partitions: list[TopicPartition],
        history: History,
    ) -> None:
        super().__init__(sim, network, name, brokers)
        self._partitions = partitions
        self._history = history
        self.positions = {tp: FetchPosition() for tp in partitions}
        self._turn = 0

    def on_start(self) -> None:
        self.refresh_metadata()
        self.after(50, self._fetch_next)

    def _fetch_next(self) -> None:
        if not self.running:
            return
        tp = self._partitions[self._turn % len(self._partitions)]
        self._turn += 1
        leader = self.leaders.get(tp)
        broker = self.leader_of(tp)
        if leader is None or broker is None:
            self.refresh_metadata()
            self.after(RETRY_BACKOFF_MS, self._fetch_next)
            return
        position = self.positions[tp]
        position.maybe_validate(leader)
        if position.awaiting_validation:
            self._validate(tp, broker, position)
        else:
            self._fetch(tp, broker, position)

    def _call(self, broker: SimBroker, handle: Callable[[Respond], None], on_reply: Callable[[object], None]) -> None:
        """One request; whatever the answer, the next request follows (a lost one after a metadata refresh)."""

        def answered(reply: object) -> None:
            on_reply(reply)
            self.after(self.sim.rng.randint(0, 20), self._fetch_next)

        def on_failure() -> None:
            self.refresh_metadata()
            self._fetch_next()

        self._network.call(self, broker, handle, answered, on_failure, REQUEST_TIMEOUT_MS)

    def _validate(self, tp: TopicPartition, broker: SimBroker, position: FetchPosition) -> None:
        """KIP-320: ask the leader where the epoch of the last record read ends in its log; before our position
        means records we read are gone from it. Any error: refresh metadata and try again (the Java client's
        OffsetsForLeaderEpochUtils)."""
        offset, offset_epoch, leader = position.offset, position.offset_epoch, position.current_leader
        assert offset_epoch is not None and leader is not None

        def on_reply(reply: object) -> None:
            if not isinstance(reply, tuple):
                self.refresh_metadata()
                return
            if not position.awaiting_validation or (position.offset, position.current_leader) != (offset, leader):
                return  # the position moved on meanwhile
            end_epoch, end_offset = reply
            position.awaiting_validation = False
            if end_epoch < 0 or end_offset < offset:
                self._history.violation(
                    "consumer position beyond the log",
                    f"{self.name} at {tp} offset {offset} (leader epoch {offset_epoch}): {broker.name}, leader in "
                    f"epoch {leader.leader_epoch}, ends epoch {end_epoch} at {end_offset}: committed records are gone",
                )
                if end_epoch >= 0:
                    # A consumer with auto.offset.reset goes back to where the logs diverge (seekValidated).
                    position.offset, position.offset_epoch = end_offset, end_epoch

        self._call(
            broker,
            lambda respond: broker.handle_offsets_for_leader_epoch(tp, leader.leader_epoch, offset_epoch, respond),
            on_reply,
        )

    def _fetch(self, tp: TopicPartition, broker: SimBroker, position: FetchPosition) -> None:
        assert position.current_leader is not None
        offset = position.offset
        request = FetchRequestData(
            replica_id=-1,
            max_wait_ms=100,
            min_bytes=1,
            max_bytes=1 << 20,
            partitions=[
                FetchRequestPartition(
                    tp, uuid.UUID(int=0), offset, position.current_leader.leader_epoch, -1, -1, 1 << 20
                )
            ],
            isolation_level=self.isolation_level,
        )

        def on_reply(reply: object) -> None:
            if isinstance(reply, FetchReply):
                self._on_partition_data(tp, offset, reply.partitions[0])
            else:
                self.refresh_metadata()

        self._call(broker, lambda respond: broker.handle_fetch(request, respond), on_reply)

    def _on_partition_data(self, tp: TopicPartition, offset: int, data: FetchResponsePartition) -> None:
        """The Java client's FetchCollector: a broker that has not heard of our leader epoch yet
        (UNKNOWN_LEADER_EPOCH) is asked again as is; any other refusal sends us to fresh metadata."""
        if data.error is not None:
            if data.error == "OFFSET_OUT_OF_RANGE":
                self._history.violation(
                    "consumer position beyond the log",
                    f"{self.name} at {tp} offset {offset} was told OFFSET_OUT_OF_RANGE: committed records are gone",
                )
            if data.error != "UNKNOWN_LEADER_EPOCH":
                self.refresh_metadata()
            return
        position = self.positions[tp]
        if position.offset != offset or not data.records:
            return  # a reply to an older fetch, or nothing new
        self._take_records(tp, position, data)

    def _take_records(self, tp: TopicPartition, position: FetchPosition, data: FetchResponsePartition) -> None:
        assert data.records is not None
        for batch in decode_batches(bytes(data.records)):
            for record in batch.records:
                if record.offset < position.offset:
                    continue
                value = record.value.decode() if record.value is not None else ""
                self._history.read(self.name, tp, record.offset, value, data.high_watermark, expected=position.offset)
                position.offset = record.offset + 1
                position.offset_epoch = batch.header.partition_leader_epoch


@dataclass(frozen=True, slots=True)
class CommittedRead:
    """What a read_committed consumer takes from one partition's answer: (offset, value) of each record handed
    to the application, where to fetch next, and the leader epoch of the last batch (its position's epoch)."""

    records: list[tuple[int, str]]
    next_offset: int
    last_epoch: int | None


def read_committed_records(data: bytes, fetch_offset: int, aborted: Iterable[AbortedTxn]) -> CommittedRead:
    """Kafka's consumer (CompletedFetch.nextFetchedRecord) under read_committed: the answer's aborted transactions
    in order of first offset; a producer's batches are dropped from its aborted transaction's first offset to its
    ABORT marker; control batches are skipped; records below the fetch offset (the batch that holds it may start
    earlier) are skipped too; the next fetch starts after the last batch."""
    pending = sorted(aborted, key=lambda txn: txn.first_offset)
    aborted_producers: set[int] = set()
    records: list[tuple[int, str]] = []
    next_offset = fetch_offset
    last_epoch: int | None = None
    for batch in decode_batches(data):
        header = batch.header
        last_epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else None
        if header.producer_id >= 0:
            while pending and pending[0].first_offset <= header.last_offset:
                aborted_producers.add(pending.pop(0).producer_id)
            if (
                header.is_control
                and batch.records
                and control_record_type(batch.records[0].key) == ControlRecordType.ABORT
            ):
                aborted_producers.discard(header.producer_id)
            elif header.is_transactional and header.producer_id in aborted_producers:
                next_offset = header.next_offset
                continue
        for record in batch.records:
            if record.offset >= next_offset:
                if not header.is_control:
                    records.append((record.offset, record.value.decode() if record.value is not None else ""))
                next_offset = record.offset + 1
        next_offset = header.next_offset
    return CommittedRead(records, next_offset, last_epoch)


class SimReadCommittedConsumer(SimConsumer):
    """A consumer with isolation.level=read_committed: its fetches read below the LSO and carry the aborted
    transactions, whose records it drops as Kafka's consumer does (`read_committed_records`)."""

    isolation_level = READ_COMMITTED

    def _take_records(self, tp: TopicPartition, position: FetchPosition, data: FetchResponsePartition) -> None:
        assert isinstance(data, ConsumerFetchResponse) and data.records is not None
        if data.aborted_transactions is None:
            self._history.violation(
                "read_committed answer without aborted transactions",
                f"{self.name} {tp} offset {position.offset}: null where Kafka answers a list (transactions.md#fetch)",
            )
        read = read_committed_records(bytes(data.records), position.offset, data.aborted_transactions or ())
        for offset, value in read.records:
            self._history.read_committed(self.name, tp, offset, value, data.last_stable_offset, data.high_watermark)
        if read.next_offset > data.last_stable_offset:
            self._history.violation(
                "read_committed beyond the LSO",
                f"{self.name} {tp}: handed batches up to offset {read.next_offset - 1} with LSO "
                f"{data.last_stable_offset}",
            )
        position.offset = max(position.offset, read.next_offset)
        if read.last_epoch is not None:
            position.offset_epoch = read.last_epoch


class SimTransactionalWriter(SimProducer):
    """A transactional producer and its coordinator's marker channel in one (docs/simulation.md#transactions).

    It takes a producer id from the controller as the idempotent producers do and keeps producer epoch 0. Each
    transaction writes one or two sequenced transactional batches to every partition, one at a time with acks=all,
    each resent as it is until acknowledged; then it decides commit or abort (`ABORT_RATIO`) and has each
    partition's leader append the COMMIT or ABORT marker with origin COORDINATOR and acks=all, resent until
    acknowledged (Kafka's marker channel); only then does the next transaction begin. A marker request is
    handled at most once (`may_duplicate=False`): Kafka's coordinator resends one only after the previous
    attempt failed, and a second copy landing after the next transaction began in that partition would end it
    with the previous one's decision. Once stopped, it finishes the transaction under way (a real coordinator
    would abort it after transaction.timeout.ms)."""

    def __init__(
        self,
        sim: Simulation,
        network: Network,
        name: str,
        brokers: dict[int, SimBroker],
        partitions: list[TopicPartition],
        history: History,
        controllers: dict[int, SimController],
    ) -> None:
        super().__init__(sim, network, name, brokers, partitions, history, controllers)
        self._transactions = 0
        self.in_transaction = False
        self.committed = 0
        self.aborted = 0

    @property
    def done(self) -> bool:
        """Stopped, with no transaction under way."""
        return not self.running and not self.in_transaction

    def _send_next(self) -> None:
        """Begin the next transaction: its batches to the partitions in a random order (each partition at least
        once)."""
        if not self.running:
            self.in_transaction = False
            return
        self._transactions += 1
        txn = f"{self.name}-txn-{self._transactions}"
        rng = self.sim.rng
        order = [tp for tp in self._partitions for _ in range(rng.randint(1, 2))]
        rng.shuffle(order)
        self.in_transaction = True
        self._write(txn, order, 0)

    def _write(self, txn: str, order: list[TopicPartition], index: int) -> None:
        if index == len(order):
            self._end(txn, sorted(set(order)))
            return
        tp = order[index]
        values = [f"{txn}-p{tp.partition}-b{index}-r{i}" for i in range(self.sim.rng.randint(1, 3))]
        self._history.txn_written(txn, tp, values)
        batch = build_batch(
            [(None, value.encode(), [], self.sim.now) for value in values],
            producer_id=self.producer_id,
            producer_epoch=0,
            base_sequence=self._next_sequence[tp],
            transactional=True,
        )

        def acknowledged(reply: AppendResult) -> None:
            assert reply.info is not None
            for i, value in enumerate(values):
                self._history.acknowledged(tp, reply.info.first_offset + i, value, self.sim.now)
            self._next_sequence[tp] += len(values)
            self.after(self.sim.rng.randint(0, 20), lambda: self._write(txn, order, index + 1))

        self._until_acknowledged(tp, f"{txn} batch {index}", batch, False, acknowledged)

    def _end(self, txn: str, partitions: list[TopicPartition]) -> None:
        committed = self.sim.rng.random() >= ABORT_RATIO
        self._history.txn_decided(txn, committed)
        control_type = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
        waiting = set(partitions)
        for tp in partitions:
            marker = bytes(build_end_txn_marker_batch(self.producer_id, 0, EndTxnMarker(control_type, 0), self.sim.now))

            def acknowledged(reply: AppendResult, tp: TopicPartition = tp) -> None:
                assert reply.info is not None
                self._history.txn_marker_acknowledged(txn, tp, reply.info.first_offset)
                waiting.discard(tp)
                if not waiting:
                    self.committed += committed
                    self.aborted += not committed
                    self.after(self.sim.rng.randint(0, 20), self._send_next)

            self._until_acknowledged(tp, f"{txn} {control_type.name} marker", marker, True, acknowledged)

    def _until_acknowledged(
        self,
        tp: TopicPartition,
        what: str,
        batch: bytes,
        marker: bool,
        on_acknowledged: Callable[[AppendResult], None],
    ) -> None:
        """Send `batch` (a transactional batch, or a marker as the coordinator's WriteTxnMarkers) to the leader
        of `tp` as the client knows it, again after any error or timeout, until it is acknowledged."""
        leader = self.leader_of(tp)

        def retry() -> None:
            self.refresh_metadata()
            self.after(RETRY_BACKOFF_MS, lambda: self._until_acknowledged(tp, what, batch, marker, on_acknowledged))

        if leader is None:
            retry()
            return

        def on_reply(reply: object) -> None:
            assert isinstance(reply, AppendResult)
            if reply.error is None:
                on_acknowledged(reply)
                return
            refused = (
                reply.error not in MARKER_RETRIABLE
                if marker
                else reply.error in TXN_BATCH_REFUSALS
                or (reply.error == "OUT_OF_ORDER_SEQUENCE_NUMBER" and self._is_current_leader(leader, tp))
            )
            if refused:
                self._history.violation(
                    "transactional write refused", f"{self.name} {tp} {what}: {reply.error} {reply.message}"
                )
            retry()

        if marker:

            def handle(respond: Respond) -> None:
                leader.handle_write_txn_marker(tp, batch, REQUEST_TIMEOUT_MS, respond)

        else:

            def handle(respond: Respond) -> None:
                leader.handle_produce(tp, batch, -1, REQUEST_TIMEOUT_MS, respond)

        self._network.call(self, leader, handle, on_reply, retry, REQUEST_TIMEOUT_MS + 2000, may_duplicate=not marker)

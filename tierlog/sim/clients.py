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

They record what they were told (acknowledgements with their offsets, records read with the HW they came
with) in the run's `History`; the invariants judge the cluster by it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch, decode_batches
from tierlog.replication.fetcher import FetchRequestData, FetchRequestPartition, FetchResponsePartition
from tierlog.replication.replica_manager import AppendResult
from tierlog.sim.broker_node import PartitionLeader, SimBroker
from tierlog.sim.controller_node import NOT_CONTROLLER, ControllerGuess, SimController, active_controller
from tierlog.sim.invariants import History
from tierlog.sim.world import Network, Node, Respond, Simulation

REQUEST_TIMEOUT_MS = 30_000
DELIVERY_ATTEMPTS = 20
RETRY_BACKOFF_MS = 100


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
        )

        def on_reply(reply: object) -> None:
            if isinstance(reply, list):
                self._on_partition_data(tp, offset, reply[0])
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
        for batch in decode_batches(bytes(data.records)):
            for record in batch.records:
                if record.offset < position.offset:
                    continue
                value = record.value.decode() if record.value is not None else ""
                self._history.read(self.name, tp, record.offset, value, data.high_watermark, expected=position.offset)
                position.offset = record.offset + 1
                position.offset_epoch = batch.header.partition_leader_epoch

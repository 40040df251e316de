"""Simulated Kafka clients: producers that send unique values with acks=all and retry the way a client does
(refresh metadata, send again), and consumers that read every partition from offset 0 at the leader.

An idempotent producer (enable.idempotence) takes a producer id from the controller, numbers its batches per
partition and sends the very same batch again until it is acknowledged, so every value must end up in the
log exactly once; a plain producer gives a value up after `DELIVERY_ATTEMPTS` and may write it twice.

They record what they were told (acknowledgements with their offsets, records read with the HW they came
with) in the run's `History`; the invariants judge the cluster by it.
"""

from __future__ import annotations

import uuid

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch, decode_batches
from tierlog.replication.fetcher import FetchRequestData, FetchRequestPartition, FetchResponsePartition
from tierlog.replication.replica_manager import AppendResult
from tierlog.sim.broker_node import SimBroker
from tierlog.sim.controller_node import SimController
from tierlog.sim.invariants import History
from tierlog.sim.world import Network, Node, Simulation

REQUEST_TIMEOUT_MS = 30_000
DELIVERY_ATTEMPTS = 20
RETRY_BACKOFF_MS = 100


class SimClient(Node):
    """What both kinds of client share: a cache of partition leaders, refreshed from any broker."""

    def __init__(self, sim: Simulation, network: Network, name: str, brokers: dict[int, SimBroker]) -> None:
        super().__init__(sim, name)
        self._network = network
        self._brokers = brokers
        self.leaders: dict[TopicPartition, int] = {}
        self.running = True

    def refresh_metadata(self) -> None:
        broker = self._brokers[self.sim.rng.choice(sorted(self._brokers))]

        def on_reply(reply: object) -> None:
            self.leaders = dict(reply)  # type: ignore[call-overload]

        self._network.call(self, broker, broker.handle_metadata, on_reply, lambda: None, REQUEST_TIMEOUT_MS)

    def leader_of(self, tp: TopicPartition) -> SimBroker | None:
        leader_id = self.leaders.get(tp, -1)
        return self._brokers.get(leader_id)


class SimProducer(SimClient):
    def __init__(
        self,
        sim: Simulation,
        network: Network,
        name: str,
        brokers: dict[int, SimBroker],
        partitions: list[TopicPartition],
        history: History,
        controller: SimController | None = None,
    ) -> None:
        """With `controller`, the producer is idempotent: it asks the controller for its producer id."""
        super().__init__(sim, network, name, brokers)
        self._partitions = partitions
        self._history = history
        self._controller = controller
        self._sequence = 0
        self.producer_id = -1
        self._next_sequence = dict.fromkeys(partitions, 0)

    @property
    def idempotent(self) -> bool:
        return self._controller is not None

    def on_start(self) -> None:
        self.refresh_metadata()
        if self.idempotent:
            self._init_producer_id()
        else:
            self.after(50, self._send_next)

    def _init_producer_id(self) -> None:
        controller = self._controller
        assert controller is not None

        def on_reply(reply: object) -> None:
            self.producer_id = int(reply)  # type: ignore[call-overload]
            self._send_next()

        self._network.call(
            self,
            controller,
            controller.allocate_producer_id,
            on_reply,
            lambda: self.after(RETRY_BACKOFF_MS, self._init_producer_id),
            REQUEST_TIMEOUT_MS,
        )

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
        in the epoch it holds itself. Unknown (controller down) counts as no."""
        controller = self._controller.controller if self._controller is not None else None
        if controller is None or not self._controller.up:  # type: ignore[union-attr]
            return False
        topic = controller.metadata.topics.get(tp.topic)
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


class SimConsumer(SimClient):
    """Reads each partition from offset 0, one fetch at a time, round robin."""

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
        self.positions = dict.fromkeys(partitions, 0)
        self._turn = 0

    def on_start(self) -> None:
        self.refresh_metadata()
        self.after(50, self._fetch_next)

    def _fetch_next(self) -> None:
        if not self.running:
            return
        tp = self._partitions[self._turn % len(self._partitions)]
        self._turn += 1
        leader = self.leader_of(tp)
        if leader is None:
            self.refresh_metadata()
            self.after(RETRY_BACKOFF_MS, self._fetch_next)
            return
        position = self.positions[tp]
        request = FetchRequestData(
            replica_id=-1,
            max_wait_ms=100,
            min_bytes=1,
            max_bytes=1 << 20,
            partitions=[FetchRequestPartition(tp, uuid.UUID(int=0), position, -1, -1, -1, 1 << 20)],
        )

        def on_reply(reply: object) -> None:
            if isinstance(reply, list):
                self._on_partition_data(tp, position, reply[0])
            else:
                self.refresh_metadata()
            self.after(self.sim.rng.randint(0, 20), self._fetch_next)

        def on_failure() -> None:
            self.refresh_metadata()
            self._fetch_next()

        self._network.call(
            self,
            leader,
            lambda respond: leader.handle_fetch(request, respond),
            on_reply,
            on_failure,
            REQUEST_TIMEOUT_MS,
        )

    def _on_partition_data(self, tp: TopicPartition, position: int, data: FetchResponsePartition) -> None:
        if data.error is not None:
            if data.error == "OFFSET_OUT_OF_RANGE":
                self._history.violation(
                    "consumer position beyond the log",
                    f"{self.name} at {tp} offset {position} was told OFFSET_OUT_OF_RANGE: committed records are gone",
                )
            self.refresh_metadata()
            return
        if self.positions[tp] != position or not data.records:
            return  # a reply to an older fetch, or nothing new
        for batch in decode_batches(bytes(data.records)):
            for record in batch.records:
                if record.offset < position:
                    continue
                value = record.value.decode() if record.value is not None else ""
                self._history.read(self.name, tp, record.offset, value, data.high_watermark, expected=position)
                position = record.offset + 1
        self.positions[tp] = position

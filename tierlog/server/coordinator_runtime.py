"""What the group and transaction coordinators' asyncio shells share (Kafka 3.7+'s CoordinatorRuntime).

Each shell owns one compacted internal topic (`__consumer_offsets`, `__transaction_state`) and a core; this is
the machinery around them that does not depend on which:
- the topic is created on demand, one creation at a time, remembering why the last one failed;
- the partitions of the topic this broker leads are found after each metadata image, and each is loaded from
  the local log (`load.buffer.size` bytes at a time, yielding between reads) when the shell elects it;
- a core's write is one batch appended with acks=all through ReplicaManager, answered when the HW passes it or
  the shell's timeout ends, its purgatory deadline armed;
- one asyncio timer is kept at the core's earliest deadline (no polling).
What differs stays in each shell: the topic's configs, how a batch is decoded for its core, how leadership
changes reach the core, metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from tierlog.common import TopicPartition
from tierlog.metadata.image import ClusterMetadata
from tierlog.records.codec import DecodedBatch, decode_batches
from tierlog.replication.replica_manager import AppendResult, ReplicaManager
from tierlog.server.clock import now_ms
from tierlog.storage.producer_state import AppendOrigin

logger = logging.getLogger(__name__)

CreateTopic = Callable[[str, int, int, dict[str, str]], Awaitable[str | None]]
AppendDone = Callable[[str | None, int], None]
Entry = TypeVar("Entry")
Answer = TypeVar("Answer")


@dataclass(frozen=True)
class InternalTopic:
    num_partitions: int
    replication_factor: int
    configs: dict[str, str]
    # The settings that chose the partitions and replication factor, named when creation fails.
    settings: str


class CoordinatorRuntime:
    def __init__(
        self,
        topic: str,
        coordinator_name: str,
        replica_manager: ReplicaManager,
        image: Callable[[], ClusterMetadata],
        create_topic: CreateTopic,
        internal_topic: Callable[[], InternalTopic],
        arm_purgatory_timer: Callable[[int], None],
        append_timeout_ms: int,
        load_buffer_size: int,
        next_deadline_ms: Callable[[], int | None],
        on_timer: Callable[[int], None],
    ) -> None:
        self.topic = topic
        self._coordinator_name = coordinator_name
        self._replica_manager = replica_manager
        self._image = image
        self._create_topic = create_topic
        self._internal_topic = internal_topic
        self._arm_purgatory_timer = arm_purgatory_timer
        self._append_timeout_ms = append_timeout_ms
        self._load_buffer_size = load_buffer_size
        self._next_deadline_ms = next_deadline_ms
        self._on_timer = on_timer
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: int | None = None
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._creating: asyncio.Task[None] | None = None
        # Why the last creation of the topic failed, for the clients that keep asking.
        self._creation_error: str | None = None
        self.stopped = False

    # The topic

    def topic_ready(self, create_task_name: str) -> str | None:
        """None when the topic exists; otherwise start creating it (once at a time) and return why clients must
        retry, as Kafka's FindCoordinator answers COORDINATOR_NOT_AVAILABLE meanwhile."""
        if self.topic in self._image().topics:
            return None
        if not self.stopped and (self._creating is None or self._creating.done()):
            self._creating = asyncio.create_task(self._create(), name=create_task_name)
        return self._creation_error or f"{self.topic} is being created"

    async def _create(self) -> None:
        spec = self._internal_topic()
        try:
            error = await self._create_topic(self.topic, spec.num_partitions, spec.replication_factor, spec.configs)
        except Exception as e:  # the controller may be away; the next FindCoordinator tries again
            error = str(e)
        if error not in (None, "TOPIC_ALREADY_EXISTS"):
            self._creation_error = (
                f"cannot create {self.topic} with {spec.num_partitions} partitions and replication "
                f"factor {spec.replication_factor} ({spec.settings}): {error}"
            )
            logger.warning("%s", self._creation_error)

    def leader_of(self, partition: int) -> int:
        """The broker leading `partition` of the topic, or -1 (no such topic or no leader yet)."""
        topic = self._image().topics.get(self.topic)
        if topic is None or partition >= len(topic.partitions):
            return -1
        return topic.partitions[partition].leader

    # Appends

    def append(
        self,
        partition: int,
        batch: bytearray,
        now: int,
        on_done: AppendDone,
    ) -> None:
        # Every append of a coordinator is Kafka's AppendOrigin.COORDINATOR write (appendForGroup,
        # appendTransactionToLog): the broker built the batch, so the client-batch checks do not apply.
        tp = TopicPartition(self.topic, partition)

        def respond(results: dict[TopicPartition, AppendResult]) -> None:
            result = results.get(tp)
            on_done("UNKNOWN_TOPIC_OR_PARTITION" if result is None else result.error, now_ms())
            self.rearm()

        try:
            delayed = self._replica_manager.append_records(
                {tp: batch}, -1, self._append_timeout_ms, now, respond, origin=AppendOrigin.COORDINATOR
            )
        except Exception as e:
            logger.warning("appending to %s failed: %s", tp, e)
            on_done("UNKNOWN_SERVER_ERROR", now_ms())
            return
        if delayed is not None:
            self._arm_purgatory_timer(delayed.deadline_ms)

    # Leadership and loading

    def leading_partitions(self, image: ClusterMetadata) -> dict[int, int]:
        """The topic's partitions this broker leads after ReplicaManager applied `image`, with their leader epoch."""
        leading: dict[int, int] = {}
        topic = image.topics.get(self.topic)
        if topic is not None:
            for index in range(len(topic.partitions)):
                partition = self._replica_manager.partitions.get(TopicPartition(self.topic, index))
                if partition is not None and partition.is_leader:
                    leading[index] = partition.leader_epoch
        return leading

    def load(
        self,
        index: int,
        task_name: str,
        decode: Callable[[DecodedBatch, int], Iterable[Entry]],
        complete: Callable[[list[Entry]], None],
        follow_log_end: bool,
    ) -> None:
        """Read partition `index` from its log start to its log end offset in a task, `decode` turning each batch
        (and the offset read from, to skip what was read already) into entries, then hand them to `complete`.
        With `follow_log_end` the log end offset is read again before each read (Kafka's loadGroupsAndOffsets),
        so what is appended meanwhile is loaded too; otherwise it is read once (Kafka's TransactionStateManager)."""
        self._loads[index] = asyncio.create_task(
            self._load(index, decode, complete, follow_log_end), name=f"{task_name}-{index}"
        )

    async def _load(
        self,
        index: int,
        decode: Callable[[DecodedBatch, int], Iterable[Entry]],
        complete: Callable[[list[Entry]], None],
        follow_log_end: bool,
    ) -> None:
        tp = TopicPartition(self.topic, index)
        entries: list[Entry] = []
        try:
            log = self._replica_manager.get_partition(tp).log
            offset, end = log.log_start_offset, log.log_end_offset
            while offset < end:
                data = log.read(offset, self._load_buffer_size, end, True).records
                if data is None:
                    break
                for batch in decode_batches(data.read_bytes()):
                    entries.extend(decode(batch, offset))
                    offset = max(offset, batch.header.last_offset + 1)
                await asyncio.sleep(0)
                if follow_log_end:
                    end = log.log_end_offset
        except asyncio.CancelledError:
            raise
        except Exception:
            # The partition stays loading (COORDINATOR_LOAD_IN_PROGRESS) rather than serving partial state.
            logger.exception("loading %s failed", tp)
            return
        finally:
            # A resignation may have cancelled this load and an election started the next one already.
            if self._loads.get(index) is asyncio.current_task():
                del self._loads[index]
        complete(entries)
        self.rearm()

    def cancel_load(self, index: int) -> None:
        task = self._loads.pop(index, None)
        if task is not None:
            task.cancel()

    # The timer

    def rearm(self) -> None:
        """Keep one timer armed at the core's earliest deadline."""
        if self.stopped:
            return
        deadline = self._next_deadline_ms()
        if deadline is None or (self._timer_deadline is not None and self._timer_deadline <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_deadline = deadline
        self._timer = asyncio.get_running_loop().call_later(max(0.0, (deadline - now_ms()) / 1000), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_deadline = None
        try:
            self._on_timer(now_ms())
        except Exception:
            logger.exception("%s timer failed", self._coordinator_name)
        self.rearm()

    def stop(self) -> None:
        """At shutdown: no more timers, loads or creations; the shell then resigns its partitions."""
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self._loads.values():
            task.cancel()
        if self._creating is not None:
            self._creating.cancel()


async def parked(call: Callable[[Callable[[Answer], None]], None], after_call: Callable[[], None]) -> Answer:
    """Call into a coordinator core with a callback and wait for its answer (at once, or when the core answers
    later); `after_call` re-arms the shell's timer, as the call may have moved the core's earliest deadline."""
    answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

    def respond(result: Answer) -> None:
        if not answered.done():
            answered.set_result(result)

    call(respond)
    after_call()
    return await answered

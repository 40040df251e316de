"""A broker as a simulated node: the broker's core on the simulated disk, with the simulated network in place of
sockets and virtual timers in place of asyncio's.

Every step the asyncio shell (`tierlog/server/`) takes is a state machine of the core that this node drives
exactly as the shell does: it asks each for its next request (`poll`), carries that over the network and hands
the answer back. `BrokerLifecycleManager` registers and heartbeats, `MetadataLoader` follows the metadata log and
says when to publish, `BrokerMetadataPublisher` loads the logs and applies the image, each `ReplicaFetcher`
fetches from its leader, `AlterPartitionManager` sends ISR changes, and the leader answers fetches through
`fetch_messages_for_request`. Requests for the controller go to the voter the broker takes for the active one
(`ControllerGuess`), and to another after NOT_CONTROLLER or a timeout; the metadata comes from Raft Fetch
requests as an observer (replica id = broker id), which the leader answers with committed records only. What
is this node's own is the world: the timers (purgatory deadlines, ISR expiration, checkpoints, flushes), the
messages, and what a crash or a power loss does to the files.

A process crash (SIGKILL) closes the files without writing anything; a power loss also cuts every log back
to its recovery point, the last offset Kafka's flush made durable, keeping a torn part of the next write
sometimes (a log loses a suffix: files of one log are not modelled as written back out of order).
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tierlog.common import Idle, TopicPartition
from tierlog.controller.metadata_log import decode_metadata_batches
from tierlog.metadata.lifecycle import BrokerLifecycleManager, BrokerRegistrationRequest
from tierlog.metadata.loader import MetadataBatches, MetadataLoader
from tierlog.metadata.records import Endpoint, decode_record
from tierlog.raft.messages import (
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    OffsetAndEpoch,
    RaftFetchRequest,
    RaftFetchResponse,
)
from tierlog.raft.snapshot import parse_snapshot
from tierlog.records.record_batch import complete_batches, read_header
from tierlog.replication.alter_partition_manager import AlterPartitionAnswer, AlterPartitionManager
from tierlog.replication.fetch_request import fetch_messages_for_request
from tierlog.replication.fetch_session import FetchManager, FetchSessionCache
from tierlog.replication.fetcher import FetcherConfig, FetchRequestData, FetchResponsePartition, ListOffsetsRequest
from tierlog.replication.metadata_publisher import BrokerMetadataPublisher
from tierlog.replication.replica_manager import AppendResult, FetchPartitionResult, ReplicaManager, error_name_of
from tierlog.sim.controller_node import NOT_CONTROLLER, ControllerGuess, SimController
from tierlog.sim.invariants import QuorumChecker
from tierlog.sim.world import Network, Node, Respond, Simulation
from tierlog.storage.log_manager import LogManager
from tierlog.storage.producer_state import AppendOrigin
from tierlog.storage.transaction_index import AbortedTxn

NOT_SERVING = "NOT_SERVING"


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    """A partition's leader and leader epoch, as a Metadata response carries them (leader -1: none)."""

    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Kafka's defaults, except the lag and checkpoint intervals, shortened so a minute of virtual time sees ISR
    shrinks and recovery-point checkpoints, and the request timeouts, which are the simulated connections'."""

    heartbeat_interval_ms: int = 2000
    controller_request_timeout_ms: int = 5000
    replica_socket_timeout_ms: int = 30_000
    replica_lag_time_max_ms: int = 10_000
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_backoff_ms: int = 1000
    high_watermark_checkpoint_interval_ms: int = 5000
    recovery_point_checkpoint_interval_ms: int = 10_000
    flush_check_interval_ms: int = 1000
    fetch_max_bytes: int = 57_671_680
    max_incremental_fetch_session_cache_slots: int = 1000
    min_incremental_fetch_session_eviction_ms: int = 120_000


@dataclass(frozen=True, slots=True)
class ConsumerFetchResponse(FetchResponsePartition):
    """A partition of a consumer's Fetch answer: what a follower gets, and the last stable offset and, for
    read_committed (isolation level 1), the aborted transactions of what was read (None otherwise), as Fetch v4+
    carries them (docs/transactions.md#fetch)."""

    last_stable_offset: int
    aborted_transactions: tuple[AbortedTxn, ...] | None


@dataclass(frozen=True, slots=True)
class FetchReply:
    """A Fetch answer as the wire carries it: the session error and id (docs/performance.md#fetch-sessions), then
    the partitions answered."""

    error: str | None
    session_id: int
    partitions: list[FetchResponsePartition]


def to_fetch_response(result: FetchPartitionResult, *, consumer: bool) -> FetchResponsePartition:
    """What the wire would carry: the bytes are read now, as the leader's sendfile would."""
    read = result.read
    if read is None:
        if consumer:
            return ConsumerFetchResponse(result.topic_partition, result.error, -1, -1, None, None, -1, None)
        return FetchResponsePartition(result.topic_partition, result.error, -1, -1, None, None)
    records = read.records.read_bytes() if read.records is not None else None
    if consumer:
        aborted = tuple(read.aborted_transactions) if read.aborted_transactions is not None else None
        return ConsumerFetchResponse(
            result.topic_partition,
            None,
            read.high_watermark,
            read.log_start_offset,
            read.diverging_epoch,
            records,
            read.last_stable_offset,
            aborted,
        )
    return FetchResponsePartition(
        result.topic_partition, None, read.high_watermark, read.log_start_offset, read.diverging_epoch, records
    )


class SimBroker(Node):
    def __init__(
        self,
        sim: Simulation,
        network: Network,
        broker_id: int,
        data_dir: Path,
        controllers: dict[int, SimController],
        peers: dict[int, SimBroker],
        settings: BrokerSettings,
        log_defaults: dict[str, str],
        quorum_checker: QuorumChecker,
    ) -> None:
        super().__init__(sim, f"broker-{broker_id}")
        self.broker_id = broker_id
        self.data_dir = data_dir
        self._network = network
        self._controllers = controllers
        self._controller_guess = ControllerGuess(list(controllers))
        self._quorum_checker = quorum_checker
        # The epoch of the last metadata batch received: the next fetch's LastFetchedEpoch.
        self._peers = peers
        self.settings = settings
        self._log_defaults = log_defaults
        self.loader = MetadataLoader()
        self.lifecycle: BrokerLifecycleManager | None = None
        self.log_manager: LogManager | None = None
        self.replica_manager: ReplicaManager | None = None
        self.fetch_manager: FetchManager | None = None
        self.publisher: BrokerMetadataPublisher | None = None
        self.alter_partitions: AlterPartitionManager | None = None
        self._fetcher_loops: set[int] = set()

    # Life cycle

    def on_start(self) -> None:
        self.loader = MetadataLoader()
        self._controller_guess = ControllerGuess(list(self._controllers))
        self.lifecycle = self._lifecycle_manager()
        self.log_manager = LogManager([self.data_dir], self._log_defaults, new_uuid=self.sim.new_uuid)
        t = self.settings
        self.replica_manager = ReplicaManager(
            self.broker_id,
            self.log_manager,
            replica_lag_time_max_ms=t.replica_lag_time_max_ms,
            fetcher_config=FetcherConfig(
                replica_id=self.broker_id,
                max_wait_ms=t.replica_fetch_wait_max_ms,
                backoff_ms=t.replica_fetch_backoff_ms,
            ),
        )
        self.publisher = BrokerMetadataPublisher(self.replica_manager)
        # Fetch sessions live in memory: a restart forgets them, and fetchers fall back to full fetches.
        self.fetch_manager = FetchManager(
            FetchSessionCache(
                t.max_incremental_fetch_session_cache_slots,
                t.min_incremental_fetch_session_eviction_ms,
                # A stream of its own, so session ids never shift the fault schedule.
                random.Random(f"{self.sim.seed}/fetch-sessions/{self.broker_id}/{self.sim.now}"),
            ),
            self._topic_name,
        )
        self.alter_partitions = AlterPartitionManager(self.broker_id, self.replica_manager)
        self._fetcher_loops = set()
        self._drive_lifecycle()
        self._follow_metadata()
        self.every(t.high_watermark_checkpoint_interval_ms, self._with_logs(LogManager.checkpoint_high_watermarks))
        self.every(t.recovery_point_checkpoint_interval_ms, self._with_logs(LogManager.checkpoint_recovery_points))
        self.every(t.flush_check_interval_ms, self._with_logs(lambda m: m.flush_dirty_logs(self.sim.now)))
        self.every(t.replica_lag_time_max_ms // 2, self._shrink_isrs)

    def on_crash(self) -> None:
        """SIGKILL: every file is closed without another byte written."""
        if self.log_manager is not None:
            for log in self.log_manager.all_logs():
                log.close_handlers()
        self.lifecycle = None
        self.log_manager = None
        self.replica_manager = None
        self.fetch_manager = None
        self.publisher = None
        self.alter_partitions = None

    def _topic_name(self, topic_id: uuid.UUID) -> str | None:
        topic = self.loader.image.topic_by_id(topic_id)
        return topic.name if topic is not None else None

    @property
    def serving(self) -> bool:
        """Whether this broker has loaded its logs (the asyncio shell opens its client port only after that)."""
        return self.publisher is not None and self.publisher.logs_loaded

    def lose_power(self) -> list[str]:
        """Crash, and lose what was not fsynced: each log keeps its bytes up to its recovery point (the offset
        Kafka's flush made durable) and, half the time, a torn prefix of what followed; segment files created
        after that point are gone. Returns what was cut, for the run's story."""
        truncations: list[tuple[Path, int]] = []
        removals: list[Path] = []
        if self.log_manager is not None:
            rng = self.sim.rng
            for log in self.log_manager.all_logs():
                recovery_point = log.recovery_point
                if recovery_point >= log.log_end_offset:
                    continue  # all of it was flushed
                cut = False
                for segment in log.segments:
                    if cut:
                        removals.append(segment.log_path)
                        continue
                    if segment.base_offset >= recovery_point:
                        durable = 0
                    else:
                        batch = segment.translate_offset(recovery_point)
                        if batch is None:
                            continue  # the recovery point lies in a later segment
                        durable = batch.position
                    cut = True
                    size = os.stat(segment.log_path).st_size
                    keep = durable if rng.random() < 0.5 else rng.randint(durable, size)
                    truncations.append((segment.log_path, keep))
        self.crash()
        story = []
        for path, keep in truncations:
            os.truncate(path, keep)
            story.append(f"{path.parent.name}/{path.name} cut to {keep} bytes")
        for path in removals:
            for sibling in path.parent.glob(path.stem + ".*"):
                sibling.unlink()
            story.append(f"{path.parent.name}/{path.name} lost")
        return story

    def _with_logs(self, action: Callable[[LogManager], object]) -> Callable[[], None]:
        def run() -> None:
            if self.log_manager is not None and self.serving:
                action(self.log_manager)

        return run

    # Registration, heartbeats, metadata

    def _lifecycle_manager(self) -> BrokerLifecycleManager:
        """A new process: a new incarnation, and no cluster id on its disk (the simulator writes no
        meta.properties), so it joins the simulated cluster."""
        return BrokerLifecycleManager(
            self.broker_id,
            self.sim.new_uuid(),
            "",
            [Endpoint("PLAINTEXT", self.name, 9092)],
            None,
            self.loader,
            heartbeat_interval_ms=self.settings.heartbeat_interval_ms,
        )

    @property
    def fenced(self) -> bool:
        return self.lifecycle is None or self.lifecycle.fenced

    def _call_controller(
        self,
        handle: Callable[[SimController, Respond], None],
        on_answer: Callable[[object], None],
        on_failure: Callable[[], None],
        timeout_ms: int,
    ) -> None:
        """A request to the voter taken for the active controller. NOT_CONTROLLER or no answer in time: the next
        request goes to another voter, and this one fails as an unanswered request does (the caller retries),
        as Kafka's controller channel does."""
        tried = self._controller_guess.current
        controller = self._controllers[tried]

        def on_reply(reply: object) -> None:
            if reply == NOT_CONTROLLER:
                failed()
            else:
                on_answer(reply)

        def failed() -> None:
            self._controller_guess.failed(tried)
            on_failure()

        self._network.call(self, controller, lambda respond: handle(controller, respond), on_reply, failed, timeout_ms)

    def _drive_lifecycle(self) -> None:
        """Carry the lifecycle manager's registration and heartbeats (`BrokerLifecycleManager.poll`) to the
        controller and the answers back."""
        lifecycle = self.lifecycle
        assert lifecycle is not None
        action = lifecycle.poll(self.sim.now)
        if isinstance(action, Idle):
            self.after(action.until_ms - self.sim.now, self._drive_lifecycle)
            return

        def on_failure() -> None:
            lifecycle.on_request_failed("no answer in time", self.sim.now)
            self._drive_lifecycle()

        if isinstance(action, BrokerRegistrationRequest):
            registration = action

            def on_registration(reply: object) -> None:
                if isinstance(reply, str):
                    lifecycle.on_registration_refused(reply, self.sim.now)
                elif lifecycle.on_registration_response(int(reply), self.sim.now):  # type: ignore[call-overload]
                    self._publish()
                self._drive_lifecycle()

            self._call_controller(
                lambda controller, respond: controller.register(registration, respond),
                on_registration,
                on_failure,
                self.settings.controller_request_timeout_ms,
            )
        else:
            heartbeat = action

            def on_heartbeat(reply: object) -> None:
                if isinstance(reply, str):
                    lifecycle.on_heartbeat_refused(reply, self.sim.now)
                else:
                    lifecycle.on_heartbeat_response(reply.is_fenced, self.sim.now)  # type: ignore[attr-defined]
                self._drive_lifecycle()

            self._call_controller(
                lambda controller, respond: controller.heartbeat(heartbeat, respond),
                on_heartbeat,
                on_failure,
                self.settings.controller_request_timeout_ms,
            )

    def _follow_metadata(self) -> None:
        """Carry the metadata loader's fetches (`MetadataLoader.poll`) to the active controller as an observer's
        Raft Fetch, and its answers back."""
        action = self.loader.poll(self.sim.now)
        if isinstance(action, Idle):
            self.after(action.until_ms - self.sim.now, self._follow_metadata)
            return
        guess = self._controller_guess
        tried = guess.current
        controller = self._controllers[tried]
        request = RaftFetchRequest(
            replica_id=self.broker_id,
            current_leader_epoch=guess.leader_epoch,
            fetch_offset=action.offset,
            last_fetched_epoch=action.last_fetched_epoch,
            max_wait_ms=action.max_wait_ms,
        )

        def on_reply(reply: object) -> None:
            assert isinstance(reply, RaftFetchResponse)
            named_leader = guess.hint(reply.leader_id, reply.leader_epoch)
            if reply.error is not None:
                # FENCED_LEADER_EPOCH from the leader names itself: ask it again, with its epoch.
                if not named_leader:
                    guess.failed(tried)
                self.loader.on_fetch_failed(self.sim.now)
            elif reply.snapshot_id is not None:
                # The offset is gone from the leader's log: load its snapshot first, then fetch after it.
                self._fetch_snapshot(controller, reply.snapshot_id, reply.high_watermark, bytearray())
                return
            elif self._take_metadata(request, reply):
                self._publish()
            self._follow_metadata()

        def on_failure() -> None:
            guess.failed(tried)
            self.loader.on_fetch_failed(self.sim.now)
            self._follow_metadata()

        self._network.call(
            self,
            controller,
            lambda respond: controller.handle_raft(request, respond),
            on_reply,
            on_failure,
            self.settings.controller_request_timeout_ms + request.max_wait_ms,
        )

    def _fetch_snapshot(
        self, controller: SimController, snapshot_id: OffsetAndEpoch, high_watermark: int, data: bytearray
    ) -> None:
        """FetchSnapshot from `controller` chunk by chunk, then hand the snapshot to the loader; any failure (the
        leader moved on to a newer snapshot, no answer) is a failed metadata fetch, retried after the backoff."""
        guess = self._controller_guess
        request = FetchSnapshotRequest(self.broker_id, guess.leader_epoch, snapshot_id, len(data))

        def on_reply(reply: object) -> None:
            assert isinstance(reply, FetchSnapshotResponse)
            if reply.error is not None or reply.position != len(data):
                self.loader.on_fetch_failed(self.sim.now)
                self._follow_metadata()
                return
            data.extend(reply.data)
            if len(data) < reply.size:
                self._fetch_snapshot(controller, snapshot_id, high_watermark, data)
                return
            records = [decode_record(value) for value in parse_snapshot(snapshot_id, bytes(data)).values]
            self._quorum_checker.check_snapshot(self.name, snapshot_id.offset, records)
            if self.loader.on_snapshot(records, snapshot_id.offset, high_watermark):
                self._publish()
            self._follow_metadata()

        def on_failure() -> None:
            self.loader.on_fetch_failed(self.sim.now)
            self._follow_metadata()

        self._network.call(
            self,
            controller,
            lambda respond: controller.handle_raft(request, respond),
            on_reply,
            on_failure,
            self.settings.controller_request_timeout_ms,
        )

    def _take_metadata(self, request: RaftFetchRequest, response: RaftFetchResponse) -> bool:
        """Fold the committed records of a Fetch response into the loader's image; True if it is to be published
        now."""
        data = response.records
        headers = [read_header(data, position) for position, _ in complete_batches(data)]
        self._quorum_checker.check_observer_fetch(self.name, request.fetch_offset, response, headers)
        batches = decode_metadata_batches(data, request.fetch_offset)
        records = [r for r in batches.records if r[0] >= request.fetch_offset]
        return self.loader.on_records(
            MetadataBatches(records, batches.next_offset, batches.last_epoch), response.high_watermark
        )

    def _publish(self) -> None:
        """The broker's side of a published image: the core's publisher, then a fetch loop for each new leader."""
        assert self.publisher is not None and self.replica_manager is not None
        self.publisher.publish(self.loader.image, self.sim.now)
        for leader_id in list(self.replica_manager.fetchers):
            if leader_id not in self._fetcher_loops:
                self._fetcher_loops.add(leader_id)
                self._fetch_from(leader_id)
        self._send_alter_partitions()

    # Follower side: one fetch loop per leader broker

    def _fetch_from(self, leader_id: int) -> None:
        """Carry the requests of the fetcher for `leader_id` (`ReplicaFetcher.poll`) to that leader and its
        answers back, one at a time, for as long as this broker follows a partition it leads."""
        rm = self.replica_manager
        fetcher = rm.fetchers.get(leader_id) if rm is not None else None
        if fetcher is None:
            self._fetcher_loops.discard(leader_id)
            return
        leader = self._peers[leader_id]
        action = fetcher.poll(self.sim.now)
        if isinstance(action, Idle):
            self.after(action.until_ms - self.sim.now, lambda: self._fetch_from(leader_id))
            return

        def failed() -> None:
            fetcher.on_fetch_failed(self.sim.now)
            self._fetch_from(leader_id)

        if isinstance(action, FetchRequestData):
            request = action

            def on_response(reply: object) -> None:
                if not isinstance(reply, FetchReply):
                    failed()
                    return
                if reply.error is not None:
                    fetcher.on_fetch_session_error(reply.error, self.sim.now)
                else:
                    fetcher.process_fetch_response(reply.partitions, self.sim.now, session_id=reply.session_id)
                self._send_alter_partitions()
                self._fetch_from(leader_id)

            self._network.call(
                self,
                leader,
                lambda respond: leader.handle_fetch(request, respond),
                on_response,
                failed,
                self.settings.replica_socket_timeout_ms + request.max_wait_ms,
            )
        elif isinstance(action, ListOffsetsRequest):
            tp, timestamps = action.topic_partition, action.timestamps

            def on_offsets(reply: object) -> None:
                if isinstance(reply, str):
                    fetcher.on_list_offsets_failed(tp, reply, self.sim.now)
                else:
                    fetcher.on_list_offsets(tp, reply, self.sim.now)  # type: ignore[arg-type]
                self._fetch_from(leader_id)

            self._network.call(
                self,
                leader,
                lambda respond: leader.handle_list_offsets(self.broker_id, tp, timestamps, respond),
                on_offsets,
                failed,
                self.settings.replica_socket_timeout_ms,
            )
        else:
            # The simulated cluster has no remote tier, so no partition ever needs its remote log state.
            fetcher.on_remote_log_aux_state_failed(action.topic_partition, "no remote tier", self.sim.now)
            self._fetch_from(leader_id)

    # Leader side: requests from followers and clients

    def handle_fetch(self, request: FetchRequestData, respond: Respond) -> None:
        rm = self.replica_manager
        if rm is None or not self.serving:
            respond(NOT_SERVING)
            return
        assert self.fetch_manager is not None
        delayed = fetch_messages_for_request(
            rm,
            self.fetch_manager,
            request,
            self.sim.now,
            lambda answer: respond(
                FetchReply(
                    answer.error,
                    answer.session_id,
                    [to_fetch_response(r, consumer=request.replica_id < 0) for _, r in answer.partitions],
                )
            ),
            fetch_max_bytes=self.settings.fetch_max_bytes,
        )
        if delayed is not None:
            self.after(delayed.deadline_ms - self.sim.now, lambda: rm.fetch_purgatory.expire(self.sim.now))
        self._send_alter_partitions()

    def handle_list_offsets(
        self, replica_id: int, tp: TopicPartition, timestamps: tuple[int, ...], respond: Respond
    ) -> None:
        """ListOffsets from replica `replica_id`: (offset, leader epoch) at each timestamp, or the error."""
        rm = self.replica_manager
        if rm is None or not self.serving:
            respond(NOT_SERVING)
            return
        answers = []
        for timestamp in timestamps:
            try:
                found = rm.fetch_offset_for_timestamp(
                    tp, timestamp, isolation_level=0, current_leader_epoch=-1, replica_id=replica_id
                )
            except Exception as error:
                respond(error_name_of(error))
                return
            answers.append((found.offset, found.leader_epoch) if found is not None else (-1, -1))
        respond(answers)

    def handle_produce(self, tp: TopicPartition, records: bytes, acks: int, timeout_ms: int, respond: Respond) -> None:
        rm = self.replica_manager
        if rm is None or not self.serving:
            respond(AppendResult(error="NOT_LEADER_OR_FOLLOWER"))
            return
        delayed = rm.append_records({tp: bytearray(records)}, acks, timeout_ms, self.sim.now, lambda r: respond(r[tp]))
        if delayed is not None:
            self.after(timeout_ms, lambda: rm.produce_purgatory.expire(self.sim.now))
        self._send_alter_partitions()

    def handle_write_txn_marker(self, tp: TopicPartition, marker: bytes, timeout_ms: int, respond: Respond) -> None:
        """One partition of a WriteTxnMarkers request: the marker batch appended as leader with origin COORDINATOR
        and acks=all, answered once the HW passes it (docs/transactions.md#write-txn-markers); the answer is the
        append's `AppendResult`."""
        rm = self.replica_manager
        if rm is None or not self.serving:
            respond(AppendResult(error="NOT_LEADER_OR_FOLLOWER"))
            return
        delayed = rm.append_records(
            {tp: bytearray(marker)},
            -1,
            timeout_ms,
            self.sim.now,
            lambda r: respond(r[tp]),
            origin=AppendOrigin.COORDINATOR,
        )
        if delayed is not None:
            self.after(timeout_ms, lambda: rm.produce_purgatory.expire(self.sim.now))
        self._send_alter_partitions()

    def handle_offsets_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int, respond: Respond
    ) -> None:
        """OffsetsForLeaderEpoch from a consumer validating its position: (epoch, end offset) or an error name."""
        rm = self.replica_manager
        if rm is None or not self.serving:
            respond(NOT_SERVING)
            return
        try:
            respond(rm.get_partition(tp).last_offset_for_leader_epoch(current_leader_epoch, leader_epoch))
        except Exception as error:
            respond(error_name_of(error))

    def handle_metadata(self, respond: Respond) -> None:
        """Metadata for clients: each partition's leader and leader epoch as this broker's image has them."""
        leaders = {
            TopicPartition(name, index): PartitionLeader(registration.leader, registration.leader_epoch)
            for name, topic in self.loader.image.topics.items()
            for index, registration in enumerate(topic.partitions)
        }
        respond(leaders)

    # ISR changes

    def _shrink_isrs(self) -> None:
        if self.replica_manager is not None:
            self.replica_manager.maybe_shrink_isr(self.sim.now)
            self._send_alter_partitions()

    def _send_alter_partitions(self) -> None:
        """Carry the AlterPartitionManager's next request, if it has one, to the controller and the answers back."""
        manager, lifecycle = self.alter_partitions, self.lifecycle
        if manager is None or lifecycle is None:
            return
        request = manager.poll(lifecycle.broker_epoch)
        if request is None:
            return

        def on_reply(reply: object) -> None:
            if isinstance(reply, str):
                refused = AlterPartitionAnswer(None, reply)
                manager.on_response({p.topic_partition: refused for p in request.proposals}, self.sim.now)
            else:
                manager.on_response(reply, self.sim.now)  # type: ignore[arg-type]
            self._send_alter_partitions()

        def on_failure() -> None:
            manager.on_request_failed("no answer in time", self.sim.now)
            self._send_alter_partitions()

        self._call_controller(
            lambda controller, respond: controller.alter_partition(request, respond),
            on_reply,
            on_failure,
            self.settings.controller_request_timeout_ms,
        )

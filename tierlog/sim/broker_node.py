"""A broker as a simulated node: the real LogManager, ReplicaManager, Partitions and ReplicaFetchers on the
simulated disk, driven by the same steps as the asyncio shell in `tierlog/server/` (register, follow the
metadata log, publish the image once caught up with its own registration, heartbeat, fetch from leaders,
send ISR changes, expire purgatories, checkpoint and flush on timers).

A process crash (SIGKILL) closes the files without writing anything; a power loss also cuts every log back
to its recovery point, the last offset Kafka's flush made durable, keeping a torn part of the next write
sometimes (a log loses a suffix: files of one log are not modelled as written back out of order).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import Endpoint
from tierlog.replication.fetcher import FetcherConfig, FetchRequestData, FetchResponsePartition
from tierlog.replication.replica_manager import (
    AppendResult,
    FetchParams,
    FetchPartitionResult,
    PartitionFetchInfo,
    ReplicaManager,
    error_name_of,
)
from tierlog.sim.controller_node import SimController
from tierlog.sim.world import Network, Node, Respond, Simulation
from tierlog.storage.log_manager import LogManager

NOT_SERVING = "NOT_SERVING"


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    """A partition's leader and leader epoch, as a Metadata response carries them (leader -1: none)."""

    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerTiming:
    """Kafka's defaults, except the lag and checkpoint intervals, shortened so a minute of virtual time
    sees ISR shrinks and recovery-point checkpoints."""

    heartbeat_interval_ms: int = 2000
    fenced_heartbeat_interval_ms: int = 100
    controller_request_timeout_ms: int = 5000
    replica_socket_timeout_ms: int = 30_000
    replica_lag_time_max_ms: int = 10_000
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_backoff_ms: int = 1000
    high_watermark_checkpoint_interval_ms: int = 5000
    recovery_point_checkpoint_interval_ms: int = 10_000
    flush_check_interval_ms: int = 1000
    retry_backoff_ms: int = 200


def to_fetch_response(result: FetchPartitionResult) -> FetchResponsePartition:
    """What the wire would carry: the bytes are read now, as the leader's sendfile would."""
    read = result.read
    if read is None:
        return FetchResponsePartition(result.topic_partition, result.error, -1, -1, None, None)
    records = read.records.read_bytes() if read.records is not None else None
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
        controller: SimController,
        peers: dict[int, SimBroker],
        timing: BrokerTiming,
        log_defaults: dict[str, str],
    ) -> None:
        super().__init__(sim, f"broker-{broker_id}")
        self.broker_id = broker_id
        self.data_dir = data_dir
        self._network = network
        self._controller = controller
        self._peers = peers
        self.timing = timing
        self._log_defaults = log_defaults
        self.image = ClusterMetadata()
        self.broker_epoch = -1
        self.fenced = True
        self.log_manager: LogManager | None = None
        self.replica_manager: ReplicaManager | None = None
        self._fetcher_loops: set[int] = set()
        self._metadata_high_watermark = 0

    # Life cycle

    def on_start(self) -> None:
        self.image = ClusterMetadata()
        self.broker_epoch = -1
        self.fenced = True
        self.log_manager = None
        self.replica_manager = None
        self._fetcher_loops = set()
        self._metadata_high_watermark = 0
        self._register()
        self._fetch_metadata()
        t = self.timing
        self.every(t.high_watermark_checkpoint_interval_ms, self._with_logs(LogManager.checkpoint_high_watermarks))
        self.every(t.recovery_point_checkpoint_interval_ms, self._with_logs(LogManager.checkpoint_recovery_points))
        self.every(t.flush_check_interval_ms, self._with_logs(lambda m: m.flush_dirty_logs(self.sim.now)))
        self.every(t.replica_lag_time_max_ms // 2, self._shrink_isrs)

    def on_crash(self) -> None:
        """SIGKILL: every file is closed without another byte written."""
        if self.log_manager is not None:
            for log in self.log_manager.all_logs():
                log.close_handlers()
        self.log_manager = None
        self.replica_manager = None

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
            if self.log_manager is not None:
                action(self.log_manager)

        return run

    # Registration, heartbeats, metadata

    def _register(self) -> None:
        incarnation_id = f"broker-{self.broker_id}-incarnation-{self.incarnation}"
        endpoints = [Endpoint("PLAINTEXT", self.name, 9092)]
        self._network.call(
            self,
            self._controller,
            lambda respond: self._controller.register(self.broker_id, incarnation_id, endpoints, respond),
            self._on_registered,
            lambda: self.after(self.timing.retry_backoff_ms, self._register),
            self.timing.controller_request_timeout_ms,
        )

    def _on_registered(self, reply: object) -> None:
        if not isinstance(reply, int):
            self.after(self.timing.retry_backoff_ms, self._register)
            return
        self.broker_epoch = reply
        self._maybe_publish()
        self._heartbeat()

    def _heartbeat(self) -> None:
        epoch = self.broker_epoch

        def on_reply(reply: object) -> None:
            if isinstance(reply, str):
                # STALE_BROKER_EPOCH or BROKER_ID_NOT_REGISTERED: the controller forgot us; register again.
                self._register()
                return
            self.fenced = reply.is_fenced  # type: ignore[attr-defined]
            self._next_heartbeat()

        self._network.call(
            self,
            self._controller,
            lambda respond: self._controller.heartbeat(self.broker_id, epoch, self.image.offset, respond),
            on_reply,
            self._next_heartbeat,
            self.timing.controller_request_timeout_ms,
        )

    def _next_heartbeat(self) -> None:
        t = self.timing
        self.after(t.fenced_heartbeat_interval_ms if self.fenced else t.heartbeat_interval_ms, self._heartbeat)

    def _fetch_metadata(self) -> None:
        def on_reply(reply: object) -> None:
            records, high_watermark = reply  # type: ignore[misc]
            for offset, record in records:
                if offset > self.image.offset:
                    self.image.apply(offset, record)
            self._metadata_high_watermark = high_watermark
            if records:
                self._maybe_publish()
            self._fetch_metadata()

        self._network.call(
            self,
            self._controller,
            lambda respond: self._controller.fetch_metadata(self.image.offset + 1, respond),
            on_reply,
            lambda: self.after(self.timing.retry_backoff_ms, self._fetch_metadata),
            self.timing.controller_request_timeout_ms,
        )

    def _maybe_publish(self) -> None:
        """The metadata loader's rule: publish only once caught up with the log and past our registration."""
        if self.broker_epoch < 0 or self.image.offset < self.broker_epoch:
            return
        if self.image.offset + 1 < self._metadata_high_watermark:
            return
        now = self.sim.now
        if self.replica_manager is None:
            self.log_manager = LogManager([self.data_dir], self._log_defaults, new_uuid=self.sim.new_uuid)
            configs = {name: topic.configs for name, topic in self.image.topics.items()}
            self.log_manager.startup(configs, now)
            t = self.timing
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
        self.replica_manager.apply_metadata(self.image, now)
        for leader_id in list(self.replica_manager.fetchers):
            if leader_id not in self._fetcher_loops:
                self._fetcher_loops.add(leader_id)
                self._fetch_from(leader_id)
        self._send_alter_partitions()

    # Follower side: one fetch loop per leader broker

    def _fetch_from(self, leader_id: int) -> None:
        rm = self.replica_manager
        fetcher = rm.fetchers.get(leader_id) if rm is not None else None
        if fetcher is None:
            self._fetcher_loops.discard(leader_id)
            return
        leader = self._peers[leader_id]
        now = self.sim.now

        def failed() -> None:
            fetcher.on_fetch_failed(self.sim.now)
            self._fetch_from(leader_id)

        lookups = fetcher.offset_lookups()
        if lookups:
            tp = lookups[0]

            def on_offsets(reply: object) -> None:
                if isinstance(reply, tuple):
                    fetcher.on_leader_offsets(tp, reply[0], reply[1], self.sim.now)
                    self._fetch_from(leader_id)
                else:
                    failed()

            self._network.call(
                self,
                leader,
                lambda respond: leader.handle_leader_offsets(tp, respond),
                on_offsets,
                failed,
                self.timing.replica_socket_timeout_ms,
            )
            return
        request = fetcher.build_fetch_request(now)
        if request is None:
            wake_at = fetcher.next_wakeup_ms()
            delay = 100 if wake_at is None else max(1, min(100, wake_at - now))
            self.after(delay, lambda: self._fetch_from(leader_id))
            return

        def on_response(reply: object) -> None:
            if not isinstance(reply, list):
                failed()
                return
            fetcher.process_fetch_response(reply, self.sim.now)
            self._send_alter_partitions()
            self._fetch_from(leader_id)

        self._network.call(
            self,
            leader,
            lambda respond: leader.handle_fetch(request, respond),
            on_response,
            failed,
            self.timing.replica_socket_timeout_ms + request.max_wait_ms,
        )

    # Leader side: requests from followers and clients

    def handle_fetch(self, request: FetchRequestData, respond: Respond) -> None:
        rm = self.replica_manager
        if rm is None:
            respond(NOT_SERVING)
            return
        params = FetchParams(request.replica_id, request.max_wait_ms, request.min_bytes, request.max_bytes, 0)
        infos = [
            (
                p.topic_partition,
                PartitionFetchInfo(
                    p.fetch_offset,
                    p.partition_max_bytes,
                    p.current_leader_epoch,
                    p.last_fetched_epoch,
                    p.log_start_offset,
                ),
            )
            for p in request.partitions
        ]
        delayed = rm.fetch_messages(
            params, infos, self.sim.now, lambda results: respond([to_fetch_response(r) for r in results])
        )
        if delayed is not None:
            self.after(delayed.deadline_ms - self.sim.now, lambda: rm.fetch_purgatory.expire(self.sim.now))
        self._send_alter_partitions()

    def handle_leader_offsets(self, tp: TopicPartition, respond: Respond) -> None:
        """ListOffsets as a replica: the leader's log start and end."""
        rm = self.replica_manager
        partition = rm.partitions.get(tp) if rm is not None else None
        if partition is None or not partition.is_leader:
            respond("NOT_LEADER_OR_FOLLOWER")
            return
        respond((partition.log.log_start_offset, partition.log.log_end_offset))

    def handle_produce(self, tp: TopicPartition, records: bytes, acks: int, timeout_ms: int, respond: Respond) -> None:
        rm = self.replica_manager
        if rm is None:
            respond(AppendResult(error="NOT_LEADER_OR_FOLLOWER"))
            return
        delayed = rm.append_records({tp: bytearray(records)}, acks, timeout_ms, self.sim.now, lambda r: respond(r[tp]))
        if delayed is not None:
            self.after(timeout_ms, lambda: rm.produce_purgatory.expire(self.sim.now))
        self._send_alter_partitions()

    def handle_offsets_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int, respond: Respond
    ) -> None:
        """OffsetsForLeaderEpoch from a consumer validating its position: (epoch, end offset) or an error name."""
        rm = self.replica_manager
        if rm is None:
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
            for name, topic in self.image.topics.items()
            for index, registration in enumerate(topic.partitions)
        }
        respond(leaders)

    # ISR changes

    def _shrink_isrs(self) -> None:
        if self.replica_manager is not None:
            self.replica_manager.maybe_shrink_isr(self.sim.now)
            self._send_alter_partitions()

    def _send_alter_partitions(self) -> None:
        rm = self.replica_manager
        if rm is None:
            return
        for proposal in rm.take_alter_partition_proposals():
            tp = proposal.topic_partition

            def on_reply(reply: object, tp: TopicPartition = tp) -> None:
                registration, error = reply  # type: ignore[misc]
                if self.replica_manager is not None:
                    self.replica_manager.on_alter_partition_response(tp, registration, error, self.sim.now)
                    self._send_alter_partitions()

            def on_failure(tp: TopicPartition = tp) -> None:
                if self.replica_manager is not None:
                    self.replica_manager.on_alter_partition_response(tp, None, "REQUEST_TIMED_OUT", self.sim.now)

            self._network.call(
                self,
                self._controller,
                lambda respond, p=proposal: self._controller.alter_partition(
                    self.broker_id, self.broker_epoch, p, respond
                ),
                on_reply,
                on_failure,
                self.timing.controller_request_timeout_ms,
            )

"""Kafka's LogManager: every partition log of the broker's log directories and their checkpoint files.

Each log dir holds the partitions' `topic-N` directories, three offset checkpoints (recovery points, log
start offsets, high watermarks) and, only after a clean shutdown, `.kafka_cleanshutdown`. The marker is
deleted once the logs are loaded, so a crash before the next clean shutdown is detected and recovered.
Periodic work (retention, flushing, checkpoints) is a method the asyncio shell calls on a timer.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.storage.checkpoints import (
    HIGH_WATERMARK_FILENAME,
    LOG_START_OFFSET_CHECKPOINT_FILENAME,
    PARTITION_METADATA_FILENAME,
    RECOVERY_POINT_CHECKPOINT_FILENAME,
    OffsetCheckpointFile,
    PartitionMetadataFile,
    atomic_write_text,
    fsync_directory,
)
from tierlog.storage.errors import InconsistentTopicIdError, KafkaStorageError
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig
from tierlog.storage.producer_state import ProducerStateManagerConfig

CLEAN_SHUTDOWN_FILENAME = ".kafka_cleanshutdown"
DELETE_DIR_SUFFIX = "-delete"
STRAY_DIR_SUFFIX = "-stray"
# A replica being moved to another log dir (AlterReplicaLogDirs): `topic-N.<uuid>-future` until it replaces the
# current log (docs/replication.md#log-dirs).
FUTURE_DIR_SUFFIX = "-future"


# Opened by the controller (tierlog.controller.metadata_log), never by the LogManager.
METADATA_LOG_DIR_NAME = "__cluster_metadata-0"


@dataclass(frozen=True, slots=True)
class ReplicaLogDescription:
    """One partition's log in a log dir, as DescribeLogDirs reports it (docs/replication.md#log-dirs)."""

    topic_partition: TopicPartition
    size_bytes: int
    # Kafka's: how far a current log's end is behind its high watermark (never negative), a future log's behind
    # the current log's end.
    offset_lag: int
    is_future: bool


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    path: Path
    replicas: list[ReplicaLogDescription]


class LogManager:
    def __init__(
        self,
        log_dirs: Sequence[Path],
        broker_log_defaults: Mapping[str, str],
        remote_storage_system_enable: bool = False,
        producer_state_config: ProducerStateManagerConfig | None = None,
        *,
        new_uuid: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        """`new_uuid` names the directories of deleted and stray logs: the simulator gives one its seed decides."""
        self.log_dirs = [Path(d) for d in log_dirs]
        self._new_uuid = new_uuid
        self._producer_state_config = producer_state_config or ProducerStateManagerConfig()
        self._broker_log_defaults = dict(broker_log_defaults)
        self._remote_storage_system_enable = remote_storage_system_enable
        self._logs: dict[TopicPartition, Log] = {}
        # Logs being filled in another log dir, to replace the current one (AlterReplicaLogDirs).
        self._future_logs: dict[TopicPartition, Log] = {}
        # Where AlterReplicaLogDirs asked a partition not yet here to be created (Kafka's preferredLogDirs).
        self._preferred_log_dirs: dict[TopicPartition, Path] = {}
        self._topic_ids: dict[TopicPartition, uuid.UUID] = {}
        # The overrides update_topic_config last applied to each topic's logs.
        self._applied_topic_overrides: dict[str, dict[str, str]] = {}
        # Logs of deleted partitions, their `*-delete` directory and the time they may be removed (set by
        # the first cleanup_logs call that sees them, as deletion itself is not told the time).
        self._logs_to_delete: list[tuple[Log, Path, int | None]] = []
        # Checkpoints may be written off the event loop (`high_watermark_checkpoint`): one file is written by one
        # writer at a time, and a snapshot older than the one a file already holds is never written over it.
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_snapshots = itertools.count()
        self._checkpoint_written: dict[Path, int] = {}

    def startup(self, topic_configs: Mapping[str, Mapping[str, str]], now_ms: int) -> None:
        """Load every partition of every log dir, recovering those of a dir without the clean-shutdown
        marker from their recovery points; remove directories left by an unfinished deletion; take up the future
        logs of moves to another log dir (from offset 0 after a crash: they have no checkpoint)."""
        futures: list[tuple[Path, bool]] = []
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            marker = log_dir / CLEAN_SHUTDOWN_FILENAME
            had_clean_shutdown = marker.exists()
            recovery_points = OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT_FILENAME).read()
            log_start_offsets = OffsetCheckpointFile(log_dir / LOG_START_OFFSET_CHECKPOINT_FILENAME).read()
            high_watermarks = OffsetCheckpointFile(log_dir / HIGH_WATERMARK_FILENAME).read()
            for child in sorted(log_dir.iterdir()):
                if not child.is_dir():
                    continue
                if child.name.endswith(DELETE_DIR_SUFFIX):
                    shutil.rmtree(child)
                    continue
                if child.name == METADATA_LOG_DIR_NAME:
                    continue  # the controller's metadata log shares the first log dir, as in Kafka
                if child.name.endswith(FUTURE_DIR_SUFFIX):
                    futures.append((child, had_clean_shutdown))
                    continue
                try:
                    tp = TopicPartition.parse_dir_name(child.name)
                except ValueError:
                    continue
                existing = self._logs.get(tp)
                if existing is not None:
                    raise KafkaStorageError(
                        f"Duplicate log directories for {tp} are found in both {existing.dir} and {child}."
                    )
                config = self._config_for(topic_configs.get(tp.topic, {}))
                self._logs[tp] = Log.open(
                    child,
                    config,
                    topic_partition=tp,
                    recovery_point=recovery_points.get(tp, 0),
                    log_start_offset=log_start_offsets.get(tp, 0),
                    high_watermark=high_watermarks.get(tp, 0),
                    had_clean_shutdown=had_clean_shutdown,
                    now_ms=now_ms,
                    remote_log_enabled=self.remote_log_enabled(tp.topic, config),
                    producer_state_config=self._producer_state_config,
                )
            marker.unlink(missing_ok=True)
        for directory, had_clean_shutdown in futures:
            self._load_future_log(directory, topic_configs, had_clean_shutdown, now_ms)

    def _load_future_log(
        self,
        directory: Path,
        topic_configs: Mapping[str, Mapping[str, str]],
        had_clean_shutdown: bool,
        now_ms: int,
    ) -> None:
        """A `topic-N.<uuid>-future` directory found at startup: the move goes on. One whose partition has no
        current log is set aside as stray (never deleted: it may be the only copy)."""
        name, _, _ = directory.name.rpartition(".")
        tp = TopicPartition.parse_dir_name(name)
        if tp not in self._logs or tp in self._future_logs:
            os.replace(directory, directory.with_name(f"{tp}.{self._new_uuid().hex}{STRAY_DIR_SUFFIX}"))
            return
        config = self._config_for(topic_configs.get(tp.topic, {}))
        self._future_logs[tp] = Log.open(
            directory,
            config,
            topic_partition=tp,
            recovery_point=0,
            log_start_offset=0,
            high_watermark=0,
            had_clean_shutdown=had_clean_shutdown,
            now_ms=now_ms,
            remote_log_enabled=self.remote_log_enabled(tp.topic, config),
            producer_state_config=self._producer_state_config,
        )

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def all_logs(self) -> list[Log]:
        return list(self._logs.values())

    def get_or_create_log(
        self, tp: TopicPartition, topic_id: uuid.UUID, topic_overrides: Mapping[str, str], now_ms: int
    ) -> Log:
        """The partition's log, created empty if it is new: in the log dir AlterReplicaLogDirs preferred for it,
        else in the one holding the fewest partitions.
        Raises InconsistentTopicIdError if the directory belongs to another incarnation of the topic."""
        log = self._logs.get(tp)
        if log is not None:
            self._check_topic_id(log, topic_id)
            return log
        # Where AlterReplicaLogDirs asked for it, once; else the log dir holding the fewest partitions.
        log_dir = self._preferred_log_dirs.pop(tp, None) or self._least_loaded_log_dir()
        directory = log_dir / str(tp)
        directory.mkdir(parents=True, exist_ok=True)
        PartitionMetadataFile(directory / PARTITION_METADATA_FILENAME).write(topic_id)
        config = self._config_for(topic_overrides)
        log = Log.open(
            directory,
            config,
            topic_partition=tp,
            recovery_point=0,
            log_start_offset=0,
            high_watermark=0,
            had_clean_shutdown=True,
            now_ms=now_ms,
            remote_log_enabled=self.remote_log_enabled(tp.topic, config),
            producer_state_config=self._producer_state_config,
        )
        self._logs[tp] = log
        self._topic_ids[tp] = topic_id
        return log

    def _least_loaded_log_dir(self) -> Path:
        # Counted in one pass, and not at all with one log dir: creating N partitions must not cost N^2
        # (docs/performance.md#many-partitions).
        if len(self.log_dirs) == 1:
            return self.log_dirs[0]
        counts = Counter(log.dir.parent for log in self._logs.values())
        return min(self.log_dirs, key=lambda d: counts[d])

    def _check_topic_id(self, log: Log, topic_id: uuid.UUID) -> None:
        tp = log.topic_partition
        known = self._topic_ids.get(tp)
        if known is None:
            metadata = PartitionMetadataFile(log.dir / PARTITION_METADATA_FILENAME)
            known = metadata.read()
            if known is None:
                # A directory from before topic ids: adopt the id, as Kafka does.
                metadata.write(topic_id)
                known = topic_id
            self._topic_ids[tp] = known
        if known != topic_id:
            raise InconsistentTopicIdError(
                f"Tried to assign topic ID {topic_id} to log for topic partition {tp}, but log already "
                f"contained topic ID {known}"
            )

    def delete_log(self, tp: TopicPartition) -> None:
        """Kafka's asyncDelete: rename the directory to `topic-N.<uuid>-delete` at once, so a crash never
        brings the partition back, and remove it file.delete.delay.ms later (reads in flight finish)."""
        self._preferred_log_dirs.pop(tp, None)
        self.delete_future_log(tp)
        log = self._logs.pop(tp, None)
        if log is None:
            return
        self._topic_ids.pop(tp, None)
        self._delete_later(log)

    def _delete_later(self, log: Log) -> None:
        tp = log.topic_partition
        renamed = log.dir.with_name(f"{tp}.{self._new_uuid().hex}{DELETE_DIR_SUFFIX}")
        os.replace(log.dir, renamed)
        self._logs_to_delete.append((log, renamed, None))

    def mark_stray(self, tp: TopicPartition) -> Path | None:
        """Kafka's stray logs: a partition on disk that the metadata does not know is set aside as
        `topic-N.<uuid>-stray`, never deleted, so a lost or foreign metadata store cannot destroy data."""
        self.delete_future_log(tp)  # a copy of what is set aside
        log = self._logs.pop(tp, None)
        if log is None:
            return None
        self._topic_ids.pop(tp, None)
        log.close()
        renamed = log.dir.with_name(f"{tp}.{self._new_uuid().hex}{STRAY_DIR_SUFFIX}")
        os.replace(log.dir, renamed)
        return renamed

    def describe_log_dirs(self, partitions: Collection[TopicPartition] | None) -> list[LogDirDescription]:
        """Kafka's ReplicaManager.describeLogDirs: every configured log dir (absolute, in configuration order)
        with the logs of `partitions` it holds (of every partition when None): the bytes of their local
        segments and the lag of their log end behind the high watermark, never negative. A log dir holding
        none of them is listed empty; a partition not on this broker is left out."""
        by_dir: dict[Path, list[ReplicaLogDescription]] = {log_dir: [] for log_dir in self.log_dirs}
        for tp, log in sorted(self._logs.items()):
            if partitions is not None and tp not in partitions:
                continue
            by_dir[log.dir.parent].append(
                ReplicaLogDescription(
                    topic_partition=tp,
                    size_bytes=log.size_in_bytes,
                    offset_lag=max(log.high_watermark - log.log_end_offset, 0),
                    is_future=False,
                )
            )
            future = self._future_logs.get(tp)
            if future is not None:
                by_dir[future.dir.parent].append(
                    ReplicaLogDescription(
                        topic_partition=tp,
                        size_bytes=future.size_in_bytes,
                        offset_lag=log.log_end_offset - future.log_end_offset,
                        is_future=True,
                    )
                )
        return [LogDirDescription(Path(os.path.abspath(d)), replicas) for d, replicas in by_dir.items()]

    def configured_log_dir(self, path: str) -> Path | None:
        """The log dir of `log.dirs` an AlterReplicaLogDirs path names (Kafka compares absolute paths), or None."""
        return next((d for d in self.log_dirs if os.path.abspath(d) == os.path.abspath(path)), None)

    def get_future_log(self, tp: TopicPartition) -> Log | None:
        return self._future_logs.get(tp)

    def future_partitions(self) -> list[TopicPartition]:
        return sorted(self._future_logs)

    def maybe_update_preferred_log_dir(self, tp: TopicPartition, log_dir: Path) -> None:
        """Kafka's: remember `log_dir` for when the partition's log is created, unless its current or future log
        is already there."""
        current, future = self._logs.get(tp), self._future_logs.get(tp)
        if (current is None or current.dir.parent != log_dir) and (future is None or future.dir.parent != log_dir):
            self._preferred_log_dirs[tp] = log_dir

    def create_future_log(self, tp: TopicPartition, now_ms: int) -> Log:
        """The empty future log of `tp` in its preferred log dir (which this uses up), starting where the current
        log's local segments start; the current log's configuration and topic id."""
        current = self._logs[tp]
        log_dir = self._preferred_log_dirs.pop(tp)
        if log_dir == current.dir.parent:
            raise ValueError(f"Can not create the future log for {tp} in the current log directory of this partition")
        directory = log_dir / f"{tp}.{self._new_uuid().hex}{FUTURE_DIR_SUFFIX}"
        directory.mkdir(parents=True)
        topic_id = PartitionMetadataFile(current.dir / PARTITION_METADATA_FILENAME).read()
        if topic_id is not None:
            PartitionMetadataFile(directory / PARTITION_METADATA_FILENAME).write(topic_id)
        start = current.segments[0].base_offset
        future = Log.open(
            directory,
            current.config,
            topic_partition=tp,
            recovery_point=start,
            log_start_offset=start,
            high_watermark=start,
            had_clean_shutdown=True,
            now_ms=now_ms,
            remote_log_enabled=current.remote_log_enabled,
            producer_state_config=self._producer_state_config,
        )
        self._future_logs[tp] = future
        return future

    def delete_future_log(self, tp: TopicPartition) -> None:
        """Give up a move: the future log is deleted as a deleted partition's is."""
        future = self._future_logs.pop(tp, None)
        if future is not None:
            self._delete_later(future)

    def replace_current_with_future_log(self, tp: TopicPartition, now_ms: int) -> Log:
        """Kafka's replaceCurrentWithFutureLog, for a future log that holds everything the current one does (the
        caller checked, with nothing able to append in between): the future log's directory takes the
        partition's name in its log dir, then the current one is renamed for deletion (as a deleted partition's,
        reads in flight finish). Returns the partition's log from now on, reopened at its new path with the
        current log's high watermark and log start. Between the two renames a crash leaves both directories,
        and startup refuses them until one is removed, as Kafka's does."""
        current = self._logs[tp]
        future = self._future_logs.pop(tp)
        future.flush()
        future.close()
        directory = future.dir.parent / str(tp)
        os.replace(future.dir, directory)
        fsync_directory(directory.parent)
        self._delete_later(current)
        log = Log.open(
            directory,
            future.config,
            topic_partition=tp,
            recovery_point=future.log_end_offset,
            log_start_offset=current.log_start_offset,
            high_watermark=current.high_watermark,
            had_clean_shutdown=True,
            now_ms=now_ms,
            remote_log_enabled=current.remote_log_enabled,
            producer_state_config=self._producer_state_config,
        )
        log.update_highest_offset_in_remote_storage(current.highest_offset_in_remote_storage)
        self._logs[tp] = log
        # The partition left the old dir and joined the new one: both dirs' checkpoints say so at once.
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        self.checkpoint_high_watermarks()
        return log

    def update_topic_config(self, topic: str, overrides: Mapping[str, str]) -> None:
        """Every metadata image is applied with each topic's overrides: only a topic whose overrides changed since
        then costs a pass over the logs, so a publish does not cost topics x partitions
        (docs/performance.md#many-partitions). A log created meanwhile got the overrides it was created with."""
        if self._applied_topic_overrides.get(topic) == overrides:
            return
        self._applied_topic_overrides[topic] = dict(overrides)
        config = self._config_for(overrides)
        for tp, log in self._logs.items():
            if tp.topic == topic:
                log.update_config(config, self.remote_log_enabled(topic, config))

    def reconfigure(
        self,
        broker_log_defaults: Mapping[str, str],
        producer_state_config: ProducerStateManagerConfig,
        topic_configs: Mapping[str, Mapping[str, str]],
    ) -> None:
        """New broker defaults of topic configs (dynamic broker configs, Kafka's DynamicLogConfig): every log's
        configuration is resolved again from its topic's overrides (`topic_configs`) and the new defaults."""
        self._broker_log_defaults = dict(broker_log_defaults)
        self._producer_state_config = producer_state_config
        for tp, log in self._logs.items():
            config = self._config_for(topic_configs.get(tp.topic, {}))
            log.update_config(config, self.remote_log_enabled(tp.topic, config))
            log.producer_state_manager.config = producer_state_config

    def remote_log_enabled(self, topic: str, config: LogConfig) -> bool:
        """Kafka's UnifiedLog.remoteLogEnabled: the broker's remote.log.storage.system.enable, the topic's
        remote.storage.enable, and never for internal topics (their names start with "__")."""
        return self._remote_storage_system_enable and config.remote_storage_enable and not topic.startswith("__")

    def _config_for(self, topic_overrides: Mapping[str, str]) -> LogConfig:
        return LogConfig.from_props(topic_overrides, self._broker_log_defaults)

    # Periodic work

    def cleanup_logs(self, now_ms: int) -> int:
        """Retention for every log, removal of `*.deleted` segments and deleted partitions whose delay has
        passed. Returns the number of segments retention deleted."""
        deleted = 0
        for log in [*self._logs.values(), *self._future_logs.values()]:
            deleted += log.delete_old_segments(now_ms)
            log.remove_deleted_segments(now_ms)
        pending: list[tuple[Log, Path, int | None]] = []
        for log, directory, delete_at_ms in self._logs_to_delete:
            if delete_at_ms is None:
                pending.append((log, directory, now_ms + log.config.file_delete_delay_ms))
            elif delete_at_ms <= now_ms:
                log.close_handlers()
                shutil.rmtree(directory, ignore_errors=True)
            else:
                pending.append((log, directory, delete_at_ms))
        self._logs_to_delete = pending
        return deleted

    def flush_dirty_logs(self, now_ms: int) -> None:
        """Flush segments rolled since the last call, and logs whose flush.ms has passed."""
        for log in self._logs.values():
            log.flush_if_due(now_ms)

    def checkpoint_high_watermarks(self) -> None:
        self.high_watermark_checkpoint()()

    def high_watermark_checkpoint(self) -> Callable[[], None]:
        """The HW of every log as of now, and the function that writes them to the checkpoint files: Kafka writes
        it on a scheduler thread, and so may the caller (two fsyncs on the event loop every 5 s stall every
        request of the broker: docs/performance.md#replication)."""
        return self._checkpoint_writer(HIGH_WATERMARK_FILENAME, lambda log: log.high_watermark)

    def checkpoint_recovery_points(self) -> None:
        self._checkpoint(RECOVERY_POINT_CHECKPOINT_FILENAME, lambda log: log.recovery_point)
        # Recovery now starts at the checkpointed points: older producer snapshots are no longer needed.
        for log in self._logs.values():
            log.delete_snapshots_after_recovery_point_checkpoint()

    def remove_expired_producers(self, now_ms: int) -> int:
        """Kafka's producer-id expiration check (every producer.id.expiration.check.interval.ms)."""
        return sum(log.remove_expired_producers(now_ms) for log in self._logs.values())

    def checkpoint_log_start_offsets(self) -> None:
        self.log_start_offset_checkpoint()()

    def log_start_offset_checkpoint(self) -> Callable[[], None]:
        """As `high_watermark_checkpoint`, for the log start offsets."""
        # Kafka records a log start only where it differs from what the segments imply.
        return self._checkpoint_writer(
            LOG_START_OFFSET_CHECKPOINT_FILENAME,
            lambda log: log.log_start_offset if log.log_start_offset != log.segments[0].base_offset else None,
        )

    def _checkpoint(self, filename: str, offset_of: Callable[[Log], int | None]) -> None:
        self._checkpoint_writer(filename, offset_of)()

    def _checkpoint_writer(self, filename: str, offset_of: Callable[[Log], int | None]) -> Callable[[], None]:
        """Read the offsets now (on the caller's thread, which owns the logs); the function returned writes them,
        on any thread, unless a later snapshot of the same file was written first."""
        snapshot = next(self._checkpoint_snapshots)
        files: list[tuple[Path, dict[TopicPartition, int]]] = []
        for log_dir in self.log_dirs:
            offsets: dict[TopicPartition, int] = {}
            for tp, log in self._logs.items():
                if log.dir.parent == log_dir:
                    offset = offset_of(log)
                    if offset is not None:
                        offsets[tp] = offset
            files.append((log_dir / filename, offsets))

        def write() -> None:
            with self._checkpoint_lock:
                for path, offsets in files:
                    if self._checkpoint_written.get(path, -1) < snapshot:
                        OffsetCheckpointFile(path).write(offsets)
                        self._checkpoint_written[path] = snapshot

        return write

    def shutdown(self) -> None:
        """Flush every log, write the checkpoints, close the files, then mark each log dir clean."""
        for log in self._logs.values():
            log.flush()
        self.checkpoint_high_watermarks()
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        for log in self._logs.values():
            log.close()
        # A future log carries on from its files at the next start (it has no checkpoint entry of its own).
        for future in self._future_logs.values():
            future.flush()
            future.close()
        # Directories still awaiting deletion keep their `-delete` name; the next startup removes them.
        for log, _, _ in self._logs_to_delete:
            log.close_handlers()
        self._logs_to_delete.clear()
        marker = json.dumps({"version": "0", "broker_epoch": "-1"})
        for log_dir in self.log_dirs:
            atomic_write_text(log_dir / CLEAN_SHUTDOWN_FILENAME, marker)

"""The metadata log: `__cluster_metadata-0`, the durable store of every metadata change.

It is an ordinary partition log (the storage engine's `Log`) holding RecordBatch v2 batches whose record
values are `records.encode_record` JSON, so brokers read it with ordinary Fetch requests and `tierlog
dump-log` can show it. Unlike data partitions it is fsynced on every append: with a single controller
there is no replica to make an unflushed append durable.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tierlog.common import TopicPartition
from tierlog.metadata.records import MetadataRecord, decode_record, encode_record
from tierlog.records.codec import build_batch, decode_batches
from tierlog.storage.file_records import FileSlice
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig

METADATA_TOPIC = "__cluster_metadata"
# Kafka's fixed id of the metadata topic (Uuid.METADATA_TOPIC_ID).
METADATA_TOPIC_ID = uuid.UUID(int=1)
METADATA_PARTITION = TopicPartition(METADATA_TOPIC, 0)
# The partition leader epoch stamped into every batch. With a single controller there are no controller
# elections, so the epoch never changes.
CONTROLLER_EPOCH = 1
# KRaft's largest metadata batch (KafkaRaftClient.MAX_BATCH_SIZE_BYTES); one controller operation is one batch.
MAX_BATCH_SIZE_BYTES = 8 * 1024 * 1024


class MetadataLog(Protocol):
    @property
    def end_offset(self) -> int:
        """The offset the next record gets."""
        ...

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        """Durably append the records of one operation, all or none; returns the offset of the first."""
        ...

    def records_from(self, start_offset: int) -> list[tuple[int, MetadataRecord]]: ...

    def read(self, start_offset: int, max_bytes: int) -> FileSlice | None:
        """Whole batches from the one holding `start_offset` (the first regardless of `max_bytes`)."""
        ...

    def close(self) -> None: ...


class DiskMetadataLog:
    def __init__(self, log_dir: Path) -> None:
        config = LogConfig.from_props({"max.message.bytes": str(MAX_BATCH_SIZE_BYTES)}, {})
        self._log = Log.open(
            log_dir / str(METADATA_PARTITION),
            config,
            topic_partition=METADATA_PARTITION,
            # No checkpoints are kept for this log: every open validates it from the start, which costs
            # little for a log this small and truncates a tail torn by a crash.
            recovery_point=0,
            log_start_offset=0,
            # Unused: with one controller every fsynced record is committed, so reads go to the log end.
            high_watermark=0,
            had_clean_shutdown=False,
            # Dates only a segment created before the first append; rolls are decided by batch timestamps.
            now_ms=0,
        )

    @property
    def end_offset(self) -> int:
        return self._log.log_end_offset

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        batch = bytearray(build_batch([(None, encode_record(record), [], now_ms) for record in records]))
        info = self._log.append_as_leader(batch, CONTROLLER_EPOCH, now_ms)
        self._log.flush()
        return info.first_offset

    def records_from(self, start_offset: int) -> list[tuple[int, MetadataRecord]]:
        found: list[tuple[int, MetadataRecord]] = []
        offset = start_offset
        # A read stops at the end of a segment; keep reading until the end of the log.
        while offset < self._log.log_end_offset:
            chunk = self.read(offset, MAX_BATCH_SIZE_BYTES)
            if chunk is None:
                break
            records = decode_metadata_batches(chunk.read_bytes())
            # The batch holding `offset` comes whole, so it may start before it.
            found.extend(r for r in records if r[0] >= offset)
            offset = records[-1][0] + 1
        return found

    def read(self, start_offset: int, max_bytes: int) -> FileSlice | None:
        return self._log.read(start_offset, max_bytes, max_offset=None, min_one_message=True).records

    def close(self) -> None:
        self._log.close()


@dataclass(frozen=True, slots=True)
class _ParkedFetch:
    offset: int
    deadline_ms: int
    on_ready: Callable[[], None]


class WakingMetadataLog:
    """The metadata log with KRaft's fetch purgatory: a broker's fetch that finds no records at its offset is
    parked until an append brings some or its wait ends (long polling). Every controller operation appends
    through here, so no caller has to remember to wake the fetches. The asyncio shell and the simulator both
    serve brokers' metadata fetches from it, arming a timer for each parked fetch's deadline."""

    def __init__(self, log: MetadataLog) -> None:
        self.log = log
        self._parked: list[_ParkedFetch] = []

    @property
    def end_offset(self) -> int:
        return self.log.end_offset

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        first_offset = self.log.append(records, now_ms)
        self._complete(lambda fetch: fetch.offset < self.log.end_offset)
        return first_offset

    def records_from(self, start_offset: int) -> list[tuple[int, MetadataRecord]]:
        return self.log.records_from(start_offset)

    def read(self, start_offset: int, max_bytes: int) -> FileSlice | None:
        return self.log.read(start_offset, max_bytes)

    def close(self) -> None:
        self.log.close()

    def wait_for_records(self, offset: int, max_wait_ms: int, now_ms: int, on_ready: Callable[[], None]) -> int | None:
        """Call `on_ready` once the log holds `offset` or `max_wait_ms` has passed: at once (returning None) if it
        holds it already or there is no wait, else when an append brings it or `expire` is called at or after
        the returned deadline."""
        if offset < self.log.end_offset or max_wait_ms <= 0:
            on_ready()
            return None
        fetch = _ParkedFetch(offset, now_ms + max_wait_ms, on_ready)
        self._parked.append(fetch)
        return fetch.deadline_ms

    def expire(self, now_ms: int) -> None:
        """Answer every parked fetch whose wait has ended."""
        self._complete(lambda fetch: fetch.deadline_ms <= now_ms)

    def _complete(self, ready: Callable[[_ParkedFetch], bool]) -> None:
        done: list[_ParkedFetch] = []
        waiting: list[_ParkedFetch] = []
        for fetch in self._parked:
            (done if ready(fetch) else waiting).append(fetch)
        self._parked = waiting
        for fetch in done:
            fetch.on_ready()


def decode_metadata_batches(data: bytes) -> list[tuple[int, MetadataRecord]]:
    """(offset, record) for every record of the complete batches in `data` (a Fetch response may end in a
    partial batch, which is left for the next fetch); ValueError for anything that is not a metadata batch.
    Control batches (the Raft quorum's LeaderChangeMessage) hold no metadata and are skipped."""
    decoded: list[tuple[int, MetadataRecord]] = []
    for batch in decode_batches(data):
        if batch.header.is_control:
            continue
        for record in batch.records:
            if record.value is None:
                raise ValueError(f"metadata record at offset {record.offset} has no value")
            decoded.append((record.offset, decode_record(record.value)))
    return decoded

"""Direct reads of the remote tier for the Spark source (issue 6, item 2).

The driver plans: it reads `__remote_log_metadata` with an ordinary Kafka consumer (never the brokers' Fetch
path for user data), folds the events into a RemoteLogMetadataCache exactly as the brokers do, keeps the
COPY_SEGMENT_FINISHED segments of the partition's current lineage, and cuts [start, end) into
RemoteSegmentSlice descriptors: plain picklable values, one Spark input partition each.

Executors read: `read_slice` fetches the slice's `.log` object straight from object storage through the same
FsspecRemoteStorageManager (and `rsm.config.*` settings) the brokers use, in chunks that end on batch
boundaries, and turns each chunk into an Arrow batch (tierlog.spark.arrow), so a 1 GiB segment never sits
in memory whole.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import pyarrow as pa
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError
from confluent_kafka import Consumer, KafkaException, TopicCollection
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import READ_COMMITTED, PartitionFetch, fetch_request
from tierlog.client.security_settings import client_security
from tierlog.common import TopicPartition
from tierlog.records.record_batch import RECORD_BATCH_OVERHEAD, batch_size_at, read_header
from tierlog.spark.arrow import record_batches_to_arrow
from tierlog.spark.offsets import NO_CLIENT_SETTINGS, current_leader
from tierlog.storage.epoch_entry import EpochEntry
from tierlog.storage.transaction_index import AbortedTxn
from tierlog.tiered.fsspec_storage import FsspecRemoteStorageManager
from tierlog.tiered.remote_log_manager import is_within_lineage, parse_epoch_checkpoint
from tierlog.tiered.remote_log_metadata_cache import (
    REMOTE_LOG_METADATA_TOPIC,
    RemoteLogMetadataCache,
    RemoteLogMetadataStore,
)
from tierlog.tiered.remote_storage_manager import IndexType, RemoteStorageError
from tierlog.tiered.remote_transactions import collect_remote_aborted_transactions, fetch_remote_aborted_txns
from tierlog.tiered.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
    decode_event,
)

# Bytes decoded at a time: large enough that object-store latency is amortised, small enough to bound memory.
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
# A chunk is read as ranged GETs of this size, all at once (docs/performance.md#spark-direct).
DEFAULT_RANGE_BYTES = 2 * 1024 * 1024
PARALLEL_RANGES = 4
DEFAULT_TIMEOUT_S = 30.0
_POLL_S = 0.2
_CONSUME_MAX = 1000


class RemoteTierError(RuntimeError):
    """The remote tier cannot be read with the job's rsm.config.* settings; the message names the cause in one
    line (it reaches a person through Spark's error, which keeps only the last line of a Python traceback)."""


def check_remote_tier(rsm_config: Mapping[str, str]) -> None:
    """Fail now, with the cause named, if the settings cannot reach the remote tier: a bad URL, no or wrong
    credentials, no bucket, an endpoint that does not answer. One request (RemoteStorageManager.check_access)."""
    try:
        with FsspecRemoteStorageManager.from_config(rsm_config) as rsm:
            rsm.check_access()
    except ValueError as e:
        raise RemoteTierError(f"remote tier: {e}") from None
    except RemoteStorageError as e:
        raise RemoteTierError(remote_tier_problem(e, rsm_config, checking_bucket=True)) from None


def remote_tier_problem(error: RemoteStorageError, rsm_config: Mapping[str, str], checking_bucket: bool = False) -> str:
    """One line for a failed remote-tier call, naming the cause and the setting to look at rather than the
    object store client's exception. `checking_bucket`: the call was check_access, so "not found" is the bucket."""
    url = rsm_config.get("url", "")
    endpoint = rsm_config.get("s3.endpoint.url") or "AWS S3"
    causes = _causes(error)

    def caused_by(*kinds: type[BaseException]) -> bool:
        return any(isinstance(cause, kinds) for cause in causes)

    if caused_by(NoCredentialsError):
        return (
            f"remote tier {url}: no credentials: give rsm.config.aws.access.key.id and "
            "rsm.config.aws.secret.access.key (as the brokers have them)"
        )
    if caused_by(PermissionError):
        return (
            f"remote tier {url}: {endpoint} denied access (403 Forbidden): check rsm.config.aws.access.key.id and "
            "rsm.config.aws.secret.access.key"
        )
    if caused_by(EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionError, TimeoutError):
        if caused_by(socket.gaierror):
            reason = "unknown host"
        elif caused_by(ConnectionRefusedError):
            reason = "connection refused"
        elif caused_by(ConnectTimeoutError, ReadTimeoutError, TimeoutError):
            reason = "timed out"
        else:
            reason = "connection failed"
        return f"remote tier {url}: cannot reach {endpoint} ({reason}): check rsm.config.s3.endpoint.url"
    if caused_by(FileNotFoundError) and checking_bucket:
        bucket = url.removeprefix("s3://").split("/", 1)[0]
        return f"remote tier {url}: bucket {bucket!r} does not exist at {endpoint}: check rsm.config.url"
    missing = next((cause for cause in causes if isinstance(cause, FileNotFoundError)), None)
    if missing is not None:
        return (
            f"remote tier {url}: no object {missing.filename or missing}, which the brokers' remote log metadata "
            "lists: are these the brokers' own rsm.config.* settings?"
        )
    return f"remote tier {url}: {error}"


def _causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


@dataclass(frozen=True, slots=True)
class RemoteSegmentSlice:
    """Offsets [start_offset, end_offset) of one remote segment: one Spark input partition.

    `metadata` is the segment's own metadata (it names the object: topic id, segment id, start offset), so the
    executor's RemoteStorageManager finds the `.log` without asking anyone."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    metadata: RemoteLogSegmentMetadata
    # read_committed: the aborted transactions overlapping the slice, from the remote transaction indexes
    # (docs/transactions.md#spark-source); None reads uncommitted.
    aborted_transactions: tuple[AbortedTxn, ...] | None = None

    @property
    def size_in_bytes(self) -> int:
        return self.metadata.segment_size_in_bytes


def topic_ids_of(
    bootstrap: str,
    topics: list[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client_settings: Mapping[str, str] = NO_CLIENT_SETTINGS,
) -> dict[str, uuid.UUID]:
    """Each topic's id: remote metadata is keyed by it, so a deleted and re-created topic's segments are ignored."""
    admin = _admin_client(bootstrap, tuple(sorted(client_settings.items())))
    futures = admin.describe_topics(TopicCollection(sorted(set(topics))), request_timeout=timeout_s)
    ids = {}
    for topic, future in futures.items():
        topic_id = future.result(timeout_s).topic_id
        # confluent-kafka's Uuid prints base64 (Kafka's form); the metadata events carry the 128-bit value.
        high = topic_id.get_most_significant_bits() & (2**64 - 1)
        low = topic_id.get_least_significant_bits() & (2**64 - 1)
        ids[topic] = uuid.UUID(int=(high << 64) | low)
    return ids


@functools.lru_cache(maxsize=4)
def _admin_client(bootstrap: str, client_settings: tuple[tuple[str, str], ...]) -> AdminClient:
    """One admin client per cluster and settings for the life of the planning process: a new one pays its
    connections and metadata again, every plan (docs/performance.md#spark-direct)."""
    return AdminClient({**dict(client_settings), "bootstrap.servers": bootstrap})


def topic_id_of(bootstrap: str, topic: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> uuid.UUID:
    return topic_ids_of(bootstrap, [topic], timeout_s)[topic]


class RemoteLogMetadataView:
    """`__remote_log_metadata` folded into RemoteLogMetadataCaches as the brokers fold it, and followed: each
    `catch_up` reads only what was appended since the last one, up to each partition's high watermark (what the
    brokers act on), as Kafka's RemoteLogMetadataManager follows the topic. A stream keeps one for its life, so
    a micro-batch is planned without replaying the whole topic (docs/performance.md#spark-direct).

    `wanted`: the only topic-partitions kept (a one-off plan); None keeps every one (a stream, whose topics may
    grow). Records the metadata topic no longer holds (its log start moved past what was read) start it over."""

    def __init__(
        self,
        bootstrap: str,
        wanted: set[TopicIdPartition] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        client_settings: Mapping[str, str] = NO_CLIENT_SETTINGS,
    ) -> None:
        self._wanted = wanted
        self._timeout_s = timeout_s
        self._consumer = Consumer(
            {
                **client_settings,
                "bootstrap.servers": bootstrap,
                "group.id": "tierlog-spark-remote-planner",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 100,
            }
        )
        self._store = RemoteLogMetadataStore()
        # The next offset to read of each metadata partition.
        self._positions: dict[int, int] = {}

    def catch_up(self) -> None:
        """Read every partition of the metadata topic from where the last call stopped to its high watermark now.
        Every partition is read, not just metadata_partition_for's: the broker-side partition count is a broker
        setting the job does not know, and the topic is small next to the data it describes."""
        consumer, timeout_s = self._consumer, self._timeout_s
        metadata = consumer.list_topics(REMOTE_LOG_METADATA_TOPIC, timeout=timeout_s)
        topic_metadata = metadata.topics.get(REMOTE_LOG_METADATA_TOPIC)
        if topic_metadata is None or topic_metadata.error is not None or not topic_metadata.partitions:
            return
        ends: dict[int, int] = {}
        starts: dict[int, int] = {}
        for partition in topic_metadata.partitions:
            low, high = consumer.get_watermark_offsets(
                KafkaTopicPartition(REMOTE_LOG_METADATA_TOPIC, partition), timeout=timeout_s
            )
            if partition in self._positions and low > self._positions[partition]:
                # Records this view has not read are gone: what it holds can no longer be completed.
                self._store, self._positions = RemoteLogMetadataStore(), {}
                self.catch_up()
                return
            starts[partition] = max(low, self._positions.get(partition, 0))
            if high > starts[partition]:
                ends[partition] = high
        if not ends:
            return
        consumer.assign([KafkaTopicPartition(REMOTE_LOG_METADATA_TOPIC, p, starts[p]) for p in ends])
        remaining = dict(ends)
        # Offsets still to read of each partition: consume() returns once it has the messages asked for, so
        # asking for no more than are left ends the read without waiting out its timeout every plan
        # (docs/performance.md#spark-direct). Transaction markers take offsets but are no messages: then the
        # timeout ends the call, and the positions below still end the read.
        left = {p: ends[p] - starts[p] for p in ends}
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{REMOTE_LOG_METADATA_TOPIC} not read to its end in {timeout_s}s: {remaining}")
            for message in consumer.consume(min(max(sum(left.values()), 1), _CONSUME_MAX), timeout=_POLL_S):
                if message.error() is not None:
                    raise KafkaException(message.error())
                value = message.value()
                if value is None:
                    continue
                try:
                    event = decode_event(value)
                except (ValueError, KeyError, TypeError):
                    continue  # not one of ours; the brokers skip such records too
                if self._wanted is None or event.segment_id.topic_id_partition in self._wanted:
                    self._store.apply(event)
            # Positions, not the offsets of the messages seen: a partition's last offsets may hold no message
            # (a transaction marker), and the position still moves past them.
            positions = consumer.position([KafkaTopicPartition(REMOTE_LOG_METADATA_TOPIC, p) for p in remaining])
            for position in positions:
                if position.offset >= remaining[position.partition]:
                    del remaining[position.partition]
                    del left[position.partition]
                elif position.offset >= starts[position.partition]:
                    left[position.partition] = remaining[position.partition] - position.offset
        for partition, end in ends.items():
            self._positions[partition] = end

    def caches(self, topic_id_partitions: list[TopicIdPartition]) -> dict[TopicIdPartition, RemoteLogMetadataCache]:
        """The cache of every asked-for partition that has remote segments, as of the last catch_up."""
        return {tip: cache for tip in topic_id_partitions if (cache := self._store.cache(tip)) is not None}

    def close(self) -> None:
        self._consumer.close()


def load_remote_log_metadata(
    bootstrap: str,
    topic_id_partitions: list[TopicIdPartition],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client_settings: Mapping[str, str] = NO_CLIENT_SETTINGS,
) -> dict[TopicIdPartition, RemoteLogMetadataCache]:
    """Replay `__remote_log_metadata` up to each partition's high watermark (what the brokers act on) and
    return the cache of every asked-for partition that has remote segments."""
    view = RemoteLogMetadataView(bootstrap, set(topic_id_partitions), timeout_s, client_settings)
    try:
        view.catch_up()
        return view.caches(topic_id_partitions)
    finally:
        view.close()


def lineage_segments(cache: RemoteLogMetadataCache, rsm: FsspecRemoteStorageManager) -> list[RemoteLogSegmentMetadata]:
    """The COPY_SEGMENT_FINISHED segments on the log's current lineage, by start offset, without overlaps.

    The driver has no broker's leader-epoch cache, so the lineage is taken from the remote tier itself: the
    leader-epoch checkpoint uploaded with the copied segment of the highest epoch (then highest end) is the
    history of the leader that copied last, and epochs only grow across leaders. Copies a deposed leader
    made of offsets the new one rewrote fall outside it (is_within_lineage, the brokers' own test)."""
    copied = [s for s in cache.list_remote_log_segments() if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
    if not copied:
        return []
    newest = max(copied, key=lambda s: (s.segment_leader_epochs[-1][0], s.end_offset, s.event_timestamp_ms))
    history = _leader_epoch_history(rsm, newest)
    reach = newest.end_offset + 1
    lineage = [s for s in copied if is_within_lineage(s, history, reach)]
    # Overlapping copies of the same offsets (a retried copy) hold the same records: keep, for each offset,
    # the segment starting last at or below it, as the brokers' lookup does, so no record is read twice.
    chosen: list[RemoteLogSegmentMetadata] = []
    for segment in sorted(lineage, key=lambda s: (s.start_offset, -s.end_offset)):
        if chosen and segment.end_offset <= chosen[-1].end_offset:
            continue
        chosen.append(segment)
    return chosen


# What the driver fetched of segments' objects, by (store url, segment id): a segment's objects are written once,
# before COPY_SEGMENT_FINISHED, and never change, so planning after planning need not fetch them again
# (docs/performance.md#spark-direct). Bounded: the oldest entries go first.
_SEGMENT_OBJECT_CACHE_ENTRIES = 4096
_leader_epoch_histories: dict[tuple[str, uuid.UUID], list[EpochEntry]] = {}
_aborted_txn_indexes: dict[tuple[str, uuid.UUID], list[AbortedTxn]] = {}
V = TypeVar("V")


def _segment_object(
    cache: dict[tuple[str, uuid.UUID], V],
    rsm: FsspecRemoteStorageManager,
    segment: RemoteLogSegmentMetadata,
    fetch: Callable[[], V],
) -> V:
    """What `fetch` reads of `segment`'s objects, fetched once per store and segment."""
    key = (rsm.url, segment.segment_id.id)
    if (found := cache.get(key)) is None:
        if len(cache) >= _SEGMENT_OBJECT_CACHE_ENTRIES:
            del cache[next(iter(cache))]
        found = cache[key] = fetch()
    return found


def _leader_epoch_history(rsm: FsspecRemoteStorageManager, segment: RemoteLogSegmentMetadata) -> list[EpochEntry]:
    """The leader-epoch checkpoint uploaded with `segment`."""

    def fetch() -> list[EpochEntry]:
        checkpoint = parse_epoch_checkpoint(rsm.fetch_index(segment, IndexType.LEADER_EPOCH))
        return [EpochEntry(epoch, start) for epoch, start in checkpoint]

    return _segment_object(_leader_epoch_histories, rsm, segment, fetch)


def _remote_aborted_txns(rsm: FsspecRemoteStorageManager, segment: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
    """The transaction index uploaded with `segment` (fetch_remote_aborted_txns)."""
    return _segment_object(_aborted_txn_indexes, rsm, segment, lambda: fetch_remote_aborted_txns(rsm, segment))


def plan_remote_slices(
    topic: str,
    partition: int,
    segments: list[RemoteLogSegmentMetadata],
    start_offset: int,
    end_offset: int,
) -> list[RemoteSegmentSlice]:
    """Cut [start_offset, end_offset) into one slice per remote segment holding part of it. Offsets the
    remote tier does not hold (the local tail, or a gap) are the caller's to read through the brokers:
    `remote_reach(slices)` says where the remote part stops."""
    slices: list[RemoteSegmentSlice] = []
    position = start_offset
    for segment in segments:
        if segment.end_offset < position:
            continue
        if segment.start_offset > position or position >= end_offset:
            break  # a gap: what follows it cannot be stitched to the remote part seamlessly
        slice_end = min(segment.end_offset + 1, end_offset)
        slices.append(RemoteSegmentSlice(topic, partition, position, slice_end, segment))
        position = slice_end
    return slices


def remote_reach(slices: list[RemoteSegmentSlice], start_offset: int) -> int:
    """The first offset at or above `start_offset` the slices do not cover."""
    return slices[-1].end_offset if slices else start_offset


def with_aborted_transactions(
    slices: list[RemoteSegmentSlice],
    lineage: list[RemoteLogSegmentMetadata],
    aborted_txns_of: Callable[[RemoteLogSegmentMetadata], Sequence[AbortedTxn]],
    local_aborted: Callable[[int], Sequence[AbortedTxn] | None],
) -> list[RemoteSegmentSlice]:
    """read_committed: each slice with the aborted transactions overlapping it, searched as the brokers search
    a remote read's (collect_remote_aborted_transactions: the slice's segment, then the following ones of the
    lineage). A search the remote tier cannot complete needs the transactions whose markers are still only in
    the local log, after the remote tier's end: `local_aborted(remote end)` (asked once) gives them, as the
    brokers finish such a search from the local log. Without them (None) the slices end before the first
    incomplete one and the caller reads from there through a broker."""
    remote_end = max((s.end_offset + 1 for s in lineage), default=0)
    local: Sequence[AbortedTxn] | None = None
    asked = False
    out = []
    for piece in slices:
        following = [s for s in lineage if s.start_offset >= piece.metadata.start_offset]
        found = collect_remote_aborted_transactions(piece.start_offset, piece.end_offset, following, aborted_txns_of)
        aborted = list(found.aborted)
        if not found.is_complete:
            if not asked:
                local, asked = local_aborted(remote_end), True
            if local is None:
                break
            aborted.extend(txn for txn in local if txn.first_offset < piece.end_offset and txn not in aborted)
        out.append(replace(piece, aborted_transactions=tuple(aborted)))
    return out


def local_aborted_transactions(
    leader: str, tp: TopicPartition, offset: int, client_settings: Mapping[str, str]
) -> list[AbortedTxn] | None:
    """The aborted transactions a read_committed Fetch at `offset` (the remote tier's end) is answered with: every
    one whose marker is at or after `offset`, and which started before the records returned end (so every one a
    remote slice can overlap). None if the leader does not answer so (the caller then reads through it)."""
    host, _, port = leader.rpartition(":")
    request = fetch_request([PartitionFetch(tp, offset, 1)], max_wait_ms=0, max_bytes=1, isolation_level=READ_COMMITTED)
    loop = asyncio.new_event_loop()
    try:
        connection = loop.run_until_complete(
            KafkaConnection.open(
                host,
                int(port),
                client_id="tierlog-spark",
                timeout_s=DEFAULT_TIMEOUT_S,
                security=client_security(client_settings),
            )
        )
        try:
            answer = loop.run_until_complete(connection.send(request, timeout_s=DEFAULT_TIMEOUT_S))
        finally:
            loop.run_until_complete(connection.close())
    except KafkaConnectionError:
        return None
    finally:
        loop.close()
    partition = answer.responses[0].partitions[0]
    if partition.error_code.name.upper() != "NONE" or partition.aborted_transactions is None:
        return None
    # The marker's offset is not in the answer; it is at or after `offset`, after every chunk of a remote slice.
    return [AbortedTxn(int(t.producer_id), int(t.first_offset), offset, -1) for t in partition.aborted_transactions]


def plan_remote_reads(
    bootstrap: str,
    ranges: Mapping[TopicPartition, tuple[int, int]],
    rsm_config: Mapping[str, str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client_settings: Mapping[str, str] = NO_CLIENT_SETTINGS,
    read_committed: bool = False,
    metadata: RemoteLogMetadataView | None = None,
) -> dict[TopicPartition, list[RemoteSegmentSlice]]:
    """The driver's whole job: for each topic-partition's [start, end), the remote slices from `start` on,
    as far as the remote tier reaches contiguously (possibly none). The metadata topic is read once for all,
    or, given a stream's `metadata` view, only what was appended to it since the last plan.
    `client_settings` are the job's kafka.* settings for the clients that ask the brokers. With `read_committed`
    each slice carries its aborted transactions (with_aborted_transactions)."""
    ids = topic_ids_of(bootstrap, [tp.topic for tp in ranges], timeout_s, client_settings)
    wanted = {tp: TopicIdPartition(ids[tp.topic], tp) for tp in ranges}
    if metadata is None:
        caches = load_remote_log_metadata(bootstrap, list(wanted.values()), timeout_s, client_settings)
    else:
        metadata.catch_up()
        caches = metadata.caches(list(wanted.values()))
    plans: dict[TopicPartition, list[RemoteSegmentSlice]] = {tp: [] for tp in ranges}
    if not caches:
        return plans
    # The process's storage manager for these settings, kept between plans (a stream plans every micro-batch).
    rsm = _storage_manager(tuple(sorted(rsm_config.items())))
    for tp, (start, end) in ranges.items():
        cache = caches.get(wanted[tp])
        if cache is None:
            continue
        lineage = lineage_segments(cache, rsm)
        plans[tp] = plan_remote_slices(tp.topic, tp.partition, lineage, start, end)
        if read_committed:
            plans[tp] = with_aborted_transactions(
                plans[tp],
                lineage,
                lambda metadata: _remote_aborted_txns(rsm, metadata),
                lambda offset, tp=tp: _local_aborted(bootstrap, tp, offset, client_settings),
            )
    return plans


def _local_aborted(
    bootstrap: str, tp: TopicPartition, offset: int, client_settings: Mapping[str, str]
) -> list[AbortedTxn] | None:
    leader = current_leader(bootstrap, tp.topic, tp.partition, client_settings)
    return None if leader is None else local_aborted_transactions(leader, tp, offset, client_settings)


def plan_partition(
    bootstrap: str,
    topic: str,
    partition: int,
    start_offset: int,
    end_offset: int,
    rsm_config: Mapping[str, str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[RemoteSegmentSlice]:
    """plan_remote_reads for one topic-partition."""
    tp = TopicPartition(topic, partition)
    return plan_remote_reads(bootstrap, {tp: (start_offset, end_offset)}, rsm_config, timeout_s)[tp]


def divide_run(run: list[RemoteSegmentSlice], parts: int) -> list[tuple[RemoteSegmentSlice, ...]]:
    """A topic-partition's consecutive slices cut into `parts` runs of about equal offsets, as Kafka's
    KafkaOffsetRangeCalculator cuts a range (a cut inside a segment splits its slice): one Spark task each, which
    reads its slices in order (docs/performance.md#spark-direct)."""
    if parts <= 0:
        raise ValueError(f"parts must be positive, not {parts}")
    start, end = run[0].start_offset, run[-1].end_offset
    size = end - start
    out = []
    for i in range(parts):
        low = start + int(size * i / parts)
        high = end if i == parts - 1 else start + int(size * (i + 1) / parts)
        pieces = tuple(
            replace(piece, start_offset=max(piece.start_offset, low), end_offset=min(piece.end_offset, high))
            for piece in run
            if piece.start_offset < high and piece.end_offset > low
        )
        if pieces:
            out.append(pieces)
    return out


def start_position(rsm: FsspecRemoteStorageManager, piece: RemoteSegmentSlice) -> int:
    """A batch boundary at or before the batch holding the slice's first offset, from the segment's remote
    offset index, so a slice starting deep in a segment (a streaming micro-batch) does not read its head."""
    metadata = piece.metadata
    if piece.start_offset <= metadata.start_offset:
        return 0
    data = rsm.fetch_index(metadata, IndexType.OFFSET)
    # Kafka's `.index` entries: (relative offset, position), int32 big-endian each; an entry says the batch at
    # `position` ends at or below the offset, so the largest entry at or below the target starts early enough.
    position = 0
    previous = -1
    for relative, entry_position in struct.iter_unpack(">ii", data[: len(data) - len(data) % 8]):
        if relative <= previous or metadata.start_offset + relative > piece.start_offset:
            break  # past the target, or into the zero padding of a preallocated index
        previous, position = relative, entry_position
    return position


_range_pool: ThreadPoolExecutor | None = None
_range_pool_lock = threading.Lock()


def _ranges_pool() -> ThreadPoolExecutor:
    """The worker process's threads for parallel ranged GETs (one pool for its life: Spark reuses the worker)."""
    global _range_pool
    with _range_pool_lock:
        if _range_pool is None:
            _range_pool = ThreadPoolExecutor(PARALLEL_RANGES, thread_name_prefix="tierlog-ranged-get")
        return _range_pool


def fetch_in_parallel_ranges(
    rsm: FsspecRemoteStorageManager,
    metadata: RemoteLogSegmentMetadata,
    start: int,
    end: int,
    range_bytes: int = DEFAULT_RANGE_BYTES,
) -> bytes:
    """Bytes [start, end) of the segment's `.log` object, exactly as one ranged GET returns them (shorter if the
    object ends first), read as ranged GETs of `range_bytes` in parallel: one GET of a few MiB leaves the
    connection's latency and the store's per-request time unhidden, several overlap them."""
    bounds = [(at, min(at + range_bytes, end)) for at in range(start, end, range_bytes)]
    if len(bounds) <= 1:
        return rsm.fetch_log_segment(metadata, start, end)
    parts = list(_ranges_pool().map(lambda bound: rsm.fetch_log_segment(metadata, *bound), bounds))
    # A part shorter than asked is the object's end: what follows it is empty, as one GET would stop there.
    return b"".join(parts)


def iter_slice_chunks(
    rsm: FsspecRemoteStorageManager,
    piece: RemoteSegmentSlice,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    range_bytes: int = DEFAULT_RANGE_BYTES,
) -> Iterator[bytes]:
    """Whole record batches of the slice's segment, in chunks of about `chunk_bytes` (each read as parallel
    ranged GETs of `range_bytes`), from the first batch holding offsets at or above the slice start to the last
    one starting below its end."""
    size = piece.metadata.segment_size_in_bytes
    position = start_position(rsm, piece)
    pending = b""
    while position < size:
        data = pending + fetch_in_parallel_ranges(
            rsm, piece.metadata, position, min(size, position + chunk_bytes), range_bytes
        )
        position += len(data) - len(pending)
        if len(data) == len(pending):
            break  # the object is shorter than its metadata says: nothing more to read
        cut = 0
        start = None
        done = False
        while True:
            batch_size = batch_size_at(data, cut)
            if batch_size is None or cut + max(batch_size, RECORD_BATCH_OVERHEAD) > len(data):
                break
            header = read_header(data, cut)
            if header.base_offset >= piece.end_offset:
                done = True
                break
            if start is None and header.last_offset >= piece.start_offset:
                start = cut
            cut += batch_size
        if start is not None and cut > start:
            yield data[start:cut]
        if done:
            return
        # A batch cut by the chunk's end is read again whole with the next chunk.
        pending = data[cut:]


def read_slice(
    piece: RemoteSegmentSlice,
    rsm_config: Mapping[str, str],
    include_headers: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[pa.RecordBatch]:
    """On an executor: the slice's records as Arrow batches in the Kafka source's layout, one per chunk,
    read from object storage directly."""
    rsm = _storage_manager(tuple(sorted(rsm_config.items())))
    for chunk in iter_slice_chunks(rsm, piece, chunk_bytes):
        batch = record_batches_to_arrow(
            chunk,
            piece.topic,
            piece.partition,
            piece.start_offset,
            piece.end_offset,
            include_headers,
            chunk_aborted_transactions(piece.aborted_transactions, read_header(chunk).base_offset),
        )
        if batch.num_rows:
            yield batch


def chunk_aborted_transactions(aborted: tuple[AbortedTxn, ...] | None, chunk_start: int) -> list[AbortedTxn] | None:
    """The aborted transactions a Fetch answer starting at `chunk_start` would carry: those not ended before it.
    One ended earlier must not be applied again, or its producer's later committed batches would be dropped."""
    if aborted is None:
        return None
    return [txn for txn in aborted if txn.last_offset >= chunk_start]


@functools.lru_cache(maxsize=4)
def _storage_manager(rsm_config: tuple[tuple[str, str], ...]) -> FsspecRemoteStorageManager:
    """One storage manager per settings for the life of the Python process (an executor's worker, which Spark
    reuses for task after task, or the driver's planner): creating the S3 client costs ~0.2 s, as much as
    reading a segment."""
    return FsspecRemoteStorageManager.from_config(dict(rsm_config))

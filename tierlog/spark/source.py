"""`spark.read.format("tierlog")` and `spark.readStream.format("tierlog")`: the readers.

The driver resolves the offset ranges (offsets.py) and cuts them into Spark partitions: with direct remote
reads (remote_tier.py), the remote segments a range reaches into (one per task, or with minPartitions a
topic-partition's consecutive segments per task), read by the executor straight from object storage; the rest,
and everything without direct reads, one per range (split for minPartitions), read on the executor with raw
Fetch requests to the partition's leader. Either way the record-batch bytes go straight to the Arrow decoder
instead of through a client's per-record objects.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import READ_COMMITTED, READ_UNCOMMITTED, PartitionFetch, fetch_request
from tierlog.client.security_settings import client_security
from tierlog.common import TopicPartition
from tierlog.protocol.errors import error_code
from tierlog.records.record_batch import complete_batches, read_header
from tierlog.spark.arrow import record_batches_to_arrow, spark_ddl
from tierlog.spark.offsets import (
    DataLossError,
    OffsetRange,
    batch_ranges,
    current_leader,
    partition_states,
    split_ranges,
    starting_offset,
)
from tierlog.spark.options import SourceOptions, option, parse_batch_options, parse_stream_options
from tierlog.spark.remote_tier import (
    RemoteLogMetadataView,
    RemoteSegmentSlice,
    RemoteTierError,
    divide_run,
    plan_remote_reads,
    read_slice,
    remote_reach,
    remote_tier_problem,
)
from tierlog.spark.sink import (
    TRANSACTIONAL_OPTION,
    TierlogStreamWriter,
    TierlogWriter,
    complete_decided_batches,
    parse_sink_options,
)
from tierlog.tiered.remote_storage_manager import RemoteResourceNotFoundError, RemoteStorageError

# Per-request bounds on an executor's fetches; a range is read in as many fetches as it takes.
FETCH_TIMEOUT_S = 30.0
FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 8 * 1024 * 1024
_NO_ERROR = error_code(None)
# Fetch errors that mean "ask someone else": the leadership moved (Kafka's consumer refreshes its metadata).
LEADERSHIP_ERRORS = frozenset(
    {
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "REPLICA_NOT_AVAILABLE",
        "KAFKA_STORAGE_ERROR",
    }
)
# How long a task keeps looking for a leader before it fails (Spark then retries the task).
LEADER_CHANGE_TIMEOUT_S = 60.0
LEADER_RETRY_BACKOFF_S = 0.5


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """Offsets read through the partition's leader with Fetch."""

    range: OffsetRange
    include_headers: bool
    fail_on_data_loss: bool
    bootstrap_servers: str  # to find the leader again if it moved
    # The job's kafka.* settings (librdkafka's names): the fetch connection's security, and the leader lookup's.
    client_settings: tuple[tuple[str, str], ...] = ()
    read_committed: bool = False


@dataclass(frozen=True)
class RemoteSlicePartition(InputPartition):
    """Consecutive offsets of one topic-partition in one or more remote segments, read in order by the executor
    straight from object storage."""

    slices: tuple[RemoteSegmentSlice, ...]
    rsm_config: tuple[tuple[str, str], ...]
    include_headers: bool
    fail_on_data_loss: bool

    @property
    def slice(self) -> RemoteSegmentSlice:
        """The first slice: the only one unless minPartitions grouped segments (plan_input_partitions)."""
        return self.slices[0]


def plan_input_partitions(
    options: SourceOptions, ranges: list[OffsetRange], metadata: RemoteLogMetadataView | None = None
) -> list[InputPartition]:
    """The Spark partitions for `ranges`: with direct remote reads, the remote segments a range reaches into,
    and the rest of the range (the local tail) through the brokers; together exactly the ranges, once.
    `metadata`: a stream's view of the remote log metadata, followed from one micro-batch to the next.

    Without minPartitions, one task per remote segment. With it, as Kafka's KafkaOffsetRangeCalculator, counting
    a topic-partition's remote part (its consecutive segments) as one range and its tail as another: no more
    tasks than minPartitions asks for, each remote part cut in proportion to its share of the offsets
    (docs/performance.md#spark-direct)."""
    include, fail, bootstrap = options.include_headers, options.fail_on_data_loss, options.bootstrap_servers
    settings, committed = options.client_settings, options.read_committed
    ranges = [r for r in ranges if r.size > 0]
    if options.remote_read != "direct" or not ranges:
        return [
            RangePartition(r, include, fail, bootstrap, settings, committed)
            for r in split_ranges(ranges, options.min_partitions)
        ]
    rsm_config = dict(options.rsm_config)
    try:
        plans = plan_remote_reads(
            options.bootstrap_servers,
            {TopicPartition(r.topic, r.partition): (r.start, r.end) for r in ranges},
            rsm_config,
            client_settings=dict(settings),
            read_committed=committed,
            metadata=metadata,
        )
    except RemoteStorageError as e:
        raise RemoteTierError(remote_tier_problem(e, rsm_config)) from None
    runs: list[list[RemoteSegmentSlice]] = []
    tails: list[OffsetRange] = []
    for r in ranges:
        planned = plans.get(TopicPartition(r.topic, r.partition), [])
        if planned:
            runs.append(planned)
        reach = remote_reach(planned, r.start)
        if reach < r.end:
            tails.append(replace(r, start=reach))
    if options.min_partitions is None:
        groups = [(piece,) for run in runs for piece in run]
    elif len(runs) + len(tails) >= options.min_partitions:
        groups = [tuple(run) for run in runs]
    else:
        total = sum(r.size for r in ranges)
        groups = [group for run in runs for group in divide_run(run, _parts(run, total, options.min_partitions))]
        tails = split_ranges(tails, _tail_partitions(tails, total, options.min_partitions))
    remote: list[InputPartition] = [RemoteSlicePartition(g, options.rsm_config, include, fail) for g in groups]
    return remote + [RangePartition(r, include, fail, bootstrap, settings, committed) for r in tails]


def _parts(run: list[RemoteSegmentSlice], total: int, min_partitions: int) -> int:
    # Scala's math.round, as split_ranges: halves round up.
    size = run[-1].end_offset - run[0].start_offset
    return max(math.floor(size / total * min_partitions + 0.5), 1)


def _tail_partitions(tails: list[OffsetRange], total: int, min_partitions: int) -> int | None:
    # split_ranges spreads its minPartitions over the tails' own total; scale it to the tails' share.
    tail_total = sum(r.size for r in tails)
    if not tails or tail_total == 0:
        return None
    return max(math.floor(tail_total / total * min_partitions + 0.5), len(tails))


class TierlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tierlog"

    def schema(self) -> str:
        include_headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return spark_ddl(include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TierlogBatchReader(parse_batch_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TierlogStreamReader(parse_stream_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            # As Kafka's sink: a log is appended to, never replaced.
            raise ValueError(
                "save mode overwrite is not allowed for tierlog; allowed save modes are append and errorifexists"
            )
        if (option(self.options, TRANSACTIONAL_OPTION) or "").strip().lower() == "true":
            raise ValueError(
                f"option '{TRANSACTIONAL_OPTION}' is for streaming queries (writeStream), whose micro-batches "
                "Spark commits once; a batch write is at-least-once"
            )
        return TierlogWriter(parse_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_sink_options(self.options, schema)
        if options.transactional:
            # Called on the driver when each micro-batch's write is planned, before its tasks run (and again
            # for its commit): the point where a restart completes or aborts what a crash left.
            complete_decided_batches(options)
        return TierlogStreamWriter(options)


class TierlogBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return plan_input_partitions(self.options, batch_ranges(self.options, partition_states(self.options)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # partitions() gave nothing to read: PySpark then plans one placeholder InputPartition(None) anyway,
        # which read_partition answers with no records.
        yield from read_partition(partition)


# A stream offset, as in Spark's Kafka source checkpoints: {"topic": {"0": 23, "1": 7}}.
StreamOffset = dict[str, dict[str, int]]


def _to_json(offsets: dict[tuple[str, int], int]) -> StreamOffset:
    out: StreamOffset = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _from_json(offsets: StreamOffset) -> dict[tuple[str, int], int]:
    return {(topic, int(p)): int(o) for topic, partitions in offsets.items() for p, o in partitions.items()}


class TierlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offset ranges. The offsets of each batch are Spark's to checkpoint, so a restart
    resumes exactly where the last committed batch ended; nothing is committed to the brokers."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._initial: StreamOffset | None = None
        # Trigger.AvailableNow's target: what was in the log when the query started, never read beyond.
        self._target: dict[tuple[str, int], int] | None = None
        # When the last micro-batch was planned, for minOffsetsPerTrigger's maxTriggerDelay (driver clock).
        self._last_trigger_s = time.monotonic()
        # Direct remote reads: the remote log metadata, followed for the life of the query.
        self._metadata: RemoteLogMetadataView | None = None

    def initialOffset(self) -> dict:
        # Spark may ask more than once; latest and timestamps must resolve to the same offsets each time.
        if self._initial is None:
            states = partition_states(self.options)
            self._initial = _to_json({(s.topic, s.partition): starting_offset(self.options, s) for s in states})
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {(s.topic, s.partition): s.latest for s in partition_states(self.options)}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _from_json(start)
        states = partition_states(self.options)
        # Partitions that appeared since the last batch are read from their beginning, as Kafka's source.
        latest = {(s.topic, s.partition): s.latest for s in states}
        for s in states:
            begin.setdefault((s.topic, s.partition), s.earliest)
        if self._target is not None:
            latest = {tp: min(o, self._target[tp]) for tp, o in latest.items() if tp in self._target}
        end = {tp: max(o, begin[tp]) for tp, o in latest.items()}
        if self._target is None and self._too_few_to_trigger(sum(end[tp] - begin[tp] for tp in end)):
            return start
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(limit.max_rows, begin, end)
        for tp, offset in _from_json(start).items():
            end.setdefault(tp, offset)
        if end != _from_json(start):
            self._last_trigger_s = time.monotonic()
        return _to_json(end)

    def _too_few_to_trigger(self, available: int) -> bool:
        """Kafka's minOffsetsPerTrigger: wait for more offsets unless maxTriggerDelay has passed since the last
        micro-batch (AvailableNow never waits: it reads what there is and stops)."""
        minimum = self.options.min_offsets_per_trigger
        if minimum is None or available >= minimum:
            return False
        return (time.monotonic() - self._last_trigger_s) * 1000 < self.options.max_trigger_delay_ms

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin = _from_json(start)
        states = {(s.topic, s.partition): s for s in partition_states(self.options)}
        ranges = []
        for tp, until in _from_json(end).items():
            state = states.get(tp)
            if state is None:
                continue
            offset = begin.get(tp, state.earliest)
            if offset < state.earliest:
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{tp[0]}-{tp[1]}: offsets {offset} to {state.earliest - 1} were deleted before they "
                        f"were read (the log now starts at {state.earliest}); some data may have been lost. "
                        "Set the option failOnDataLoss to false to go on from the log start."
                    )
                offset = state.earliest
            if offset < until:
                ranges.append(OffsetRange(tp[0], tp[1], offset, until, state.leader))
        if self.options.remote_read == "direct" and self._metadata is None:
            self._metadata = RemoteLogMetadataView(
                self.options.bootstrap_servers, client_settings=dict(self.options.client_settings)
            )
        return plan_input_partitions(self.options, ranges, self._metadata)

    def stop(self) -> None:
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(partition)

    # commit() is the base class's no-op on purpose: the Spark checkpoint holds the offsets, and the
    # brokers keep no state for this query.


def rate_limit(
    limit: int, begin: dict[tuple[str, int], int], end: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """Kafka's source rateLimit: `limit` offsets shared among partitions in proportion to what each has
    available; a share below one offset is rounded up, so a small partition is not starved."""
    sizes = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(sizes.values())
    if total <= limit:
        return dict(end)
    out = {}
    for tp, size in sizes.items():
        share = limit * size / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end[tp], begin[tp] + take)
    return out


# The kinds of partition after whose first read this Python worker froze its heap (_freeze_long_lived_objects).
_FROZEN_AFTER: set[type] = set()


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, RangePartition):
        yield from read_range(
            partition.range,
            partition.include_headers,
            partition.fail_on_data_loss,
            partition.bootstrap_servers,
            dict(partition.client_settings),
            partition.read_committed,
        )
    elif isinstance(partition, RemoteSlicePartition):
        yield from read_remote_slices(partition)
    _freeze_long_lived_objects(type(partition))


def _freeze_long_lived_objects(kind: type) -> None:
    """After the first read of each kind in this worker process, move every object it holds out of the cyclic
    garbage collector's sight (gc.freeze). PySpark's worker runs a full gc.collect() after every task, which walks
    every object the process holds; a read loads numba, pyarrow and botocore's service models once for the life
    of the worker (~150k objects), and walking them took longer than reading a segment
    (docs/performance.md#spark-direct). Collected first, so no garbage is frozen."""
    if kind in _FROZEN_AFTER:
        return
    _FROZEN_AFTER.add(kind)
    gc.collect()
    gc.freeze()


def read_remote_slices(partition: RemoteSlicePartition) -> Iterator[pa.RecordBatch]:
    """The partition's slices in order, each as if it were its own task: a slice whose segment is gone is data
    loss on its own, and with failOnDataLoss false the read goes on with the next slice."""
    rsm_config = dict(partition.rsm_config)
    for piece in partition.slices:
        try:
            yield from read_slice(piece, rsm_config, partition.include_headers)
        except RemoteResourceNotFoundError as e:
            # Retention deleted the segment after the driver planned it: its records are gone.
            if partition.fail_on_data_loss:
                raise DataLossError(
                    f"{piece.topic}-{piece.partition}: offsets {piece.start_offset} to {piece.end_offset - 1} were "
                    f"deleted from the remote tier before they were read ({e}); some data may have been lost. Set "
                    "the option failOnDataLoss to false to go on without them."
                ) from None
        except RemoteStorageError as e:
            raise RemoteTierError(remote_tier_problem(e, rsm_config)) from None


def read_range(
    r: OffsetRange,
    include_headers: bool,
    fail_on_data_loss: bool,
    bootstrap_servers: str,
    client_settings: Mapping[str, str],
    read_committed: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The records of `r` as Arrow batches, one per Fetch response, fetched from the partition's leader.

    With `read_committed` the Fetch asks for isolation level 1, as Kafka's consumer: the leader answers up to
    the last stable offset, and the records of aborted transactions are dropped with the answer's
    aborted_transactions (docs/transactions.md#spark-source).

    A leader that moved since the driver planned the range (NOT_LEADER_OR_FOLLOWER, a fenced epoch, a lost
    connection) is looked up again and the read goes on from the same offset, for up to
    LEADER_CHANGE_TIMEOUT_S without progress, as a Kafka consumer refreshes its metadata."""
    # An SSLContext does not travel to executors: each range makes its own from the settings.
    security = client_security(client_settings)
    # One event loop for the whole range: a connection is opened once per leader and reused by every fetch.
    loop = asyncio.new_event_loop()
    connection: KafkaConnection | None = None
    leader = r.leader
    offset = r.start
    stuck_since: float | None = None
    empty_since: float | None = None
    try:
        while offset < r.end:
            try:
                if connection is None:
                    host, _, port = leader.rpartition(":")
                    connection = loop.run_until_complete(
                        KafkaConnection.open(
                            host, int(port), client_id="tierlog-spark", timeout_s=FETCH_TIMEOUT_S, security=security
                        )
                    )
                request = fetch_request(
                    [PartitionFetch(TopicPartition(r.topic, r.partition), offset, FETCH_MAX_BYTES)],
                    max_wait_ms=FETCH_MAX_WAIT_MS,
                    max_bytes=FETCH_MAX_BYTES,
                    isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
                )
                response = loop.run_until_complete(connection.send(request, timeout_s=FETCH_TIMEOUT_S))
                answer = response.responses[0].partitions[0]
                problem = None if answer.error_code == _NO_ERROR else answer.error_code.name.upper()
            except KafkaConnectionError as e:
                answer, problem = None, str(e)
            if answer is None or problem in LEADERSHIP_ERRORS:
                if connection is not None:
                    loop.run_until_complete(connection.close())
                    connection = None
                now = time.monotonic()
                stuck_since = now if stuck_since is None else stuck_since
                if now - stuck_since > LEADER_CHANGE_TIMEOUT_S:
                    raise RuntimeError(
                        f"fetch of {r.topic}-{r.partition} at {offset} found no leader to read from for "
                        f"{LEADER_CHANGE_TIMEOUT_S:.0f}s (last: {leader}: {problem})"
                    )
                time.sleep(LEADER_RETRY_BACKOFF_S)
                leader = current_leader(bootstrap_servers, r.topic, r.partition, client_settings) or leader
                continue
            stuck_since = None
            if problem == "OFFSET_OUT_OF_RANGE":
                # Deleted since the driver planned the range: retention or truncation got there first.
                if fail_on_data_loss:
                    raise DataLossError(
                        f"{r.topic}-{r.partition}: offset {offset} is no longer in the log (log start "
                        f"{int(answer.log_start_offset)}); some data may have been lost. Set the option "
                        "failOnDataLoss to false to read what remains."
                    )
                if int(answer.log_start_offset) <= offset:
                    return
                offset = int(answer.log_start_offset)
                continue
            if problem is not None:
                raise RuntimeError(f"fetch of {r.topic}-{r.partition} at {offset} from {leader} failed: {problem}")
            records = answer.records or b""
            next_offset = _next_offset(records)
            if next_offset is None:
                # What the leader serves this reader: up to the high watermark, or the last stable offset.
                readable_end = int(answer.last_stable_offset if read_committed else answer.high_watermark)
                if readable_end <= offset:
                    # The range was planned below that end; the log now ends earlier (truncated).
                    if fail_on_data_loss:
                        raise DataLossError(
                            f"{r.topic}-{r.partition}: the log ends at {readable_end}, before "
                            f"offset {offset} the query planned to read; set failOnDataLoss to false to go on."
                        )
                    return
                if not records:
                    # Nothing below the readable end yet: a read from the remote tier that did not finish within
                    # the broker's remote.fetch.max.wait.ms is answered empty (Kafka's DelayedRemoteFetch). Fetch
                    # again, as Kafka's consumer does, for as long as a leader change may take.
                    now = time.monotonic()
                    empty_since = now if empty_since is None else empty_since
                    if now - empty_since <= LEADER_CHANGE_TIMEOUT_S:
                        continue
                raise RuntimeError(
                    f"fetch of {r.topic}-{r.partition} at {offset} returned no complete batch within "
                    f"{FETCH_MAX_BYTES} bytes"
                )
            empty_since = None
            # None unless read_committed: a read_uncommitted answer carries no aborted transactions.
            aborted = (answer.aborted_transactions or ()) if read_committed else None
            batch = record_batches_to_arrow(records, r.topic, r.partition, offset, r.end, include_headers, aborted)
            if batch.num_rows:
                yield batch
            offset = next_offset
    finally:
        if connection is not None:
            loop.run_until_complete(connection.close())
        loop.close()


def _next_offset(records: bytes | memoryview) -> int | None:
    """The offset after the last complete batch in `records`, or None when there is none."""
    view = memoryview(records)
    next_offset = None
    for position, _ in complete_batches(view):
        next_offset = read_header(view, position).next_offset
    return next_offset

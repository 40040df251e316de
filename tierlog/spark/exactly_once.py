"""The sink's exactly-once mode (`tierlog.sink.transactional=true`): each micro-batch's rows become visible to
read_committed readers once, whatever crashes, as Spark's checkpoint sees the batch committed once.

Two-phase commit with the driver as coordinator (rules: docs/transactions.md#spark-sink, guarantee and limits:
docs/spark.md#exactly-once-writes):
- Task (executor) of micro-batch B, Spark partition P of query Q: InitProducerId on the transactional id
  `<prefix>-<Q>-<P>` (which aborts whatever an earlier attempt, run or batch left open under it, and fences that
  attempt), writes every row inside that transaction and does NOT commit; it reports the transactional id, the
  producer id and epoch and the partitions it wrote (TaskTransaction).
- Driver, StreamingWrite.commit(B): writes the decision (B and every reported transaction) durably to the sink
  log in the query's checkpoint, then sends EndTxn(commit) for each with the reported producer id and epoch
  (tierlog's client resumes the task's transaction, as Flink's sink does), then marks the decision completed.
  Spark writes its own commit log for B only after that.
- Restart: when each micro-batch's write is planned on the driver, before its tasks run, a decision not marked
  completed is completed (its transactions committed). A rerun of B that finds B's decision (the crash came
  after it, before Spark's commit log) aborts the rerun's own transactions instead of committing them: B's rows
  are already committed once. After each commit the query's transactions still open (left by a run that crashed
  before deciding) are aborted by an InitProducerId on their ids.
"""

from __future__ import annotations

import json
import logging
import os
import random
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from tierlog.client.connection import ApiNotServedError, KafkaConnectionError
from tierlog.common import TopicPartition
from tierlog.records.codec import RecordSpec, build_batch
from tierlog.records.record_batch import CompressionType
from tierlog.spark.txn_client import ListedTransaction, ProducerIdAndEpoch, TransactionError

logger = logging.getLogger(__name__)

SINK_LOG_DIRECTORY = "tierlog-sink"
# Spark keeps this many batches of its own metadata by default (spark.sql.streaming.minBatchesToRetain).
DECISIONS_RETAINED = 100
# A batch is sent once its partitions' pending records reach either bound.
FLUSH_RECORDS = 10_000
FLUSH_BYTES = 1024 * 1024
ONGOING = "Ongoing"
# The task's local properties Spark's micro-batch execution sets (StreamExecution.QUERY_ID_KEY, BATCH_ID_KEY).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class SinkCommitError(RuntimeError):
    """A decided micro-batch could not be committed whole: some of its rows may never become visible."""


@dataclass(frozen=True)
class TaskTransaction(WriterCommitMessage):
    """What a task reports to the driver: the transaction holding its rows, left open."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    batch_id: int
    partitions: tuple[tuple[str, int], ...]
    records: int

    @property
    def producer(self) -> ProducerIdAndEpoch:
        return ProducerIdAndEpoch(self.producer_id, self.producer_epoch)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.transactional_id, self.producer_id, self.producer_epoch)


@dataclass(frozen=True)
class Decision:
    """The driver's decision to commit a micro-batch: the commit point of the two-phase commit."""

    batch_id: int
    transactions: tuple[TaskTransaction, ...]
    completed: bool = False


class Coordinator(Protocol):
    """The transaction requests the driver sends (TxnClient; a fake in the unit tests)."""

    def init_producer_id(self, transactional_id: str, transaction_timeout_ms: int) -> ProducerIdAndEpoch: ...

    def end_txn(self, transactional_id: str, producer: ProducerIdAndEpoch, commit: bool) -> str | None: ...

    def list_transactions(self, states: Iterable[str] = ()) -> list[ListedTransaction]: ...


def transactional_id(prefix: str, query_id: str, partition: int) -> str:
    """One transactional id per query and Spark partition, reused batch after batch: the coordinator keeps one
    entry per id (until transactional.id.expiration.ms), so a stream of many batches does not grow it."""
    return f"{prefix}-{query_id}-{partition}"


def query_prefix(prefix: str, query_id: str) -> str:
    return f"{prefix}-{query_id}-"


class SinkLog:
    """The driver's decisions, one JSON file per micro-batch in `<checkpoint>/tierlog-sink/`, each written
    whole (a temporary file fsynced, then renamed over) so a crash leaves the old version or the new one."""

    def __init__(self, checkpoint_location: str) -> None:
        self.directory = Path(_local_path(checkpoint_location)) / SINK_LOG_DIRECTORY

    def _file(self, batch_id: int) -> Path:
        return self.directory / f"{batch_id}.json"

    def read(self, batch_id: int) -> Decision | None:
        try:
            raw = json.loads(self._file(batch_id).read_text())
        except FileNotFoundError:
            return None
        return _decision_of(raw)

    def write(self, decision: Decision) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self._file(decision.batch_id)
        temporary = target.with_suffix(".tmp")
        with open(temporary, "w") as f:
            json.dump(asdict(decision), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def decisions(self) -> list[Decision]:
        if not self.directory.is_dir():
            return []
        found = [self.read(int(f.stem)) for f in self.directory.glob("*.json") if f.stem.isdigit()]
        return sorted((d for d in found if d is not None), key=lambda d: d.batch_id)

    def prune(self, latest_batch_id: int) -> None:
        for f in self.directory.glob("*.json"):
            if f.stem.isdigit() and int(f.stem) <= latest_batch_id - DECISIONS_RETAINED:
                f.unlink(missing_ok=True)


def _decision_of(raw: dict) -> Decision:
    transactions = tuple(
        TaskTransaction(
            t["transactional_id"],
            int(t["producer_id"]),
            int(t["producer_epoch"]),
            int(t["batch_id"]),
            tuple((topic, int(partition)) for topic, partition in t["partitions"]),
            int(t["records"]),
        )
        for t in raw["transactions"]
    )
    return Decision(int(raw["batch_id"]), transactions, bool(raw["completed"]))


def _local_path(location: str) -> str:
    """The checkpoint location as a path the driver's Python can write ("file:" URIs included)."""
    if location.startswith("file://"):
        return location[len("file://") :]
    if location.startswith("file:"):
        return location[len("file:") :]
    if "://" in location:
        raise ValueError(
            f"tierlog.sink.transactional keeps its commit decisions beside the checkpoint, which must be a "
            f"file system path the driver can write (local or a mounted shared file system), not {location!r}"
        )
    if not os.path.isabs(location):
        # The driver's Python workers, which read and write the decisions, need not share the JVM's directory.
        raise ValueError(f"tierlog.sink.transactional needs an absolute checkpointLocation, not {location!r}")
    return location


# --- the driver -------------------------------------------------------------------------------------------


def commit_batch(
    coordinator: Coordinator,
    log: SinkLog,
    batch_id: int,
    messages: Sequence[object],
    open_prefix: str | None,
    timeout_ms: int,
) -> None:
    """StreamingWrite.commit(batch_id): decide, commit every task's transaction, mark the decision completed;
    then abort the transactions under `open_prefix` (this query's ids) that are still open: none of this query's
    tasks runs now, so they are left by a run that crashed before deciding (docs/transactions.md#spark-sink)."""
    reported = [m for m in messages if isinstance(m, TaskTransaction)]
    decided = log.read(batch_id)
    if decided is None:
        decision = Decision(batch_id, tuple(t for t in reported if t.partitions))
        log.write(decision)
        _complete(coordinator, decision)
        log.write(replace(decision, completed=True))
        log.prune(batch_id)
    else:
        # A rerun of a batch decided before a crash: its rows are committed (or about to be, below) already, so
        # this run's transactions hold them a second time.
        if not decided.completed:
            _complete(coordinator, decided)
            log.write(replace(decided, completed=True))
        already = {t.key for t in decided.transactions}
        abort_transactions(coordinator, [t for t in reported if t.partitions and t.key not in already])
    if open_prefix is not None:
        abort_open_transactions(coordinator, open_prefix, timeout_ms)


def abort_transactions(coordinator: Coordinator, transactions: Iterable[TaskTransaction]) -> None:
    """EndTxn(abort) for each; one already ended or fenced (an error) needs nothing more: a transaction the
    coordinator does not end now is aborted by the next InitProducerId on its id, or by its timeout."""
    for t in transactions:
        coordinator.end_txn(t.transactional_id, t.producer, commit=False)


def _complete(coordinator: Coordinator, decision: Decision) -> None:
    for t in decision.transactions:
        error = coordinator.end_txn(t.transactional_id, t.producer, commit=True)
        if error is not None:
            raise SinkCommitError(
                f"micro-batch {decision.batch_id}: the transaction of {t.transactional_id} (producer {t.producer_id}, "
                f"epoch {t.producer_epoch}, {t.records} rows) could not be committed: {error}; the coordinator "
                "aborted it (transaction.timeout.ms passed before the commit, or another writer took the id), so "
                "those rows are not in the topic while the batch's other rows are"
            )


def complete_decisions(coordinator: Coordinator, log: SinkLog) -> None:
    """On the driver before a micro-batch's tasks run (and at its commit): commit the transactions of every
    decided batch whose commit a crash interrupted. It must precede the rerun's tasks, whose InitProducerId on
    the same ids would abort those transactions."""
    for decision in log.decisions():
        if not decision.completed:
            _complete(coordinator, decision)
            log.write(replace(decision, completed=True))


def abort_open_transactions(coordinator: Coordinator, open_prefix: str, timeout_ms: int) -> None:
    """InitProducerId on every open transaction whose id starts with `open_prefix`, which aborts it, so that no
    read_committed reader waits for it until its timeout. Brokers without ListTransactions are skipped: the
    next InitProducerId on the same id (a later task of the same Spark partition), or the timeout, aborts it."""
    # Best effort: the batch is committed already, and what this misses the timeout aborts.
    try:
        listed = coordinator.list_transactions([ONGOING])
        for t in listed:
            if t.transactional_id.startswith(open_prefix) and t.state == ONGOING:
                coordinator.init_producer_id(t.transactional_id, timeout_ms)
    except (ApiNotServedError, TransactionError, KafkaConnectionError) as e:
        logger.warning("transactions of %s* left open by a crash were not all aborted: %s", open_prefix, e)


def checkpoint_query_id(checkpoint_location: str) -> str | None:
    """The query id Spark keeps in the checkpoint's `metadata` file ({"id": ...}), or None before the first run."""
    try:
        with open(Path(_local_path(checkpoint_location)) / "metadata") as f:
            return json.loads(f.readline())["id"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


# --- the task ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkRow:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    partition: int | None


def rows_of(default_topic: str | None, batches: Iterator[pa.RecordBatch]) -> Iterator[SinkRow]:
    """The sink's rows with the Kafka sink's column rules (topic option over the column, partition optional)."""
    for batch in batches:
        columns = {name.lower(): batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
        for row in range(batch.num_rows):
            topic = default_topic or columns["topic"][row]
            if topic is None:
                raise ValueError("null topic present in the data; use the topic option for setting a topic")
            key = columns["key"][row] if "key" in columns else None
            value = columns["value"][row]
            headers = columns.get("headers")
            partition = columns.get("partition")
            yield SinkRow(
                topic,
                key.encode() if isinstance(key, str) else key,
                value.encode() if isinstance(value, str) else value,
                tuple((h["key"], h["value"]) for h in headers[row]) if headers is not None and headers[row] else (),
                partition[row] if partition is not None else None,
            )


class TransactionWriter:
    """One task's rows into its open transaction: batches per partition with the producer's id, epoch and
    sequence numbers, each partition added to the transaction before its first batch."""

    def __init__(
        self,
        client: TransactionalProducer,
        txn_id: str,
        producer: ProducerIdAndEpoch,
        acks: int,
        timeout_ms: int,
        compression: CompressionType = CompressionType.NONE,
    ) -> None:
        self.client = client
        self.compression = compression
        self.txn_id = txn_id
        self.producer = producer
        self.acks = acks
        self.timeout_ms = timeout_ms
        self.sequences: dict[TopicPartition, int] = {}
        self.pending: dict[TopicPartition, list[RecordSpec]] = {}
        self.pending_bytes = 0
        self.pending_records = 0
        self.records = 0

    def partition_of(self, row: SinkRow) -> TopicPartition:
        """librdkafka's default partitioner (consistent_random), as the sink's non-transactional producer:
        CRC-32 of the key modulo the partition count, a random partition for a null key."""
        if row.partition is not None:
            return TopicPartition(row.topic, row.partition)
        count = self.client.partition_count(row.topic)
        if row.key is None:
            return TopicPartition(row.topic, random.randrange(count))
        return TopicPartition(row.topic, zlib.crc32(row.key) % count)

    def add(self, row: SinkRow, timestamp_ms: int) -> None:
        tp = self.partition_of(row)
        self.pending.setdefault(tp, []).append((row.key, row.value, row.headers, timestamp_ms))
        self.pending_bytes += len(row.key or b"") + len(row.value or b"") + 16
        self.pending_records += 1
        if self.pending_bytes >= FLUSH_BYTES or self.pending_records >= FLUSH_RECORDS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        new = [tp for tp in self.pending if tp not in self.sequences]
        self.client.add_partitions(self.txn_id, self.producer, new)
        batches = {}
        for tp, records in self.pending.items():
            sequence = self.sequences.get(tp, 0)
            batches[tp] = build_batch(
                records,
                producer_id=self.producer.producer_id,
                producer_epoch=self.producer.producer_epoch,
                base_sequence=sequence,
                transactional=True,
                compression=self.compression,
            )
            self.sequences[tp] = sequence + len(records)
        self.client.produce(self.txn_id, batches, self.acks, self.timeout_ms)
        self.records += self.pending_records
        self.pending, self.pending_bytes, self.pending_records = {}, 0, 0

    def written_partitions(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((tp.topic, tp.partition) for tp in self.sequences))


class TransactionalProducer(Protocol):
    def partition_count(self, topic: str) -> int: ...

    def add_partitions(
        self, transactional_id: str, producer: ProducerIdAndEpoch, partitions: Iterable[TopicPartition]
    ) -> None: ...

    def produce(
        self, transactional_id: str, batches: dict[TopicPartition, bytes], acks: int, timeout_ms: int
    ) -> None: ...

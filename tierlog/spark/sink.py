"""`df.write.format("tierlog")` and `df.writeStream.format("tierlog")`: the sink, as Spark's Kafka sink.

The columns and their rules are KafkaWriter.validateQuery's: `value` (string or binary) is required; `key`
(string or binary), `headers` (array<struct<key string, value binary>>), `topic` (string) and `partition` (int)
are optional; the `topic` option, when given, overrides the column. Every task produces its rows with one
idempotent producer (acks=all unless the job says otherwise) and fails if any of them is not acknowledged, so
Spark's task retry applies: like Kafka's sink this is at-least-once, and a retried task may write its rows again.

With `tierlog.sink.transactional=true` a stream writes each micro-batch in Kafka transactions that the driver
commits when Spark commits the batch: exactly once for read_committed readers (tierlog.spark.exactly_once).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from tierlog.client.security_settings import client_security
from tierlog.records.record_batch import CompressionType
from tierlog.spark.exactly_once import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    SinkLog,
    TaskTransaction,
    TransactionWriter,
    abort_transactions,
    checkpoint_query_id,
    commit_batch,
    complete_decisions,
    query_prefix,
    rows_of,
    transactional_id,
)
from tierlog.spark.options import kafka_client_settings, option
from tierlog.spark.txn_client import TxnClient

# Every record acknowledged within this bound, or the task fails (Kafka's delivery.timeout.ms default).
FLUSH_TIMEOUT_S = 120.0
# Producer settings a job may not override: the sink hands the producer bytes it has already serialised.
_FIXED = {
    "key.serializer": "the sink writes the key and value as bytes",
    "value.serializer": "the sink writes the key and value as bytes",
}


TRANSACTIONAL_OPTION = "tierlog.sink.transactional"
TRANSACTIONAL_ID_PREFIX_OPTION = "tierlog.sink.transactional.id.prefix"
DEFAULT_TRANSACTIONAL_ID_PREFIX = "tierlog-spark"
# The brokers' default transaction.max.timeout.ms: a transaction must outlive its micro-batch's tasks, the
# driver's commit and, for a batch decided before a crash, the restart that completes it.
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000


@dataclass(frozen=True)
class SinkOptions:
    topic: str | None
    producer_config: tuple[tuple[str, str], ...]
    # Exactly-once mode (streams only): where the decisions go, the ids' prefix and the transactions' timeout.
    transactional: bool = False
    checkpoint_location: str | None = None
    transactional_id_prefix: str = DEFAULT_TRANSACTIONAL_ID_PREFIX
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS

    @property
    def bootstrap_servers(self) -> str:
        return dict(self.producer_config)["bootstrap.servers"]

    def txn_client(self) -> TxnClient:
        config = dict(self.producer_config)
        return TxnClient(self.bootstrap_servers, client_security(config))

    @property
    def compression(self) -> CompressionType:
        """The producer's compression.type (librdkafka's compression.codec too), for the transactional batches."""
        config = dict(self.producer_config)
        name = config.get("compression.type", config.get("compression.codec", "none")).strip().upper()
        return CompressionType[name]

    @property
    def acks(self) -> int:
        acks = dict(self.producer_config).get("acks", "all").strip().lower()
        return -1 if acks == "all" else int(acks)


@dataclass
class ProducedCount(WriterCommitMessage):
    records: int


def parse_sink_options(options: Mapping[str, str], schema: StructType) -> SinkOptions:
    """The options and the DataFrame's columns checked on the driver, with Spark's Kafka sink messages."""
    bootstrap = option(options, "kafka.bootstrap.servers") or option(options, "bootstrap.servers")
    if not bootstrap:
        raise ValueError("option 'kafka.bootstrap.servers' must be specified for configuring tierlog producer")
    topic = option(options, "topic")
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if topic is None:
        if "topic" not in fields:
            raise ValueError(
                "topic option required when no 'topic' attribute is present. Use the topic option for setting a topic."
            )
        if not isinstance(fields["topic"], StringType):
            raise ValueError(f"topic attribute type must be a string, not {fields['topic'].simpleString()}")
    if "value" not in fields:
        raise ValueError("required attribute 'value' not found")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], StringType | BinaryType):
            raise ValueError(f"{name} attribute type must be a string or binary, not {fields[name].simpleString()}")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise ValueError(f"partition attribute type must be an int, not {fields['partition'].simpleString()}")
    if "headers" in fields and not _is_headers_type(fields["headers"]):
        raise ValueError(
            "headers attribute type must be array<struct<key:string,value:binary>>, "
            f"not {fields['headers'].simpleString()}"
        )
    config = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": "true", "linger.ms": "5"}
    config.update(kafka_client_settings(options, _FIXED))
    raw = (option(options, TRANSACTIONAL_OPTION) or "false").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"option '{TRANSACTIONAL_OPTION}' must be true or false, got '{raw}'")
    if raw == "false":
        return SinkOptions(topic, tuple(sorted(config.items())))
    if "transactional.id" in config:
        raise ValueError(
            "option 'kafka.transactional.id' is not supported: with tierlog.sink.transactional the sink derives "
            f"one per query and partition (set {TRANSACTIONAL_ID_PREFIX_OPTION} to choose their prefix)"
        )
    if dict(config).get("acks", "all").strip().lower() not in ("all", "-1"):
        raise ValueError("option 'kafka.acks' must be all with tierlog.sink.transactional (Kafka's rule)")
    checkpoint = option(options, "checkpointLocation")
    if checkpoint is None:
        raise ValueError(
            f"option '{TRANSACTIONAL_OPTION}' needs the query's checkpointLocation option (not only the session's "
            "spark.sql.streaming.checkpointLocation): the sink keeps its commit decisions beside Spark's checkpoint"
        )
    SinkLog(checkpoint)  # a location that is not an absolute file system path fails now, in one line
    codec = config.get("compression.type", config.get("compression.codec", "none")).strip().upper()
    if codec not in CompressionType.__members__:
        raise ValueError(
            f"option 'kafka.compression.type' must be none, gzip, snappy, lz4 or zstd, got '{codec.lower()}'"
        )
    timeout_ms = config.pop("transaction.timeout.ms", str(DEFAULT_TRANSACTION_TIMEOUT_MS))
    if not timeout_ms.strip().isdigit() or int(timeout_ms) <= 0:
        raise ValueError(f"option 'kafka.transaction.timeout.ms' must be a positive integer, got '{timeout_ms}'")
    return SinkOptions(
        topic,
        tuple(sorted(config.items())),
        transactional=True,
        checkpoint_location=checkpoint,
        transactional_id_prefix=option(options, TRANSACTIONAL_ID_PREFIX_OPTION) or DEFAULT_TRANSACTIONAL_ID_PREFIX,
        transaction_timeout_ms=int(timeout_ms),
    )


def _is_headers_type(data_type: object) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    element = {f.name: f.dataType for f in data_type.elementType.fields}
    return isinstance(element.get("key"), StringType) and isinstance(element.get("value"), BinaryType)


def produce_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> ProducedCount:
    """One task's rows, produced and acknowledged, or an exception naming the first failure."""
    producer = Producer(dict(options.producer_config))
    failures: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None and len(failures) < 1:
            failures.append(str(error))

    count = 0
    for row in rows_of(options.topic, batches):
        kwargs: dict[str, object] = {"value": row.value, "key": row.key, "on_delivery": delivered}
        if row.partition is not None:
            kwargs["partition"] = row.partition
        if row.headers:
            kwargs["headers"] = list(row.headers)
        _produce(producer, row.topic, kwargs)
        count += 1
        if failures:
            break
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if failures:
        raise KafkaException(f"writing to tierlog failed: {failures[0]}")
    if remaining:
        raise TimeoutError(f"writing to tierlog failed: {remaining} records not acknowledged in {FLUSH_TIMEOUT_S}s")
    return ProducedCount(count)


def _produce(producer: Producer, topic: str, kwargs: dict[str, object]) -> None:
    while True:
        try:
            producer.produce(topic, **kwargs)
            producer.poll(0)
            return
        except BufferError:
            # The producer's queue is full: let it deliver some before queueing more.
            producer.poll(0.1)


class TierlogWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return produce_batches(self.options, iterator)


def write_in_transaction(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> TaskTransaction:
    """A task of a transactional stream: its rows in one transaction, left open for the driver to commit."""
    context = TaskContext.get()
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if context is None or query_id is None or batch_id is None:
        raise RuntimeError("tierlog.sink.transactional writes micro-batches of a streaming query only")
    txn_id = transactional_id(options.transactional_id_prefix, query_id, context.partitionId())
    with options.txn_client() as client:
        producer = client.init_producer_id(txn_id, options.transaction_timeout_ms)
        timeout_ms = int(FLUSH_TIMEOUT_S * 1000)
        writer = TransactionWriter(client, txn_id, producer, options.acks, timeout_ms, options.compression)
        for row in rows_of(options.topic, batches):
            writer.add(row, int(time.time() * 1000))
        writer.flush()
    return TaskTransaction(
        txn_id,
        producer.producer_id,
        producer.producer_epoch,
        int(batch_id),
        writer.written_partitions(),
        writer.records,
    )


def complete_decided_batches(options: SinkOptions) -> None:
    """The driver, before a micro-batch's tasks run: commit what a crash left decided."""
    with options.txn_client() as client:
        complete_decisions(client, SinkLog(options.checkpoint_location or ""))


class TierlogStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch's rows are produced by its tasks. At-least-once by default: the base class's commit()
    is right as it is, since the records are in the log once the tasks succeed (a failed batch runs again, rows
    included). With tierlog.sink.transactional the tasks leave their transactions open and commit() ends them."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if self.options.transactional:
            return write_in_transaction(self.options, iterator)
        return produce_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if not self.options.transactional:
            return
        checkpoint = self.options.checkpoint_location or ""
        query_id = checkpoint_query_id(checkpoint)
        open_prefix = None if query_id is None else query_prefix(self.options.transactional_id_prefix, query_id)
        with self.options.txn_client() as client:
            log = SinkLog(checkpoint)
            commit_batch(client, log, batchId, messages, open_prefix, self.options.transaction_timeout_ms)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if not self.options.transactional:
            return
        with self.options.txn_client() as client:
            abort_transactions(client, [m for m in messages if isinstance(m, TaskTransaction) and m.partitions])

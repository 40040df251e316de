"""`df.write.format("tierlog")` and `df.writeStream.format("tierlog")`: the sink, as Spark's Kafka sink.

The columns and their rules are KafkaWriter.validateQuery's: `value` (string or binary) is required; `key`
(string or binary), `headers` (array<struct<key string, value binary>>), `topic` (string) and `partition` (int)
are optional; the `topic` option, when given, overrides the column. Every task produces its rows with one
idempotent producer (acks=all unless the job says otherwise) and fails if any of them is not acknowledged, so
Spark's task retry applies: like Kafka's sink this is at-least-once, and a retried task may write its rows again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from tierlog.spark.options import kafka_client_settings, option

# Every record acknowledged within this bound, or the task fails (Kafka's delivery.timeout.ms default).
FLUSH_TIMEOUT_S = 120.0
# Producer settings a job may not override: the sink hands the producer bytes it has already serialised.
_FIXED = {
    "key.serializer": "the sink writes the key and value as bytes",
    "value.serializer": "the sink writes the key and value as bytes",
}


@dataclass(frozen=True)
class SinkOptions:
    topic: str | None
    producer_config: tuple[tuple[str, str], ...]


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
    return SinkOptions(topic, tuple(sorted(config.items())))


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
    for batch in batches:
        columns = {name.lower(): batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
        for row in range(batch.num_rows):
            topic = options.topic or columns["topic"][row]
            if topic is None:
                raise ValueError("null topic present in the data; use the topic option for setting a topic")
            kwargs: dict[str, object] = {"value": columns["value"][row], "on_delivery": delivered}
            if "key" in columns:
                kwargs["key"] = columns["key"][row]
            if columns.get("partition") is not None and columns["partition"][row] is not None:
                kwargs["partition"] = columns["partition"][row]
            if columns.get("headers") is not None and columns["headers"][row]:
                kwargs["headers"] = [(h["key"], h["value"]) for h in columns["headers"][row]]
            _produce(producer, topic, kwargs)
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


class TierlogStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch's rows are produced by its tasks; the base class's commit() is right as it is, since the
    records are in the log once the tasks succeed (at-least-once: a failed batch runs again, rows included)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return produce_batches(self.options, iterator)

"""`spark.read.format("tierlog")`: the batch reader, through the brokers.

The driver resolves the offset ranges (offsets.py); each Spark partition is one range, read on an
executor with raw Fetch requests to the partition's leader, so the record-batch bytes go straight to the
Arrow decoder instead of through a client's per-record objects.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from tierlog.protocol.errors import error_code
from tierlog.records.record_batch import batch_size_at, read_header
from tierlog.server.entities import request_schema
from tierlog.server.kafka_client import KafkaConnection
from tierlog.spark.arrow import record_batches_to_arrow, spark_ddl
from tierlog.spark.offsets import DataLossError, OffsetRange, batch_ranges, partition_states
from tierlog.spark.options import SourceOptions, parse_batch_options

FETCH_VERSION = 12
# Per-request bounds on an executor's fetches; a range is read in as many fetches as it takes.
FETCH_TIMEOUT_S = 30.0
FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 8 * 1024 * 1024
_NO_ERROR = error_code(None)


@dataclass(frozen=True)
class RangePartition(InputPartition):
    range: OffsetRange
    include_headers: bool
    fail_on_data_loss: bool


class TierlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tierlog"

    def schema(self) -> str:
        include_headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return spark_ddl(include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TierlogBatchReader(parse_batch_options(self.options))


class TierlogBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        ranges = batch_ranges(self.options, partition_states(self.options))
        return [RangePartition(r, self.options.include_headers, self.options.fail_on_data_loss) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            # partitions() gave no range (nothing to read): PySpark then plans one placeholder
            # InputPartition(None) anyway, which holds no records.
            return
        yield from read_range(partition.range, partition.include_headers, partition.fail_on_data_loss)


def read_range(r: OffsetRange, include_headers: bool, fail_on_data_loss: bool) -> Iterator[pa.RecordBatch]:
    """The records of `r` as Arrow batches, one per Fetch response, fetched from the range's leader."""
    # One event loop for the whole range: the connection is opened once and reused by every fetch.
    loop = asyncio.new_event_loop()
    connection: KafkaConnection | None = None
    try:
        host, _, port = r.leader.rpartition(":")
        connection = loop.run_until_complete(
            KafkaConnection.open(host, int(port), client_id="tierlog-spark", timeout_s=FETCH_TIMEOUT_S)
        )
        offset = r.start
        while offset < r.end:
            response = loop.run_until_complete(connection.send(_fetch_request(r, offset), timeout_s=FETCH_TIMEOUT_S))
            answer = response.responses[0].partitions[0]
            if answer.error_code != _NO_ERROR:
                name = answer.error_code.name.upper()
                if name == "OFFSET_OUT_OF_RANGE":
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
                raise RuntimeError(f"fetch of {r.topic}-{r.partition} at {offset} from {r.leader} failed: {name}")
            records = answer.records or b""
            next_offset = _next_offset(records)
            if next_offset is None:
                if int(answer.high_watermark) <= offset:
                    # The range was planned below the high watermark; the log now ends earlier (truncated).
                    if fail_on_data_loss:
                        raise DataLossError(
                            f"{r.topic}-{r.partition}: the log ends at {int(answer.high_watermark)}, before "
                            f"offset {offset} the query planned to read; set failOnDataLoss to false to go on."
                        )
                    return
                raise RuntimeError(
                    f"fetch of {r.topic}-{r.partition} at {offset} returned no complete batch within "
                    f"{FETCH_MAX_BYTES} bytes"
                )
            batch = record_batches_to_arrow(records, r.topic, r.partition, offset, r.end, include_headers)
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
    position = 0
    next_offset = None
    while True:
        size = batch_size_at(view, position)
        if size is None or size > len(view) - position:
            return next_offset
        next_offset = read_header(view, position).next_offset
        position += size


def _fetch_request(r: OffsetRange, offset: int) -> Any:
    s = request_schema(1, FETCH_VERSION)
    return s.FetchRequest(
        replica_id=-1,  # a consumer: the broker answers up to the high watermark only
        max_wait=datetime.timedelta(milliseconds=FETCH_MAX_WAIT_MS),
        min_bytes=1,
        max_bytes=FETCH_MAX_BYTES,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            s.FetchTopic(
                topic=r.topic,
                partitions=(
                    s.FetchPartition(
                        partition=r.partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=FETCH_MAX_BYTES,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )

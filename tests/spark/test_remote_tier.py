"""Direct remote-tier reads for the Spark source, against a real tiered broker on file:// and on S3 (SeaweedFS):
the driver's plan (which segments, which offsets) and the executor's read (bytes straight from the object
store) give exactly what a Kafka consumer reads through the brokers."""

from __future__ import annotations

import itertools
import pickle
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cluster_helpers import ClusterFactory
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from tiered_helpers import (
    CLIENT_TIMEOUT_S,
    LATEST_TIERED,
    create_topic,
    list_offsets,
    start_tiered_broker,
    tiered_topic_configs,
    wait_tiered,
)

from tierlog.common import TopicPartition
from tierlog.records.codec import Record, decode_batches
from tierlog.spark.offsets import DataLossError
from tierlog.spark.options import parse_batch_options, rsm_config_from_options
from tierlog.spark.remote_tier import (
    RemoteLogMetadataView,
    RemoteSegmentSlice,
    divide_run,
    iter_slice_chunks,
    lineage_segments,
    load_remote_log_metadata,
    plan_partition,
    plan_remote_reads,
    plan_remote_slices,
    read_slice,
    remote_reach,
    start_position,
    topic_id_of,
)
from tierlog.spark.source import RangePartition, RemoteSlicePartition, TierlogBatchReader
from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server
from tierlog.tiered.fsspec_storage import FsspecRemoteStorageManager
from tierlog.tiered.remote_log_metadata_cache import RemoteLogMetadataCache
from tierlog.tiered.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)

TOPIC = "events"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RECORDS = 600
BASE_TIMESTAMP_MS = 1_700_000_000_000
# Smaller than a segment (16 KiB) and than most runs of batches, so chunks end mid-batch and mid-segment.
SMALL_CHUNK_BYTES = 3000

Message = tuple[int, bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]


class TieredTopic:
    def __init__(self, cluster: LocalCluster, rsm_config: dict[str, str], remote_end: int) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap
        self.rsm_config = rsm_config
        self.remote_end = remote_end  # Ry + 1: the first offset the remote tier does not hold


@pytest.fixture(params=["file", "s3"])
def tiered_topic(request: pytest.FixtureRequest, tmp_path: Path, cluster_factory: ClusterFactory) -> TieredTopic:
    if request.param == "s3":
        server: LocalS3Server = request.getfixturevalue("s3_server")
        broker_properties = server.rsm_properties(request.getfixturevalue("s3_bucket"), prefix=tmp_path.name)
    else:
        remote = tmp_path / "remote"
        remote.mkdir()
        broker_properties = {"rsm.config.url": f"file://{remote}"}
    # The job hands the brokers' rsm.config.* settings to the source as Spark options.
    options = {f"tierlog.remote.{key}": value for key, value in broker_properties.items()} | {"subscribe": TOPIC}
    rsm_config = rsm_config_from_options(options)
    cluster = start_tiered_broker(cluster_factory, rsm_config)
    # No retention.ms: the records' fixed timestamps are older than the default 7 days.
    create_topic(cluster.bootstrap, TOPIC, tiered_topic_configs(**{"retention.ms": "-1"}), replication_factor=1)
    produce_records(cluster.bootstrap)
    wait_tiered(cluster, 1, TOPIC, RECORDS // 2, settled=True)
    error, highest_tiered, _ = list_offsets(cluster.bootstrap, TOPIC, LATEST_TIERED)
    assert error == 0, f"ListOffsets LATEST_TIERED failed with error {error}"
    return TieredTopic(cluster, rsm_config, highest_tiered + 1)


def produce_records(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 2048})
    failures: list[object] = []
    for i in range(RECORDS):
        producer.produce(
            TOPIC,
            value=f"value-{i:06d}-".encode() + bytes(range(256))[: 50 + i % 100],
            key=None if i % 7 == 0 else f"key-{i % 13}".encode(),
            headers=[("n", str(i).encode()), ("empty", None)] if i % 3 == 0 else None,
            timestamp=BASE_TIMESTAMP_MS + i * 10,
            on_delivery=lambda error, _m: failures.append(error) if error is not None else None,
        )
        producer.poll(0)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not failures, failures[:3]


def consume_from_brokers(bootstrap: str, end: int) -> list[Message]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False, "fetch.wait.max.ms": 100}
    )
    consumer.assign([KafkaTopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    messages: list[Message] = []
    try:

        def more() -> bool:
            for m in consumer.consume(500, timeout=0.5):
                assert m.error() is None, m.error()
                if m.offset() < end:
                    headers = [(k, v) for k, v in (m.headers() or [])]
                    messages.append((m.offset(), m.key(), m.value(), m.timestamp()[1], headers))
            return len(messages) >= end

        wait_until(more, CLIENT_TIMEOUT_S * 2, lambda: f"{end} records of {TOPIC} (have {len(messages)})")
    finally:
        consumer.close()
    return messages


def read_directly(piece: RemoteSegmentSlice, rsm_config: dict[str, str], chunk_bytes: int) -> list[Message]:
    """What an executor reads for one slice, decoded record by record (the Arrow step is SP1's converter)."""
    with FsspecRemoteStorageManager.from_config(rsm_config) as rsm:
        records: list[Record] = [
            record
            for chunk in iter_slice_chunks(rsm, piece, chunk_bytes)
            for batch in decode_batches(chunk)
            for record in batch.records
            if piece.start_offset <= record.offset < piece.end_offset
        ]
    return [(r.offset, r.key, r.value, r.timestamp, [(k, v) for k, v in r.headers]) for r in records]


def test_the_plan_covers_exactly_the_remote_offsets_and_direct_reads_equal_a_consumer(
    tiered_topic: TieredTopic,
) -> None:
    ry_plus_1 = tiered_topic.remote_end
    slices = plan_partition(tiered_topic.bootstrap, TOPIC, 0, 0, RECORDS, tiered_topic.rsm_config)

    assert len(slices) >= 2, "the older half should span several 16 KiB segments"
    assert slices[0].start_offset == 0
    assert remote_reach(slices, 0) == ry_plus_1
    for before, after in itertools.pairwise(slices):
        assert before.end_offset == after.start_offset
    # Spark ships the descriptors to executors pickled.
    assert pickle.loads(pickle.dumps(slices)) == slices
    for piece in slices:
        assert piece.metadata.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
        assert piece.end_offset == piece.metadata.end_offset + 1

    direct = [m for piece in slices for m in read_directly(piece, tiered_topic.rsm_config, SMALL_CHUNK_BYTES)]
    expected = consume_from_brokers(tiered_topic.bootstrap, ry_plus_1)
    assert [m[0] for m in direct] == list(range(ry_plus_1))
    assert direct == expected


def test_read_slice_yields_arrow_batches_with_every_remote_record_and_its_headers(tiered_topic: TieredTopic) -> None:
    slices = plan_partition(tiered_topic.bootstrap, TOPIC, 0, 3, RECORDS, tiered_topic.rsm_config)
    batches = [
        batch
        for piece in slices
        for batch in read_slice(piece, tiered_topic.rsm_config, include_headers=True, chunk_bytes=SMALL_CHUNK_BYTES)
    ]

    assert len(batches) > len(slices), "small chunks give several Arrow batches per segment"
    rows = pa.Table.from_batches(batches).to_pylist()
    expected = [m for m in consume_from_brokers(tiered_topic.bootstrap, tiered_topic.remote_end) if m[0] >= 3]
    assert [message_of(row) for row in rows] == expected
    assert {(row["topic"], row["partition"], row["timestampType"]) for row in rows} == {(TOPIC, 0, 0)}


def test_a_range_boundary_in_the_middle_of_a_segment_is_honoured(tiered_topic: TieredTopic) -> None:
    all_slices = plan_partition(tiered_topic.bootstrap, TOPIC, 0, 0, RECORDS, tiered_topic.rsm_config)
    first = all_slices[0]
    start = first.start_offset + 5
    end = all_slices[1].end_offset - 3
    slices = plan_partition(tiered_topic.bootstrap, TOPIC, 0, start, end, tiered_topic.rsm_config)

    assert [(s.start_offset, s.end_offset) for s in slices] == [
        (start, first.end_offset),
        (first.end_offset, end),
    ]
    expected = [m for m in consume_from_brokers(tiered_topic.bootstrap, end) if m[0] >= start]
    for chunk_bytes in (SMALL_CHUNK_BYTES, 8 * 1024 * 1024):
        direct = [m for piece in slices for m in read_directly(piece, tiered_topic.rsm_config, chunk_bytes)]
        assert direct == expected
    # Cut into pieces for more Spark tasks, the same records come back, each once.
    pieces = [part for run in divide_run(slices, 10) for part in run]
    assert len(pieces) > len(slices)
    assert [m for piece in pieces for m in read_directly(piece, tiered_topic.rsm_config, SMALL_CHUNK_BYTES)] == expected
    # Near a segment's end the read starts from the offset index's position, not the segment's head.
    late = plan_partition(
        tiered_topic.bootstrap, TOPIC, 0, first.end_offset - 4, first.end_offset, tiered_topic.rsm_config
    )
    with FsspecRemoteStorageManager.from_config(tiered_topic.rsm_config) as rsm:
        assert start_position(rsm, late[0]) > 0
    direct = read_directly(late[0], tiered_topic.rsm_config, SMALL_CHUNK_BYTES)
    assert [m[0] for m in direct] == list(range(first.end_offset - 4, first.end_offset))


def test_segments_not_yet_copied_or_being_deleted_are_not_planned(tiered_topic: TieredTopic) -> None:
    topic_id_partition = TopicIdPartition(topic_id_of(tiered_topic.bootstrap, TOPIC), TopicPartition(TOPIC, 0))
    real = load_remote_log_metadata(tiered_topic.bootstrap, [topic_id_partition])[topic_id_partition]
    copied = real.list_remote_log_segments()
    assert all(s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED for s in copied)

    # The same segments, then: a copy of the next offsets that has only started, and the first segment's
    # deletion started (retention at work).
    cache = RemoteLogMetadataCache()
    for segment in copied:
        started = RemoteLogSegmentMetadata(
            segment.segment_id,
            segment.start_offset,
            segment.end_offset,
            segment.max_timestamp_ms,
            segment.broker_id,
            segment.event_timestamp_ms,
            segment.segment_size_in_bytes,
            segment.segment_leader_epochs,
        )
        cache.add_copy_in_progress_segment(started)
        cache.update_remote_log_segment_metadata(
            RemoteLogSegmentMetadataUpdate(segment.segment_id, 0, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1)
        )
    last = copied[-1]
    in_progress = RemoteLogSegmentMetadata(
        RemoteLogSegmentId(topic_id_partition, uuid.uuid4()),
        last.end_offset + 1,
        last.end_offset + 50,
        last.max_timestamp_ms,
        1,
        0,
        1000,
        ((last.segment_leader_epochs[-1][0], last.end_offset + 1),),
    )
    cache.add_copy_in_progress_segment(in_progress)
    cache.update_remote_log_segment_metadata(
        RemoteLogSegmentMetadataUpdate(copied[0].segment_id, 0, RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 1)
    )

    with FsspecRemoteStorageManager.from_config(tiered_topic.rsm_config) as rsm:
        segments = lineage_segments(cache, rsm)
    assert [s.segment_id for s in segments] == [s.segment_id for s in copied[1:]]
    # From the deleted segment's offsets there is nothing remote to read: the plan does not jump the gap.
    assert plan_remote_slices(TOPIC, 0, segments, 0, RECORDS) == []
    tail = plan_remote_slices(TOPIC, 0, segments, copied[1].start_offset, RECORDS)
    assert remote_reach(tail, copied[1].start_offset) == last.end_offset + 1


@pytest.mark.parametrize("tiered_topic", ["file"], indirect=True)
def test_a_followed_metadata_view_plans_as_a_full_re_read_after_copies_and_after_deletions(
    tiered_topic: TieredTopic,
) -> None:
    bootstrap, rsm_config = tiered_topic.bootstrap, tiered_topic.rsm_config
    tp = TopicPartition(TOPIC, 0)
    view = RemoteLogMetadataView(bootstrap)

    def full_and_followed(start: int, end: int) -> tuple[list[RemoteSegmentSlice], list[RemoteSegmentSlice]]:
        full = plan_remote_reads(bootstrap, {tp: (start, end)}, rsm_config)[tp]
        return full, plan_remote_reads(bootstrap, {tp: (start, end)}, rsm_config, metadata=view)[tp]

    try:
        first, followed = full_and_followed(0, RECORDS)
        assert len(first) >= 2 and followed == first

        # More segments copied since the view last read the metadata topic: it reads only what was appended.
        produce_records(bootstrap)
        wait_tiered(tiered_topic.cluster, 1, TOPIC, tiered_topic.remote_end, settled=True)
        grown, followed = full_and_followed(0, 2 * RECORDS)
        assert remote_reach(grown, 0) > remote_reach(first, 0)
        assert followed == grown

        # Segments deleted (DeleteRecords past the first two): their deletion events reach the view too.
        cut = grown[2].start_offset
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_records([KafkaTopicPartition(TOPIC, 0, cut)]).values():
            future.result(CLIENT_TIMEOUT_S)
        # Once both have left the plan, their deletions' remaining events change no plan: the two can be compared.
        wait_until(
            lambda: all(full_and_followed(grown[i].start_offset, 2 * RECORDS)[0] == [] for i in (0, 1)),
            CLIENT_TIMEOUT_S,
            lambda: "the segments below the new log start leave the plan",
        )
        for start in (0, cut):
            full, followed = full_and_followed(start, 2 * RECORDS)
            assert followed == full
        assert full[0].start_offset == cut and remote_reach(full, cut) == remote_reach(grown, 0)
    finally:
        view.close()


def remote_fetches_served(cluster: LocalCluster) -> float:
    """The broker's count of reads it served from the remote tier (Kafka's RemoteFetchRequestsPerSec)."""
    node_id = cluster.node_ids[0]
    with urllib.request.urlopen(f"http://{cluster.http_address(node_id)}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = [line.split()[-1] for line in text.splitlines() if line.startswith("tierlog_remote_fetch_requests_total")]
    assert samples, "the broker exports tierlog_remote_fetch_requests_total"
    return sum(float(s) for s in samples)


def spark_options(tiered_topic: TieredTopic, remote_read: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": tiered_topic.bootstrap,
        "subscribe": TOPIC,
        "includeHeaders": "true",
        "tierlog.remote.read": remote_read,
        **{f"tierlog.remote.rsm.config.{key}": value for key, value in tiered_topic.rsm_config.items()},
    }


def _bytes(value: bytes | bytearray | None) -> bytes | None:
    return None if value is None else bytes(value)  # Spark gives binary columns as bytearray


def rows_as_messages(frame: DataFrame) -> list[Message]:
    rows = frame.selectExpr("offset", "key", "value", "unix_millis(timestamp) AS ts", "headers").collect()
    return sorted(
        (r.offset, _bytes(r.key), _bytes(r.value), r.ts, [(h.key, _bytes(h.value)) for h in r.headers]) for r in rows
    )


@pytest.mark.parametrize("remote_read", ["direct", "broker"])
def test_a_batch_query_reads_the_remote_and_local_parts_as_one_dataframe_exactly_once(
    spark: SparkSession, tiered_topic: TieredTopic, remote_read: str
) -> None:
    options = spark_options(tiered_topic, remote_read)
    planned = TierlogBatchReader(parse_batch_options(options)).partitions()
    remote = [p for p in planned if isinstance(p, RemoteSlicePartition)]
    through_brokers = [p for p in planned if isinstance(p, RangePartition)]
    if remote_read == "direct":
        # One Spark partition per remote segment, then the local tail from the brokers.
        assert len(remote) >= 2 and remote[0].slice.start_offset == 0
        assert len(through_brokers) == 1 and through_brokers[0].range.start == tiered_topic.remote_end
    else:
        assert not remote and [(p.range.start, p.range.end) for p in through_brokers] == [(0, RECORDS)]

    served_before = remote_fetches_served(tiered_topic.cluster)
    read = rows_as_messages(spark.read.format("tierlog").options(**options).load())
    served = remote_fetches_served(tiered_topic.cluster) - served_before

    assert [m[0] for m in read] == list(range(RECORDS))
    assert read == consume_from_brokers(tiered_topic.bootstrap, RECORDS)
    assert [m[3] for m in read] == [BASE_TIMESTAMP_MS + i * 10 for i in range(RECORDS)]
    if remote_read == "direct":
        assert served == 0, "the direct path must not read the remote tier through the broker"
    else:
        assert served > 0, "the broker path reads the remote part through the broker"


def test_a_stream_with_direct_remote_reads_writes_every_record_once_in_bounded_micro_batches(
    spark: SparkSession, tiered_topic: TieredTopic, tmp_path: Path
) -> None:
    options = spark_options(tiered_topic, "direct") | {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "150"}
    out = tmp_path / "out"
    query = (
        spark.readStream.format("tierlog")
        .options(**options)
        .load()
        .selectExpr("offset", "CAST(value AS STRING) AS value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the query did not finish"
    assert query.exception() is None, query.exception()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == RECORDS and max(sizes) <= 150
    assert sorted(r.offset for r in spark.read.parquet(str(out)).collect()) == list(range(RECORDS))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_remote_segment_deleted_after_planning_is_data_loss_per_fail_on_data_loss(
    tiered_topic: TieredTopic, fail_on_data_loss: bool
) -> None:
    options = spark_options(tiered_topic, "direct") | {"failOnDataLoss": str(fail_on_data_loss).lower()}
    reader = TierlogBatchReader(parse_batch_options(options))
    first = next(p for p in reader.partitions() if isinstance(p, RemoteSlicePartition))
    with FsspecRemoteStorageManager.from_config(tiered_topic.rsm_config) as rsm:
        rsm.delete_log_segment_data(first.slice.metadata)
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=r"deleted from the remote tier.*failOnDataLoss"):
            list(reader.read(first))
    else:
        assert list(reader.read(first)) == []


def message_of(row: dict[str, Any]) -> tuple[Any, ...]:
    """A Spark row as the (offset, key, value, timestamp ms, headers) tuple consume_from_brokers gives."""
    return (
        row["offset"],
        row["key"],
        row["value"],
        (row["timestamp"] - EPOCH) // timedelta(milliseconds=1),
        [(h["key"], h["value"]) for h in row["headers"]],
    )


def read_in_process(reader: TierlogBatchReader, partitions: list[object]) -> list[Message]:
    """Every planned partition read as an executor reads it, in this process, as messages in offset order."""
    rows = [row for p in partitions for batch in reader.read(p) for row in pa.Table.from_batches([batch]).to_pylist()]
    return sorted(message_of(row) for row in rows)


def test_min_partitions_groups_a_partitions_consecutive_segments_into_tasks_that_read_the_same_rows(
    tiered_topic: TieredTopic,
) -> None:
    per_segment = TierlogBatchReader(parse_batch_options(spark_options(tiered_topic, "direct")))
    segments = [p for p in per_segment.partitions() if isinstance(p, RemoteSlicePartition)]
    assert len(segments) >= 3 and all(len(p.slices) == 1 for p in segments)
    expected = consume_from_brokers(tiered_topic.bootstrap, RECORDS)
    assert read_in_process(per_segment, per_segment.partitions()) == expected

    # One topic-partition: its remote part and its tail are Kafka's two ranges, so minPartitions 2 is met by one
    # task reading every remote segment in order and one reading the tail through the broker.
    grouped = TierlogBatchReader(parse_batch_options(spark_options(tiered_topic, "direct") | {"minPartitions": "2"}))
    planned = grouped.partitions()
    [remote] = [p for p in planned if isinstance(p, RemoteSlicePartition)]
    [tail] = [p for p in planned if isinstance(p, RangePartition)]
    assert [s.metadata for s in remote.slices] == [p.slice.metadata for p in segments]
    assert (remote.slices[0].start_offset, remote.slices[-1].end_offset, tail.range.start) == (
        0,
        tiered_topic.remote_end,
        tiered_topic.remote_end,
    )
    assert pickle.loads(pickle.dumps(remote)) == remote
    assert read_in_process(grouped, planned) == expected

    # More tasks than ranges: the remote part is cut in proportion to its share of the offsets (Kafka's
    # KafkaOffsetRangeCalculator, halves rounded up), at offsets inside segments too, each offset in one task.
    min_partitions = 7
    divided = TierlogBatchReader(
        parse_batch_options(spark_options(tiered_topic, "direct") | {"minPartitions": str(min_partitions)})
    )
    planned = divided.partitions()
    remote_parts = [p for p in planned if isinstance(p, RemoteSlicePartition)]
    share = tiered_topic.remote_end / RECORDS * min_partitions
    assert len(remote_parts) == max(int(share + 0.5), 1) > 1
    assert len(planned) >= min_partitions - 1  # rounding each range's share, as Kafka, may lose one
    offsets = [(s.start_offset, s.end_offset) for p in remote_parts for s in p.slices]
    assert offsets[0][0] == 0 and offsets[-1][1] == tiered_topic.remote_end
    assert all(before[1] == after[0] for before, after in itertools.pairwise(offsets))
    assert read_in_process(divided, planned) == expected


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_segment_deleted_after_planning_inside_a_grouped_task_is_data_loss_for_its_offsets_only(
    tiered_topic: TieredTopic, fail_on_data_loss: bool
) -> None:
    options = spark_options(tiered_topic, "direct") | {
        "minPartitions": "2",
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    reader = TierlogBatchReader(parse_batch_options(options))
    [remote] = [p for p in reader.partitions() if isinstance(p, RemoteSlicePartition)]
    assert len(remote.slices) >= 3
    gone = remote.slices[1]
    # Read before the deletion: afterwards the brokers cannot serve the deleted offsets either.
    remaining = [
        m
        for m in consume_from_brokers(tiered_topic.bootstrap, tiered_topic.remote_end)
        if not gone.start_offset <= m[0] < gone.end_offset
    ]
    with FsspecRemoteStorageManager.from_config(tiered_topic.rsm_config) as rsm:
        rsm.delete_log_segment_data(gone.metadata)
    if fail_on_data_loss:
        message = rf"offsets {gone.start_offset} to {gone.end_offset - 1} were deleted from the remote tier.*"
        with pytest.raises(DataLossError, match=message + "failOnDataLoss"):
            list(reader.read(remote))
    else:
        # The segments before and after the deleted one are still read, in order.
        assert read_in_process(reader, [remote]) == remaining


def test_a_batch_query_with_grouped_remote_segments_reads_every_record_once(
    spark: SparkSession, tiered_topic: TieredTopic
) -> None:
    options = spark_options(tiered_topic, "direct") | {"minPartitions": "2"}
    frame = spark.read.format("tierlog").options(**options).load()
    # One task for the remote segments, one for the local tail.
    assert frame.rdd.getNumPartitions() == 2
    assert rows_as_messages(frame) == consume_from_brokers(tiered_topic.bootstrap, RECORDS)

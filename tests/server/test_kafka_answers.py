"""Answers clients rely on, as Kafka 3.x gives them, for every version the broker serves, sent raw to a real
broker: a produce refused for some of its records names them (record_errors and error_message, v8+), and
DeleteRecords takes no negative offset but -1 (the high watermark)."""

from __future__ import annotations

import asyncio
import datetime
import re
import time
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tierlog.cli.local_cluster import BrokerProcess
from tierlog.records.codec import RecordSpec, build_batch
from tierlog.records.record_batch import CompressionType
from tierlog.server.entities import request_schema
from tierlog.server.kafka_client import KafkaConnection

TIMEOUT_S = 10.0
API_PRODUCE, API_DELETE_RECORDS = 0, 21
REQUEST_CLASSES = {API_PRODUCE: "ProduceRequest", API_DELETE_RECORDS: "DeleteRecordsRequest"}


def send(broker: BrokerProcess, api_key: int, version: int, **body: Any) -> Any:
    """One request of that version (fields the version lacks are dropped), answered by the broker."""
    request = getattr(request_schema(api_key, version), REQUEST_CLASSES[api_key])(**body)

    async def exchange() -> Any:
        async with asyncio.timeout(TIMEOUT_S):
            connection = await KafkaConnection.open("127.0.0.1", broker.port, client_id="answers", timeout_s=TIMEOUT_S)
            try:
                return await connection.send(request, timeout_s=TIMEOUT_S)
            finally:
                await connection.close()

    return asyncio.run(exchange())


def produce(broker: BrokerProcess, version: int, topic: str, batch: bytes) -> Any:
    s = request_schema(API_PRODUCE, version)
    response = send(
        broker,
        API_PRODUCE,
        version,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
        topic_data=(s.TopicProduceData(name=topic, partition_data=(s.PartitionProduceData(index=0, records=batch),)),),
    )
    ((topic_response,),) = (response.responses,)
    (partition,) = topic_response.partition_responses
    return partition


def keyed(pattern: str) -> list[RecordSpec]:
    """A record per character of `pattern`: 'k' has a key, '-' has none."""
    now = int(time.time() * 1000)
    return [(b"k" if c == "k" else None, f"v{i}".encode(), [], now) for i, c in enumerate(pattern)]


PRODUCE_VERSIONS = range(3, 12)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_keyless_records_on_a_compacted_topic_are_named_in_record_errors_from_v8(
    shared_broker: BrokerProcess, kafka: Any, version: int
) -> None:
    topic = kafka.topic_name(f"v{version}")
    kafka.create_topic(shared_broker.bootstrap, topic, config={"cleanup.policy": "compact"})
    refused = produce(shared_broker, version, topic, build_batch(keyed("k-k-k"), compression=CompressionType.LZ4))
    assert (refused.error_code, refused.base_offset) == (ErrorCode.invalid_record, -1)
    if version >= 5:
        assert refused.log_start_offset == 0
    message = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
    if version >= 8:
        assert [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors] == [
            (1, message),
            (3, message),
        ]
        assert refused.error_message == (
            "One or more records have been rejected due to 2 record errors in total, and only showing the first "
            f"three errors at most: [RecordError(batchIndex=1, message='{message}'), "
            f"RecordError(batchIndex=3, message='{message}')]"
        )
    # Nothing of the refused batch was written: the next batch starts at offset 0.
    accepted = produce(shared_broker, version, topic, build_batch(keyed("kk")))
    assert (accepted.error_code, accepted.base_offset) == (ErrorCode.none, 0)
    if version >= 8:
        assert (accepted.record_errors, accepted.error_message) == ((), None)


@pytest.mark.parametrize("version", [7, 8, 11])
def test_records_out_of_the_timestamp_range_are_named_with_invalid_timestamp(
    shared_broker: BrokerProcess, kafka: Any, version: int
) -> None:
    topic = kafka.topic_name(f"v{version}")
    kafka.create_topic(shared_broker.bootstrap, topic, config={"message.timestamp.before.max.ms": "3600000"})
    now = int(time.time() * 1000)
    old = now - 2 * 3_600_000
    # The first and the largest timestamp are in range: only the records show the old one.
    records: list[RecordSpec] = [(None, b"a", [], now), (None, b"b", [], old), (None, b"c", [], now)]
    refused = produce(shared_broker, version, topic, build_batch(records))
    assert refused.error_code == ErrorCode.invalid_timestamp
    if version >= 8:
        ((index, text),) = [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors]
        assert index == 1
        assert re.fullmatch(
            rf"Timestamp {old} of message with offset 1 is out of range\. The timestamp should be within "
            r"\[(\d+), (\d+)\]",
            text,
        )
        assert refused.error_message == "One or more records have been rejected due to invalid timestamp"


@pytest.mark.parametrize("version", range(0, 3))
def test_delete_records_takes_no_negative_offset_but_minus_one(
    shared_broker: BrokerProcess, kafka: Any, version: int
) -> None:
    topic = kafka.topic_name(f"v{version}")
    kafka.create_topic(shared_broker.bootstrap, topic)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"x"}] * 3)
    s = request_schema(API_DELETE_RECORDS, version)

    def delete(offset: int) -> tuple[int, int]:
        response = send(
            shared_broker,
            API_DELETE_RECORDS,
            version,
            topics=(
                s.DeleteRecordsTopic(
                    name=topic, partitions=(s.DeleteRecordsPartition(partition_index=0, offset=offset),)
                ),
            ),
            timeout=datetime.timedelta(seconds=TIMEOUT_S),
        )
        ((result,),) = (response.topics,)
        (partition,) = result.partitions
        return partition.error_code, partition.low_watermark

    assert delete(-1001) == (ErrorCode.offset_out_of_range, -1)
    assert delete(-2) == (ErrorCode.offset_out_of_range, -1)
    assert delete(4) == (ErrorCode.offset_out_of_range, -1)  # above the high watermark
    assert delete(1) == (ErrorCode.none, 1)
    assert delete(-1) == (ErrorCode.none, 3)  # the high watermark

"""The data path of transactions on a real broker (docs/transactions.md#data-path), with the transaction coordinator
played by hand: transactional batches produced with tierlog's client under a transactional id, markers written with
WriteTxnMarkers, and read by confluent-kafka (librdkafka) and kafka-python consumers with
isolation.level=read_committed. They stop at the LSO while a transaction is open, then see what was committed and
never what was aborted; ListOffsets latest is the LSO for them and the HW for read_uncommitted readers."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import pytest
from cluster_helpers import send_request
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as PythonTopicPartition
from kio.schema.errors import ErrorCode

from tierlog.client.requests import request_schema
from tierlog.records.codec import build_batch
from tierlog.testing.local_cluster import BrokerProcess

API_PRODUCE = 0
API_FETCH = 1
API_INIT_PRODUCER_ID = 22
API_WRITE_TXN_MARKERS = 27
TIMEOUT_S = 20.0


def init_producer_id(bootstrap: str) -> int:
    """A fresh producer id (an idempotent producer's: the test plays the transaction coordinator)."""
    s = request_schema(API_INIT_PRODUCER_ID, 4)
    body = s.InitProducerIdRequest(
        transactional_id=None,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )
    answer = send_request(bootstrap, body)
    assert answer.error_code == ErrorCode.none
    assert answer.producer_epoch == 0
    return int(answer.producer_id)


def produce(
    bootstrap: str, topic: str, values: Sequence[bytes], *, producer_id: int = -1, transactional_id: str | None = None
) -> ErrorCode:
    """One batch of `values` to partition 0, acks=all; transactional (sequence 0) when a producer id is given."""
    records = [(None, value, [], 1_700_000_000_000) for value in values]
    if producer_id >= 0:
        batch = build_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=0, transactional=True)
    else:
        batch = build_batch(records)
    s = request_schema(API_PRODUCE, 9)
    body = s.ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(s.TopicProduceData(name=topic, partition_data=(s.PartitionProduceData(index=0, records=batch),)),),
    )
    (answer,) = send_request(bootstrap, body).responses
    (partition,) = answer.partition_responses
    return ErrorCode(partition.error_code)


def write_markers(bootstrap: str, topic: str, outcomes: dict[int, bool], partitions: Sequence[int] = (0,)) -> Any:
    """WriteTxnMarkers v1: for each producer id, COMMIT (True) or ABORT (False) in `partitions` of `topic`."""
    s = request_schema(API_WRITE_TXN_MARKERS, 1)
    body = s.WriteTxnMarkersRequest(
        markers=tuple(
            s.WritableTxnMarker(
                producer_id=producer_id,
                producer_epoch=0,
                transaction_result=committed,
                topics=(s.WritableTxnMarkerTopic(name=topic, partition_indexes=tuple(partitions)),),
                coordinator_epoch=0,
            )
            for producer_id, committed in outcomes.items()
        )
    )
    return send_request(bootstrap, body)


def marker_errors(answer: Any) -> dict[tuple[int, str, int], ErrorCode]:
    return {
        (marker.producer_id, topic.name, partition.partition_index): ErrorCode(partition.error_code)
        for marker in answer.markers
        for topic in marker.topics
        for partition in topic.partitions
    }


def consume_to_eof(consumer: Consumer, count_eofs: int = 1) -> tuple[list[bytes], int]:
    """The values a confluent-kafka consumer delivers until its `count_eofs`-th end of partition, and where that
    end was (librdkafka's end of partition for read_committed is the LSO)."""
    values: list[bytes] = []
    eofs = 0
    while True:
        msg = consumer.poll(TIMEOUT_S)
        assert msg is not None, f"no end of partition within {TIMEOUT_S}s after {values}"
        error = msg.error()
        if error is None:
            values.append(msg.value())
            continue
        if error.code() != KafkaError._PARTITION_EOF:
            raise KafkaException(error)
        eofs += 1
        if eofs == count_eofs:
            return values, msg.offset()


def python_consumer(bootstrap: str, topic: str) -> tuple[KafkaConsumer, PythonTopicPartition]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        group_id=None,
        request_timeout_ms=int(TIMEOUT_S * 1000),
        consumer_timeout_ms=int(TIMEOUT_S * 1000),
    )
    partition = PythonTopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    return consumer, partition


def python_values(consumer: KafkaConsumer, partition: PythonTopicPartition, until_offset: int) -> list[bytes]:
    """What kafka-python delivers until its position reaches `until_offset`."""
    values: list[bytes] = []
    while consumer.position(partition) < until_offset:
        batch = consumer.poll(timeout_ms=int(TIMEOUT_S * 1000))
        assert batch or consumer.position(partition) >= until_offset, f"kafka-python stalled after {values}"
        values += [record.value for record in batch.get(partition, [])]
    return values


@pytest.fixture(scope="module")
def broker(module_broker_factory: Any) -> BrokerProcess:
    return module_broker_factory()


def test_read_committed_consumers_stop_at_the_lso_then_see_committed_and_skip_aborted_records(
    broker: BrokerProcess, kafka: Any
) -> None:
    bootstrap = broker.bootstrap
    topic = kafka.new_topic(bootstrap)
    committing, aborting = init_producer_id(bootstrap), init_producer_id(bootstrap)
    assert produce(bootstrap, topic, [b"p0"]) == ErrorCode.none  # offset 0
    assert produce(bootstrap, topic, [b"c1", b"c2"], producer_id=committing, transactional_id="t-commit") == 0  # 1-2
    assert produce(bootstrap, topic, [b"a1"], producer_id=aborting, transactional_id="t-abort") == 0  # 3
    assert produce(bootstrap, topic, [b"p1"]) == ErrorCode.none  # 4

    committed = kafka.consumer(bootstrap, isolation_level="read_committed")
    uncommitted = kafka.consumer(bootstrap, isolation_level="read_uncommitted")
    python, partition = python_consumer(bootstrap, topic)
    try:
        committed.assign([ConfluentTopicPartition(topic, 0, OFFSET_BEGINNING)])
        uncommitted.assign([ConfluentTopicPartition(topic, 0, OFFSET_BEGINNING)])
        # Both transactions are open: the LSO is their first offset, 1.
        assert consume_to_eof(committed) == ([b"p0"], 1)
        assert consume_to_eof(uncommitted) == ([b"p0", b"c1", b"c2", b"a1", b"p1"], 5)
        assert committed.get_watermark_offsets(ConfluentTopicPartition(topic, 0), TIMEOUT_S, cached=False)[1] == 1
        assert uncommitted.get_watermark_offsets(ConfluentTopicPartition(topic, 0), TIMEOUT_S, cached=False)[1] == 5
        assert python.end_offsets([partition]) == {partition: 1}
        assert python_values(python, partition, 1) == [b"p0"]

        answer = write_markers(bootstrap, topic, {committing: True, aborting: False})
        assert marker_errors(answer) == {(committing, topic, 0): ErrorCode.none, (aborting, topic, 0): ErrorCode.none}

        # The consumers waiting at the LSO go on (markers at 5 and 6): committed records in, aborted ones out.
        assert consume_to_eof(committed) == ([b"c1", b"c2", b"p1"], 7)
        assert python_values(python, partition, 7) == [b"c1", b"c2", b"p1"]
        assert python.end_offsets([partition]) == {partition: 7}
        assert committed.get_watermark_offsets(ConfluentTopicPartition(topic, 0), TIMEOUT_S, cached=False)[1] == 7
    finally:
        committed.close()
        uncommitted.close()
        python.close()


def test_markers_for_a_partition_not_hosted_are_refused_per_partition(broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = broker.bootstrap
    topic = kafka.new_topic(bootstrap)
    producer_id = init_producer_id(bootstrap)
    assert produce(bootstrap, topic, [b"t"], producer_id=producer_id, transactional_id="t-partial") == 0
    answer = write_markers(bootstrap, topic, {producer_id: True}, partitions=(0, 7))
    assert marker_errors(answer) == {
        (producer_id, topic, 0): ErrorCode.none,
        (producer_id, topic, 7): ErrorCode.unknown_topic_or_partition,
    }
    assert [r.value for r in kafka.consume_all(bootstrap, topic)] == [b"t"]


def test_transactional_records_without_a_transactional_id_are_refused_whole(broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = broker.bootstrap
    topic = kafka.new_topic(bootstrap)
    producer_id = init_producer_id(bootstrap)
    refused = produce(bootstrap, topic, [b"t"], producer_id=producer_id)
    assert refused == ErrorCode.transactional_id_authorization_failed
    assert kafka.watermarks(bootstrap, topic) == (0, 0)


@pytest.mark.parametrize("internal_topic", ["__consumer_offsets", "__transaction_state"])
def test_clients_may_not_produce_to_the_coordinators_topics(broker: BrokerProcess, internal_topic: str) -> None:
    assert produce(broker.bootstrap, internal_topic, [b"forged"]) == ErrorCode.invalid_topic_exception


def fetch_partition(bootstrap: str, topic: str, isolation_level: int) -> Any:
    """Fetch v12 of partition 0 from offset 0 as a consumer, at once."""
    s = request_schema(API_FETCH, 12)
    body = s.FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=(
            s.FetchTopic(
                topic=topic,
                partitions=(
                    s.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    ((partition,),) = (topic.partitions for topic in send_request(bootstrap, body).responses)
    assert partition.error_code == ErrorCode.none
    return partition


def test_fetch_answers_the_lso_and_lists_aborted_transactions_only_for_read_committed(
    broker: BrokerProcess, kafka: Any
) -> None:
    bootstrap = broker.bootstrap
    topic = kafka.new_topic(bootstrap)
    aborting, open_producer = init_producer_id(bootstrap), init_producer_id(bootstrap)
    assert produce(bootstrap, topic, [b"a1"], producer_id=aborting, transactional_id="t-aborting") == 0  # 0
    # The marker's timestamp is now, years after the batch's: the segment rolls (segment.ms), so the abort is indexed
    # in the next segment's .txnindex, and the read of the first segment alone still finds it.
    assert marker_errors(write_markers(bootstrap, topic, {aborting: False})) == {(aborting, topic, 0): 0}  # 1
    assert produce(bootstrap, topic, [b"o1"], producer_id=open_producer, transactional_id="t-open") == 0  # 2
    committed = fetch_partition(bootstrap, topic, 1)
    assert (committed.high_watermark, committed.last_stable_offset) == (3, 2)
    assert [(t.producer_id, t.first_offset) for t in committed.aborted_transactions] == [(aborting, 0)]
    uncommitted = fetch_partition(bootstrap, topic, 0)
    assert (uncommitted.last_stable_offset, uncommitted.aborted_transactions) == (2, None)
    empty_topic = kafka.new_topic(bootstrap)
    # Nothing read, nothing aborted: an empty list, not null, as Kafka answers read_committed.
    assert fetch_partition(bootstrap, empty_topic, 1).aborted_transactions == ()

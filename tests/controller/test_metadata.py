"""ClusterMetadata.apply: the one fold that builds every image, refusing records that do not fit it."""

from __future__ import annotations

import uuid

import pytest

from tierlog.metadata.image import BrokerRegistration, ClusterMetadata, PartitionRegistration
from tierlog.metadata.records import (
    BrokerRegistrationChangeRecord,
    ClusterIdRecord,
    ConfigRecord,
    Endpoint,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)

TOPIC_ID = uuid.UUID(int=42)


def image(*records: MetadataRecord) -> ClusterMetadata:
    metadata = ClusterMetadata()
    for offset, record in enumerate(records):
        metadata.apply(offset, record)
    return metadata


def test_records_fold_into_the_image() -> None:
    metadata = image(
        ClusterIdRecord("cluster"),
        RegisterBrokerRecord(1, "i1", 1, (Endpoint("PLAINTEXT", "h", 9092),), None, True),
        BrokerRegistrationChangeRecord(1, 1, False, None),
        TopicRecord("events", TOPIC_ID),
        PartitionRecord(TOPIC_ID, 0, (1,), (1,), 1, 0, 0),
        PartitionRecord(TOPIC_ID, 1, (1,), (1,), 1, 0, 0),
        PartitionRecord(TOPIC_ID, 0, (1,), (1,), -1, 1, 1),
        ConfigRecord("events", "retention.ms", "5"),
        ConfigRecord("events", "segment.ms", "6"),
        ConfigRecord("events", "retention.ms", None),
        ProducerIdsRecord(1, 3000),
    )
    assert metadata.offset == 10
    assert metadata.cluster_id == "cluster"
    assert metadata.next_producer_id == 3000
    assert metadata.brokers == {
        1: BrokerRegistration(1, "i1", 1, [Endpoint("PLAINTEXT", "h", 9092)], None, fenced=False)
    }
    topic = metadata.topics["events"]
    assert metadata.topic_by_id(TOPIC_ID) is topic
    assert topic.partitions == [PartitionRegistration([1], [1], -1, 1, 1), PartitionRegistration([1], [1], 1, 0, 0)]
    assert topic.configs == {"segment.ms": "6"}
    metadata.apply(11, RemoveTopicRecord(TOPIC_ID))
    assert metadata.topics == {}
    assert metadata.topic_by_id(TOPIC_ID) is None


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (TopicRecord("events", uuid.UUID(int=7)), "exists"),
        (TopicRecord("other", TOPIC_ID), "exists"),
        (PartitionRecord(uuid.UUID(int=7), 0, (1,), (1,), 1, 0, 0), "unknown topic id"),
        (PartitionRecord(TOPIC_ID, 2, (1,), (1,), 1, 0, 0), "has 1 partitions"),
        (ConfigRecord("other", "retention.ms", "1"), "unknown topic other"),
        (RemoveTopicRecord(uuid.UUID(int=7)), "unknown topic id"),
        (BrokerRegistrationChangeRecord(2, 1, True, None), "broker 2 epoch 1"),
        (BrokerRegistrationChangeRecord(1, 5, True, None), "broker 1 epoch 5"),
    ],
)
def test_records_that_do_not_fit_the_image_are_refused_and_change_nothing(record: MetadataRecord, message: str) -> None:
    history = (
        RegisterBrokerRecord(1, "i1", 0, (), None, True),
        TopicRecord("events", TOPIC_ID),
        PartitionRecord(TOPIC_ID, 0, (1,), (1,), 1, 0, 0),
    )
    metadata = image(*history)
    with pytest.raises(ValueError, match=message):
        metadata.apply(3, record)
    assert metadata == image(*history)
    assert metadata.topic_by_id(TOPIC_ID) is metadata.topics["events"]


def test_records_apply_in_offset_order_only() -> None:
    metadata = image(ClusterIdRecord("a"))
    with pytest.raises(ValueError, match="offset 0 applied after offset 0"):
        metadata.apply(0, ClusterIdRecord("b"))
    assert metadata.cluster_id == "a"

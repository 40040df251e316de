"""A metadata image written as records (what a snapshot holds) and replayed into an empty image is the same image,
whatever sequence of records built it; and the snapshot leaves out nothing a record type can change."""

from __future__ import annotations

import uuid
from typing import get_args

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    SCRAM_MECHANISM_NAMES,
    AccessControlEntryRecord,
    BrokerRegistrationChangeRecord,
    ClusterIdRecord,
    ConfigRecord,
    Endpoint,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    UserScramCredentialRecord,
    decode_record,
    encode_record,
)

BROKER_IDS = [1, 2, 3, 4]
TOPIC_NAMES = ["events", "orders", "__consumer_offsets"]
CONFIG_NAMES = ["retention.ms", "cleanup.policy", "log.cleaner.threads"]
USERS = ["alice", "bob"]
# A few ids, so later records often name an earlier one (a topic deleted and created again, an ACL removed).
IDS = [uuid.UUID(int=n) for n in range(2, 8)]


def _record(data: st.DataObject, image: ClusterMetadata) -> MetadataRecord:
    """One record, most of them fitting `image` (naming its brokers, topics, partitions, credentials, ACLs)."""
    kind = data.draw(st.sampled_from(get_args(MetadataRecord)))
    draw = data.draw
    maybe_none = st.none() | st.booleans()
    if kind is ClusterIdRecord:
        return ClusterIdRecord(draw(st.sampled_from(["MkU3OEVBNTcwNTJENDM2Qk", "x" * 22])))
    if kind is RegisterBrokerRecord:
        broker_id = draw(st.sampled_from(BROKER_IDS))
        endpoints = tuple(Endpoint(name, "127.0.0.1", draw(st.integers(1, 65535))) for name in ("PLAINTEXT", "SSL"))
        return RegisterBrokerRecord(
            broker_id,
            draw(st.sampled_from(["inc-a", "inc-b"])),
            draw(st.integers(0, 1000)),
            endpoints[: draw(st.integers(0, 2))],
            draw(st.none() | st.sampled_from(["rack-a", "rack-b"])),
            draw(st.booleans()),
        )
    if kind is BrokerRegistrationChangeRecord:
        broker = image.brokers.get(draw(st.sampled_from(BROKER_IDS)))
        broker_id, broker_epoch = (1, 0) if broker is None else (broker.broker_id, broker.broker_epoch)
        return BrokerRegistrationChangeRecord(broker_id, broker_epoch, draw(maybe_none), draw(maybe_none))
    if kind is UnregisterBrokerRecord:
        broker = image.brokers.get(draw(st.sampled_from(BROKER_IDS)))
        return (
            UnregisterBrokerRecord(1, 0)
            if broker is None
            else UnregisterBrokerRecord(broker.broker_id, broker.broker_epoch)
        )
    if kind is TopicRecord:
        return TopicRecord(draw(st.sampled_from(TOPIC_NAMES)), draw(st.sampled_from(IDS)))
    if kind is PartitionRecord:
        topics = sorted(image.topics.values(), key=lambda t: t.name)
        topic_id = draw(st.sampled_from([t.topic_id for t in topics])) if topics else draw(st.sampled_from(IDS))
        known = image.topic_by_id(topic_id)
        replicas = tuple(draw(st.lists(st.sampled_from(BROKER_IDS), max_size=3, unique=True)))
        return PartitionRecord(
            topic_id,
            draw(st.integers(0, len(known.partitions) if known else 0)),
            replicas,
            tuple(draw(st.lists(st.sampled_from(replicas), unique=True))) if replicas else (),
            draw(st.sampled_from([-1, *replicas])),
            draw(st.integers(0, 50)),
            draw(st.integers(0, 50)),
            # A reassignment in progress: the snapshot must carry it.
            tuple(draw(st.lists(st.sampled_from(replicas), unique=True))) if replicas else (),
            tuple(draw(st.lists(st.sampled_from(replicas), unique=True))) if replicas else (),
        )
    if kind is ConfigRecord:
        resource_type = draw(st.sampled_from([RESOURCE_TOPIC, RESOURCE_BROKER]))
        resource_names = TOPIC_NAMES if resource_type == RESOURCE_TOPIC else ["", "1", "2"]
        return ConfigRecord(
            draw(st.sampled_from(resource_names)),
            draw(st.sampled_from(CONFIG_NAMES)),
            draw(st.none() | st.sampled_from(["1", "delete", "compact"])),
            resource_type,
        )
    if kind is RemoveTopicRecord:
        topics = sorted(image.topics.values(), key=lambda t: t.name)
        return RemoveTopicRecord(draw(st.sampled_from([t.topic_id for t in topics] or IDS)))
    if kind is ProducerIdsRecord:
        return ProducerIdsRecord(draw(st.sampled_from(BROKER_IDS)), image.next_producer_id + 1000)
    if kind is UserScramCredentialRecord:
        return UserScramCredentialRecord(
            draw(st.sampled_from(USERS)),
            draw(st.sampled_from(sorted(SCRAM_MECHANISM_NAMES))),
            draw(st.binary(min_size=1, max_size=8)),
            draw(st.binary(min_size=1, max_size=8)),
            draw(st.binary(min_size=1, max_size=8)),
            draw(st.integers(4096, 16384)),
        )
    if kind is RemoveUserScramCredentialRecord:
        return RemoveUserScramCredentialRecord(
            draw(st.sampled_from(USERS)), draw(st.sampled_from(sorted(SCRAM_MECHANISM_NAMES)))
        )
    if kind is AccessControlEntryRecord:
        return AccessControlEntryRecord(
            draw(st.sampled_from(IDS)),
            draw(st.integers(1, 5)),
            draw(st.sampled_from(TOPIC_NAMES)),
            draw(st.integers(1, 3)),
            draw(st.sampled_from(["User:alice", "User:*"])),
            draw(st.sampled_from(["*", "10.0.0.1"])),
            draw(st.integers(2, 12)),
            draw(st.integers(2, 3)),
        )
    assert kind is RemoveAccessControlEntryRecord
    return RemoveAccessControlEntryRecord(draw(st.sampled_from(sorted(image.acls) or IDS)))


def _build_image(data: st.DataObject, length: int) -> ClusterMetadata:
    """Apply `length` random records at increasing offsets; those that do not fit are refused (ValueError, the
    image unchanged), as a diverged log would be, and left out."""
    image = ClusterMetadata()
    offset = 0
    for _ in range(length):
        record = _record(data, image)
        offset += data.draw(st.integers(1, 3))
        try:
            image.apply(offset, record)
        except ValueError:
            continue
    return image


# No shrinking: shrinking a sequence whose every record depends on the image before it takes minutes; a failure
# shows the records as drawn.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def _replayed(image: ClusterMetadata) -> ClusterMetadata:
    # Through the record encoding too, as a snapshot file stores them.
    records = [decode_record(encode_record(record)) for record in image.snapshot_records()]
    return ClusterMetadata.from_snapshot(records, image.offset + 1)


@settings(max_examples=300, deadline=None, phases=NO_SHRINK)
@given(data=st.data(), length=st.integers(0, 80))
def test_an_image_replayed_from_its_snapshot_records_is_the_same_image(data: st.DataObject, length: int) -> None:
    image = _build_image(data, length)
    replayed = _replayed(image)
    assert replayed == image
    # The derived index is rebuilt too, so the replayed image answers lookups by topic id.
    for topic in image.topics.values():
        assert replayed.topic_by_id(topic.topic_id) == topic


@settings(max_examples=100, deadline=None, phases=NO_SHRINK)
@given(data=st.data(), length=st.integers(0, 60), more=st.integers(1, 30))
def test_records_after_the_snapshot_apply_to_the_replayed_image_as_to_the_original(
    data: st.DataObject, length: int, more: int
) -> None:
    """A restarted node loads the snapshot, then replays the log after it: it must end where the original did."""
    image = _build_image(data, length)
    replayed = _replayed(image)
    offset = image.offset
    for _ in range(more):
        record = _record(data, image)
        offset += 1
        results = []
        for target in (image, replayed):
            try:
                target.apply(offset, record)
                results.append(None)
            except ValueError as e:
                results.append(str(e))
        assert results[0] == results[1]
    assert replayed == image


def test_a_snapshot_holds_every_part_of_the_image() -> None:
    """One image with every kind of state, so the snapshot cannot silently leave one out."""
    topic_id, acl_id = IDS[0], IDS[1]
    records: list[MetadataRecord] = [
        ClusterIdRecord("MkU3OEVBNTcwNTJENDM2Qk"),
        RegisterBrokerRecord(1, "inc", 1, (Endpoint("PLAINTEXT", "h", 9092),), "rack-a", False),
        BrokerRegistrationChangeRecord(1, 1, None, True),
        RegisterBrokerRecord(2, "inc-2", 3, (), None, True),
        ConfigRecord("", "log.cleaner.threads", "2", RESOURCE_BROKER),
        ConfigRecord("2", "log.cleaner.threads", "3", RESOURCE_BROKER),
        TopicRecord("events", topic_id),
        PartitionRecord(topic_id, 0, (1, 2), (1,), 1, 3, 7),
        PartitionRecord(topic_id, 1, (2, 1), (2, 1), 2, 0, 0),
        ConfigRecord("events", "retention.ms", "1000"),
        ProducerIdsRecord(1, 2000),
        UserScramCredentialRecord("alice", 2, b"salt", b"stored", b"server", 8192),
        AccessControlEntryRecord(acl_id, 2, "events", 3, "User:alice", "*", 3, 3),
    ]
    image = ClusterMetadata()
    for offset, record in enumerate(records, start=10):
        image.apply(offset, record)
    snapshot = image.snapshot_records()
    assert {type(record) for record in snapshot} == {type(record) for record in records}
    replayed = ClusterMetadata.from_snapshot(snapshot, image.offset + 1)
    assert replayed == image
    assert replayed.offset == 22
    assert replayed.brokers[1].in_controlled_shutdown
    assert replayed.next_producer_id == 2000


def test_an_empty_image_is_an_empty_snapshot() -> None:
    assert ClusterMetadata().snapshot_records() == []
    assert ClusterMetadata.from_snapshot([], 0) == ClusterMetadata()


def test_a_snapshot_record_that_does_not_fit_is_refused_naming_where() -> None:
    with pytest.raises(ValueError, match=r"^PartitionRecord for unknown topic id"):
        ClusterMetadata.from_snapshot([PartitionRecord(IDS[0], 0, (1,), (1,), 1, 0, 0)], 5)
    with pytest.raises(ValueError, match=r"^ConfigRecord 1 of the snapshot at offset 5 for unknown topic events$"):
        ClusterMetadata.from_snapshot([ClusterIdRecord("c"), ConfigRecord("events", "retention.ms", "1")], 5)

"""Metadata records survive encoding exactly, and anything else is refused with a message naming the fault."""

from __future__ import annotations

import json
import re
import uuid
from typing import get_args

import pytest

from tierlog.metadata.records import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
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

TOPIC_ID = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")

EVERY_RECORD_TYPE: list[MetadataRecord] = [
    ClusterIdRecord("MkU3OEVBNTcwNTJENDM2Qk"),
    RegisterBrokerRecord(
        1, "a-uuid", 7, (Endpoint("PLAINTEXT", "h1", 9092), Endpoint("CONTROLLER", "h1", 9093)), None, True
    ),
    RegisterBrokerRecord(2, "b-uuid", 9, (), "rack-a", False),
    BrokerRegistrationChangeRecord(1, 7, True, None),
    BrokerRegistrationChangeRecord(1, 7, None, False),
    UnregisterBrokerRecord(1, 7),
    TopicRecord("events", TOPIC_ID),
    PartitionRecord(TOPIC_ID, 3, (1, 2, 3), (1, 3), 1, 4, 9),
    ConfigRecord("events", "retention.ms", "1000"),
    ConfigRecord("events", "retention.ms", None),
    RemoveTopicRecord(TOPIC_ID),
    ProducerIdsRecord(-1, 2000),
    UserScramCredentialRecord("alice", 2, b"salt\x00\xff", b"stored", b"server", 8192),
    RemoveUserScramCredentialRecord("alice", 2),
    AccessControlEntryRecord(TOPIC_ID, 2, "events", 4, "User:alice", "*", 3, 3),
    RemoveAccessControlEntryRecord(TOPIC_ID),
]


def test_the_round_trip_cases_cover_every_record_type() -> None:
    assert {type(r) for r in EVERY_RECORD_TYPE} == set(get_args(MetadataRecord))


@pytest.mark.parametrize("record", EVERY_RECORD_TYPE, ids=lambda r: type(r).__name__)
def test_every_record_type_round_trips(record: MetadataRecord) -> None:
    assert decode_record(encode_record(record)) == record


def test_records_are_compact_json_with_their_type_and_string_topic_ids() -> None:
    assert encode_record(PartitionRecord(TOPIC_ID, 0, (1, 2), (2,), 2, 1, 3)) == (
        b'{"type":"PartitionRecord","topic_id":"6ba7b810-9dad-11d1-80b4-00c04fd430c8","partition_id":0,'
        b'"replicas":[1,2],"isr":[2],"leader":2,"leader_epoch":1,"partition_epoch":3,'
        b'"adding_replicas":[],"removing_replicas":[]}'
    )
    assert json.loads(
        encode_record(RegisterBrokerRecord(1, "i", 7, (Endpoint("PLAINTEXT", "h", 9092),), None, True))
    ) == {
        "type": "RegisterBrokerRecord",
        "broker_id": 1,
        "incarnation_id": "i",
        "broker_epoch": 7,
        "endpoints": [{"name": "PLAINTEXT", "host": "h", "port": 9092}],
        "rack": None,
        "fenced": True,
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "metadata record is not JSON"),
        (b"{not json", "metadata record is not JSON"),
        (b"[1, 2]", "metadata record is not a JSON object"),
        (b'{"cluster_id": "x"}', "unknown metadata record type None"),
        (b'{"type": "LeaderChangeRecord"}', "unknown metadata record type 'LeaderChangeRecord'"),
        (b'{"type": "ClusterIdRecord"}', "ClusterIdRecord lacks field 'cluster_id'"),
        (b'{"type": "ClusterIdRecord", "cluster_id": 5}', "ClusterIdRecord.cluster_id: expected a string"),
        (b'{"type": "ProducerIdsRecord", "broker_id": true, "next_producer_id": 1}', "ProducerIdsRecord.broker_id"),
        (b'{"type": "RemoveTopicRecord", "topic_id": "nope"}', "RemoveTopicRecord.topic_id"),
        (
            b'{"type": "BrokerRegistrationChangeRecord", "broker_id": 1, "broker_epoch": 2, "fenced": "yes", '
            b'"in_controlled_shutdown": null}',
            "BrokerRegistrationChangeRecord.fenced: expected true or false",
        ),
        (
            b'{"type": "PartitionRecord", "topic_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8", "partition_id": 0, '
            b'"replicas": [1, "2"], "isr": [1], "leader": 1, "leader_epoch": 0, "partition_epoch": 0}',
            "PartitionRecord.replicas: expected an integer",
        ),
        (
            b'{"type": "UserScramCredentialRecord", "name": "a", "mechanism": 1, "salt": "not base64!", '
            b'"stored_key": "", "server_key": "", "iterations": 4096}',
            "UserScramCredentialRecord.salt: expected base64",
        ),
        (
            b'{"type": "RegisterBrokerRecord", "broker_id": 1, "incarnation_id": "i", "broker_epoch": 0, '
            b'"endpoints": [{"name": "P", "host": "h"}], "rack": null, "fenced": true}',
            "RegisterBrokerRecord.endpoints: expected an endpoint",
        ),
    ],
)
def test_garbage_is_refused_with_a_clear_message(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        decode_record(data)


def test_a_config_record_written_before_broker_configs_existed_is_a_topic_config() -> None:
    old = b'{"type":"ConfigRecord","resource_name":"events","name":"retention.ms","value":"1000"}'
    assert decode_record(old) == ConfigRecord("events", "retention.ms", "1000", RESOURCE_TOPIC)
    broker = ConfigRecord("", "log.retention.ms", "1000", RESOURCE_BROKER)
    assert decode_record(encode_record(broker)) == broker


def test_scram_keys_are_base64_in_the_log_and_kept_out_of_reprs() -> None:
    record = UserScramCredentialRecord("alice", 1, b"\x01\x02", b"\x03", b"\x04", 4096)
    assert json.loads(encode_record(record)) == {
        "type": "UserScramCredentialRecord",
        "name": "alice",
        "mechanism": 1,
        "salt": "AQI=",
        "stored_key": "Aw==",
        "server_key": "BA==",
        "iterations": 4096,
    }
    assert repr(record) == "UserScramCredentialRecord(name='alice', mechanism=1, iterations=4096)"

"""The served version table agrees with kio's schemas and Kafka's header rules."""

from __future__ import annotations

import pytest
from kio.index import load_request_schema, load_response_schema
from protocol_helpers import SERVED

from tierlog.protocol.api_versions import (
    SUPPORTED_APIS,
    enabled_apis,
    request_header_version,
    response_header_version,
    supported_api_versions,
)


def test_table_is_the_agreed_one() -> None:
    ranges = {api.name: (api.min_version, api.max_version) for api in SUPPORTED_APIS.values()}
    assert ranges == {
        "ApiVersions": (0, 4),
        "Metadata": (0, 12),
        "Produce": (3, 11),
        "Fetch": (4, 16),
        "ListOffsets": (1, 9),
        "CreateTopics": (2, 7),
        "DeleteTopics": (1, 6),
        "CreatePartitions": (0, 3),
        "ElectLeaders": (0, 2),
        "AlterPartitionReassignments": (0, 0),
        "ListPartitionReassignments": (0, 0),
        "UnregisterBroker": (0, 0),
        "DescribeAcls": (1, 3),
        "CreateAcls": (1, 3),
        "DeleteAcls": (1, 3),
        "DescribeConfigs": (1, 4),
        "AlterConfigs": (0, 2),
        "IncrementalAlterConfigs": (0, 1),
        "DescribeCluster": (0, 1),
        "DeleteRecords": (0, 2),
        "DescribeLogDirs": (1, 4),
        "AlterReplicaLogDirs": (1, 2),
        "OffsetForLeaderEpoch": (2, 4),
        "FindCoordinator": (0, 4),
        "InitProducerId": (0, 4),
        "DescribeProducers": (0, 0),
        "AddPartitionsToTxn": (0, 3),
        "AddOffsetsToTxn": (0, 3),
        "EndTxn": (0, 3),
        "DescribeTransactions": (0, 0),
        "ListTransactions": (0, 1),
        "WriteTxnMarkers": (1, 1),
        "JoinGroup": (0, 9),
        "SyncGroup": (0, 5),
        "Heartbeat": (0, 4),
        "LeaveGroup": (0, 5),
        "OffsetCommit": (2, 9),
        "OffsetFetch": (1, 9),
        "ListGroups": (0, 5),
        "DescribeGroups": (0, 5),
        "DeleteGroups": (0, 2),
        "OffsetDelete": (0, 0),
        "TxnOffsetCommit": (0, 3),
        "SaslHandshake": (0, 1),
        "SaslAuthenticate": (0, 2),
        "DescribeUserScramCredentials": (0, 0),
        "AlterUserScramCredentials": (0, 0),
        "AlterPartition": (2, 3),
        "BrokerRegistration": (0, 4),
        "BrokerHeartbeat": (0, 1),
        "AllocateProducerIds": (0, 0),
        "Vote": (0, 2),
        "BeginQuorumEpoch": (0, 1),
        "EndQuorumEpoch": (0, 1),
        "DescribeQuorum": (0, 2),
        "FetchSnapshot": (0, 1),
    }


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_kio_has_every_served_version_with_our_flexibility_and_headers(api_key: int, version: int) -> None:
    request_type = load_request_schema(api_key, version)
    response_type = load_response_schema(api_key, version)
    api = SUPPORTED_APIS[api_key]
    assert request_type.__flexible__ == api.is_flexible(version)
    assert response_type.__flexible__ == api.is_flexible(version)
    assert request_type.__header_schema__.__version__ == request_header_version(api_key, version)
    assert response_type.__header_schema__.__version__ == response_header_version(api_key, version)


def test_api_versions_response_header_is_always_v0() -> None:
    assert response_header_version(18, 3) == 0
    assert response_header_version(18, 4) == 0
    assert request_header_version(18, 3) == 2
    assert request_header_version(18, 0) == 1


def test_produce_is_advertised_from_v0_like_kafka_4() -> None:
    # KAFKA-18659: librdkafka's compressed produce needs Produce v0 in the ApiVersions answer.
    entries = {entry.api_key: entry for entry in supported_api_versions(SUPPORTED_APIS)}
    assert (entries[0].min_version, entries[0].max_version) == (0, 11)
    assert (entries[1].min_version, entries[1].max_version) == (4, 16)
    assert not SUPPORTED_APIS[0].serves(2)


def test_entries_follow_the_enabled_subset_sorted_by_key() -> None:
    assert supported_api_versions(enabled_apis([3, 18, 0])) == ((0, 0, 11), (3, 0, 12), (18, 0, 4))
    assert supported_api_versions([18, 18]) == ((18, 0, 4),)


def test_enabled_apis_rejects_unknown_keys_and_requires_api_versions() -> None:
    with pytest.raises(ValueError, match="not implemented"):
        enabled_apis([18, 99])
    with pytest.raises(ValueError, match="ApiVersions"):
        enabled_apis([0, 1])

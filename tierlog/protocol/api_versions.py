"""The Kafka APIs and versions this broker serves, and the header versions each of them uses.

The table is data: the server picks which API keys it enables (`enabled_apis`), answers ApiVersions with
`supported_api_versions` and hands the same mapping to `codec.parse_request`, so a broker never
advertises a version it would then refuse, nor parses one it did not advertise.

Every maximum is the smaller of what kio 0.6.5 has a schema for and the last version whose semantics we
implement; the reason for each cap sits next to the entry (quotes are from Kafka 4.x's message JSON).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

API_VERSIONS_KEY = 18


@dataclass(frozen=True, slots=True)
class ApiSupport:
    """One API: the versions we parse and answer, and where its flexible (KIP-482) versions start."""

    api_key: int
    name: str
    min_version: int
    max_version: int
    first_flexible_version: int
    # What ApiVersions advertises as the minimum, when it must differ from what we parse (Produce only).
    advertised_min_version: int | None = None

    def serves(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return version >= self.first_flexible_version


_TABLE: tuple[ApiSupport, ...] = (
    # v4 only lifts KAFKA-17011 (a SupportedFeatures MinVersion of 0); kio's newest is v4.
    ApiSupport(18, "ApiVersions", 0, 4, 3),
    # v13 adds a top-level error code for KIP-1102 rebootstrap (REBOOTSTRAP_REQUIRED), which we never
    # send; capping at v12 keeps one response shape (v10+ already carries topic ids).
    ApiSupport(3, "Metadata", 0, 12, 9),
    # Kafka 4.0 removed v0-2 but, because of librdkafka's compressed-produce bug (KAFKA-18659), still lists
    # Produce from v0 in ApiVersions and rejects v0-2 requests: we do the same (kio has no v0-2 either).
    # v12 means "the broker adds the partition to the transaction itself" (KIP-890 part 2) and v13
    # replaces topic names with ids; we implement neither, so v11 is the cap.
    ApiSupport(0, "Produce", 3, 11, 9, advertised_min_version=0),
    # kio starts at v4 (as does Kafka 4.0). v13+ name topics by id, which the controller keeps. v17 adds the
    # ReplicaDirectoryId of KIP-853 (KRaft voters) and v18 the HighWatermark of KIP-1166: neither applies.
    ApiSupport(1, "Fetch", 4, 16, 12),
    # v0 is gone in Kafka 4.0 and kio. v9 adds LATEST_TIERED_TIMESTAMP (-5); v10 adds a TimeoutMs for async
    # remote lookups (KIP-1075) and v11 EARLIEST_PENDING_UPLOAD (-6, KIP-1023), which we do not implement.
    ApiSupport(2, "ListOffsets", 1, 9, 6),
    ApiSupport(19, "CreateTopics", 2, 7, 5),
    # v6 names topics by name or id; both are resolvable here.
    ApiSupport(20, "DeleteTopics", 1, 6, 4),
    ApiSupport(37, "CreatePartitions", 0, 3, 2),
    # v1 adds the election type (KIP-460) and a top-level error code; v2 is Kafka's newest.
    ApiSupport(43, "ElectLeaders", 0, 2, 2),
    # Reassignments (KIP-455) and decommissioning (KIP-500), forwarded to the controller (docs/reassignment.md).
    # AlterPartitionReassignments v1 adds AllowReplicationFactorChange (KIP-860), which we do not implement.
    ApiSupport(45, "AlterPartitionReassignments", 0, 0, 0),
    ApiSupport(46, "ListPartitionReassignments", 0, 0, 0),
    ApiSupport(64, "UnregisterBroker", 0, 0, 0),
    # Kafka 4.0 (and kio) start the ACL APIs at v1 (v0 had no pattern types); v3 is the newest.
    ApiSupport(29, "DescribeAcls", 1, 3, 2),
    ApiSupport(30, "CreateAcls", 1, 3, 2),
    ApiSupport(31, "DeleteAcls", 1, 3, 2),
    ApiSupport(32, "DescribeConfigs", 1, 4, 4),
    ApiSupport(33, "AlterConfigs", 0, 2, 2),
    ApiSupport(44, "IncrementalAlterConfigs", 0, 1, 1),
    # v2 adds IncludeFencedBrokers (KIP-1073), which we do not report.
    ApiSupport(60, "DescribeCluster", 0, 1, 0),
    ApiSupport(21, "DeleteRecords", 0, 2, 2),
    # The log-dir APIs (docs/replication.md#log-dirs). Kafka 4.0 (KIP-896) and kio start both at v1. DescribeLogDirs
    # v3 adds the top-level error code, v4 the file system's total and usable bytes; kio's v5 is past Kafka's 4.0.
    ApiSupport(35, "DescribeLogDirs", 1, 4, 2),
    ApiSupport(34, "AlterReplicaLogDirs", 1, 2, 2),
    # kio (and Kafka 4.0) start at v2; v4 is the newest.
    ApiSupport(23, "OffsetForLeaderEpoch", 2, 4, 4),
    # v5 adds TRANSACTION_ABORTABLE (KIP-890) and v6 share-group keys (KIP-932); we implement neither.
    ApiSupport(10, "FindCoordinator", 0, 4, 3),
    # v5 adds TRANSACTION_ABORTABLE (KIP-890) and v6 two-phase commit (KIP-939); we implement neither.
    ApiSupport(22, "InitProducerId", 0, 4, 2),
    # kio's only (and Kafka's newest) version; flexible from v0.
    ApiSupport(61, "DescribeProducers", 0, 0, 0),
    # Transactions (KIP-98, docs/transactions.md#coordinator-shell). AddPartitionsToTxn v4+ batches transactions for
    # KIP-890's broker-side verification, AddOffsetsToTxn v4 and EndTxn v4 add TRANSACTION_ABORTABLE and EndTxn v5
    # KIP-890's epoch bump on every commit: we implement none of them, so v3 is the cap of all three.
    ApiSupport(24, "AddPartitionsToTxn", 0, 3, 3),
    ApiSupport(25, "AddOffsetsToTxn", 0, 3, 3),
    ApiSupport(26, "EndTxn", 0, 3, 3),
    # KIP-664's admin APIs; ListTransactions v1 adds the duration filter (KIP-994), v2 a transactional id pattern
    # (KIP-1152), which we do not implement.
    ApiSupport(65, "DescribeTransactions", 0, 0, 0),
    ApiSupport(66, "ListTransactions", 0, 1, 0),
    # The transaction coordinator's markers (docs/transactions.md#write-txn-markers). kio starts at v1 (Kafka 4.0
    # dropped v0); v2 adds the marker's TransactionVersion of KIP-890 part 2, which we do not implement.
    ApiSupport(27, "WriteTxnMarkers", 1, 1, 1),
    # The classic group protocol (docs/groups.md). JoinGroup v9's SkipAssignment is always false here, which
    # a v9 broker may answer; kio's newest are JoinGroup v9, SyncGroup v5, Heartbeat v4, LeaveGroup v5.
    ApiSupport(11, "JoinGroup", 0, 9, 6),
    ApiSupport(14, "SyncGroup", 0, 5, 4),
    ApiSupport(12, "Heartbeat", 0, 4, 4),
    ApiSupport(13, "LeaveGroup", 0, 5, 4),
    # kio (and Kafka 4.0) start OffsetCommit at v2 and OffsetFetch at v1. v10 of both name topics by id
    # (KIP-848's consumer protocol), which classic groups do not use: v9 is the cap.
    ApiSupport(8, "OffsetCommit", 2, 9, 8),
    ApiSupport(9, "OffsetFetch", 1, 9, 6),
    ApiSupport(16, "ListGroups", 0, 5, 3),
    # v6 answers an unknown group GROUP_ID_NOT_FOUND with an error message (KIP-1043); up to v5 Kafka
    # describes it as Dead without an error, as we do.
    ApiSupport(15, "DescribeGroups", 0, 5, 5),
    ApiSupport(42, "DeleteGroups", 0, 2, 2),
    # No flexible version exists (the first would be v1).
    ApiSupport(47, "OffsetDelete", 0, 0, 1),
    # Offsets committed in a transaction (docs/transactions.md#offsets). v3 adds KIP-447's member id, generation
    # and instance id; v4 means the broker verifies the transaction itself (KIP-890 part 2), which we do not.
    ApiSupport(28, "TxnOffsetCommit", 0, 3, 3),
    # SASL (KIP-43, KIP-152): a SASL listener's connection sends these before it is authenticated (the
    # authenticator answers them, docs/security.md#sasl); afterwards, and on other listeners, the broker answers
    # ILLEGAL_SASL_STATE, as Kafka. SaslHandshake has no flexible version (the first would be v2).
    ApiSupport(17, "SaslHandshake", 0, 1, 2),
    ApiSupport(36, "SaslAuthenticate", 0, 2, 2),
    # SCRAM credential management (KIP-554); kio's only (and Kafka's newest) versions, flexible from v0.
    ApiSupport(50, "DescribeUserScramCredentials", 0, 0, 0),
    ApiSupport(51, "AlterUserScramCredentials", 0, 0, 0),
    # Controller APIs, enabled only on a controller node. AlterPartition v2 names topics by id and v3 adds
    # broker epochs to the new ISR; BrokerHeartbeat v2 adds offline log dir ids (JBOD), not served.
    ApiSupport(56, "AlterPartition", 2, 3, 0),
    ApiSupport(62, "BrokerRegistration", 0, 4, 0),
    ApiSupport(63, "BrokerHeartbeat", 0, 1, 0),
    ApiSupport(67, "AllocateProducerIds", 0, 0, 0),
    # The controller quorum's APIs (KIP-595), enabled only on a controller node: every version kio has, so Kafka
    # 3.7 to 4.x controllers' requests parse. Vote v1, BeginQuorumEpoch v1, EndQuorumEpoch v1, FetchSnapshot v1
    # and DescribeQuorum v2 add KIP-853's directory ids and endpoints (static voters have no use for them), Vote
    # v2 KIP-996's PreVote, DescribeQuorum v1 the replicas' last fetch and caught-up times.
    ApiSupport(52, "Vote", 0, 2, 0),
    ApiSupport(53, "BeginQuorumEpoch", 0, 1, 1),
    ApiSupport(54, "EndQuorumEpoch", 0, 1, 1),
    ApiSupport(55, "DescribeQuorum", 0, 2, 0),
    ApiSupport(59, "FetchSnapshot", 0, 1, 0),
)

SUPPORTED_APIS: Mapping[int, ApiSupport] = MappingProxyType({api.api_key: api for api in _TABLE})


def api_name(api_key: int) -> str:
    """Kafka's name of an API tierlog serves (e.g. "DescribeQuorum"), else "API <key>"."""
    support = SUPPORTED_APIS.get(api_key)
    return support.name if support is not None else f"API {api_key}"


def enabled_apis(enabled_keys: Iterable[int]) -> Mapping[int, ApiSupport]:
    """The subset of SUPPORTED_APIS the server enables; ApiVersions must be among them (KIP-511).

    Raises ValueError for a key we do not implement, so a typo cannot silently disable an API.
    """
    keys = set(enabled_keys)
    unknown = keys - SUPPORTED_APIS.keys()
    if unknown:
        raise ValueError(f"API keys not implemented by the protocol layer: {sorted(unknown)}")
    if API_VERSIONS_KEY not in keys:
        raise ValueError("ApiVersions (18) must be enabled: clients cannot negotiate without it")
    return MappingProxyType({key: SUPPORTED_APIS[key] for key in sorted(keys)})


class ApiVersionEntry(NamedTuple):
    """One `api_keys` entry of an ApiVersions response; build the kio `ApiVersion` of the response's
    version from it (each ApiVersions version has its own class)."""

    api_key: int
    min_version: int
    max_version: int


def supported_api_versions(enabled_keys: Iterable[int]) -> tuple[ApiVersionEntry, ...]:
    """What ApiVersions advertises for `enabled_keys` (e.g. the mapping `enabled_apis` returned), by key."""
    entries = []
    for key in sorted(set(enabled_keys)):
        api = SUPPORTED_APIS[key]
        advertised_min = api.min_version if api.advertised_min_version is None else api.advertised_min_version
        entries.append(ApiVersionEntry(api.api_key, advertised_min, api.max_version))
    return tuple(entries)


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header v2 (tagged fields after client_id) in flexible versions, v1 otherwise."""
    return 2 if SUPPORTED_APIS[api_key].is_flexible(api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header v1 (tagged fields after the correlation id) in flexible versions, v0 otherwise.

    ApiVersions always answers with v0: a client that sent a version we do not know must still be able
    to read the correlation id and the error of our answer (KIP-511).
    """
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if SUPPORTED_APIS[api_key].is_flexible(api_version) else 0

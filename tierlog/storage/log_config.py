"""Topic-level configuration with Kafka 3.9's names, types, defaults, validators and broker synonyms.

A topic's effective value is its override, else the broker's setting of the synonym (`log.segment.bytes`
for `segment.bytes`, ...), else Kafka's default. A few broker synonyms fall back to coarser units the way
KafkaConfig resolves them: `log.retention.ms` > `log.retention.minutes` > `log.retention.hours`,
`log.roll.ms` > `log.roll.hours`, `log.roll.jitter.ms` > `log.roll.jitter.hours`, and
`log.flush.interval.ms` > `log.flush.scheduler.interval.ms`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from tierlog.config_def import (
    LONG_MAX,
    ConfigDef,
    ConfigException,
    Validator,
    parse_config_value,
    parse_typed,
)
from tierlog.records.codec import (
    GZIP_DEFAULT_LEVEL,
    GZIP_MAX_LEVEL,
    GZIP_MIN_LEVEL,
    LZ4_DEFAULT_LEVEL,
    LZ4_MAX_LEVEL,
    LZ4_MIN_LEVEL,
    ZSTD_DEFAULT_LEVEL,
    ZSTD_MAX_LEVEL,
    ZSTD_MIN_LEVEL,
    Compression,
)
from tierlog.records.record_batch import CompressionType

MINUTE_MS = 60_000
HOUR_MS = 3_600_000

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"


# compression.type's values (Kafka's BrokerCompressionType) and the codec each stores batches with; `producer`
# keeps every batch as the producer compressed it.
COMPRESSION_PRODUCER = "producer"
COMPRESSION_CODECS: dict[str, CompressionType] = {
    "uncompressed": CompressionType.NONE,
    "zstd": CompressionType.ZSTD,
    "lz4": CompressionType.LZ4,
    "snappy": CompressionType.SNAPPY,
    "gzip": CompressionType.GZIP,
}


def _gzip_level(value: object) -> str | None:
    # CompressionType.GZIP.levelValidator: zlib's levels, or -1 for its default.
    if value == GZIP_DEFAULT_LEVEL or GZIP_MIN_LEVEL <= value <= GZIP_MAX_LEVEL:  # type: ignore[operator]
        return None
    return f"Value must be between {GZIP_MIN_LEVEL} and {GZIP_MAX_LEVEL} or equal to {GZIP_DEFAULT_LEVEL}"


def _topic(
    name: str, broker_synonym: str | None, default: object, type_: str, doc: str, **validation: object
) -> ConfigDef:
    if type_ == "list" and isinstance(default, str):
        default = parse_typed(name, "list", default)
    return ConfigDef(name, type_, default, doc, broker_synonym=broker_synonym, **validation)  # type: ignore[arg-type]


def _by_name(*definitions: ConfigDef) -> dict[str, ConfigDef]:
    return {definition.name: definition for definition in definitions}


TOPIC_CONFIGS: dict[str, ConfigDef] = _by_name(
    _topic(
        "cleanup.policy",
        "log.cleanup.policy",
        "delete",
        "list",
        "The retention policy of old segments: delete, compact, or both.",
        choices=(CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE),
    ),
    _topic(
        "compression.gzip.level",
        "compression.gzip.level",
        GZIP_DEFAULT_LEVEL,
        "int",
        "The compression level to use if compression.type is set to gzip.",
        validator=_gzip_level,
    ),
    _topic(
        "compression.lz4.level",
        "compression.lz4.level",
        LZ4_DEFAULT_LEVEL,
        "int",
        "The compression level to use if compression.type is set to lz4.",
        at_least=LZ4_MIN_LEVEL,
        at_most=LZ4_MAX_LEVEL,
    ),
    _topic(
        "compression.type",
        "compression.type",
        COMPRESSION_PRODUCER,
        "string",
        "Final compression of the topic's data; producer keeps the codec the producer used.",
        choices=(*COMPRESSION_CODECS, COMPRESSION_PRODUCER),
    ),
    _topic(
        "compression.zstd.level",
        "compression.zstd.level",
        ZSTD_DEFAULT_LEVEL,
        "int",
        "The compression level to use if compression.type is set to zstd.",
        at_least=ZSTD_MIN_LEVEL,
        at_most=ZSTD_MAX_LEVEL,
    ),
    _topic(
        "delete.retention.ms",
        "log.cleaner.delete.retention.ms",
        86_400_000,
        "long",
        "How long delete tombstones are kept on compacted topics.",
        at_least=0,
    ),
    _topic(
        "file.delete.delay.ms",
        "log.segment.delete.delay.ms",
        60_000,
        "long",
        "Time to wait before deleting a file from the filesystem.",
        at_least=0,
    ),
    _topic(
        "flush.messages",
        "log.flush.interval.messages",
        LONG_MAX,
        "long",
        "Messages accumulated on a partition before an fsync is forced.",
        at_least=1,
    ),
    _topic(
        "flush.ms",
        "log.flush.interval.ms",
        LONG_MAX,
        "long",
        "Maximum time between fsyncs of a partition's log.",
        at_least=0,
    ),
    _topic(
        "index.interval.bytes",
        "log.index.interval.bytes",
        4096,
        "int",
        "Bytes appended between two offset index entries.",
        at_least=0,
    ),
    _topic(
        "local.retention.bytes",
        "log.local.retention.bytes",
        -2,
        "long",
        "Bytes kept on local disk when tiered storage is on; -2 means retention.bytes.",
        at_least=-2,
    ),
    _topic(
        "local.retention.ms",
        "log.local.retention.ms",
        -2,
        "long",
        "Time kept on local disk when tiered storage is on; -2 means retention.ms.",
        at_least=-2,
    ),
    _topic(
        "max.compaction.lag.ms",
        "log.cleaner.max.compaction.lag.ms",
        LONG_MAX,
        "long",
        "Maximum time a message stays ineligible for compaction.",
        at_least=1,
    ),
    _topic(
        "max.message.bytes", "message.max.bytes", 1_048_588, "int", "Largest record batch size allowed.", at_least=0
    ),
    _topic(
        "message.timestamp.after.max.ms",
        "log.message.timestamp.after.max.ms",
        LONG_MAX,
        "long",
        "How far a CreateTime timestamp may be ahead of the broker's time.",
        at_least=0,
    ),
    _topic(
        "message.timestamp.difference.max.ms",
        "log.message.timestamp.difference.max.ms",
        LONG_MAX,
        "long",
        "Deprecated: the before and after bound at once, used where neither of those is set.",
        at_least=0,
    ),
    _topic(
        "message.timestamp.before.max.ms",
        "log.message.timestamp.before.max.ms",
        LONG_MAX,
        "long",
        "How far a CreateTime timestamp may be behind the broker's time.",
        at_least=0,
    ),
    _topic(
        "message.timestamp.type",
        "log.message.timestamp.type",
        CREATE_TIME,
        "string",
        "Whether a message's timestamp is its create time or the log append time.",
        choices=(CREATE_TIME, LOG_APPEND_TIME),
    ),
    _topic(
        "min.cleanable.dirty.ratio",
        "log.cleaner.min.cleanable.ratio",
        0.5,
        "double",
        "Dirty fraction of the log that makes it eligible for compaction.",
        at_least=0,
        at_most=1,
    ),
    _topic(
        "min.compaction.lag.ms",
        "log.cleaner.min.compaction.lag.ms",
        0,
        "long",
        "Minimum time a message stays uncompacted.",
        at_least=0,
    ),
    _topic(
        "min.insync.replicas",
        "min.insync.replicas",
        1,
        "int",
        "Replicas that must acknowledge a write with acks=all.",
        at_least=1,
    ),
    _topic(
        "preallocate",
        "log.preallocate",
        False,
        "boolean",
        "Whether to preallocate a new segment's file.",
    ),
    _topic(
        "remote.storage.enable",
        None,
        False,
        "boolean",
        "Whether the topic's closed segments are copied to the remote tier.",
    ),
    _topic(
        "retention.bytes",
        "log.retention.bytes",
        -1,
        "long",
        "Largest size a partition's log may grow to before old segments are deleted; -1 is no limit.",
    ),
    _topic(
        "retention.ms",
        "log.retention.ms",
        604_800_000,
        "long",
        "Longest time a segment is kept before it is deleted; -1 is no limit.",
        at_least=-1,
    ),
    _topic("segment.bytes", "log.segment.bytes", 1_073_741_824, "int", "Size of a segment file.", at_least=14),
    _topic(
        "segment.index.bytes",
        "log.index.size.max.bytes",
        10_485_760,
        "int",
        "Largest size of a segment's offset and time index files.",
        at_least=4,
    ),
    _topic(
        "segment.jitter.ms",
        "log.roll.jitter.ms",
        0,
        "long",
        "Maximum random jitter subtracted from segment.ms.",
        at_least=0,
    ),
    _topic(
        "segment.ms",
        "log.roll.ms",
        604_800_000,
        "long",
        "Time after which a segment is rolled even if it is not full.",
        at_least=1,
    ),
    _topic(
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
        False,
        "boolean",
        "Whether a replica outside the ISR may become leader, at the cost of data loss.",
    ),
)

_MESSAGE_FORMAT_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?(-IV\d+)?$")


def _unsupported_unless(default: object, feature: str) -> Validator:
    """A validator for a config of a feature tierlog does not have yet: only the value that leaves the feature
    off is accepted, so a setting is never silently ignored."""
    return lambda value: None if value == default else f"{feature} is not supported by tierlog yet"


# Every partition of a topic is throttled (the config's wildcard `*`).
ALL_REPLICAS = "*"


def _throttled_replicas_problem(entries: object) -> str | None:
    """Kafka's ThrottledReplicaListValidator for a throttled-replicas config parsed as a list: the literal `*`
    or entries `partitionId:brokerId`."""
    items = [str(item).strip() for item in entries] if isinstance(entries, tuple) else []
    if "".join(items) == ALL_REPLICAS or all(_is_replica_entry(item) for item in items):
        return None
    return (
        "must be the literal '*' or a list of replicas in the following format: "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
    )


def _is_replica_entry(item: str) -> bool:
    partition, colon, broker = item.partition(":")
    return not item or (bool(colon) and _is_digits(partition) and _is_digits(broker))


def _is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def throttled_partitions_of(value: str, broker_id: int) -> frozenset[int] | str:
    """Kafka's TopicConfigHandler.parseThrottledPartitions: the partitions of a topic throttled on `broker_id`
    by a (valid) throttled-replicas config: ALL_REPLICAS for `*`, else the partition of every entry naming
    this broker."""
    text = value.strip()
    if text == ALL_REPLICAS:
        return ALL_REPLICAS
    partitions = set()
    for entry in text.split(","):
        partition, _, broker = entry.strip().partition(":")
        if partition and broker and int(broker) == broker_id:
            partitions.add(int(partition))
    return frozenset(partitions)


# The replicas a broker throttles as leader and as follower (docs/replication.md#throttles). They are not LogConfig
# attributes: the ReplicaManager's replication quotas read them from the topic configs of the metadata image.
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
THROTTLED_REPLICAS_CONFIGS: dict[str, ConfigDef] = _by_name(
    _topic(
        LEADER_THROTTLED_REPLICAS,
        None,
        "",
        "list",
        "Replicas whose replication is throttled on the leader side (leader.replication.throttled.rate of the "
        "broker named): [PartitionId]:[BrokerId],... or '*' for all replicas of the topic.",
        validator=_throttled_replicas_problem,
    ),
    _topic(
        FOLLOWER_THROTTLED_REPLICAS,
        None,
        "",
        "list",
        "Replicas whose replication is throttled on the follower side (follower.replication.throttled.rate of "
        "the broker named): [PartitionId]:[BrokerId],... or '*' for all replicas of the topic.",
        validator=_throttled_replicas_problem,
    ),
)


# Kafka 3.x topic configs that tierlog accepts (typed, validated, shown by DescribeConfigs) but that change
# nothing here: the two deprecated ones Kafka 3.x itself ignores for the v2 record format (tierlog serves only
# that format and Fetch v4+, so there is nothing to down-convert), and the configs of features tierlog does not
# have yet, whose only accepted value is the one that leaves the feature off. docs/configuration.md lists them.
ACCEPTED_UNUSED_TOPIC_CONFIGS: dict[str, ConfigDef] = _by_name(
    _topic(
        "message.format.version",
        "log.message.format.version",
        "3.0-IV1",
        "string",
        "Deprecated and ignored, as in Kafka 3.x: the record format is always v2.",
        validator=lambda v: None if _MESSAGE_FORMAT_VERSION.match(str(v)) else "not a Kafka version such as 3.0-IV1",
    ),
    _topic(
        "message.downconversion.enable",
        "log.message.downconversion.enable",
        True,
        "boolean",
        "Deprecated and ignored: tierlog serves Fetch v4 and newer only, so nothing is down-converted.",
    ),
    _topic(
        "remote.log.copy.disable",
        None,
        False,
        "boolean",
        "Stop copying segments of a tiered topic to the remote tier.",
        validator=_unsupported_unless(False, "remote.log.copy.disable=true"),
    ),
    _topic(
        "remote.log.delete.on.disable",
        None,
        False,
        "boolean",
        "Delete the remote data when tiered storage is turned off for the topic.",
        validator=_unsupported_unless(False, "turning tiered storage off for a topic"),
    ),
)

# Every topic config name a topic may set; LogConfig holds the values of TOPIC_CONFIGS only.
ALL_TOPIC_CONFIGS: dict[str, ConfigDef] = {
    **TOPIC_CONFIGS,
    **THROTTLED_REPLICAS_CONFIGS,
    **ACCEPTED_UNUSED_TOPIC_CONFIGS,
}

# Broker settings consulted in order for a topic config, with the factor that turns each into the topic's
# unit (KafkaConfig.logRollTimeMillis, logRetentionTimeMillis, ...). Others use their broker synonym alone.
_BROKER_FALLBACKS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "segment.ms": (("log.roll.ms", "long", 1), ("log.roll.hours", "int", HOUR_MS)),
    "segment.jitter.ms": (("log.roll.jitter.ms", "long", 1), ("log.roll.jitter.hours", "int", HOUR_MS)),
    "retention.ms": (
        ("log.retention.ms", "long", 1),
        ("log.retention.minutes", "int", MINUTE_MS),
        ("log.retention.hours", "int", HOUR_MS),
    ),
    "flush.ms": (("log.flush.interval.ms", "long", 1), ("log.flush.scheduler.interval.ms", "long", 1)),
}


def validate_topic_config(name: str, value: str) -> None:
    """Raise ConfigException with a one-line message for an unknown topic config name or an invalid value."""
    definition = ALL_TOPIC_CONFIGS.get(name)
    if definition is None:
        raise ConfigException(f"Unknown topic config name: {name}")
    parse_config_value(definition, value)


def _broker_value(definition: ConfigDef, broker_defaults: Mapping[str, str]) -> object:
    fallbacks = _BROKER_FALLBACKS.get(definition.name)
    if fallbacks is None:
        synonym = definition.broker_synonym
        if synonym is None or synonym not in broker_defaults:
            return definition.default
        return parse_config_value(definition, broker_defaults[synonym])
    for broker_name, type_, factor in fallbacks:
        if broker_name in broker_defaults:
            value = parse_typed(broker_name, type_, broker_defaults[broker_name]) * factor  # type: ignore[operator]
            # KafkaConfig.logRetentionTimeMillis turns any negative retention into "no limit".
            if definition.name == "retention.ms" and value < 0:
                return -1
            return parse_config_value(definition, str(value))
    return definition.default


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Effective topic configuration of a log; one attribute per TOPIC_CONFIGS name, dots as underscores."""

    cleanup_policy: tuple[str, ...]
    compression_gzip_level: int
    compression_lz4_level: int
    compression_type: str
    compression_zstd_level: int
    delete_retention_ms: int
    file_delete_delay_ms: int
    flush_messages: int
    flush_ms: int
    index_interval_bytes: int
    local_retention_bytes: int
    local_retention_ms: int
    max_compaction_lag_ms: int
    max_message_bytes: int
    message_timestamp_after_max_ms: int
    message_timestamp_before_max_ms: int
    message_timestamp_difference_max_ms: int
    message_timestamp_type: str
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int
    min_insync_replicas: int
    preallocate: bool
    remote_storage_enable: bool
    retention_bytes: int
    retention_ms: int
    segment_bytes: int
    segment_index_bytes: int
    segment_jitter_ms: int
    segment_ms: int
    unclean_leader_election_enable: bool
    overridden_configs: frozenset[str] = frozenset()

    @classmethod
    def from_props(cls, topic_overrides: Mapping[str, str], broker_defaults: Mapping[str, str]) -> LogConfig:
        """Topic override > broker synonym > Kafka default; ConfigException for unknown names or bad values."""
        for name, value in topic_overrides.items():
            validate_topic_config(name, value)
        values: dict[str, object] = {}
        for name, definition in TOPIC_CONFIGS.items():
            if name in topic_overrides:
                values[_attribute(name)] = parse_config_value(definition, topic_overrides[name])
            else:
                values[_attribute(name)] = _broker_value(definition, broker_defaults)
        # LogConfig.getMessageTimestampBefore/AfterMaxMs: the deprecated difference bound stands in for a
        # bound left at its default.
        for bound in ("message_timestamp_before_max_ms", "message_timestamp_after_max_ms"):
            if values[bound] == LONG_MAX:
                values[bound] = values["message_timestamp_difference_max_ms"]
        return cls(**values, overridden_configs=frozenset(topic_overrides))  # type: ignore[arg-type]

    @property
    def delete(self) -> bool:
        return CLEANUP_POLICY_DELETE in self.cleanup_policy

    @property
    def compact(self) -> bool:
        return CLEANUP_POLICY_COMPACT in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @property
    def compression(self) -> Compression | None:
        """What batches are stored with (Kafka's LogConfig.compression): compression.type's codec at its
        compression.<codec>.level; None for `producer`, which stores every batch as it was sent."""
        codec = COMPRESSION_CODECS.get(self.compression_type)
        if codec is None:
            return None
        level = {
            CompressionType.GZIP: self.compression_gzip_level,
            CompressionType.LZ4: self.compression_lz4_level,
            CompressionType.ZSTD: self.compression_zstd_level,
        }.get(codec)
        return Compression(codec, level)


def _attribute(name: str) -> str:
    return name.replace(".", "_")


# Every TOPIC_CONFIGS entry is a LogConfig attribute and vice versa, so the table and the type cannot drift.
assert {_attribute(name) for name in TOPIC_CONFIGS} == {
    f.name for f in fields(LogConfig) if f.name != "overridden_configs"
}

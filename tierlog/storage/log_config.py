"""Topic-level configuration with Kafka 3.9's names, types, defaults, validators and broker synonyms.

A topic's effective value is its override, else the broker's setting of the synonym (`log.segment.bytes`
for `segment.bytes`, ...), else Kafka's default. A few broker synonyms fall back to coarser units the way
KafkaConfig resolves them: `log.retention.ms` > `log.retention.minutes` > `log.retention.hours`,
`log.roll.ms` > `log.roll.hours`, `log.roll.jitter.ms` > `log.roll.jitter.hours`, and
`log.flush.interval.ms` > `log.flush.scheduler.interval.ms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
MINUTE_MS = 60_000
HOUR_MS = 3_600_000

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One topic config as Kafka's LogConfig defines it.

    `type` is Kafka's ConfigDef type name (int, long, double, string, list, boolean); `default` is the
    typed default, a list's as its comma-separated string, as Kafka documents it.
    """

    name: str
    broker_synonym: str | None
    default: object
    type: str
    doc: str
    at_least: float | None = None
    at_most: float | None = None
    choices: tuple[str, ...] | None = None


TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef(
            "cleanup.policy",
            "log.cleanup.policy",
            "delete",
            "list",
            "The retention policy of old segments: delete, compact, or both.",
            choices=(CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE),
        ),
        ConfigDef(
            "compression.type",
            "compression.type",
            "producer",
            "string",
            "Final compression of the topic's data; producer keeps the codec the producer used.",
            choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        ),
        ConfigDef(
            "delete.retention.ms",
            "log.cleaner.delete.retention.ms",
            86_400_000,
            "long",
            "How long delete tombstones are kept on compacted topics.",
            at_least=0,
        ),
        ConfigDef(
            "file.delete.delay.ms",
            "log.segment.delete.delay.ms",
            60_000,
            "long",
            "Time to wait before deleting a file from the filesystem.",
            at_least=0,
        ),
        ConfigDef(
            "flush.messages",
            "log.flush.interval.messages",
            LONG_MAX,
            "long",
            "Messages accumulated on a partition before an fsync is forced.",
            at_least=1,
        ),
        ConfigDef(
            "flush.ms",
            "log.flush.interval.ms",
            LONG_MAX,
            "long",
            "Maximum time between fsyncs of a partition's log.",
            at_least=0,
        ),
        ConfigDef(
            "index.interval.bytes",
            "log.index.interval.bytes",
            4096,
            "int",
            "Bytes appended between two offset index entries.",
            at_least=0,
        ),
        ConfigDef(
            "local.retention.bytes",
            "log.local.retention.bytes",
            -2,
            "long",
            "Bytes kept on local disk when tiered storage is on; -2 means retention.bytes.",
            at_least=-2,
        ),
        ConfigDef(
            "local.retention.ms",
            "log.local.retention.ms",
            -2,
            "long",
            "Time kept on local disk when tiered storage is on; -2 means retention.ms.",
            at_least=-2,
        ),
        ConfigDef(
            "max.compaction.lag.ms",
            "log.cleaner.max.compaction.lag.ms",
            LONG_MAX,
            "long",
            "Maximum time a message stays ineligible for compaction.",
            at_least=1,
        ),
        ConfigDef(
            "max.message.bytes", "message.max.bytes", 1_048_588, "int", "Largest record batch size allowed.", at_least=0
        ),
        ConfigDef(
            "message.timestamp.after.max.ms",
            "log.message.timestamp.after.max.ms",
            LONG_MAX,
            "long",
            "How far a CreateTime timestamp may be ahead of the broker's time.",
            at_least=0,
        ),
        ConfigDef(
            "message.timestamp.before.max.ms",
            "log.message.timestamp.before.max.ms",
            LONG_MAX,
            "long",
            "How far a CreateTime timestamp may be behind the broker's time.",
            at_least=0,
        ),
        ConfigDef(
            "message.timestamp.type",
            "log.message.timestamp.type",
            CREATE_TIME,
            "string",
            "Whether a message's timestamp is its create time or the log append time.",
            choices=(CREATE_TIME, LOG_APPEND_TIME),
        ),
        ConfigDef(
            "min.cleanable.dirty.ratio",
            "log.cleaner.min.cleanable.ratio",
            0.5,
            "double",
            "Dirty fraction of the log that makes it eligible for compaction.",
            at_least=0,
            at_most=1,
        ),
        ConfigDef(
            "min.compaction.lag.ms",
            "log.cleaner.min.compaction.lag.ms",
            0,
            "long",
            "Minimum time a message stays uncompacted.",
            at_least=0,
        ),
        ConfigDef(
            "min.insync.replicas",
            "min.insync.replicas",
            1,
            "int",
            "Replicas that must acknowledge a write with acks=all.",
            at_least=1,
        ),
        ConfigDef(
            "preallocate",
            "log.preallocate",
            False,
            "boolean",
            "Whether to preallocate a new segment's file.",
        ),
        ConfigDef(
            "remote.storage.enable",
            None,
            False,
            "boolean",
            "Whether the topic's closed segments are copied to the remote tier.",
        ),
        ConfigDef(
            "retention.bytes",
            "log.retention.bytes",
            -1,
            "long",
            "Largest size a partition's log may grow to before old segments are deleted; -1 is no limit.",
        ),
        ConfigDef(
            "retention.ms",
            "log.retention.ms",
            604_800_000,
            "long",
            "Longest time a segment is kept before it is deleted; -1 is no limit.",
            at_least=-1,
        ),
        ConfigDef("segment.bytes", "log.segment.bytes", 1_073_741_824, "int", "Size of a segment file.", at_least=14),
        ConfigDef(
            "segment.index.bytes",
            "log.index.size.max.bytes",
            10_485_760,
            "int",
            "Largest size of a segment's offset and time index files.",
            at_least=4,
        ),
        ConfigDef(
            "segment.jitter.ms",
            "log.roll.jitter.ms",
            0,
            "long",
            "Maximum random jitter subtracted from segment.ms.",
            at_least=0,
        ),
        ConfigDef(
            "segment.ms",
            "log.roll.ms",
            604_800_000,
            "long",
            "Time after which a segment is rolled even if it is not full.",
            at_least=1,
        ),
        ConfigDef(
            "unclean.leader.election.enable",
            "unclean.leader.election.enable",
            False,
            "boolean",
            "Whether a replica outside the ISR may become leader, at the cost of data loss.",
        ),
    )
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

_TYPE_RANGES = {"int": (INT32_MIN, INT32_MAX), "long": (LONG_MIN, LONG_MAX)}


def _invalid(name: str, value: str, reason: str) -> ValueError:
    # Kafka's ConfigException wording, which the admin tools show verbatim.
    return ValueError(f"Invalid value {value} for configuration {name}: {reason}")


def _parse_typed(name: str, type_: str, value: str) -> object:
    text = value.strip()
    if type_ in _TYPE_RANGES:
        low, high = _TYPE_RANGES[type_]
        try:
            number = int(text)
        except ValueError:
            raise _invalid(name, value, f"Not a number of type {type_.upper()}") from None
        if not low <= number <= high:
            raise _invalid(name, value, f"Not a number of type {type_.upper()}")
        return number
    if type_ == "double":
        try:
            return float(text)
        except ValueError:
            raise _invalid(name, value, "Not a number of type DOUBLE") from None
    if type_ == "boolean":
        if text.lower() not in ("true", "false"):
            raise _invalid(name, value, "Expected value to be either true or false")
        return text.lower() == "true"
    if type_ == "list":
        return tuple(item.strip() for item in text.split(",") if item.strip())
    return text


def parse_config_value(definition: ConfigDef, value: str) -> object:
    """Parse and validate `value` for `definition`; ValueError with Kafka's one-line message if invalid."""
    parsed = _parse_typed(definition.name, definition.type, value)
    if definition.choices is not None:
        for item in parsed if isinstance(parsed, tuple) else (parsed,):
            if item not in definition.choices:
                raise _invalid(definition.name, str(item), f"String must be one of: {', '.join(definition.choices)}")
    if definition.at_least is not None and parsed < definition.at_least:  # type: ignore[operator]
        raise _invalid(definition.name, value, f"Value must be at least {_number(definition.at_least)}")
    if definition.at_most is not None and parsed > definition.at_most:  # type: ignore[operator]
        raise _invalid(definition.name, value, f"Value must be no more than {_number(definition.at_most)}")
    return parsed


def _number(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)


def validate_topic_config(name: str, value: str) -> None:
    """Raise ValueError with a one-line message for an unknown topic config name or an invalid value."""
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise ValueError(f"Unknown topic config name: {name}")
    parse_config_value(definition, value)


def _broker_value(definition: ConfigDef, broker_defaults: Mapping[str, str]) -> object:
    fallbacks = _BROKER_FALLBACKS.get(definition.name)
    if fallbacks is None:
        synonym = definition.broker_synonym
        if synonym is None or synonym not in broker_defaults:
            return _default(definition)
        return parse_config_value(definition, broker_defaults[synonym])
    for broker_name, type_, factor in fallbacks:
        if broker_name in broker_defaults:
            value = _parse_typed(broker_name, type_, broker_defaults[broker_name]) * factor  # type: ignore[operator]
            # KafkaConfig.logRetentionTimeMillis turns any negative retention into "no limit".
            if definition.name == "retention.ms" and value < 0:
                return -1
            return parse_config_value(definition, str(value))
    return _default(definition)


def _default(definition: ConfigDef) -> object:
    if definition.type == "list":
        return _parse_typed(definition.name, "list", str(definition.default))
    return definition.default


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Effective topic configuration of a log; one attribute per TOPIC_CONFIGS name, dots as underscores."""

    cleanup_policy: tuple[str, ...]
    compression_type: str
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
        """Topic override > broker synonym > Kafka default; ValueError for unknown names or bad values."""
        values: dict[str, object] = {}
        for name, definition in TOPIC_CONFIGS.items():
            if name in topic_overrides:
                values[_attribute(name)] = parse_config_value(definition, topic_overrides[name])
            else:
                values[_attribute(name)] = _broker_value(definition, broker_defaults)
        for name in topic_overrides:
            if name not in TOPIC_CONFIGS:
                raise ValueError(f"Unknown topic config name: {name}")
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


def _attribute(name: str) -> str:
    return name.replace(".", "_")


# Every TOPIC_CONFIGS entry is a LogConfig attribute and vice versa, so the table and the type cannot drift.
assert {_attribute(name) for name in TOPIC_CONFIGS} == {
    f.name for f in fields(LogConfig) if f.name != "overridden_configs"
}

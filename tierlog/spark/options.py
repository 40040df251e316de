"""The options of Spark's Kafka source (KafkaSourceProvider), parsed and checked on the driver.

Errors are one line naming the option, as Spark's IllegalArgumentExceptions do, so a job ported from
`format("kafka")` fails with the message its author already knows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tierlog.client.security_settings import client_security, to_librdkafka

EARLIEST = -2
LATEST = -1
# Kafka's source: maxTriggerDelay defaults to 15 minutes.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
# The Spark options that carry the brokers' `rsm.config.*` settings: `tierlog.remote.rsm.config.url` etc.
RSM_OPTION_PREFIX = "tierlog.remote.rsm.config."
REMOTE_READ_OPTION = "tierlog.remote.read"
KAFKA_OPTION_PREFIX = "kafka."
# Consumer settings the source decides itself, refused as Spark's Kafka source refuses them.
_SOURCE_FIXED = {
    "auto.offset.reset": "set the source option 'startingOffsets' to say where to start",
    "enable.auto.commit": "the source commits no offsets: Spark's checkpoint holds them",
    "key.deserializer": "keys are read as bytes: deserialize them with DataFrame operations",
    "value.deserializer": "values are read as bytes: deserialize them with DataFrame operations",
    "interceptor.classes": "the source reads record batches without a consumer to intercept",
}
ISOLATION_LEVEL_OPTION = "kafka.isolation.level"
# The Java consumer's default, which Spark's Kafka source keeps (it sets no isolation.level of its own).
DEFAULT_ISOLATION_LEVEL = "read_uncommitted"
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}

# A starting/ending position: EARLIEST, LATEST, or per-partition offsets (-2/-1 allowed inside, as Kafka).
OffsetSpec = int | dict[tuple[str, int], int]
# A timestamp (ms) for every partition, or one per partition: the position is the first offset at or after it.
TimestampSpec = int | dict[tuple[str, int], int]


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    subscribe: tuple[str, ...] | None
    subscribe_pattern: str | None
    assign: tuple[tuple[str, int], ...] | None
    starting: OffsetSpec
    ending: OffsetSpec
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    # As Kafka's source, a timestamp option takes precedence over the offsets option of the same end.
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    # What a starting timestamp after the partition's last record means: fail ("error") or start at latest.
    starting_timestamp_strategy: str = "error"
    # Streaming admission control: at most this many offsets per micro-batch, over all partitions; and no
    # micro-batch with fewer than min_offsets_per_trigger unless max_trigger_delay_ms passed since the last one.
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    # How offsets held by the remote tier are read: straight from object storage ("direct") with the brokers'
    # rsm.config.* settings, or through the brokers' Fetch ("broker").
    remote_read: str = "broker"
    rsm_config: tuple[tuple[str, str], ...] = ()
    # Every other kafka.* option (prefix stripped, Java's security names as librdkafka's), for every client the
    # source makes: the driver's, and the executors' fetch connections (through ClientSecurity). It always holds
    # isolation.level, so the driver's ListOffsets asks for the high watermark or the last stable offset.
    client_settings: tuple[tuple[str, str], ...] = ()
    # kafka.isolation.level: read_committed reads committed transactions only, up to the last stable offset.
    read_committed: bool = False


def option(options: Mapping[str, str], name: str) -> str | None:
    # Spark's options are case-insensitive maps.
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = option(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ValueError(f"option '{name}' must be true or false, got '{raw}'")


_OFFSETS_FORM = 'earliest, latest or JSON like {"topicA":{"0":23,"1":-1}}'


def _partition_offsets(name: str, raw: str, form: str = _OFFSETS_FORM) -> dict[tuple[str, int], int]:
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict):
            raise ValueError
        return {
            (str(topic), int(partition)): int(offset)
            for topic, partitions in parsed.items()
            for partition, offset in partitions.items()
        }
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"option '{name}' must be {form}, got '{raw}'") from None


def _offset_spec(options: Mapping[str, str], name: str, default: int, allowed: tuple[str, ...]) -> OffsetSpec:
    raw = option(options, name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in allowed:
        return EARLIEST if word == "earliest" else LATEST
    if word in ("earliest", "latest"):
        raise ValueError(f"option '{name}' cannot be {word} for a batch query")
    return _partition_offsets(name, raw)


def _timestamp_spec(options: Mapping[str, str], single: str, by_partition: str) -> TimestampSpec | None:
    raw = option(options, single)
    if raw is not None:
        if not raw.strip().isdigit():
            raise ValueError(f"option '{single}' must be a timestamp in milliseconds, got '{raw}'")
        return int(raw)
    raw = option(options, by_partition)
    if raw is None:
        return None
    spec = _partition_offsets(by_partition, raw, 'JSON like {"topicA":{"0":1700000000000}}')
    if any(t < 0 for t in spec.values()):
        raise ValueError(f"option '{by_partition}' must give non-negative timestamps, got '{raw}'")
    return spec


def parse_assign(raw: str) -> tuple[tuple[str, int], ...]:
    try:
        parsed = json.loads(raw)
        pairs = tuple((str(t), int(p)) for t, ps in parsed.items() for p in ps)
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"option 'assign' must be JSON like {{\"topicA\":[0,1]}}, got '{raw}'") from None
    if not pairs:
        raise ValueError("option 'assign' names no partitions")
    return pairs


def parse_stream_options(options: Mapping[str, str]) -> SourceOptions:
    """The options of spark.readStream.format("tierlog"): as Kafka's streaming source, startingOffsets
    defaults to latest and endingOffsets is refused (a stream has no end)."""
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        if option(options, name) is not None:
            raise ValueError(f"option '{name}' is not supported for streaming queries")
    parsed = parse_batch_options(options, streaming=True)
    delay = option(options, "maxTriggerDelay")
    return replace(
        parsed,
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
        min_offsets_per_trigger=_positive_int(options, "minOffsetsPerTrigger"),
        max_trigger_delay_ms=DEFAULT_MAX_TRIGGER_DELAY_MS if delay is None else _duration_ms("maxTriggerDelay", delay),
    )


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = option(options, name)
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) <= 0:
        raise ValueError(f"option '{name}' must be a positive integer, got '{raw}'")
    return int(raw)


def _duration_ms(name: str, raw: str) -> int:
    """Spark's time strings as the Kafka source takes them: `15m`, `30s`, `500ms`, `1h`; a bare number is ms."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if match is None or match.group(2) not in ("", *_DURATION_UNITS_MS):
        raise ValueError(f"option '{name}' must be a duration like 15m, 30s or 500ms, got '{raw}'")
    return int(match.group(1)) * _DURATION_UNITS_MS.get(match.group(2), 1)


def kafka_client_settings(options: Mapping[str, str], fixed: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Every `kafka.*` option but kafka.bootstrap.servers, as Spark's Kafka connector hands them to its clients:
    the prefix stripped, with the Java client's security names (sasl.jaas.config, ssl.truststore.location, ...)
    turned into librdkafka's, and the security settings checked on the driver so a job with a wrong one fails
    at once in one line naming the option. `fixed` are the settings the connector decides (name: why).
    Rules: docs/security.md#tools."""
    prefix = KAFKA_OPTION_PREFIX

    def describe(key: str) -> str:
        return f"option '{prefix}{key}'"

    given = {
        key[len(prefix) :].lower(): value
        for key, value in options.items()
        if key.lower().startswith(prefix) and key.lower() != f"{prefix}bootstrap.servers"
    }
    for key in given:
        if key in fixed:
            raise ValueError(f"{describe(key)} is not supported: {fixed[key]}")
    settings, origin = to_librdkafka(given, describe)
    client_security(settings, lambda key: describe(origin.get(key, key)))
    return tuple(sorted(settings.items()))


def rsm_config_from_options(options: Mapping[str, str]) -> dict[str, str]:
    """The RSM settings (prefix stripped, as FsspecRemoteStorageManager.from_config takes them) from Spark
    options; empty when the job gave none, which means the remote tier is not reachable directly."""
    prefix = RSM_OPTION_PREFIX.lower()
    return {key[len(prefix) :]: value for key, value in options.items() if key.lower().startswith(prefix)}


def _remote_read(options: Mapping[str, str], rsm_config: Mapping[str, str]) -> str:
    raw = option(options, REMOTE_READ_OPTION)
    if raw is None:
        # Direct when the job says where the remote tier is: the executors can then reach it themselves.
        return "direct" if rsm_config else "broker"
    mode = raw.strip().lower()
    if mode not in ("direct", "broker"):
        raise ValueError(f"option '{REMOTE_READ_OPTION}' must be direct or broker, got '{raw}'")
    if mode == "direct" and not rsm_config:
        raise ValueError(
            f"option '{REMOTE_READ_OPTION}' is direct but no remote tier settings were given: pass the brokers' "
            f"rsm.config.* settings as {RSM_OPTION_PREFIX}* options (e.g. {RSM_OPTION_PREFIX}url)"
        )
    return mode


def parse_batch_options(options: Mapping[str, str], streaming: bool = False) -> SourceOptions:
    """The options of spark.read.format("tierlog"): as Kafka's batch source, startingOffsets may not be
    latest and endingOffsets may not be earliest."""
    bootstrap = option(options, "kafka.bootstrap.servers") or option(options, "bootstrap.servers")
    if not bootstrap:
        raise ValueError("option 'kafka.bootstrap.servers' must be specified for configuring tierlog consumer")
    strategies = {name: option(options, name) for name in ("assign", "subscribe", "subscribePattern")}
    given = [name for name, value in strategies.items() if value is not None]
    if len(given) != 1:
        raise ValueError(
            "one of the options 'assign', 'subscribe' or 'subscribePattern' must be specified"
            + (f", got {', '.join(given)}" if given else "")
        )
    subscribe = subscribe_pattern = assign = None
    if strategies["subscribe"] is not None:
        subscribe = tuple(t.strip() for t in strategies["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise ValueError("no topics to subscribe to in option 'subscribe'")
    elif strategies["subscribePattern"] is not None:
        subscribe_pattern = strategies["subscribePattern"].strip()
        if not subscribe_pattern:
            raise ValueError("pattern to subscribe is empty in option 'subscribePattern'")
        try:
            re.compile(subscribe_pattern)
        except re.error as e:
            raise ValueError(f"option 'subscribePattern' is not a valid pattern: {e}") from None
    else:
        assign = parse_assign(strategies["assign"] or "")
    min_partitions_raw = option(options, "minPartitions")
    min_partitions = None
    if min_partitions_raw is not None:
        if not min_partitions_raw.strip().isdigit() or int(min_partitions_raw) <= 0:
            raise ValueError(f"option 'minPartitions' must be a positive integer, got '{min_partitions_raw}'")
        min_partitions = int(min_partitions_raw)
    strategy = (option(options, "startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ValueError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got '{strategy}'")
    starting = (
        _offset_spec(options, "startingOffsets", LATEST, ("earliest", "latest"))
        if streaming
        else _offset_spec(options, "startingOffsets", EARLIEST, ("earliest",))
    )
    ending = _offset_spec(options, "endingOffsets", LATEST, ("latest",))
    rsm_config = rsm_config_from_options(options)
    if not streaming and isinstance(starting, dict) and any(o == LATEST for o in starting.values()):
        raise ValueError("option 'startingOffsets' cannot use -1 (latest) for a partition in a batch query")
    if isinstance(ending, dict) and any(o == EARLIEST for o in ending.values()):
        raise ValueError("option 'endingOffsets' cannot use -2 (earliest) for a partition in a batch query")
    isolation_level = (option(options, ISOLATION_LEVEL_OPTION) or DEFAULT_ISOLATION_LEVEL).strip().lower()
    if isolation_level not in ("read_committed", "read_uncommitted"):
        raise ValueError(
            f"option '{ISOLATION_LEVEL_OPTION}' must be read_committed or read_uncommitted, got '{isolation_level}'"
        )
    client_settings = dict(kafka_client_settings(options, _SOURCE_FIXED))
    client_settings["isolation.level"] = isolation_level
    return SourceOptions(
        bootstrap_servers=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=subscribe_pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        min_partitions=min_partitions,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        starting_timestamps=_timestamp_spec(options, "startingTimestamp", "startingOffsetsByTimestamp"),
        ending_timestamps=_timestamp_spec(options, "endingTimestamp", "endingOffsetsByTimestamp"),
        starting_timestamp_strategy=strategy,
        remote_read=_remote_read(options, rsm_config),
        rsm_config=tuple(sorted(rsm_config.items())),
        client_settings=tuple(sorted(client_settings.items())),
        read_committed=isolation_level == "read_committed",
    )

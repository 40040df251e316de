"""LogConfig: Kafka 3.9's topic config names, defaults, broker synonyms and validation messages."""

from __future__ import annotations

import dataclasses

import pytest

from tierlog.records.codec import Compression
from tierlog.records.record_batch import CompressionType
from tierlog.storage.log_config import TOPIC_CONFIGS, LogConfig, validate_topic_config

LONG_MAX = 2**63 - 1


def test_defaults_are_kafka_3_9_topic_defaults() -> None:
    config = LogConfig.from_props({}, {})
    assert config.cleanup_policy == ("delete",)
    assert config.delete and not config.compact
    assert config.compression_type == "producer"
    assert (config.compression_gzip_level, config.compression_lz4_level, config.compression_zstd_level) == (-1, 9, 3)
    assert config.delete_retention_ms == 86_400_000
    assert config.file_delete_delay_ms == 60_000
    assert config.flush_messages == LONG_MAX
    assert config.flush_ms == LONG_MAX
    assert config.index_interval_bytes == 4096
    assert config.max_message_bytes == 1_048_588
    assert config.message_timestamp_type == "CreateTime"
    assert config.message_timestamp_before_max_ms == LONG_MAX
    assert config.message_timestamp_after_max_ms == LONG_MAX
    assert config.min_insync_replicas == 1
    assert config.retention_bytes == -1
    assert config.retention_ms == 604_800_000
    assert config.segment_bytes == 1_073_741_824
    assert config.segment_index_bytes == 10_485_760
    assert config.segment_ms == 604_800_000
    assert config.segment_jitter_ms == 0
    assert config.unclean_leader_election_enable is False
    assert config.preallocate is False
    assert config.min_compaction_lag_ms == 0
    assert config.local_retention_ms == -2
    assert config.local_retention_bytes == -2
    assert config.remote_storage_enable is False
    assert config.overridden_configs == frozenset()


def test_every_table_entry_is_a_typed_attribute() -> None:
    attributes = {f.name for f in dataclasses.fields(LogConfig)} - {"overridden_configs"}
    assert attributes == {name.replace(".", "_") for name in TOPIC_CONFIGS}
    for definition in TOPIC_CONFIGS.values():
        assert definition.type in ("int", "long", "double", "string", "list", "boolean")


def test_broker_synonyms_are_kafkas() -> None:
    synonyms = {name: d.broker_synonym for name, d in TOPIC_CONFIGS.items()}
    assert synonyms["segment.bytes"] == "log.segment.bytes"
    assert synonyms["segment.ms"] == "log.roll.ms"
    assert synonyms["retention.ms"] == "log.retention.ms"
    assert synonyms["retention.bytes"] == "log.retention.bytes"
    assert synonyms["segment.index.bytes"] == "log.index.size.max.bytes"
    assert synonyms["index.interval.bytes"] == "log.index.interval.bytes"
    assert synonyms["cleanup.policy"] == "log.cleanup.policy"
    assert synonyms["message.timestamp.type"] == "log.message.timestamp.type"
    assert synonyms["max.message.bytes"] == "message.max.bytes"
    assert synonyms["flush.messages"] == "log.flush.interval.messages"
    assert synonyms["flush.ms"] == "log.flush.interval.ms"
    assert synonyms["local.retention.ms"] == "log.local.retention.ms"
    assert synonyms["local.retention.bytes"] == "log.local.retention.bytes"
    assert synonyms["file.delete.delay.ms"] == "log.segment.delete.delay.ms"
    assert synonyms["min.insync.replicas"] == "min.insync.replicas"
    for name in ("compression.type", "compression.gzip.level", "compression.lz4.level", "compression.zstd.level"):
        assert synonyms[name] == name
    assert synonyms["remote.storage.enable"] is None


def test_topic_override_beats_broker_synonym_beats_default() -> None:
    config = LogConfig.from_props({"segment.bytes": "2048"}, {"log.segment.bytes": "4096", "log.retention.bytes": "99"})
    assert config.segment_bytes == 2048
    assert config.retention_bytes == 99
    assert config.max_message_bytes == 1_048_588
    assert config.overridden_configs == frozenset({"segment.bytes"})


def test_retention_falls_back_from_ms_to_minutes_to_hours_like_kafka() -> None:
    assert LogConfig.from_props({}, {"log.retention.hours": "2"}).retention_ms == 2 * 3_600_000
    assert LogConfig.from_props({}, {"log.retention.hours": "2", "log.retention.minutes": "3"}).retention_ms == 180_000
    both = {"log.retention.hours": "2", "log.retention.minutes": "3", "log.retention.ms": "7"}
    assert LogConfig.from_props({}, both).retention_ms == 7
    # Any negative broker retention means "no limit", as KafkaConfig.logRetentionTimeMillis has it.
    assert LogConfig.from_props({}, {"log.retention.hours": "-5"}).retention_ms == -1


def test_roll_and_flush_fall_backs() -> None:
    assert LogConfig.from_props({}, {"log.roll.hours": "1"}).segment_ms == 3_600_000
    assert LogConfig.from_props({}, {"log.roll.hours": "1", "log.roll.ms": "5"}).segment_ms == 5
    assert LogConfig.from_props({}, {"log.roll.jitter.hours": "1"}).segment_jitter_ms == 3_600_000
    assert LogConfig.from_props({}, {"log.flush.scheduler.interval.ms": "10"}).flush_ms == 10
    assert (
        LogConfig.from_props({}, {"log.flush.interval.ms": "20", "log.flush.scheduler.interval.ms": "10"}).flush_ms
        == 20
    )


def test_list_boolean_and_double_values_parse() -> None:
    config = LogConfig.from_props(
        {"cleanup.policy": "compact, delete", "preallocate": "TRUE", "min.cleanable.dirty.ratio": "0.25"}, {}
    )
    assert config.cleanup_policy == ("compact", "delete")
    assert config.compact and config.delete
    assert config.preallocate is True
    assert config.min_cleanable_dirty_ratio == 0.25


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("segment.bytes", "abc", "Not a number of type INT"),
        ("segment.bytes", "3000000000", "Not a number of type INT"),
        ("segment.bytes", "10", "Value must be at least 14"),
        ("retention.ms", "-2", "Value must be at least -1"),
        ("message.timestamp.type", "Now", "String must be one of: CreateTime, LogAppendTime"),
        ("preallocate", "yes", "Expected value to be either true or false"),
        ("min.cleanable.dirty.ratio", "1.5", "Value must be no more than 1"),
        ("min.insync.replicas", "0", "Value must be at least 1"),
        ("compression.type", "none", "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
        ("compression.gzip.level", "0", "Value must be between 1 and 9 or equal to -1"),
        ("compression.gzip.level", "10", "Value must be between 1 and 9 or equal to -1"),
        ("compression.lz4.level", "0", "Value must be at least 1"),
        ("compression.lz4.level", "18", "Value must be no more than 17"),
        ("compression.zstd.level", "-131073", "Value must be at least -131072"),
        ("compression.zstd.level", "23", "Value must be no more than 22"),
        ("compression.zstd.level", "high", "Not a number of type INT"),
    ],
)
def test_invalid_topic_configs_get_one_line_kafka_messages(name: str, value: str, rule: str) -> None:
    with pytest.raises(ValueError) as error:
        validate_topic_config(name, value)
    assert str(error.value) == f"Invalid value {value} for configuration {name}: {rule}"
    assert "\n" not in str(error.value)


def test_a_bad_element_of_a_list_config_is_the_value_kafkas_message_names() -> None:
    with pytest.raises(ValueError) as error:
        validate_topic_config("cleanup.policy", "compact,nope")
    rule = "String must be one of: compact, delete"
    assert str(error.value) == f"Invalid value nope for configuration cleanup.policy: {rule}"


def test_an_unknown_topic_config_name_is_refused_by_name() -> None:
    with pytest.raises(ValueError) as error:
        validate_topic_config("no.such.config", "1")
    assert str(error.value) == "Unknown topic config name: no.such.config"


def test_valid_topic_configs_pass() -> None:
    for name, value in (
        ("retention.ms", "-1"),
        ("segment.ms", "1"),
        ("compression.type", "zstd"),
        ("compression.gzip.level", "-1"),
        ("compression.gzip.level", "1"),
        ("compression.lz4.level", "17"),
        ("compression.zstd.level", "-131072"),
        ("compression.zstd.level", "22"),
    ):
        validate_topic_config(name, value)


def test_compression_is_the_topics_codec_at_its_level_and_none_for_producer() -> None:
    assert LogConfig.from_props({}, {}).compression is None
    assert LogConfig.from_props({"compression.type": "uncompressed"}, {}).compression == Compression(
        CompressionType.NONE
    )
    assert LogConfig.from_props({"compression.type": "snappy"}, {}).compression == Compression(CompressionType.SNAPPY)
    assert LogConfig.from_props({"compression.type": "gzip"}, {}).compression == Compression(CompressionType.GZIP, -1)
    # The level of the topic's codec counts; the others' are ignored, as in Kafka.
    broker = {"compression.type": "zstd", "compression.zstd.level": "10", "compression.lz4.level": "2"}
    assert LogConfig.from_props({}, broker).compression == Compression(CompressionType.ZSTD, 10)
    topic = {"compression.type": "lz4", "compression.zstd.level": "-5"}
    assert LogConfig.from_props(topic, broker).compression == Compression(CompressionType.LZ4, 2)


def test_from_props_rejects_unknown_and_invalid_overrides() -> None:
    with pytest.raises(ValueError, match="Unknown topic config name: bogus"):
        LogConfig.from_props({"bogus": "1"}, {})
    with pytest.raises(ValueError, match=r"segment\.ms"):
        LogConfig.from_props({"segment.ms": "0"}, {})

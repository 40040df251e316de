"""Broker configuration: Kafka's server.properties names, defaults and file format."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.config import ConfigError, KafkaConfig, parse_properties


def test_embedded_defaults_serve_localhost_9092() -> None:
    config = KafkaConfig()
    assert config.node_id == 1
    assert [(lst.host, lst.port) for lst in config.listeners] == [("127.0.0.1", 9092)]
    assert config.get_int("socket.request.max.bytes") == 104857600
    assert config.get_bool("auto.create.topics.enable") is True


def test_kafka_server_properties_file_is_read_with_comments_and_continuations(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(
        "# a KRaft combined node, as in Kafka's config/kraft/server.properties\n"
        "process.roles=broker,controller\n"
        "node.id=3\n"
        "controller.quorum.voters=3@localhost:9093\n"
        "listeners=PLAINTEXT://:9092,CONTROLLER://:9093\n"
        "controller.listener.names=CONTROLLER\n"
        "log.dirs=/tmp/a,\\\n  /tmp/b\n"
        "num.partitions: 4\n"
    )
    config = KafkaConfig.from_file(path, {"num.partitions": "6"})
    assert config.node_id == 3
    assert [lst.name for lst in config.listeners] == ["PLAINTEXT"]
    assert config.advertised_listener.host == "127.0.0.1"
    assert config.log_dirs == [Path("/tmp/a"), Path("/tmp/b")]
    assert config.get_int("num.partitions") == 6


def test_legacy_broker_id_and_log_dir_names_are_accepted() -> None:
    config = KafkaConfig({"broker.id": "7", "log.dir": "/tmp/x"})
    assert config.node_id == 7
    assert config.log_dirs == [Path("/tmp/x")]


def test_bad_values_are_one_clear_line() -> None:
    with pytest.raises(ConfigError, match=r"node\.id=.one. is not an integer"):
        KafkaConfig({"node.id": "one"})
    with pytest.raises(ConfigError, match=r"auto\.create\.topics\.enable"):
        KafkaConfig({"auto.create.topics.enable": "yes"})
    with pytest.raises(ConfigError, match="no port"):
        KafkaConfig({"listeners": "PLAINTEXT://localhost"})


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        KafkaConfig.from_file(tmp_path / "nope.properties")


def test_parse_properties_keeps_separators_inside_values() -> None:
    assert parse_properties("a=b=c\nurl: http://x:1\n! bang comment\n") == {"a": "b=c", "url": "http://x:1"}


def test_internal_topics_of_a_standalone_node_default_to_one_replica_as_kafkas_single_node_properties() -> None:
    standalone = KafkaConfig()
    assert standalone.internal_topic_replication_factor("offsets.topic.replication.factor") == 1
    rlmm = "remote.log.metadata.topic.replication.factor"
    assert standalone.internal_topic_replication_factor(rlmm, {}) == 1
    assert standalone.internal_topic_replication_factor(rlmm, {rlmm: "2"}) == 2


def test_internal_topics_of_a_cluster_member_keep_kafkas_default_of_three_replicas_unless_set() -> None:
    member = KafkaConfig({"process.roles": "broker", "node.id": "2", "controller.quorum.voters": "1@127.0.0.1:9093"})
    assert member.internal_topic_replication_factor("offsets.topic.replication.factor") == 3
    explicit = KafkaConfig({"controller.quorum.voters": "1@127.0.0.1:9093", "offsets.topic.replication.factor": "1"})
    assert explicit.internal_topic_replication_factor("offsets.topic.replication.factor") == 1
    with pytest.raises(ConfigError, match="is not an integer"):
        member.internal_topic_replication_factor("x", {"x": "three"})

"""Broker configuration: Kafka's server.properties names, defaults and file format."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from tierlog.config import KafkaConfig, parse_properties
from tierlog.config_def import ConfigException


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


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("node.id", "one", "Not a number of type INT"),
        ("auto.create.topics.enable", "yes", "Expected value to be either true or false"),
        ("log.segment.bytes", "-5", "Value must be at least 14"),
        ("log.retention.ms", "1h", "Not a number of type LONG"),
        ("log.retention.hours", "forever", "Not a number of type INT"),
        ("message.max.bytes", "-1", "Value must be at least 0"),
        ("default.replication.factor", "0", "Value must be at least 1"),
        ("num.partitions", "0", "Value must be at least 1"),
        ("auto.leader.rebalance.enable", "sometimes", "Expected value to be either true or false"),
        ("leader.imbalance.check.interval.seconds", "0", "Value must be at least 1"),
        ("leader.imbalance.per.broker.percentage", "ten", "Not a number of type INT"),
        ("log.retention.bytes", "1GB", "Not a number of type LONG"),
        ("controller.quorum.voters", "garbage", "each entry should be in the form {id}@{host}:{port}"),
        ("listeners", "PLAINTEXT://127.0.0.1:notaport", "expected NAME://host:port"),
        ("listeners", "PLAINTEXT://127.0.0.1:99999", "port 99999 is not between 0 and 65535"),
        ("listeners", "PLAINTEXT://localhost", "expected NAME://host:port"),
        ("log.cleanup.policy", "shred", "String must be one of: compact, delete"),
        ("tierlog.http.listener", "nowhere", "expected host:port"),
        ("compression.zstd.level", "99", "Value must be no more than 22"),
        ("compression.gzip.level", "0", "Value must be between 1 and 9 or equal to -1"),
    ],
)
def test_a_bad_value_is_refused_with_kafkas_one_line_naming_key_value_and_rule(key: str, value: str, rule: str) -> None:
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({key: value})
    assert str(refused.value) == f"Invalid value {value} for configuration {key}: {rule}"
    assert "\n" not in str(refused.value)


def test_a_bad_element_of_a_list_setting_is_the_value_kafkas_message_names() -> None:
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({"process.roles": "broker,zookeeper"})
    rule = "String must be one of: broker, controller"
    assert str(refused.value) == f"Invalid value zookeeper for configuration process.roles: {rule}"


def test_a_log_retention_ms_of_zero_is_refused_as_kafka_refuses_it() -> None:
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({"log.retention.ms": "0"})
    assert str(refused.value) == "log.retention.ms must be unlimited (-1) or, greater than or equal to 1"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"listeners": "CLIENT://127.0.0.1:9094"},
            "Listener with name CLIENT defined in listeners not found in listener.security.protocol.map.",
        ),
        (
            {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"},
            "authorizer.class.name=kafka.security.authorizer.AclAuthorizer is ZooKeeper mode's authorizer, which "
            "KRaft does not have: use authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ),
        (
            {"authorizer.class.name": "com.example.MyAuthorizer"},
            "authorizer.class.name=com.example.MyAuthorizer: tierlog's only authorizer is "
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ),
        ({"super.users": "User:admin;bob"}, "expected a string in format principalType:principalName but got bob"),
        ({"ssl.keymanager.algorithm": "SunX509"}, "ssl.keymanager.algorithm is set, but tierlog does not support it"),
        (
            {"sasl.server.callback.handler.class": "com.example.LdapCallbackHandler"},
            "sasl.server.callback.handler.class is set, but tierlog does not load SASL plugins",
        ),
        ({"zookeeper.connect": "localhost:2181"}, "tierlog runs in KRaft mode only"),
        (
            {
                "node.id": "2",
                "controller.quorum.voters": "1@h1:9093",
                "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093",
            },
            "the node id 2 must be included in the set of voters",
        ),
        (
            {"process.roles": "broker", "controller.quorum.voters": "1@h1:9093"},
            "the node id 1 must not be included in the set of voters",
        ),
        (
            {"controller.quorum.voters": "1@h1:9093"},
            "controller.listener.names must only contain values appearing in the 'listeners' configuration",
        ),
        ({"replica.fetch.wait.max.ms": "40000"}, "replica.socket.timeout.ms should always be at least"),
    ],
)
def test_settings_of_what_tierlog_does_not_do_are_refused_not_ignored(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigException, match=re.escape(message)):
        KafkaConfig(settings)


def test_kafka_settings_tierlog_does_not_use_are_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    config = KafkaConfig({"num.network.threads": "3", "log.retention.hours": "24", "rsm.config.url": "file:///x"})
    assert config.unused_keys() == ["num.network.threads"]
    with caplog.at_level(logging.INFO, logger="tierlog.config"):
        config.log_unused()
    assert caplog.messages == ["These configurations '[num.network.threads]' were supplied but are not used yet."]


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigException, match="cannot read"):
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
    explicit = KafkaConfig(
        {
            "controller.quorum.voters": "1@127.0.0.1:9093",
            "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            "offsets.topic.replication.factor": "1",
        }
    )
    assert explicit.internal_topic_replication_factor("offsets.topic.replication.factor") == 1
    with pytest.raises(ConfigException, match="Invalid value three for configuration x: Not a number of type SHORT"):
        member.internal_topic_replication_factor("x", {"x": "three"})


def test_a_quorum_of_three_voters_is_accepted_and_each_voter_is_known_by_id() -> None:
    voters = "1@h1:9093,2@h2:9094,3@[::1]:9095"
    combined = KafkaConfig(
        {
            "node.id": "2",
            "controller.quorum.voters": voters,
            "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9094",
        }
    )
    assert combined.is_controller
    assert combined.quorum_voters == {1: ("h1", 9093), 2: ("h2", 9094), 3: ("::1", 9095)}
    assert combined.controller_quorum_servers == [(1, "h1", 9093), (2, "h2", 9094), (3, "::1", 9095)]
    broker = KafkaConfig({"process.roles": "broker", "node.id": "4", "controller.quorum.voters": voters})
    assert not broker.is_standalone
    assert [node_id for node_id, _, _ in broker.controller_quorum_servers] == [1, 2, 3]


def test_a_controller_with_bootstrap_servers_but_no_voters_is_refused_rather_than_made_a_cluster_of_its_own() -> None:
    with pytest.raises(ConfigException, match=r"^A controller needs controller\.quorum\.voters: "):
        KafkaConfig(
            {
                "node.id": "2",
                "controller.quorum.bootstrap.servers": "h1:9093,h2:9093,h3:9093",
                "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            }
        )


def test_bootstrap_servers_name_the_controllers_without_their_ids() -> None:
    broker = KafkaConfig(
        {"process.roles": "broker", "node.id": "4", "controller.quorum.bootstrap.servers": "h1:9093,h2:9093"}
    )
    assert broker.controller_quorum_servers == [(None, "h1", 9093), (None, "h2", 9093)]
    assert broker.quorum_voters == {}

"""Spark's `kafka.*` options reach every client the connector makes, as Spark's Kafka connector passes them:
prefix stripped, the Java client's security names turned into librdkafka's, and a bad one refused on the driver
in one line naming the option. (No Spark session: these are the driver's option checks.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
from pyspark.sql.types import BinaryType, StructField, StructType

from tierlog.client.security_settings import client_security
from tierlog.spark.options import parse_batch_options, parse_stream_options
from tierlog.spark.sink import parse_sink_options

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="pw";'
VALUES = StructType([StructField("value", BinaryType())])


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


def secured(ca_file: Path) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": "127.0.0.1:9093",
        "Kafka.Security.Protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": JAAS,
        "kafka.ssl.truststore.location": str(ca_file),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.client.id": "etl",
    }


def test_source_gets_every_kafka_option_as_librdkafka_settings(ca_file: Path) -> None:
    parsed = parse_batch_options({**secured(ca_file), "subscribe": "events"})
    assert dict(parsed.client_settings) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": "pw",
        "ssl.ca.location": str(ca_file),
        "client.id": "etl",
        "isolation.level": "read_uncommitted",
    }
    # What an executor's fetch connection is made with.
    security = client_security(dict(parsed.client_settings))
    assert (security.protocol, security.sasl_mechanism, security.sasl_username) == ("SASL_SSL", "PLAIN", "admin")
    assert security.ssl_context is not None and security.ssl_context.check_hostname


def test_stream_source_gets_them_too(ca_file: Path) -> None:
    parsed = parse_stream_options({**secured(ca_file), "subscribe": "events"})
    assert dict(parsed.client_settings)["sasl.username"] == "admin"


def test_sink_producer_gets_them_over_its_defaults(ca_file: Path) -> None:
    config = dict(parse_sink_options({**secured(ca_file), "topic": "out", "kafka.acks": "1"}, VALUES).producer_config)
    assert config["sasl.password"] == "pw"
    assert config["ssl.ca.location"] == str(ca_file)
    assert config["acks"] == "1"
    assert config["bootstrap.servers"] == "127.0.0.1:9093"
    assert "sasl.jaas.config" not in config and "ssl.truststore.location" not in config


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"kafka.ssl.truststore.type": "JKS"},
            "option 'kafka.ssl.truststore.type': only PEM truststores are supported, not JKS",
        ),
        ({"kafka.sasl.mechanism": "GSSAPI"}, "option 'kafka.sasl.mechanism': security.protocol=SASL_SSL needs"),
        (
            {"kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required user=a;"},
            "option 'kafka.sasl.jaas.config': has no username and no password",
        ),
        ({"kafka.security.protocol": "SASL"}, "option 'kafka.security.protocol': must be one of"),
        (
            {"kafka.ssl.truststore.location": "/nonexistent/ca.pem"},
            "option 'kafka.ssl.truststore.location': not a readable PEM certificate file",
        ),
    ],
)
def test_a_bad_security_option_fails_the_query_in_one_line(ca_file: Path, extra: dict[str, str], message: str) -> None:
    options = {**secured(ca_file), **extra}
    for parse in (
        lambda: parse_batch_options({**options, "subscribe": "events"}),
        lambda: parse_sink_options({**options, "topic": "out"}, VALUES),
    ):
        with pytest.raises(ValueError) as error:
            parse()
        assert str(error.value).startswith(message), str(error.value)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["auto.offset.reset", "enable.auto.commit", "key.deserializer", "interceptor.classes"])
def test_consumer_settings_the_source_decides_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^option 'kafka\.{name}' is not supported: "):
        parse_batch_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t", f"kafka.{name}": "x"})


def test_sink_still_refuses_serializers() -> None:
    with pytest.raises(ValueError, match=r"^option 'kafka\.value\.serializer' is not supported: the sink writes"):
        parse_sink_options({"kafka.bootstrap.servers": "b:1", "topic": "t", "kafka.value.serializer": "x"}, VALUES)

"""`-X key=value` and `--command-config FILE` pass librdkafka settings to every client command, with Kafka's
console tools' precedence: an option on the command line beats -X, -X beats the file, the file beats an
option's default (and $TIERLOG_BOOTSTRAP). Each test runs the real `tierlog` command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import tierlog

from tierlog.testing.local_cluster import BrokerProcess, free_port

StoredCodecs = Callable[[BrokerProcess, str, int], set[str]]
# librdkafka sends a batch uncompressed when compressing does not make it smaller: values that compress well.
COMPRESSIBLE = "tierlog " * 200


def properties(path: Path, **settings: str) -> Path:
    """A Java .properties file of `settings` (dots spelt as underscores), with a comment as Kafka's have."""
    lines = ["# client settings", *(f"{key.replace('_', '.')}={value}" for key, value in settings.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def create_topic(broker: BrokerProcess, name: str) -> None:
    created = tierlog("topic", "create", name, "-p", "1", "-b", broker.bootstrap)
    assert created.code == 0, created.stderr


def test_x_settings_reach_the_producer(shared_broker: BrokerProcess, storage: StoredCodecs) -> None:
    create_topic(shared_broker, "x-gzip")
    # No -b: bootstrap.servers comes from -X too.
    settings = [f"bootstrap.servers={shared_broker.bootstrap}", "compression.type=gzip", "linger.ms=5"]
    x_options = [arg for setting in settings for arg in ("-X", setting)]
    produced = tierlog("produce", "x-gzip", "-v", COMPRESSIBLE, "-v", COMPRESSIBLE, *x_options)
    assert produced.code == 0, produced.stderr
    assert produced.first_line == "Produced 2 records to x-gzip"
    assert storage(shared_broker, "x-gzip", 0) == {"gzip"}


def test_x_beats_the_file_and_a_given_option_beats_both(
    shared_broker: BrokerProcess, storage: StoredCodecs, tmp_path: Path
) -> None:
    path = tmp_path / "client.properties"
    config = properties(path, bootstrap_servers=shared_broker.bootstrap, compression_type="snappy")
    cases = {
        "from-file": ([], "snappy"),
        "x-over-file": (["-X", "compression.type=lz4"], "lz4"),
        "option-over-x": (["-X", "compression.type=lz4", "-z", "zstd"], "zstd"),
    }
    for topic, (extra, codec) in cases.items():
        create_topic(shared_broker, topic)
        produced = tierlog("produce", topic, "-v", COMPRESSIBLE, "--command-config", str(config), *extra)
        assert produced.code == 0, produced.stderr
        assert produced.first_line == f"Produced 1 record to {topic}"
        assert storage(shared_broker, topic, 0) == {codec}, topic


def test_an_option_left_at_its_default_yields_to_x(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "acks")
    by_x = tierlog("produce", "acks", "-v", "x", "-X", "acks=0", "-b", shared_broker.bootstrap)
    assert by_x.code == 0, by_x.stderr
    assert by_x.first_line == "Produced 1 record to acks"
    assert "unknown (acks=0)" in by_x.stdout  # the broker sends nothing back with acks=0

    by_option = tierlog("produce", "acks", "-v", "x", "-X", "acks=0", "--acks", "all", "-b", shared_broker.bootstrap)
    assert by_option.code == 0, by_option.stderr
    assert "unknown (acks=0)" not in by_option.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["topic", "list"],
        ["topic", "describe", "settings-everywhere"],
        ["groups", "list"],
        ["produce", "settings-everywhere", "-v", "x"],
        ["consume", "settings-everywhere", "-e"],
    ],
    ids=" ".join,
)
def test_every_client_command_takes_its_brokers_from_the_file(
    shared_broker: BrokerProcess, tmp_path: Path, command: list[str]
) -> None:
    tierlog("topic", "create", "settings-everywhere", "-b", shared_broker.bootstrap)  # may exist already
    config = properties(tmp_path / "client.properties", bootstrap_servers=shared_broker.bootstrap, client_id="cfg")
    dead = f"127.0.0.1:{free_port()}"
    # The file beats $TIERLOG_BOOTSTRAP, which is only -b's default.
    ran = tierlog(*command, "--command-config", str(config), env={"TIERLOG_BOOTSTRAP": dead})
    assert ran.code == 0, ran.stderr
    assert ran.stderr == ""

    # -b on the line beats the file.
    wrong = properties(tmp_path / "wrong.properties", bootstrap_servers=dead)
    ran = tierlog(*command, "--command-config", str(wrong), "-b", shared_broker.bootstrap)
    assert ran.code == 0, ran.stderr


@pytest.mark.parametrize(
    "command",
    [["topic", "list"], ["groups", "describe", "g"], ["produce", "t", "-v", "x"], ["consume", "t", "-e"]],
    ids=" ".join,
)
def test_a_setting_librdkafka_refuses_is_one_line_naming_it(command: list[str], tmp_path: Path) -> None:
    # Checked before any broker is asked: none runs at this address.
    nowhere = ["-b", f"127.0.0.1:{free_port()}"]
    bad_value = tierlog(*command, *nowhere, "-X", "linger.ms=5", "-X", "batch.size=lots")
    assert bad_value.code == 1
    assert bad_value.first_error_line == (
        'Error: client setting batch.size=lots (-X): Invalid value for configuration property "batch.size"'
    )
    assert len(bad_value.stderr.splitlines()) == 1

    # librdkafka names the alias it stores compression.type under; the line names what the user wrote.
    config = properties(tmp_path / "c.properties", compression_type="brotli")
    alias = tierlog(*command, *nowhere, "--command-config", str(config))
    assert alias.code == 1
    assert alias.first_error_line == (
        f"Error: client setting compression.type=brotli (--command-config {config}): "
        'Invalid value "brotli" for configuration property "compression.codec"'
    )

    unknown = tierlog(*command, *nowhere, "-X", "no.such.setting=1")
    assert unknown.code == 1
    assert unknown.first_error_line == (
        'Error: client setting no.such.setting=1 (-X): No such configuration property: "no.such.setting"'
    )


def test_a_setting_against_one_of_the_producers_is_named_too() -> None:
    # Alone linger.ms=20000 is fine; against the delivery timeout that --timeout sets it is not.
    ran = tierlog("produce", "t", "-v", "x", "-b", f"127.0.0.1:{free_port()}", "-X", "linger.ms=20000")
    assert ran.code == 1
    assert ran.first_error_line == (
        "Error: client setting linger.ms=20000 (-X): Failed to create producer: "
        "`message.timeout.ms` must be greater than `linger.ms`"
    )


def test_consume_refuses_to_lose_the_end_of_partition_events() -> None:
    ran = tierlog("consume", "t", "-e", "-b", f"127.0.0.1:{free_port()}", "-X", "enable.partition.eof=false")
    assert ran.code == 1
    assert ran.first_error_line == (
        "Error: client setting enable.partition.eof=false (-X): this command needs enable.partition.eof=true"
    )


def test_a_setting_this_kind_of_client_ignores_is_told(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "ignored")
    ran = tierlog("consume", "ignored", "-e", "-X", "batch.size=1000", "-b", shared_broker.bootstrap)
    assert ran.code == 0, ran.stderr
    assert ran.first_error_line == (
        "% Configuration property batch.size is a producer property and will be ignored by this consumer instance"
    )


def test_malformed_x_is_a_usage_error() -> None:
    ran = tierlog("topic", "list", "-X", "linger.ms")
    assert ran.code == 2
    assert "'linger.ms' is not of the form key=value" in ran.stderr

"""Starting `tierlog broker` as a person would, with a configuration it cannot serve: the process ends at once
with one line naming the key, the value and the rule, a non-zero exit code, no traceback, no line that looks
like a start, and nothing written into the log directories (docs/configuration.md)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from cluster_helpers import BrokerFactory
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tierlog.testing.local_cluster import free_port

# A refused start is decided before any I/O: far below this bound.
REFUSAL_TIMEOUT_S = 30.0
START_LINES = ("started", "registered", "unfenced", "shut down cleanly")


def run_broker(log_dir: Path, settings: Mapping[str, str], config_file: Path | None = None) -> tuple[int, list[str]]:
    args = [sys.executable, "-m", "tierlog", "broker"]
    if config_file is not None:
        args.append(str(config_file))
    for key, value in {
        "log.dirs": str(log_dir),
        "listeners": f"PLAINTEXT://127.0.0.1:{free_port()}",
        **settings,
    }.items():
        args += ["--override", f"{key}={value}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return done.returncode, (done.stdout + done.stderr).splitlines()


def assert_refused(code: int, lines: list[str], first_line: str, log_dir: Path) -> None:
    assert code != 0, lines
    assert lines, "no output"
    assert lines[0] == first_line, lines
    assert len(lines) == 1, lines
    assert not any(word in line for line in lines for word in START_LINES), lines
    assert not log_dir.exists() or not any(log_dir.iterdir()), sorted(p.name for p in log_dir.iterdir())


@pytest.mark.parametrize(
    ("key", "value", "first_line"),
    [
        (
            "log.segment.bytes",
            "-5",
            "Error: Invalid value -5 for configuration log.segment.bytes: Value must be at least 14",
        ),
        (
            "log.retention.ms",
            "1h",
            "Error: Invalid value 1h for configuration log.retention.ms: Not a number of type LONG",
        ),
        (
            "log.retention.hours",
            "forever",
            "Error: Invalid value forever for configuration log.retention.hours: Not a number of type INT",
        ),
        (
            "message.max.bytes",
            "-1",
            "Error: Invalid value -1 for configuration message.max.bytes: Value must be at least 0",
        ),
        (
            "default.replication.factor",
            "0",
            "Error: Invalid value 0 for configuration default.replication.factor: Value must be at least 1",
        ),
        ("num.partitions", "0", "Error: Invalid value 0 for configuration num.partitions: Value must be at least 1"),
        (
            "log.retention.bytes",
            "1GB",
            "Error: Invalid value 1GB for configuration log.retention.bytes: Not a number of type LONG",
        ),
        (
            "controller.quorum.voters",
            "garbage",
            "Error: Invalid value garbage for configuration controller.quorum.voters: "
            "each entry should be in the form {id}@{host}:{port}",
        ),
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:notaport",
            "Error: Invalid value PLAINTEXT://127.0.0.1:notaport for configuration listeners: expected NAME://host:port",
        ),
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:99999",
            "Error: Invalid value PLAINTEXT://127.0.0.1:99999 for configuration listeners: "
            "port 99999 is not between 0 and 65535",
        ),
    ],
)
def test_an_invalid_setting_ends_the_process_at_once_with_one_line(
    tmp_path: Path, key: str, value: str, first_line: str
) -> None:
    log_dir = tmp_path / "data"
    code, lines = run_broker(log_dir, {key: value})
    assert_refused(code, lines, first_line, log_dir)


def test_a_sasl_listener_with_a_mechanism_tierlog_lacks_is_refused_not_served_as_plaintext(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    port = free_port()
    config_file = tmp_path / "server.properties"
    config_file.write_text(
        f"listeners=SASL_PLAINTEXT://127.0.0.1:{port}\n"
        "sasl.enabled.mechanisms=PLAIN,GSSAPI\n"
        "listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
        'required username="admin" password="secret" user_admin="secret";\n'
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
        "allow.everyone.if.no.acl.found=false\n"
        f"log.dirs={log_dir}\n"
    )
    args = [sys.executable, "-m", "tierlog", "broker", str(config_file)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    lines = (done.stdout + done.stderr).splitlines()
    assert_refused(
        done.returncode,
        lines,
        "Error: sasl.enabled.mechanisms=PLAIN,GSSAPI for SASL listener SASL_PLAINTEXT: tierlog supports PLAIN, "
        "SCRAM-SHA-256, SCRAM-SHA-512, not GSSAPI (Kafka's default is GSSAPI): set sasl.enabled.mechanisms=PLAIN",
        log_dir,
    )
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "nothing may listen on the SASL port"


def test_a_port_in_use_ends_the_start_before_anything_is_written(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = run_broker(log_dir, {"listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    # The empty directory Kafka's LogManager would also create is all there is: no cluster id, no metadata log.
    assert_refused(
        code, lines, f"Error: cannot listen on PLAINTEXT://127.0.0.1:{port}: Address already in use", log_dir
    )


def test_an_unusable_log_dir_ends_the_start_with_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    log_dir = not_a_dir / "data"
    code, lines = run_broker(log_dir, {})
    assert_refused(code, lines, f"Error: cannot use log directory {log_dir}: Not a directory", log_dir)


def test_unknown_settings_are_reported_once_and_kafkas_deprecated_topic_configs_are_accepted(
    broker_factory: BrokerFactory,
) -> None:
    """A real Kafka server.properties starts tierlog: what tierlog does not use is named once at start-up, and
    Kafka 3.x topic configs that are deprecated but accepted there are accepted here. A replication throttle's
    rate is a dynamic-only config, as in Kafka: in server.properties it is named unused, and a throttled-replicas
    list Kafka would refuse is refused with INVALID_CONFIG."""
    broker = broker_factory(
        {
            "num.network.threads": "3",
            "socket.send.buffer.bytes": "102400",
            "log.retention.hours": "168",
            "leader.replication.throttled.rate": "1000",
        }
    )
    log = broker.log_file.read_text()
    unused = [line for line in log.splitlines() if "were supplied but are not used yet" in line]
    assert len(unused) == 1, log
    assert "'[leader.replication.throttled.rate, num.network.threads, socket.send.buffer.bytes]'" in unused[0]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deprecated = {"message.format.version": "2.8", "message.downconversion.enable": "false"}
    admin.create_topics([NewTopic("legacy", 1, 1, config=deprecated)])["legacy"].result(timeout=30)
    described = admin.describe_configs([ConfigResource("topic", "legacy")])
    entries = next(iter(described.values())).result(timeout=30)
    assert entries["message.format.version"].value == "2.8"
    assert entries["message.downconversion.enable"].value == "false"
    throttled = {"leader.replication.throttled.replicas": "0:1,1"}
    with pytest.raises(Exception, match="must be the literal '\\*' or a list of replicas") as refused:
        admin.create_topics([NewTopic("throttled", 1, 1, config=throttled)])["throttled"].result(timeout=30)
    assert refused.value.args[0].name() == "INVALID_CONFIG"


def test_a_remote_chunk_cache_size_that_is_not_a_number_of_bytes_is_refused_with_one_line(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    settings = {
        "remote.log.storage.system.enable": "true",
        "rsm.config.url": (tmp_path / "remote").as_uri(),
        "rsm.config.fetch.chunk.cache.size": "64MB",
    }
    code, lines = run_broker(log_dir, settings)
    assert_refused(
        code,
        lines,
        "Error: Invalid value 64MB for configuration rsm.config.fetch.chunk.cache.size: not a number of bytes",
        log_dir,
    )

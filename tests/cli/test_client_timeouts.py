"""--timeout bounds the whole call of every client command, however many bootstrap servers there are and
however each fails: a name that does not resolve, a refused connection, a dropped one (blackholed), a
listener that accepts and never answers. A name that does not resolve is said to be a DNS failure.

Each test runs the real `tierlog` command and measures its wall time, start-up included."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from cli_helpers import tierlog

from tierlog.testing.local_cluster import BrokerProcess, free_port

TIMEOUT_S = 2.0
# Exit and scheduling on top of --timeout and of the command's own start-up, which is measured (a busy machine
# takes seconds to import the client libraries). Probing one address after the other, as before, took at least
# 3 x TIMEOUT_S with the four unreachable ones below.
SLACK_S = 1.5


@pytest.fixture(scope="module")
def start_up_s() -> float:
    """How long `tierlog --version` takes here and now: the start-up every command pays before --timeout."""
    return max(tierlog("--version").elapsed_s for _ in range(2))


# Every client command; TOPIC stands for a topic of the test's own.
COMMANDS = [
    ["topic", "create", "TOPIC"],
    ["topic", "list"],
    ["topic", "describe", "TOPIC"],
    ["topic", "alter-config", "TOPIC", "--set", "retention.ms=1000"],
    ["topic", "delete", "TOPIC"],
    ["groups", "list"],
    ["groups", "describe", "no-such-group"],
    ["groups", "delete", "no-such-group"],
    ["produce", "TOPIC", "-v", "x"],
    ["consume", "TOPIC", "-e"],
]
IDS = [" ".join(command) for command in COMMANDS]


def with_topic(command: list[str], topic: str) -> list[str]:
    return [topic if arg == "TOPIC" else arg for arg in command]


def blackholed() -> Iterator[str]:
    """An address whose connections are never answered: a listener with a backlog of one, filled, so the
    kernel drops every further SYN, as a firewall that drops packets does."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        with socket.create_connection(listener.getsockname()):
            yield f"127.0.0.1:{listener.getsockname()[1]}"


def silent() -> Iterator[str]:
    """An address that accepts connections and never says a word (a paused broker, a wrong service)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def unreachable() -> Iterator[list[str]]:
    """Four bootstrap servers none of which answers: two blackholed, one silent, and 10.255.255.1:9092, an
    unroutable address (dropped, or on a sandboxed network accepted by a proxy that never answers)."""
    first, second, third = blackholed(), blackholed(), silent()
    addresses = [next(first), next(second), next(third), "10.255.255.1:9092"]
    yield addresses
    for generator in (first, second, third):
        generator.close()


# Each case waits out its whole --timeout: about half a minute for all of them.
@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_timeout_bounds_the_call_whatever_the_bootstrap_servers(
    command: list[str], unreachable: list[str], start_up_s: float
) -> None:
    ran = tierlog(*with_topic(command, "bounded"), "-b", ",".join(unreachable), "--timeout", str(TIMEOUT_S))
    assert ran.code == 1
    assert ran.elapsed_s < start_up_s + TIMEOUT_S + SLACK_S, f"took {ran.elapsed_s:.1f}s (start-up {start_up_s:.1f}s)"
    line = ran.first_error_line
    assert line.startswith("Error: cannot reach any bootstrap server: "), line
    blackhole_1, blackhole_2, quiet, _ = unreachable
    assert f"{blackhole_1} no answer to connecting within 2s" in line
    assert f"{blackhole_2} no answer to connecting within 2s" in line
    assert f"{quiet} accepts connections but did not answer a Kafka request" in line
    assert len(ran.stderr.splitlines()) == 1


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_one_answering_server_among_unreachable_ones_is_enough(
    command: list[str], unreachable: list[str], shared_broker: BrokerProcess, start_up_s: float
) -> None:
    topic = "mixed-" + "-".join(command[:2])
    if command[1] != "create":
        assert tierlog("topic", "create", topic, "-b", shared_broker.bootstrap).code == 0
    bootstrap = ",".join([*unreachable, shared_broker.bootstrap])
    ran = tierlog(*with_topic(command, topic), "-b", bootstrap, "--timeout", str(TIMEOUT_S * 3))
    assert ran.elapsed_s < start_up_s + TIMEOUT_S * 3 + SLACK_S, f"took {ran.elapsed_s:.1f}s"
    if "no-such-group" in command:
        # The broker was asked and answered: the group does not exist.
        assert ran.code == 1
        assert "group 'no-such-group' does not exist" in ran.stdout + ran.stderr
    else:
        assert ran.code == 0, ran.stderr
        assert ran.stderr == ""


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_name_that_does_not_resolve_is_a_dns_failure(command: list[str], start_up_s: float) -> None:
    ran = tierlog(*with_topic(command, "bounded"), "-b", "no-such-host.invalid:9092", "--timeout", str(TIMEOUT_S))
    assert ran.code == 1
    assert ran.first_error_line.startswith("Error: cannot resolve no-such-host.invalid ("), ran.stderr
    assert ran.first_error_line.endswith("): is the bootstrap server's host name right?")
    assert ran.elapsed_s < start_up_s + TIMEOUT_S + SLACK_S


def test_each_bootstrap_server_says_how_it_failed() -> None:
    refused = f"127.0.0.1:{free_port()}"
    ran = tierlog("topic", "list", "-b", f"no-such-host.invalid:9092,{refused}", "--timeout", str(TIMEOUT_S))
    assert ran.code == 1
    assert ran.first_error_line.startswith(
        "Error: cannot reach any bootstrap server: no-such-host.invalid:9092 cannot resolve no-such-host.invalid ("
    )
    assert ran.first_error_line.endswith(f"; {refused} connection refused")

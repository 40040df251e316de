"""`tierlog user scram set|describe|delete` against a real broker process: the real command, its exit code
and first line (docs/security.md#scram-credentials)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import Ran, tierlog

from tierlog.testing.local_cluster import BrokerProcess

pytestmark = pytest.mark.cluster


def scram(broker: BrokerProcess, *args: str, stdin: bytes = b"") -> Ran:
    return tierlog("user", "scram", *args, "-b", broker.bootstrap, "--timeout", "15", stdin=stdin)


def table(ran: Ran) -> list[list[str]]:
    return [line.split() for line in ran.stdout.splitlines()]


def test_set_describe_and_delete_a_users_credentials(shared_broker: BrokerProcess) -> None:
    first = scram(
        shared_broker,
        "set",
        "alice",
        "--mechanism",
        "SCRAM-SHA-256",
        "--iterations",
        "8192",
        "--password-stdin",
        stdin=b"alice-secret\n",
    )
    assert (first.code, first.first_line) == (0, "SCRAM-SHA-256 credential of user 'alice' set (8192 iterations)")
    second = scram(shared_broker, "set", "alice", "--mechanism", "scram-sha-512", "--password-stdin", stdin=b"s\n")
    assert (second.code, second.first_line) == (0, "SCRAM-SHA-512 credential of user 'alice' set (4096 iterations)")
    prompted = scram(shared_broker, "set", "bob", "--mechanism", "SCRAM-SHA-512", stdin=b"bob-secret\nbob-secret\n")
    assert prompted.code == 0, prompted.stderr
    assert prompted.first_line.endswith("SCRAM-SHA-512 credential of user 'bob' set (4096 iterations)")

    described = scram(shared_broker, "describe", "alice", "bob")
    assert described.code == 0, described.stderr
    assert table(described) == [
        ["USER", "MECHANISM", "ITERATIONS"],
        ["alice", "SCRAM-SHA-256", "8192"],
        ["alice", "SCRAM-SHA-512", "4096"],
        ["bob", "SCRAM-SHA-512", "4096"],
    ]
    assert b"secret" not in described.out
    every = scram(shared_broker, "describe")
    assert every.code == 0 and table(every)[0] == ["USER", "MECHANISM", "ITERATIONS"]
    assert {("alice", "SCRAM-SHA-256"), ("alice", "SCRAM-SHA-512"), ("bob", "SCRAM-SHA-512")} <= {
        (row[0], row[1]) for row in table(every)[1:]
    }

    deleted = scram(shared_broker, "delete", "alice", "--mechanism", "SCRAM-SHA-512")
    assert (deleted.code, deleted.first_line) == (0, "SCRAM-SHA-512 credential of user 'alice' deleted")
    assert table(scram(shared_broker, "describe", "alice"))[1:] == [["alice", "SCRAM-SHA-256", "8192"]]


def test_failures_are_one_line(shared_broker: BrokerProcess, tmp_path: Path) -> None:
    too_few = scram(
        shared_broker,
        "set",
        "carol",
        "--mechanism",
        "SCRAM-SHA-256",
        "--iterations",
        "100",
        "--password-stdin",
        stdin=b"secret\n",
    )
    assert (too_few.code, too_few.first_error_line) == (
        1,
        "Error: SCRAM-SHA-256 credential of user 'carol': Too few iterations (UNACCEPTABLE_CREDENTIAL)",
    )
    empty = scram(shared_broker, "set", "carol", "--mechanism", "SCRAM-SHA-256", "--password-stdin", stdin=b"\n")
    assert (empty.code, empty.first_error_line) == (1, "Error: the password must not be empty")
    missing = scram(shared_broker, "delete", "carol", "--mechanism", "SCRAM-SHA-512")
    assert (missing.code, missing.first_error_line) == (
        1,
        "Error: SCRAM-SHA-512 credential of user 'carol' does not exist",
    )
    unknown = scram(shared_broker, "describe", "carol")
    assert (unknown.code, unknown.first_error_line, unknown.stdout) == (
        1,
        "Error: SCRAM credential of user 'carol' does not exist",
        "",
    )
    no_mechanism = scram(shared_broker, "delete", "carol")
    assert no_mechanism.code == 2 and "Missing option '--mechanism'" in no_mechanism.stderr


def test_the_commands_take_client_settings(shared_broker: BrokerProcess, tmp_path: Path) -> None:
    refused = scram(shared_broker, "describe", "-X", "no.such.setting=1")
    assert refused.code == 1
    assert refused.first_error_line.startswith("Error: client setting no.such.setting=1 (-X): ")
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=PLAINTEXT\nclient.id=scram-admin\n")
    via_file = scram(
        shared_broker,
        "set",
        "dan",
        "--mechanism",
        "SCRAM-SHA-256",
        "--password-stdin",
        "--command-config",
        str(config),
        stdin=b"secret\n",
    )
    assert (via_file.code, via_file.first_line) == (0, "SCRAM-SHA-256 credential of user 'dan' set (4096 iterations)")

"""`tierlog consume --group` and `tierlog groups list|describe|delete` against a real broker process."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest
from cli_helpers import assert_fits, run_in_terminal
from click.testing import CliRunner, Result

from tierlog.cli.main import cli
from tierlog.testing.local_cluster import BrokerProcess, wait_until

# What Kafka users set for group tests on one broker.
GROUP_SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "3",
}
MEMBER_S = 30.0


@pytest.fixture(scope="module")
def group_broker(module_broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return module_broker_factory(GROUP_SETTINGS)


def run(broker: BrokerProcess, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, "-b", broker.bootstrap, "--timeout", "15"])


def produce(broker: BrokerProcess, topic: str, partition: int, *values: str) -> None:
    args = [arg for value in values for arg in ("-v", value)]
    produced = run(broker, "produce", topic, "-p", str(partition), *args)
    assert produced.exit_code == 0, produced.output


def consume_in_group(broker: BrokerProcess, topic: str, group: str, *args: str) -> list[str]:
    consumed = run(broker, "consume", topic, "-g", group, "-f", r"%p:%o:%v\n", *args)
    assert consumed.exit_code == 0, consumed.output
    return consumed.stdout.splitlines()


def start_follower(command: list[str]) -> subprocess.Popen[bytes]:
    """`tierlog consume` following a group, as a person runs it in a terminal: with Ctrl-C's default action,
    even when these tests run as a background job (whose shell starts them ignoring SIGINT, an ignore Python keeps
    and passes on, so the follower would never see Ctrl-C)."""
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def stop_follower(follower: subprocess.Popen[bytes]) -> bytes:
    """Ctrl-C: the follower closes its consumer, leaving the group, and exits; killed if it does not within the
    bound (the test fails, and no process outlives it). Its stderr."""
    follower.send_signal(signal.SIGINT)
    try:
        return follower.communicate(timeout=MEMBER_S)[1]
    except subprocess.TimeoutExpired:
        follower.kill()
        follower.communicate()
        raise


def describe_rows(output: str, columns: int = 5) -> dict[int, list[str]]:
    """partition -> CURRENT-OFFSET, LOG-END-OFFSET, LAG (and with `-o wide`, 8 columns: CONSUMER-ID, HOST,
    CLIENT-ID) of its row."""
    rows = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == columns and fields[1].isdigit():
            rows[int(fields[1])] = fields[2:]
    return rows


def test_consume_with_a_group_resumes_after_what_it_printed(group_broker: BrokerProcess) -> None:
    assert run(group_broker, "topic", "create", "ledger", "-p", "2", "-r", "1").exit_code == 0
    produce(group_broker, "ledger", 0, "a", "b", "c")
    produce(group_broker, "ledger", 1, "d", "e")

    assert sorted(consume_in_group(group_broker, "ledger", "auditors", "-e")) == [
        "0:0:a",
        "0:1:b",
        "0:2:c",
        "1:0:d",
        "1:1:e",
    ]
    # Everything printed was committed: the next run of the group has nothing to print.
    assert consume_in_group(group_broker, "ledger", "auditors", "-e") == []

    produce(group_broker, "ledger", 0, "f", "g")
    assert consume_in_group(group_broker, "ledger", "auditors", "-n", "1") == ["0:3:f"]
    assert consume_in_group(group_broker, "ledger", "auditors", "-e") == ["0:4:g"]
    # Another group has offsets of its own; starting at the end leaves the old records alone.
    assert consume_in_group(group_broker, "ledger", "latecomers", "-o", "end", "-e") == []
    # Without --group nothing is committed: the records can be read again and again.
    assert len(run(group_broker, "consume", "ledger", "-e").stdout.splitlines()) == 7


def test_group_options_that_contradict_a_group_are_usage_errors(group_broker: BrokerProcess) -> None:
    for args in (["-o", "3"], ["-p", "0"], ["--from-timestamp", "0"]):
        result = run(group_broker, "consume", "ledger", "-g", "auditors", *args)
        assert result.exit_code == 2, (args, result.output)
    assert run(group_broker, "consume", "no-such-topic", "-g", "auditors", "-e").exit_code == 1


def test_groups_list_describe_and_delete(group_broker: BrokerProcess) -> None:
    assert run(group_broker, "topic", "create", "orders", "-p", "3", "-r", "1").exit_code == 0
    for partition in range(3):
        produce(group_broker, "orders", partition, *[f"v{i}" for i in range(partition + 2)])
    assert len(consume_in_group(group_broker, "orders", "billing", "-e")) == 2 + 3 + 4
    produce(group_broker, "orders", 1, "late-1", "late-2")

    listed = run(group_broker, "groups", "list")
    assert listed.exit_code == 0, listed.output
    assert re.search(r"^billing\s+Empty$", listed.stdout, re.MULTILINE)

    described = run(group_broker, "groups", "describe", "billing")
    assert described.exit_code == 0, described.output
    assert re.search(r"billing\s+state Empty, 0 members", described.stdout)
    # CURRENT-OFFSET, LOG-END-OFFSET, LAG
    assert describe_rows(described.stdout) == {0: ["2", "2", "0"], 1: ["3", "5", "2"], 2: ["4", "4", "0"]}
    # and no member
    wide = run(group_broker, "groups", "describe", "billing", "-o", "wide")
    assert wide.exit_code == 0, wide.output
    assert describe_rows(wide.stdout, columns=8) == {
        0: ["2", "2", "0", "-", "-", "-"],
        1: ["3", "5", "2", "-", "-", "-"],
        2: ["4", "4", "0", "-", "-", "-"],
    }

    missing = run(group_broker, "groups", "describe", "no-such-group")
    assert missing.exit_code == 1
    assert "group 'no-such-group' does not exist" in missing.stderr

    deleted = run(group_broker, "groups", "delete", "billing")
    assert deleted.exit_code == 0, deleted.output
    assert re.search(r"billing\s+deleted", deleted.stdout)
    assert "billing" not in run(group_broker, "groups", "list").stdout
    assert run(group_broker, "groups", "describe", "billing").exit_code == 1
    again = run(group_broker, "groups", "delete", "billing")
    assert again.exit_code == 1
    assert "group 'billing' does not exist" in again.stdout


def test_a_group_with_a_running_consumer_is_described_with_it_and_cannot_be_deleted(
    group_broker: BrokerProcess,
) -> None:
    assert run(group_broker, "topic", "create", "events", "-p", "2", "-r", "1").exit_code == 0
    produce(group_broker, "events", 0, "x")
    command = [sys.executable, "-m", "tierlog", "consume", "events", "-g", "watchers", "-b", group_broker.bootstrap]
    follower = start_follower(command)
    try:

        def stable() -> str | None:
            result = run(group_broker, "groups", "describe", "watchers", "-o", "wide")
            return result.stdout if "state Stable, 1 members" in result.stdout else None

        output = wait_until(stable, MEMBER_S, "group watchers Stable with the following consumer")
        rows = describe_rows(output, columns=8)
        assert sorted(rows) == [0, 1]
        assert all(row[-1] == "tierlog-cli" and row[-3].startswith("tierlog-cli-") for row in rows.values()), rows
        # By default the member has a line of its own, with its partitions.
        described = run(group_broker, "groups", "describe", "watchers")
        member = next(iter(rows.values()))[-3]
        assert f"{member} (tierlog-cli, {next(iter(rows.values()))[-2]})\n  assigned events 0,1\n" in described.stdout

        refused = run(group_broker, "groups", "delete", "watchers")
        assert refused.exit_code == 1
        assert "group 'watchers' has active members" in refused.stdout
    finally:
        # Without a traceback, too.
        stderr = stop_follower(follower)
    assert follower.returncode == 0, stderr.decode()
    assert run(group_broker, "groups", "delete", "watchers").exit_code == 0


def test_describe_fits_80_columns_and_wide_puts_the_member_in_each_row(group_broker: BrokerProcess) -> None:
    topic, group = "customer-activity-events-2024x", "billing-service-consumers-prod"  # 30 characters each
    assert run(group_broker, "topic", "create", topic, "-p", "2", "-r", "1").exit_code == 0
    produce(group_broker, topic, 0, "x")
    command = [sys.executable, "-m", "tierlog", "consume", topic, "-g", group, "-b", group_broker.bootstrap]
    follower = start_follower(command)
    describe = ["groups", "describe", group, "-b", group_broker.bootstrap, "--timeout", "15"]
    try:
        wait_until(
            lambda: "state Stable, 1 members" in run(group_broker, *describe[:3]).stdout,
            MEMBER_S,
            f"group {group} Stable with the following consumer",
        )
        code, lines = run_in_terminal(describe, columns=80)
        wide_code, wide = run_in_terminal([*describe, "-o", "wide"], columns=200)
    finally:
        stop_follower(follower)
    assert code == 0, "\n".join(lines)
    assert_fits(lines, 80)
    assert lines[0].startswith(f"{group}  state Stable, 1 members, assignor range,")
    header = next(n for n, line in enumerate(lines) if line.startswith("TOPIC"))
    assert lines[header].split() == ["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    table, member_lines = lines[header + 1 : header + 3], lines[header + 3 :]
    assert [line.split()[:2] for line in table] == [[topic, "0"], [topic, "1"]]
    assert len(member_lines) == 2, lines
    assert re.fullmatch(r"tierlog-cli-[0-9a-f-]+ \(tierlog-cli, /127\.0\.0\.1\)", member_lines[0]), lines
    assert member_lines[1] == f"  assigned {topic} 0,1"

    assert wide_code == 0, "\n".join(wide)
    header = next(line.split() for line in wide if line.startswith("TOPIC"))
    assert header[5:] == ["CONSUMER-ID", "HOST", "CLIENT-ID"]
    member = member_lines[0].split()[0]
    assert [line.split()[-3:] for line in wide if line.startswith(topic)] == [[member, "/127.0.0.1", "tierlog-cli"]] * 2

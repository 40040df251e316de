"""`tierlog topic ...` against a real broker process."""

from __future__ import annotations

import re

from cli_helpers import assert_fits, run_in_terminal
from click.testing import CliRunner, Result

from tierlog.cli.main import cli
from tierlog.testing.local_cluster import BrokerProcess, free_port


def run(broker: BrokerProcess, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, "-b", broker.bootstrap, "--timeout", "15"])


def describe_rows(output: str) -> dict[int, list[str]]:
    """partition -> the rest of its row in the PARTITIONS table."""
    rows = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[0].isdigit():
            rows[int(fields[0])] = fields[1:]
    return rows


def test_topic_create_list_describe_alter_delete(shared_broker: BrokerProcess) -> None:
    created = run(shared_broker, "topic", "create", "orders", "-p", "3", "-r", "1", "-c", "retention.ms=3600000")
    assert created.exit_code == 0, created.output
    assert re.search(r"orders\s+created", created.stdout)

    listed = run(shared_broker, "topic", "list")
    assert listed.exit_code == 0, listed.output
    assert re.search(r"^orders\s+3\s+1$", listed.stdout, re.MULTILINE)

    produced = run(shared_broker, "produce", "orders", "-p", "1", "-v", "a", "-v", "b")
    assert produced.exit_code == 0, produced.output

    described = run(shared_broker, "topic", "describe", "orders")
    assert described.exit_code == 0, described.output
    # leader, replicas, ISR, earliest, latest
    assert describe_rows(described.stdout) == {
        0: ["1", "1", "1", "0", "0"],
        1: ["1", "1", "1", "0", "2"],
        2: ["1", "1", "1", "0", "0"],
    }
    assert re.search(r"^retention\.ms\s+3600000\s*$", described.stdout, re.M), described.stdout
    wide = run(shared_broker, "topic", "describe", "orders", "-o", "wide")
    assert wide.exit_code == 0, wide.output
    assert describe_rows(wide.stdout) == describe_rows(described.stdout)
    assert re.search(r"^retention\.ms\s+3600000\s+DYNAMIC_TOPIC_CONFIG\s*$", wide.stdout, re.M), wide.stdout

    altered = run(
        shared_broker, "topic", "alter-config", "orders", "--set", "cleanup.policy=delete", "--delete", "retention.ms"
    )
    assert altered.exit_code == 0, altered.output
    described = run(shared_broker, "topic", "describe", "orders", "-o", "wide")
    assert re.search(r"cleanup\.policy\s+delete\s+DYNAMIC_TOPIC_CONFIG", described.stdout)
    assert "retention.ms" not in described.stdout

    deleted = run(shared_broker, "topic", "delete", "orders")
    assert deleted.exit_code == 0, deleted.output
    assert re.search(r"orders\s+deleted", deleted.stdout)
    assert "orders" not in run(shared_broker, "topic", "list").stdout


def test_topic_errors_are_one_line_and_fail(shared_broker: BrokerProcess) -> None:
    assert run(shared_broker, "topic", "create", "twice").exit_code == 0
    again = run(shared_broker, "topic", "create", "twice")
    assert again.exit_code == 1
    assert "topic 'twice' already exists" in again.stdout

    missing = run(shared_broker, "topic", "describe", "no-such-topic")
    assert missing.exit_code == 1
    assert "topic 'no-such-topic' does not exist" in missing.stderr

    assert run(shared_broker, "topic", "delete", "no-such-topic").exit_code == 1

    bad_config = run(shared_broker, "topic", "create", "bad-config", "-c", "retention.ms=soon")
    assert bad_config.exit_code == 1


def test_unreachable_broker_says_what_to_do() -> None:
    address = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["topic", "list"], env={"TIERLOG_BOOTSTRAP": address})
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"Error: cannot reach {address}: is a broker running? start one with `tierlog broker`"
    )


def test_describe_fits_80_columns_and_wide_adds_where_each_config_comes_from(shared_broker: BrokerProcess) -> None:
    name = "customer-activity-events-2024x"  # 30 characters
    configs = ["-c", "retention.ms=3600000", "-c", "message.timestamp.after.max.ms=86400000"]
    assert run(shared_broker, "topic", "create", name, "-p", "3", "-r", "1", *configs).exit_code == 0
    assert run(shared_broker, "produce", name, "-p", "2", "-v", "a").exit_code == 0
    describe = ["topic", "describe", name, "-b", shared_broker.bootstrap, "--timeout", "15"]

    code, lines = run_in_terminal(describe, columns=80)
    assert code == 0, "\n".join(lines)
    assert_fits(lines, 80)
    assert lines[0] == f"{name}  partitions 3, replication factor 1"
    # leader, replicas, ISR, earliest, latest
    assert describe_rows("\n".join(lines)) == {
        0: ["1", "1", "1", "0", "0"],
        1: ["1", "1", "1", "0", "0"],
        2: ["1", "1", "1", "0", "1"],
    }
    rows = [line.split() for line in lines]
    assert ["NAME", "VALUE"] in rows
    assert ["message.timestamp.after.max.ms", "86400000"] in rows

    code, wide = run_in_terminal([*describe, "-o", "wide"], columns=200)
    assert code == 0, "\n".join(wide)
    rows = [line.split() for line in wide]
    assert ["NAME", "VALUE", "SOURCE"] in rows
    assert ["message.timestamp.after.max.ms", "86400000", "DYNAMIC_TOPIC_CONFIG"] in rows

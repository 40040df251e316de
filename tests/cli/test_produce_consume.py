"""`tierlog produce` and `tierlog consume` round trips against a real broker process."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner, Result

from tierlog.cli.local_cluster import BrokerProcess
from tierlog.cli.main import cli


def run(broker: BrokerProcess, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, [*args, "-b", broker.bootstrap, "--timeout", "15"], input=stdin)


def create(broker: BrokerProcess, topic: str, partitions: int) -> None:
    result = run(broker, "topic", "create", topic, "-p", str(partitions))
    assert result.exit_code == 0, result.output


def test_values_with_key_and_headers_come_back_as_json(shared_broker: BrokerProcess) -> None:
    create(shared_broker, "greetings", 1)
    produced = run(
        shared_broker,
        "produce",
        "greetings",
        "-k",
        "k1",
        "-H",
        "source=test",
        "-H",
        "trace=abc",
        "-v",
        "hello",
        "-v",
        "wörld",
        "-z",
        "zstd",
    )
    assert produced.exit_code == 0, produced.output
    assert "Produced 2 records to greetings" in produced.stdout

    consumed = run(shared_broker, "consume", "greetings", "-e", "-f", "json")
    assert consumed.exit_code == 0, consumed.output
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == [(0, "k1", "hello"), (1, "k1", "wörld")]
    assert records[0]["headers"] == [{"key": "source", "value": "test"}, {"key": "trace", "value": "abc"}]
    assert records[0]["topic"] == "greetings"
    assert records[0]["partition"] == 0
    assert records[0]["timestamp"] > 0


def test_stdin_lines_with_key_separator_round_trip(shared_broker: BrokerProcess) -> None:
    create(shared_broker, "lines", 3)
    lines = [f"user-{i % 4}\tevent {i}" for i in range(40)]
    produced = run(shared_broker, "produce", "lines", "-K", r"\t", stdin="\n".join(lines) + "\n")
    assert produced.exit_code == 0, produced.output
    assert "Produced 40 records to lines" in produced.stdout

    consumed = run(shared_broker, "consume", "lines", "-e")
    assert consumed.exit_code == 0, consumed.output
    # Default format "%k\t%v\n": each stdin line comes back as it went in, each key in its own order.
    assert sorted(consumed.stdout.splitlines()) == sorted(lines)
    for key in {line.split("\t")[0] for line in lines}:
        assert [li for li in consumed.stdout.splitlines() if li.startswith(key + "\t")] == [
            li for li in lines if li.startswith(key + "\t")
        ]


def test_consume_offsets_partition_count_and_format(shared_broker: BrokerProcess) -> None:
    create(shared_broker, "numbers", 2)
    for partition in ("0", "1"):
        values = [arg for i in range(10) for arg in ("-v", f"p{partition}-{i}")]
        assert run(shared_broker, "produce", "numbers", "-p", partition, *values).exit_code == 0

    tail = run(shared_broker, "consume", "numbers", "-p", "1", "-o", "-3", "-e", "-f", r"%p:%o:%v\n")
    assert tail.stdout.splitlines() == ["1:7:p1-7", "1:8:p1-8", "1:9:p1-9"]

    from_offset = run(shared_broker, "consume", "numbers", "-p", "0", "-o", "5", "-n", "2", "-f", r"%v,")
    assert from_offset.exit_code == 0, from_offset.output
    assert from_offset.stdout == "p0-5,p0-6,"

    at_end = run(shared_broker, "consume", "numbers", "-o", "end", "-e")
    assert at_end.exit_code == 0, at_end.output
    assert at_end.stdout == ""

    future = run(shared_broker, "consume", "numbers", "--from-timestamp", "4102444800000", "-e")
    assert future.exit_code == 0, future.output
    assert future.stdout == ""

    since_epoch = run(shared_broker, "consume", "numbers", "--from-timestamp", "0", "-e", "-f", r"%v\n")
    assert len(since_epoch.stdout.splitlines()) == 20


def test_consume_of_a_missing_topic_fails(shared_broker: BrokerProcess) -> None:
    result = run(shared_broker, "consume", "no-such-topic", "-e")
    assert result.exit_code == 1
    assert "topic 'no-such-topic' does not exist" in result.stderr


def test_records_without_a_key_on_a_compacted_topic_fail_with_the_reason(shared_broker: BrokerProcess) -> None:
    created = run(shared_broker, "topic", "create", "latest", "-c", "cleanup.policy=compact")
    assert created.exit_code == 0, created.output
    # Two lines lack the key separator, so their records have no key; the broker refuses the whole batch.
    lines = "a\t1\nno key\nb\t2\nnone either\n"
    result = subprocess.run(
        [sys.executable, "-m", "tierlog", "produce", "latest", "-K", r"\t", "-b", shared_broker.bootstrap],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines()[0] == (
        "Error: 4 of 4 records not acknowledged: topic 'latest' is compacted: every record needs a key "
        "(-k or -K) (INVALID_RECORD) (2 records); topic 'latest': Local: an invalid record in the same batch "
        "caused the failure of this message too (_INVALID_DIFFERENT_RECORD) (2 records)"
    )

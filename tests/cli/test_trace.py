"""`tierlog trace`: parsing, merging and printing trace events, against canned streams (no brokers), and a
partition that does not exist, against a real broker."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC
from pathlib import Path

import pytest
from cli_helpers import FakeBrokerHttp, event, tierlog
from click.testing import CliRunner

from tierlog.cli.cluster import CLUSTER_FILE, ClusterInfo, NodeInfo
from tierlog.cli.main import cli
from tierlog.cli.trace import EventMerger, TraceEvent, event_row, format_value, header_row, parse_event
from tierlog.testing.local_cluster import BrokerProcess, free_port


def ev(seq: int, time_ms: int, broker_id: int, attribute: str = "Leader LEO", old: int = 0, new: int = 1) -> TraceEvent:
    return parse_event(json.dumps(event(seq, time_ms, broker_id, attribute, old, new)))


def cells(line: str) -> list[str]:
    """A printed row's cells: columns are separated by at least two spaces."""
    return re.split(r" {2,}", line.strip())


def test_parse_event_reads_every_field() -> None:
    line = json.dumps(event(7, 1_000, 2, "ISR", [1, 2, 3], [1, 2], "broker 3 behind for 30000 ms"))
    assert parse_event(line) == TraceEvent(
        seq=7,
        time_ms=1_000,
        broker_id=2,
        topic="orders",
        partition=0,
        attribute="ISR",
        phase="PRODUCE",
        old=[1, 2, 3],
        new=[1, 2],
        why="broker 3 behind for 30000 ms",
    )


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        json.dumps({"seq": 1}),
        json.dumps({**event(1, 1, 1, "Leader LEO", 0, 1), "old": "zero"}),
        json.dumps({**event(1, 1, 1, "ISR", [1], [1, 2]), "new": [1, "2"]}),
        json.dumps([1, 2, 3]),
    ],
)
def test_parse_event_rejects_what_is_not_an_event(line: str) -> None:
    with pytest.raises(ValueError):
        parse_event(line)


def test_merger_orders_by_time_then_broker_then_seq_once_held_long_enough() -> None:
    merger = EventMerger(hold_ms=200)
    # Broker 2's stream delivers its earlier event after broker 1's later one: held, it still goes first.
    assert merger.push(ev(5, 1_010, 1), now_ms=0)
    assert merger.push(ev(3, 1_000, 2), now_ms=100)
    assert merger.push(ev(4, 1_010, 2), now_ms=100)
    assert merger.push(ev(4, 1_005, 1), now_ms=100) is False  # broker 1 already sent seq 5
    assert merger.pop_ready(now_ms=199) == []
    # The head (time 1000) arrived at 100: nothing is released before it, although broker 1's event is due.
    assert merger.pop_ready(now_ms=250) == []
    assert [e.order for e in merger.pop_ready(now_ms=300)] == [(1_000, 2, 3), (1_010, 1, 5), (1_010, 2, 4)]
    assert merger.drain() == []


def test_merger_drops_a_replayed_backlog_but_takes_a_restarted_brokers_events() -> None:
    merger = EventMerger(hold_ms=0)
    for seq in range(3):
        assert merger.push(ev(seq, 1_000 + seq, 1), now_ms=0)
    # The stream reconnects to the same process: its backlog comes again.
    assert [merger.push(ev(seq, 1_000 + seq, 1), now_ms=1) for seq in range(3)] == [False, False, False]
    # The broker restarted: seq starts again, at a later time.
    assert merger.push(ev(0, 5_000, 1), now_ms=2)
    assert [e.order for e in merger.drain()] == [(1_000, 1, 0), (1_001, 1, 1), (1_002, 1, 2), (5_000, 1, 0)]


def test_rows_have_seed_000_columns() -> None:
    assert cells(header_row().plain) == ["time", "broker", "attribute", "phase", "old", "new", "why"]
    leader_hw = parse_event(json.dumps(event(9, 3_723_004, 1, "Leader HW", 0, 1, "min(Leader LEO=1, Remote LEO=1)")))
    assert cells(event_row(leader_hw, UTC).plain) == [
        "01:02:03.004",
        "1",
        "Leader HW",
        "FETCH",
        "0",
        "1",
        "min(Leader LEO=1, Remote LEO=1)",
    ]
    long_attribute = ev(1, 0, 12, "Remote LEO (broker 12345)", 100_000_000, 100_000_001)
    row = cells(event_row(long_attribute, UTC).plain)
    assert row[2:6] == ["Remote LEO (broker 12345)", "PRODUCE", "100000000", "100000001"]


def test_values_print_as_in_the_seed_tables() -> None:
    assert format_value(0) == "0"
    assert format_value([1, 2, 3]) == "[1, 2, 3]"
    assert format_value(None) == "-"


SEED_000_LEADER = [
    event(0, 1_000, 1, "Leader LEO", 0, 1, "appended 1 record"),
    event(1, 1_000, 1, "Leader HW", 0, 0, "min(Leader LEO=1, Remote LEO=0)"),
    event(2, 2_000, 1, "Remote LEO (broker 2)", 0, 1, "fetch offset 1"),
    event(3, 2_000, 1, "Leader HW", 0, 1, "min(Leader LEO=1, Remote LEO=1)"),
]
SEED_000_FOLLOWER = [
    event(0, 1_500, 2, "Follower LEO", 0, 1, "appended 1 fetched record"),
    event(1, 1_500, 2, "Follower HW", 0, 0, "min(leader HW=0, LEO=1)"),
    event(2, 2_100, 2, "Follower HW", 0, 1, "min(leader HW=1, LEO=1)"),
]


def test_trace_merges_the_streams_of_every_broker() -> None:
    leader_lines = [json.dumps(e) for e in SEED_000_LEADER]
    follower_lines = [json.dumps(e) for e in SEED_000_FOLLOWER]
    with FakeBrokerHttp(trace_lines=leader_lines) as leader, FakeBrokerHttp(trace_lines=follower_lines) as follower:
        result = CliRunner().invoke(
            cli,
            ["trace", "orders", "0", "--http", leader.address, "--http", follower.address, "--no-follow"],
        )
        assert result.exit_code == 0, result.output
        assert leader.trace_queries == [{"topic": ["orders"], "partition": ["0"]}]
    rows = [cells(line) for line in result.stdout.splitlines()]
    assert rows[0] == ["time", "broker", "attribute", "phase", "old", "new", "why"]
    assert [(row[1], row[2], row[4], row[5]) for row in rows[1:]] == [
        ("1", "Leader LEO", "0", "1"),
        ("1", "Leader HW", "0", "0"),
        ("2", "Follower LEO", "0", "1"),
        ("2", "Follower HW", "0", "0"),
        ("1", "Remote LEO (broker 2)", "0", "1"),
        ("1", "Leader HW", "0", "1"),
        ("2", "Follower HW", "0", "1"),
    ]


def test_trace_goes_on_without_a_broker_that_does_not_answer() -> None:
    with (
        FakeBrokerHttp(trace_lines=[json.dumps(e) for e in SEED_000_LEADER]) as leader,
        FakeBrokerHttp(trace_status=404) as broken,
    ):
        unreachable = f"127.0.0.1:{free_port()}"
        addresses = ["--http", leader.address, "--http", broken.address, "--http", unreachable]
        result = CliRunner().invoke(cli, ["trace", "orders", "0", *addresses, "--no-follow", "--timeout", "2"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1 + len(SEED_000_LEADER)
    assert f"{broken.address} answered GET /v1/trace?topic=orders&partition=0 with HTTP 404" in result.stderr
    assert f"cannot reach {unreachable}" in result.stderr


def test_trace_skips_lines_that_are_not_events() -> None:
    lines = ["{not json", json.dumps(SEED_000_LEADER[0])]
    with FakeBrokerHttp(trace_lines=lines) as broker:
        result = CliRunner().invoke(cli, ["trace", "orders", "0", "--http", broker.address, "--no-follow"])
    assert result.exit_code == 0, result.output
    assert "not a trace event, skipped" in result.stderr
    assert [cells(line)[2] for line in result.stdout.splitlines()] == ["attribute", "Leader LEO"]


def test_trace_says_how_many_events_a_broker_dropped() -> None:
    # A broker tells a reader that fell behind how many events it lost, where they would have been.
    lines = [json.dumps(SEED_000_LEADER[0]), json.dumps({"dropped": 3, "broker_id": 1}), json.dumps(SEED_000_LEADER[1])]
    with FakeBrokerHttp(trace_lines=lines) as broker:
        result = CliRunner().invoke(cli, ["trace", "orders", "0", "--http", broker.address, "--no-follow"])
    assert result.exit_code == 0, result.output
    assert f"{broker.address} dropped 3 trace events" in result.stderr
    assert "not a trace event" not in result.stderr
    assert [cells(line)[2] for line in result.stdout.splitlines()] == ["attribute", "Leader LEO", "Leader HW"]


def test_trace_fails_in_one_line_when_no_broker_answers() -> None:
    address = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["trace", "orders", "0", "--http", address, "--no-follow", "--timeout", "2"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith(f"Error: no broker answered GET /v1/trace (cannot reach {address}")


def test_trace_of_a_cluster_asks_its_brokers_not_its_dedicated_controller(tmp_path: Path) -> None:
    with FakeBrokerHttp(trace_lines=[json.dumps(SEED_000_LEADER[0])]) as broker:
        nodes = [
            NodeInfo(1, 100, "broker", "127.0.0.1:9092", broker.address, "/d/broker-1", "/d/broker-1.log"),
            NodeInfo(3000, 101, "controller", "127.0.0.1:9093", "", "/d/controller-3000", "/d/controller-3000.log"),
        ]
        info = ClusterInfo(bootstrap="127.0.0.1:9092", controller="127.0.0.1:9093", nodes=nodes)
        (tmp_path / CLUSTER_FILE).write_text(info.to_json())
        result = CliRunner().invoke(cli, ["trace", "orders", "0", "--dir", str(tmp_path), "--no-follow"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert [cells(line)[2] for line in result.stdout.splitlines()] == ["attribute", "Leader LEO"]


def test_trace_without_a_cluster_says_how_to_start_one(tmp_path: object) -> None:
    result = CliRunner().invoke(cli, ["trace", "orders", "0", "--dir", str(tmp_path), "--no-follow"])
    assert result.exit_code == 1
    assert "no cluster in" in result.stderr and "tierlog cluster up" in result.stderr


def test_trace_rejects_a_malformed_http_address() -> None:
    result = CliRunner().invoke(cli, ["trace", "orders", "0", "--http", "localhost"])
    assert result.exit_code == 2
    assert "'localhost' is not of the form host:port" in result.stderr


@pytest.mark.parametrize("follow", ["--follow", "--no-follow"])
def test_trace_of_a_partition_no_broker_has_fails_in_one_line(
    broker_factory: Callable[..., BrokerProcess], follow: str
) -> None:
    http = f"127.0.0.1:{free_port()}"
    broker = broker_factory({"tierlog.http.listener": http})
    assert tierlog("topic", "create", "orders", "-p", "2", "-b", broker.bootstrap).code == 0

    missing_topic = tierlog("trace", "no-such-topic", "0", "--http", http, follow, "--timeout", "5")
    assert missing_topic.code == 1
    assert missing_topic.first_error_line == (
        "Error: topic 'no-such-topic' does not exist: no broker has a replica of it "
        "(`tierlog topic list` shows the topics)"
    )
    assert missing_topic.stdout == ""

    missing_partition = tierlog("trace", "orders", "2", "--http", http, follow, "--timeout", "5")
    assert missing_partition.code == 1
    assert missing_partition.first_error_line == "Error: topic 'orders' has no partition 2 (it has 2)"

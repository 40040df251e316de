"""`tierlog cluster status|up|down` without brokers: merging canned /v1/partitions answers, the tables, the
cluster file, and stopping recorded processes."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import FakeBrokerHttp, assert_fits, run_in_terminal
from click.testing import CliRunner
from rich.console import Console

from tierlog.cli.cluster import (
    CLUSTER_FILE,
    BrokerReport,
    ClusterInfo,
    NodeInfo,
    broker_alive,
    human_bytes,
    merge_partition_reports,
    status_table,
)
from tierlog.cli.main import cli
from tierlog.testing.local_cluster import free_port


def partition(
    role: str,
    leo: int,
    *,
    leader: int = 1,
    leader_epoch: int = 0,
    partition_epoch: int = 0,
    isr: list[int] | None = None,
    hw: int = 0,
    remote: dict[str, int] | None = None,
    topic: str = "orders",
    number: int = 0,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "topic": topic,
        "partition": number,
        "role": role,
        "leader": leader,
        "leader_epoch": leader_epoch,
        "partition_epoch": partition_epoch,
        "replicas": [1, 2, 3],
        "isr": isr if isr is not None else [1, 2, 3],
        "maximal_isr": isr if isr is not None else [1, 2, 3],
        "high_watermark": hw,
        "log_start_offset": 0,
        "log_end_offset": leo,
    }
    if remote is not None:
        entry["remote_replicas"] = {b: {"log_end_offset": o, "last_caught_up_time_ms": 0} for b, o in remote.items()}
    return entry


def render(table: Any) -> list[list[str]]:
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(table)
    return [line.split() for line in console.export_text().splitlines()]


# Broker 3 lags (LEO 3, out of the ISR); broker 2 follows; broker 1 leads with HW 4.
REPORTS = [
    BrokerReport(1, "h1", [partition("leader", 5, isr=[1, 2], hw=4, remote={"2": 4, "3": 3})]),
    BrokerReport(2, "h2", [partition("follower", 4, isr=[1, 2], hw=4)]),
    BrokerReport(3, "h3", [partition("follower", 3, isr=[1, 2, 3], hw=2)]),
]


def test_the_leaders_view_is_authoritative_and_each_replica_reports_its_own_leo() -> None:
    [status] = merge_partition_reports(REPORTS)
    assert (status.topic, status.partition, status.leader, status.view_of) == ("orders", 0, 1, 1)
    assert status.isr == [1, 2]
    assert status.high_watermark == 4
    assert status.log_end_offsets == {1: 5, 2: 4, 3: 3}
    assert status.remote_log_end_offsets == {2: 4, 3: 3}


def test_a_broker_that_is_down_leaves_its_replicas_leo_unknown() -> None:
    reports = [REPORTS[0], REPORTS[1], BrokerReport(3, "h3", None, "cannot reach h3")]
    [status] = merge_partition_reports(reports)
    assert status.log_end_offsets == {1: 5, 2: 4, 3: None}
    rows = render(status_table(reports, [status]))
    assert rows[0] == ["TOPIC", "PARTITION", "LEADER", "EPOCH", "ISR", "HW", "LEO@1", "LEO@2", "LEO@3"]
    assert rows[1] == ["orders", "0", "1", "0", "1,2", "4", "5", "4", "down"]


def test_a_deposed_leader_loses_to_the_newer_view_of_a_follower() -> None:
    # Broker 1 led epoch 0 and has not heard that broker 2 (not answering now) leads epoch 1 without it.
    reports = [
        BrokerReport(1, "h1", [partition("leader", 7, isr=[1, 2, 3], hw=5, remote={"2": 5, "3": 5})]),
        BrokerReport(2, "h2", None, "cannot reach h2"),
        BrokerReport(3, "h3", [partition("follower", 6, leader=2, leader_epoch=1, partition_epoch=1, isr=[2, 3])]),
    ]
    [status] = merge_partition_reports(reports)
    assert (status.leader, status.leader_epoch, status.isr, status.view_of) == (2, 1, [2, 3], 3)
    assert status.log_end_offsets == {1: 7, 2: None, 3: 6}
    assert status.remote_log_end_offsets == {}  # only a leader's view has them


def test_a_broker_outside_the_replicas_that_reports_the_partition_shows_its_leo() -> None:
    stray = {**partition("follower", 2, isr=[1, 2]), "replicas": [1, 2]}
    reports = [
        BrokerReport(1, "h1", [{**partition("leader", 5, isr=[1, 2], hw=4), "replicas": [1, 2]}]),
        BrokerReport(2, "h2", None, "cannot reach h2"),
        BrokerReport(3, "h3", [stray]),
    ]
    [status] = merge_partition_reports(reports)
    assert status.log_end_offsets == {1: 5, 2: None, 3: 2}


def test_partitions_are_sorted_and_replicas_elsewhere_are_blank() -> None:
    def single_replica(topic: str, number: int, broker: int) -> dict[str, Any]:
        entry = partition("leader", 1, leader=broker, isr=[broker], hw=1, topic=topic, number=number)
        return {**entry, "replicas": [broker]}

    reports = [
        BrokerReport(1, "h1", [single_replica("b", 0, 1), single_replica("a", 1, 1)]),
        BrokerReport(2, "h2", [single_replica("a", 0, 2)]),
    ]
    statuses = merge_partition_reports(reports)
    assert [(s.topic, s.partition) for s in statuses] == [("a", 0), ("a", 1), ("b", 0)]
    assert render(status_table(reports, statuses))[1:] == [
        ["a", "0", "2", "0", "2", "1", "1"],
        ["a", "1", "1", "0", "1", "1", "1"],
        ["b", "0", "1", "0", "1", "1", "1"],
    ]


def test_cluster_info_round_trips_through_json() -> None:
    settings = {"process.roles": "broker,controller", "min.insync.replicas": "2"}
    info = ClusterInfo(
        bootstrap="127.0.0.1:1,127.0.0.1:2",
        controller="127.0.0.1:3",
        nodes=[
            NodeInfo(1, 100, "broker,controller", "127.0.0.1:1", "127.0.0.1:4", "/d/broker-1", "/d/1.log", settings)
        ],
    )
    assert ClusterInfo.from_json(info.to_json()) == info
    document = json.loads(info.to_json())
    assert document["version"] == 1
    # A file from before `cluster start` lacks the brokers' settings: `status` and `down` still read it.
    del document["nodes"][0]["overrides"]
    assert ClusterInfo.from_json(json.dumps(document)).nodes[0].overrides is None


@pytest.fixture
def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture
def live_pids() -> Iterator[list[int]]:
    """Five processes that look like brokers to `broker_alive` ("tierlog" in their command line)."""
    processes = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "tierlog"]) for _ in range(5)]
    try:
        yield [process.pid for process in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait(5)


def write_cluster(directory: Path, nodes: list[NodeInfo]) -> None:
    info = ClusterInfo(bootstrap=",".join(n.kafka for n in nodes), controller="127.0.0.1:1", nodes=nodes)
    (directory / CLUSTER_FILE).write_text(info.to_json())


def node(node_id: int, pid: int, http: str, directory: Path) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        pid=pid,
        roles="broker,controller" if node_id == 1 else "broker",
        kafka=f"127.0.0.1:{9000 + node_id}",
        http=http,
        data_dir=str(directory / f"broker-{node_id}"),
        log_file=str(directory / f"broker-{node_id}.log"),
    )


def test_status_merges_what_every_broker_answers(tmp_path: Path, live_pids: list[int], dead_pid: int) -> None:
    reports = {r.node_id: r for r in REPORTS}
    with (
        FakeBrokerHttp(partitions={"broker_id": 1, "partitions": reports[1].partitions}) as b1,
        FakeBrokerHttp(partitions={"broker_id": 2, "partitions": reports[2].partitions}) as b2,
    ):
        gone = f"127.0.0.1:{free_port()}"
        write_cluster(
            tmp_path,
            [
                node(1, live_pids[0], b1.address, tmp_path),
                node(2, live_pids[1], b2.address, tmp_path),
                # Running, but its HTTP listener does not answer.
                node(3, live_pids[2], gone, tmp_path),
                # Its process is gone: down, though something answers on its HTTP port.
                node(4, dead_pid, b1.address, tmp_path),
            ],
        )
        table = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(tmp_path)])
        wide = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(tmp_path), "-o", "wide"])
        as_json = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(tmp_path), "--json"])
    assert table.exit_code == 0, table.output
    assert re.search(r"^\s*1\s+broker,controller\s+\d+\s+127\.0\.0\.1:9001\s+up\s*$", table.stdout, re.M)
    assert re.search(r"^\s*3\s+broker\s+\d+\s+127\.0\.0\.1:9003\s+not answering\s*$", table.stdout, re.M)
    assert re.search(
        rf"^\s*4\s+broker\s+{dead_pid}\s+127\.0\.0\.1:9004\s+down \(process gone\)\s*$", table.stdout, re.M
    )
    assert re.search(r"^orders\s+0\s+1\s+0\s+1,2\s+4\s*$", table.stdout, re.M), table.stdout

    assert wide.exit_code == 0, wide.output
    assert re.search(
        rf"^\s*3\s+broker\s+\d+\s+127\.0\.0\.1:9003\s+{gone}\s+not answering \(cannot reach {gone}", wide.stdout, re.M
    )
    assert re.search(r"^orders\s+0\s+1\s+0\s+1,2\s+4\s+5\s+4\s+down\s*$", wide.stdout, re.M), wide.stdout

    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    assert [(b["node_id"], b["up"]) for b in document["brokers"]] == [(1, True), (2, True), (3, False), (4, False)]
    assert document["brokers"][2]["error"].startswith(f"cannot reach {gone}")
    assert document["brokers"][3]["error"] == f"process {dead_pid} is gone"
    [merged] = document["partitions"]
    assert merged["log_end_offsets"] == {"1": 5, "2": 4, "3": None}
    assert merged["isr"] == [1, 2]
    assert merged["high_watermark"] == 4


def test_status_fits_80_columns_with_five_brokers_and_long_topic_names(tmp_path: Path, live_pids: list[int]) -> None:
    topic = "customer-activity-events-2024x"  # 30 characters
    replicas = [1, 2, 3, 4, 5]

    def report(broker: int) -> dict[str, Any]:
        entries = []
        for name, count in ((topic, 6), ("__consumer_offsets", 3)):
            for number in range(count):
                leader = replicas[number % 5]
                role = "leader" if broker == leader else "follower"
                entry = partition(role, 123_456, leader=leader, isr=replicas, hw=123_456, topic=name, number=number)
                entries.append({**entry, "replicas": replicas})
        return {"broker_id": broker, "partitions": entries}

    with contextlib.ExitStack() as stack:
        fakes = [stack.enter_context(FakeBrokerHttp(partitions=report(b))) for b in replicas]
        write_cluster(tmp_path, [node(b, live_pids[b - 1], fakes[b - 1].address, tmp_path) for b in replicas])
        code, lines = run_in_terminal(["cluster", "status", "--dir", str(tmp_path)], columns=80)
        internal_code, with_internal = run_in_terminal(["cluster", "status", "--dir", str(tmp_path), "-i"], columns=80)
        wide_code, wide = run_in_terminal(["cluster", "status", "--dir", str(tmp_path), "-o", "wide"], columns=200)
    assert code == 0, "\n".join(lines)
    assert_fits(lines, 80)
    assert lines[0].split() == ["NODE", "ROLES", "PID", "KAFKA", "STATE"]
    rows = [line.split() for line in lines if line.startswith(topic)]
    assert rows == [[topic, str(n), str(replicas[n % 5]), "0", "1,2,3,4,5", "123456"] for n in range(6)]
    assert lines[-1] == "not shown: internal topics __consumer_offsets (-i shows them)"

    assert internal_code == 0, "\n".join(with_internal)
    assert_fits(with_internal, 80)
    assert sum(line.startswith("__consumer_offsets ") for line in with_internal) == 3

    assert wide_code == 0, "\n".join(wide)
    assert wide[0].split() == ["NODE", "ROLES", "PID", "KAFKA", "HTTP", "STATE"]
    header = next(line.split() for line in wide if line.startswith("TOPIC"))
    assert header == ["TOPIC", "PARTITION", "LEADER", "EPOCH", "ISR", "HW", "LEO@1", "LEO@2", "LEO@3", "LEO@4", "LEO@5"]
    assert [topic, "0", "1", "0", "1,2,3,4,5", "123456", *["123456"] * 5] in [line.split() for line in wide]


def test_status_fails_in_one_line_when_no_broker_answers(tmp_path: Path, dead_pid: int) -> None:
    write_cluster(tmp_path, [node(1, dead_pid, f"127.0.0.1:{free_port()}", tmp_path)])
    result = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(tmp_path), "--timeout", "1"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"Error: no broker of the cluster in {tmp_path} answers: start it with `tierlog cluster up`"
    )


def test_status_and_down_without_a_cluster_say_how_to_start_one(tmp_path: Path) -> None:
    for command in ("status", "down"):
        result = CliRunner().invoke(cli, ["cluster", command, "--dir", str(tmp_path)])
        assert result.exit_code == 1
        assert result.stderr.strip() == (
            f"Error: no cluster in {tmp_path} (no cluster.json): start one with `tierlog cluster up`"
        )


@pytest.fixture
def fake_brokers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes that look like brokers to `broker_alive` ("tierlog" in their command line): the first
    ends on SIGTERM, the second ignores it."""
    sleeper = "import signal, sys, time; sys.argv[1] == 'stubborn' and signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    script = f"{sleeper}; print('ready', flush=True); time.sleep(60)"
    processes = [
        subprocess.Popen([sys.executable, "-c", script, kind, "tierlog"], stdout=subprocess.PIPE)
        for kind in ("polite", "stubborn")
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait(5)


def test_up_refuses_while_a_cluster_runs_and_down_stops_it(
    tmp_path: Path, fake_brokers: list[subprocess.Popen[bytes]], dead_pid: int
) -> None:
    polite, stubborn = fake_brokers
    assert broker_alive(polite.pid) and not broker_alive(dead_pid)
    http = f"127.0.0.1:{free_port()}"
    write_cluster(
        tmp_path,
        [node(1, polite.pid, http, tmp_path), node(2, stubborn.pid, http, tmp_path), node(3, dead_pid, http, tmp_path)],
    )

    refused = CliRunner().invoke(cli, ["cluster", "up", "--dir", str(tmp_path)])
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (
        f"Error: a cluster is already running in {tmp_path} (pids {polite.pid},{stubborn.pid}): "
        f"stop it with `tierlog cluster down --dir {tmp_path}`"
    )

    started = time.monotonic()
    down = CliRunner().invoke(cli, ["cluster", "down", "--dir", str(tmp_path), "--timeout", "1"])
    assert down.exit_code == 0, down.output
    assert time.monotonic() - started < 10
    assert re.search(rf"^\s*1\s+{polite.pid}\s+stopped\s*$", down.stdout, re.M)
    assert re.search(rf"^\s*2\s+{stubborn.pid}\s+killed\s*$", down.stdout, re.M)
    assert re.search(rf"^\s*3\s+{dead_pid}\s+already down\s*$", down.stdout, re.M)
    assert down.stdout.splitlines()[-2:] == [
        "node 1 stopped (controlled shutdown); node 2 killed (no controlled shutdown within 1s); node 3 already down",
        f"data and logs kept in {tmp_path}",
    ]
    # `down` reaped them (they are this test's children), so their exit codes are gone.
    assert not broker_alive(polite.pid) and not broker_alive(stubborn.pid)
    assert not (tmp_path / CLUSTER_FILE).exists()


def test_up_rejects_overrides_of_per_node_settings(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["cluster", "up", "--dir", str(tmp_path), "--override", "node.id=7"])
    assert result.exit_code == 2
    assert "node.id is set per node by the cluster and cannot be overridden" in result.stderr
    assert not (tmp_path / CLUSTER_FILE).exists()


# --- the remote tier (issue 4) ------------------------------------------------------------------------------


def tiered(entry: dict[str, Any], **tier: int) -> dict[str, Any]:
    """`entry` as a broker with the remote tier on for it reports it: the five offsets, both tiers' bytes
    and the copy lag (Partition.describe plus the broker's remote fields)."""
    defaults = {
        "log_start_offset": 0,
        "local_log_start_offset": 0,
        "highest_offset_in_remote_storage": -1,
        "local_size_bytes": 0,
        "remote_size_bytes": 0,
        "remote_segments": 0,
        "copy_lag_bytes": 0,
    }
    return {**entry, **defaults, **tier}


def local_only(entry: dict[str, Any], local_size_bytes: int) -> dict[str, Any]:
    """`entry` as a broker reports a partition without the remote tier: Ry -1, no remote fields."""
    return {
        **entry,
        "local_log_start_offset": 0,
        "highest_offset_in_remote_storage": -1,
        "local_size_bytes": local_size_bytes,
    }


def tiered_replica(
    node: int, role: str, *, lx: int, ry: int, local_bytes: int, copy_lag: int, remote: dict[str, int] | None = None
) -> BrokerReport:
    """Node `node`'s report as a replica of the tiered orders-0 (Rx = 10, Ly = HW = 80, Lz = 85, five remote
    segments of 3 MiB in all) and of the untiered plain-0 (HW = LEO = 7, 700 bytes), with its own view of where
    the local log starts (Lx), the end of the remote tier (Ry), its local bytes and its copy lag."""
    return BrokerReport(
        node,
        f"h{node}",
        [
            tiered(
                partition(role, 85, isr=[1, 2], hw=80, remote=remote),
                log_start_offset=10,
                local_log_start_offset=lx,
                highest_offset_in_remote_storage=ry,
                local_size_bytes=local_bytes,
                remote_size_bytes=3 * 1024 * 1024,
                remote_segments=5,
                copy_lag_bytes=copy_lag,
            ),
            local_only(partition(role, 7, isr=[1, 2], hw=7, topic="plain"), 700),
        ],
    )


# Rx = 10 (remote retention moved it), Ry = 59, Lx = 40, Ly = HW = 80, Lz = 85 on the leader; the follower's
# own view differs (it learned a lower Ry, keeps more locally), and only the leader's counts.
TIERED_REPORTS = [
    tiered_replica(1, "leader", lx=40, ry=59, local_bytes=46080, copy_lag=2048, remote={"2": 85, "3": 70}),
    tiered_replica(2, "follower", lx=20, ry=39, local_bytes=66560, copy_lag=4096),
    BrokerReport(3, "h3", None, "cannot reach h3"),
]


def test_the_leaders_view_gives_the_tiers() -> None:
    orders, plain = sorted(merge_partition_reports(TIERED_REPORTS), key=lambda s: s.topic)
    assert orders.remote_tier and not plain.remote_tier
    assert (orders.log_start_offset, orders.highest_offset_in_remote_storage) == (10, 59)  # Rx, Ry
    assert (orders.local_log_start_offset, orders.high_watermark, orders.log_end_offset) == (40, 80, 85)  # Lx Ly Lz
    assert (orders.local_size_bytes, orders.remote_size_bytes, orders.remote_segments) == (46080, 3 << 20, 5)
    assert orders.copy_lag_bytes == 2048
    # Without the remote tier: no Ry (Partition.describe says -1), no remote bytes, no copy lag.
    assert (plain.highest_offset_in_remote_storage, plain.remote_size_bytes, plain.copy_lag_bytes) == (None,) * 3
    # The canned reports of the older tests lack the local fields, as a broker predating them would.
    [old] = merge_partition_reports(REPORTS)
    assert (old.local_log_start_offset, old.local_size_bytes, old.remote_tier) == (None, None, False)


def test_the_table_gains_the_tier_columns_when_a_partition_has_the_remote_tier_on() -> None:
    statuses = merge_partition_reports(TIERED_REPORTS)
    rows = render(status_table(TIERED_REPORTS, statuses))
    assert rows[0] == [
        "TOPIC", "PARTITION", "LEADER", "EPOCH", "ISR", "HW", "LEO@1", "LEO@2", "LEO@3",
        "Rx", "Ry", "Lx", "Ly", "Lz", "LOCAL", "REMOTE", "COPY-LAG",
    ]  # fmt: skip
    orders, plain = rows[1:]
    assert orders[:9] == ["orders", "0", "1", "0", "1,2", "80", "85", "85", "down"]
    assert orders[9:] == ["10", "59", "40", "80", "85", "45.0KiB", "3.0MiB", "2.0KiB"]
    assert plain == ["plain", "0", "1", "0", "1,2", "7", "7", "7", "down", "-", "-", "0", "7", "7", "700B", "-", "-"]
    # Without any tiered partition the table keeps its old columns.
    untiered = [s for s in statuses if not s.remote_tier]
    assert render(status_table(TIERED_REPORTS, untiered))[0][-1] == "LEO@3"


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (None, 0, 1023, 1024, 1536, 5 << 20, 3 << 30, 2 << 40)] == [
        "-", "0B", "1023B", "1.0KiB", "1.5KiB", "5.0MiB", "3.0GiB", "2.0TiB",
    ]  # fmt: skip


def test_status_shows_the_tiers_in_the_wide_table_and_the_json(tmp_path: Path, live_pids: list[int]) -> None:
    leader, follower = (report.partitions for report in TIERED_REPORTS[:2])
    with (
        FakeBrokerHttp(partitions={"broker_id": 1, "partitions": leader}) as b1,
        FakeBrokerHttp(partitions={"broker_id": 2, "partitions": follower}) as b2,
    ):
        nodes = [node(1, live_pids[0], b1.address, tmp_path), node(2, live_pids[1], b2.address, tmp_path)]
        write_cluster(tmp_path, nodes)
        narrow = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(tmp_path)])
        table = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(tmp_path), "-o", "wide"])
        as_json = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(tmp_path), "--json"])
    assert narrow.exit_code == 0, narrow.output
    assert re.search(r"^orders\s+0\s+1\s+0\s+1,2\s+80\s*$", narrow.stdout, re.M), narrow.stdout
    assert table.exit_code == 0, table.output
    assert re.search(r"^\s*TOPIC .* LEO@2\s+Rx\s+Ry\s+Lx\s+Ly\s+Lz\s+LOCAL\s+REMOTE\s+COPY-LAG\s*$", table.stdout, re.M)
    assert re.search(
        r"^orders\s+0\s+1\s+0\s+1,2\s+80\s+85\s+85\s+10\s+59\s+40\s+80\s+85\s+45\.0KiB\s+3\.0MiB\s+2\.0KiB\s*$",
        table.stdout,
        re.M,
    )

    assert as_json.exit_code == 0, as_json.output
    orders, plain = json.loads(as_json.stdout)["partitions"]
    assert {key: orders[key] for key in TIER_KEYS} == {
        "log_start_offset": 10,
        "highest_offset_in_remote_storage": 59,
        "local_log_start_offset": 40,
        "high_watermark": 80,
        "log_end_offset": 85,
        "local_size_bytes": 46080,
        "remote_size_bytes": 3 << 20,
        "remote_segments": 5,
        "copy_lag_bytes": 2048,
    }
    assert {key: plain[key] for key in TIER_KEYS} == {
        "log_start_offset": 0,
        "highest_offset_in_remote_storage": None,
        "local_log_start_offset": 0,
        "high_watermark": 7,
        "log_end_offset": 7,
        "local_size_bytes": 700,
        "remote_size_bytes": None,
        "remote_segments": None,
        "copy_lag_bytes": None,
    }


TIER_KEYS = (
    "log_start_offset",
    "highest_offset_in_remote_storage",
    "local_log_start_offset",
    "high_watermark",
    "log_end_offset",
    "local_size_bytes",
    "remote_size_bytes",
    "remote_segments",
    "copy_lag_bytes",
)

"""`tierlog cluster start|stop|kill|restart NODE` on a cluster of three real brokers started with `tierlog cluster
up`, `status` seeing a broker whose process is gone, and what `down` reports, every command run as a person
runs it (its own process). The `cli_cluster` fixture SIGKILLs every broker the cluster recorded when the test
ends, pass or fail."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from cli_helpers import CliCluster, assert_fits, run_in_terminal
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.cli.cluster import broker_alive, read_cluster_info
from tierlog.testing.local_cluster import wait_until

CLIENT_TIMEOUT_S = 30.0
CONVERGE_S = 30.0
# As long a topic name as the tables are made to fit 80 columns with.
LONG_TOPIC = "customer-activity-events-2024x"


def first_line(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout or result.stderr).splitlines()[0]


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=3) for n in names])
    for future in futures.values():
        future.result(timeout=CLIENT_TIMEOUT_S)


def partition_status(cluster: CliCluster, topic: str) -> dict[str, Any] | None:
    result = cluster.tierlog("cluster", "status", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return next((p for p in json.loads(result.stdout)["partitions"] if p["topic"] == topic), None)


def in_sync(cluster: CliCluster, topic: str, isr: list[int], end: int) -> dict[str, Any] | None:
    """`topic`-0's status once its ISR is `isr` and the HW and every ISR member's LEO are `end`."""
    status = partition_status(cluster, topic)
    if status is None or sorted(status["isr"]) != isr or status["high_watermark"] != end:
        return None
    return status if all(status["log_end_offsets"][str(b)] == end for b in isr) else None


def test_one_node_is_killed_started_stopped_and_restarted(cli_cluster: CliCluster, kafka: Any) -> None:
    up = cli_cluster.up()
    assert up.returncode == 0, up.stdout + up.stderr
    info = read_cluster_info(cli_cluster.directory)
    nodes = {n.node_id: n for n in info.nodes}
    create_topics(info.bootstrap, "orders", LONG_TOPIC)
    assert kafka.produce(info.bootstrap, "orders", [{"value": b"first"}]) == [(0, 0)]  # acks=all
    wait_until(lambda: in_sync(cli_cluster, "orders", [1, 2, 3], 1), CONVERGE_S, "orders-0 on all three")

    # The default tables fit an 80-column terminal; `-o wide` has every column.
    code, lines = run_in_terminal(["cluster", "status", "--dir", str(cli_cluster.directory)], columns=80)
    assert code == 0, "\n".join(lines)
    assert_fits(lines, 80)
    assert lines[0].split() == ["NODE", "ROLES", "PID", "KAFKA", "STATE"]
    assert re.search(rf"^{LONG_TOPIC}\s+0\s+\d\s+0\s+\S+\s+0\s*$", "\n".join(lines), re.M), "\n".join(lines)
    code, lines = run_in_terminal(["cluster", "status", "--dir", str(cli_cluster.directory), "-o", "wide"], 200)
    assert code == 0, "\n".join(lines)
    assert lines[0].split() == ["NODE", "ROLES", "PID", "KAFKA", "HTTP", "STATE"]
    assert re.search(
        r"^TOPIC\s+PARTITION\s+LEADER\s+EPOCH\s+ISR\s+HW\s+LEO@1\s+LEO@2\s+LEO@3\s*$", "\n".join(lines), re.M
    )

    # kill: SIGKILL, a crash. `status` goes by the process, not by cluster.json.
    killed = cli_cluster.tierlog("cluster", "kill", "3")
    assert killed.returncode == 0, killed.stderr
    assert first_line(killed) == f"node 3 killed (SIGKILL): pid {nodes[3].pid}, {nodes[3].kafka}"
    assert not broker_alive(nodes[3].pid)
    again = cli_cluster.tierlog("cluster", "kill", "3")
    assert again.returncode == 0, again.stderr
    assert first_line(again) == f"node 3 was already down: pid {nodes[3].pid}, {nodes[3].kafka}"
    status = cli_cluster.tierlog("cluster", "status")
    assert status.returncode == 0, status.stderr
    assert re.search(
        rf"^\s*3\s+broker\s+{nodes[3].pid}\s+{nodes[3].kafka}\s+down \(process gone\)\s*$", status.stdout, re.M
    ), status.stdout
    as_json = json.loads(cli_cluster.tierlog("cluster", "status", "--json").stdout)
    assert [(b["node_id"], b["up"]) for b in as_json["brokers"]] == [(1, True), (2, True), (3, False)]
    assert as_json["brokers"][2]["error"] == f"process {nodes[3].pid} is gone"
    # The controller fences it and shrinks the ISR; acks=all still succeeds with min.insync.replicas=2.
    wait_until(lambda: in_sync(cli_cluster, "orders", [1, 2], 1), CONVERGE_S, "ISR [1, 2] without node 3")
    assert kafka.produce(info.bootstrap, "orders", [{"value": b"second"}]) == [(0, 1)]

    # start: the same node (settings, ports, data) in a new process, recorded for `status` and `down`.
    started = cli_cluster.tierlog("cluster", "start", "3")
    assert started.returncode == 0, started.stderr
    match = re.fullmatch(rf"node 3 started \(registered in [\d.]+s\): pid (\d+), {nodes[3].kafka}", first_line(started))
    assert match, started.stdout
    pid3 = int(match[1])
    assert pid3 != nodes[3].pid and broker_alive(pid3)
    assert {n.node_id: n.pid for n in read_cluster_info(cli_cluster.directory).nodes}[3] == pid3
    # It catches up (the record it missed included) and rejoins the ISR.
    wait_until(lambda: in_sync(cli_cluster, "orders", [1, 2, 3], 2), CONVERGE_S, "node 3 back in the ISR")
    running = cli_cluster.tierlog("cluster", "start", "3")
    assert running.returncode == 0, running.stderr
    assert first_line(running) == f"node 3 is already running: pid {pid3}, {nodes[3].kafka}"

    # stop: a controlled shutdown.
    stopped = cli_cluster.tierlog("cluster", "stop", "2")
    assert stopped.returncode == 0, stopped.stderr
    assert re.fullmatch(
        rf"node 2 stopped \(controlled shutdown in [\d.]+s\): pid {nodes[2].pid}, {nodes[2].kafka}",
        first_line(stopped),
    ), stopped.stdout
    assert not broker_alive(nodes[2].pid)
    # restart of a stopped node starts it.
    restarted = cli_cluster.tierlog("cluster", "restart", "2")
    assert restarted.returncode == 0, restarted.stderr
    match = re.fullmatch(
        rf"node 2 was down; started \(registered in [\d.]+s\): pid (\d+), {nodes[2].kafka}", first_line(restarted)
    )
    assert match, restarted.stdout
    pid2 = int(match[1])
    assert broker_alive(pid2)

    # restart of a running node: controlled shutdown, start, and the ISR recovers with every record.
    restarted = cli_cluster.tierlog("cluster", "restart", "3")
    assert restarted.returncode == 0, restarted.stderr
    match = re.fullmatch(
        rf"node 3 restarted in [\d.]+s: pid (\d+) \(was {pid3}\), {nodes[3].kafka}", first_line(restarted)
    )
    assert match, restarted.stdout
    assert not broker_alive(pid3) and broker_alive(int(match[1]))
    assert kafka.produce(info.bootstrap, "orders", [{"value": b"third"}]) == [(0, 2)]
    wait_until(lambda: in_sync(cli_cluster, "orders", [1, 2, 3], 3), CONVERGE_S, "all three in sync after restarts")
    recorded = {n.node_id: n.pid for n in read_cluster_info(cli_cluster.directory).nodes}
    assert recorded == {1: nodes[1].pid, 2: pid2, 3: int(match[1])}

    # A node the cluster does not have: one line, exit 1.
    unknown = cli_cluster.tierlog("cluster", "stop", "7")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == f"Error: no node 7 in the cluster in {cli_cluster.directory} (its nodes: 1,2,3)"

    # down stops every recorded process, the ones `start` and `restart` started too, and says what it left.
    assert cli_cluster.tierlog("cluster", "kill", "2").returncode == 0
    down = cli_cluster.tierlog("cluster", "down")
    assert down.returncode == 0, down.stderr
    assert down.stdout.splitlines()[0].split() == ["NODE", "PID", "STATUS"]
    for node_id, expected in ((1, "stopped"), (2, "already down"), (3, "stopped")):
        assert re.search(rf"^\s*{node_id}\s+{recorded[node_id]}\s+{expected}\s*$", down.stdout, re.M), down.stdout
    assert down.stdout.splitlines()[-2:] == [
        "nodes 1,3 stopped (controlled shutdown); node 2 already down",
        f"data and logs kept in {cli_cluster.directory}",
    ]
    assert not any(broker_alive(pid) for pid in cli_cluster.pids)

    # Without a cluster in --dir every node command fails in one line.
    for command in ("start", "stop", "kill", "restart"):
        result = cli_cluster.tierlog("cluster", command, "1")
        assert result.returncode == 1, (command, result.stdout)
        assert result.stderr.strip() == (
            f"Error: no cluster in {cli_cluster.directory} (no cluster.json): start one with `tierlog cluster up`"
        )

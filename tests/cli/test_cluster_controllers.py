"""`tierlog cluster up --controllers N`: the controller quorum as dedicated controller processes (nodes 3000, ...),
each listed as a node by `status`, stopped after the brokers by `down`, and killed and started like any node;
every command run as a person runs it (its own process)."""

from __future__ import annotations

import json

from cli_helpers import CliCluster, tierlog
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.cli.cluster import read_cluster_info

CLIENT_TIMEOUT_S = 30.0


def test_one_dedicated_controller_serves_three_brokers(cli_cluster: CliCluster) -> None:
    up = cli_cluster.up("--controllers", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    info = read_cluster_info(cli_cluster.directory)
    roles = {n.node_id: n.roles for n in info.nodes}
    assert roles == {1: "broker", 2: "broker", 3: "broker", 3000: "controller"}
    controller = next(n for n in info.nodes if n.node_id == 3000)
    assert info.controller == controller.kafka
    assert "3 brokers and 1 controller are up" in up.stdout
    assert f"controllers (controller.quorum.voters): 3000@{controller.kafka}" in up.stdout

    # Topics are created through a broker, which forwards CreateTopics to the dedicated controller.
    admin = AdminClient({"bootstrap.servers": info.bootstrap})
    admin.create_topics([NewTopic("orders", 1, 3)])["orders"].result(timeout=CLIENT_TIMEOUT_S)

    status = cli_cluster.tierlog("cluster", "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    document = json.loads(status.stdout)
    assert [b["node_id"] for b in document["brokers"] if b["up"]] == [1, 2, 3]
    assert document["controllers"] == [{"node_id": 3000, "up": True}]
    assert [p["topic"] for p in document["partitions"]] == ["orders"]

    killed = cli_cluster.tierlog("cluster", "kill", "3000")
    assert killed.stdout.splitlines()[0] == f"node 3000 killed (SIGKILL): {controller.describe()}"
    table = cli_cluster.tierlog("cluster", "status").stdout
    assert any(
        line.split()[:2] == ["3000", "controller"] and "down (process gone)" in line for line in table.splitlines()
    )

    started = cli_cluster.tierlog("cluster", "start", "3000")
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.startswith("node 3000 started (answering in ")

    down = cli_cluster.tierlog("cluster", "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "nodes 1,2,3,3000 stopped (controlled shutdown)" in down.stdout


def test_combined_voters_must_be_brokers() -> None:
    refused = tierlog("cluster", "up", "--brokers", "2", "--controllers", "3", "--combined", "--dir", "/nonexistent")
    assert refused.code == 2
    assert refused.stderr.splitlines()[-1] == (
        "Error: Invalid value for --controllers: --combined makes 3 of the 2 brokers voters: give 1 to 2"
    )

"""`tierlog cluster up --controllers N`: the controller quorum as dedicated controller processes (nodes 3000, ...),
each listed as a node by `status`, stopped after the brokers by `down`, and killed and started like any node;
with three, `tierlog quorum status` shows one quorum that survives kill -9 of its leader. Every command is run as
a person runs it (its own process)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from cli_helpers import TIERLOG, CliCluster, tierlog
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.cli.cluster import read_cluster_info
from tierlog.config import parse_properties
from tierlog.testing.local_cluster import wait_until

CLIENT_TIMEOUT_S = 30.0
# An election takes about a second on a quiet machine; this bounds one on two busy cores.
QUORUM_TIMEOUT_S = 30.0


def cluster_id_in(directory: Path) -> str:
    return parse_properties((directory / "meta.properties").read_text())["cluster.id"]


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


def quorum_status(cluster: CliCluster, *options: str) -> dict[str, Any] | None:
    """`tierlog quorum status --json OPTIONS`, or None while it cannot describe the quorum."""
    ran = subprocess.run(
        [str(TIERLOG), "quorum", "status", "--json", "--timeout", "5", *options],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return json.loads(ran.stdout) if ran.returncode == 0 else None


def test_three_dedicated_controllers_form_one_quorum_that_survives_its_leader(cli_cluster: CliCluster) -> None:
    up = cli_cluster.up("--controllers", "3")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "3 brokers and 3 controllers are up" in up.stdout
    info = read_cluster_info(cli_cluster.directory)
    assert {n.node_id: n.roles for n in info.nodes if not n.is_broker} == {
        3000: "controller",
        3001: "controller",
        3002: "controller",
    }

    # Asked through a broker (forwarded to the active controller) and of the controllers: the same quorum.
    through_broker = wait_until(
        lambda: quorum_status(cli_cluster, "-b", info.bootstrap), QUORUM_TIMEOUT_S, "the quorum through a broker"
    )
    assert through_broker["cluster_id"] == cluster_id_in(Path(info.nodes[0].data_dir))
    replicas = {r["node_id"]: r["status"] for r in through_broker["replicas"]}
    leader = through_broker["leader_id"]
    assert replicas == {
        **{voter: "Leader" if voter == leader else "Follower" for voter in (3000, 3001, 3002)},
        **dict.fromkeys((1, 2, 3), "Observer"),
    }
    direct = quorum_status(cli_cluster, "--bootstrap-controller", info.controller)
    assert direct is not None and direct["leader_id"] == leader and direct["cluster_id"] is None

    # kill -9 of the leader: the two other voters elect one of them, and the cluster takes writes again.
    killed = cli_cluster.tierlog("cluster", "kill", str(leader))
    assert killed.returncode == 0, killed.stderr
    after = wait_until(
        lambda: (
            (status := quorum_status(cli_cluster, "--bootstrap-controller", info.controller))
            and status["leader_id"] != leader
            and status
        ),
        QUORUM_TIMEOUT_S,
        "a new leader among the two voters left",
    )
    assert after["leader_id"] in {3000, 3001, 3002} - {leader}
    assert after["leader_epoch"] > through_broker["leader_epoch"]
    admin = AdminClient({"bootstrap.servers": info.bootstrap})
    admin.create_topics([NewTopic("after-failover", 1, 3)])["after-failover"].result(timeout=CLIENT_TIMEOUT_S)

    started = cli_cluster.tierlog("cluster", "start", str(leader))
    assert started.returncode == 0, started.stdout + started.stderr
    caught_up = wait_until(
        lambda: (
            (status := quorum_status(cli_cluster, "-b", info.bootstrap))
            and all(r["lag"] == 0 for r in status["replicas"] if r["node_id"] == leader)
            and status
        ),
        QUORUM_TIMEOUT_S,
        f"controller {leader} to catch up again",
    )
    assert {r["node_id"] for r in caught_up["replicas"]} == {3000, 3001, 3002, 1, 2, 3}

"""`tierlog cluster up --controllers 3 --combined`: every node is a voter of the controller quorum, the cluster
survives a kill -9 of the active controller's node (a topic is created through the CLI afterwards), and
`cluster down` stops it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from cli_helpers import CliCluster, tierlog

from tierlog.cli.cluster import read_cluster_info
from tierlog.testing.local_cluster import wait_until

FAILOVER_S = 30.0


def active_controller(log_files: list[Path]) -> int | None:
    """The node whose log says it became the active controller last."""
    latest: tuple[str, int] | None = None
    for node_id, log_file in enumerate(log_files, start=1):
        for line in log_file.read_text().splitlines():
            if "active in epoch" in line and (latest is None or line[:25] > latest[0]):
                latest = (line[:25], node_id)
    return None if latest is None else latest[1]


def test_three_controllers_survive_the_active_ones_crash(cli_cluster: CliCluster) -> None:
    up = cli_cluster.up("--controllers", "3", "--combined")
    assert up.returncode == 0, up.stdout + up.stderr
    info = read_cluster_info(cli_cluster.directory)
    assert [n.roles for n in info.nodes] == ["broker,controller"] * 3
    log_files = [Path(n.log_file) for n in info.nodes]
    active = wait_until(lambda: active_controller(log_files), FAILOVER_S, "an active controller")

    os.kill(info.nodes[active - 1].pid, signal.SIGKILL)
    survivors = ",".join(n.kafka for n in info.nodes if n.node_id != active)
    wait_until(lambda: active_controller(log_files) not in (None, active), FAILOVER_S, "another active controller")
    created = tierlog("topic", "create", "after-failover", "-p", "1", "-r", "2", "-b", survivors)
    assert created.code == 0, created.stderr
    listed = tierlog("topic", "list", "-b", survivors)
    assert listed.code == 0 and "after-failover" in listed.stdout, listed.stdout

    down = cli_cluster.run("cluster", "down")
    assert down.exit_code == 0, down.output
    assert down.stdout.splitlines()[-2].endswith("already down"), down.stdout

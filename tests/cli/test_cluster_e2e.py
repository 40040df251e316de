"""Three real broker processes: LocalCluster, `tierlog cluster up|status|down` and `tierlog trace`.

Every broker any test starts is stopped when the test ends, pass or fail: conftest's `cluster_factory` stops
its clusters, a cluster that cannot start stops itself, and the `cli_cluster` fixture SIGKILLs whatever
`cluster up` recorded and is still alive."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import CLUSTER_START_S, OVERRIDES, CliCluster
from click.testing import CliRunner
from cluster_helpers import ClusterFactory
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.cli.cluster import (
    CLUSTER_FILE,
    BrokerReport,
    broker_alive,
    gather_reports,
    merge_partition_reports,
    read_cluster_info,
)
from tierlog.cli.main import cli
from tierlog.client.probes import api_versions_answered
from tierlog.testing.local_cluster import BrokerStartError, LocalCluster, wait_until

pytestmark = pytest.mark.cluster

CLIENT_TIMEOUT_S = 30.0
CONVERGE_S = 30.0


def create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=3)], request_timeout=15)
    futures[name].result(timeout=CLIENT_TIMEOUT_S)


def reports(addresses: dict[int, str]) -> list[BrokerReport]:
    return asyncio.run(gather_reports(addresses, timeout_s=3))


def replicated(addresses: dict[int, str], topic: str, offset_end: int) -> dict[str, Any] | None:
    """The merged status of `topic`-0 once every replica has LEO and HW `offset_end`, all in the ISR."""
    answers = reports(addresses)
    by_broker = {r.node_id: {p["topic"]: p for p in r.partitions or []} for r in answers}
    if any(topic not in partitions for partitions in by_broker.values()):
        return None
    if any(p[topic]["high_watermark"] != offset_end for p in by_broker.values()):
        return None
    status = next(s for s in merge_partition_reports(answers) if s.topic == topic)
    if sorted(status.isr) != [1, 2, 3] or set(status.log_end_offsets.values()) != {offset_end}:
        return None
    return {"leader": status.leader, "status": status}


# --- LocalCluster -----------------------------------------------------------------------------------------


def test_local_cluster_starts_loses_and_gets_back_a_broker(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(OVERRIDES, brokers=3)
    assert cluster.metadata_views() == {1: {1, 2, 3}, 2: {1, 2, 3}, 3: {1, 2, 3}}
    http = {node_id: cluster.http_address(node_id) for node_id in cluster.node_ids}
    assert all(report.up for report in reports(http)), reports(http)

    # A crash: the controller fences broker 3 once its session times out, and Metadata drops it.
    cluster.kill(3)
    assert not cluster.broker(3).running
    cluster.wait_for_brokers(2, timeout_s=30)
    assert cluster.metadata_views() == {1: {1, 2}, 2: {1, 2}}

    first_pid = cluster.broker(3).pid
    cluster.restart(3, timeout_s=60)
    assert cluster.broker(3).pid != first_pid
    cluster.wait_for_brokers(3, timeout_s=30)

    # A paused broker keeps its sockets but answers nothing; the others keep serving.
    cluster.pause(2)
    assert not api_versions_answered("127.0.0.1", cluster.broker(2).port, timeout_s=0.5)
    assert set(cluster.metadata_views()) == {1, 3}
    cluster.resume(2)
    assert api_versions_answered("127.0.0.1", cluster.broker(2).port, timeout_s=5)
    cluster.stop()
    assert not any(cluster.broker(n).running for n in cluster.node_ids)


def test_a_cluster_that_cannot_start_fails_with_a_brokers_log_and_stops(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=3, overrides={"num.partitions": "many"})
    with pytest.raises(BrokerStartError, match=r"broker \d exited with code 1(.|\n)*num\.partitions"):
        cluster.start(CLUSTER_START_S)
    assert not any(cluster.broker(n).running for n in cluster.node_ids)


# --- tierlog cluster up|status|down -----------------------------------------------------------------------


def status_json(cluster: CliCluster) -> dict[str, Any]:
    result = cluster.run("cluster", "status", "--json")
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def partition_status(cluster: CliCluster, topic: str) -> dict[str, Any] | None:
    return next((p for p in status_json(cluster)["partitions"] if p["topic"] == topic), None)


def test_cluster_up_status_down(cli_cluster: CliCluster, kafka: Any) -> None:
    up = cli_cluster.up()
    assert up.returncode == 0, up.stdout + up.stderr
    info = read_cluster_info(cli_cluster.directory)
    assert [n.node_id for n in info.nodes] == [1, 2, 3]
    assert [n.roles for n in info.nodes] == ["broker,controller", "broker", "broker"]
    assert f"bootstrap: {info.bootstrap}" in up.stdout
    # `up` has exited; the brokers it started run on.
    assert all(broker_alive(n.pid) for n in info.nodes)

    again = cli_cluster.run("cluster", "up")
    assert again.exit_code == 1
    assert "a cluster is already running in" in again.stderr

    create_topic(info.bootstrap, "orders")
    assert kafka.produce(info.bootstrap, "orders", [{"value": b"first"}]) == [(0, 0)]  # acks=all

    def replicated_orders() -> dict[str, Any] | None:
        status = partition_status(cli_cluster, "orders")
        if status is None or status["high_watermark"] != 1 or sorted(status["isr"]) != [1, 2, 3]:
            return None
        return status if status["log_end_offsets"] == {"1": 1, "2": 1, "3": 1} else None

    orders = wait_until(replicated_orders, CONVERGE_S, "orders-0 replicated to all three brokers")
    assert sorted(orders["replicas"]) == [1, 2, 3]
    table = cli_cluster.run("cluster", "status")
    assert table.exit_code == 0, table.output
    assert re.search(r"^TOPIC\s+PARTITION\s+LEADER\s+EPOCH\s+ISR\s+HW\s*$", table.stdout, re.M), table.stdout
    row = re.search(rf"^orders\s+0\s+{orders['leader']}\s+\d+\s+(\S+)\s+1\s*$", table.stdout, re.M)
    assert row is not None, table.stdout
    assert sorted(row.group(1).split(",")) == ["1", "2", "3"]
    wide = cli_cluster.run("cluster", "status", "-o", "wide")
    assert wide.exit_code == 0, wide.output
    assert re.search(r"TOPIC\s+PARTITION\s+LEADER\s+EPOCH\s+ISR\s+HW\s+LEO@1\s+LEO@2\s+LEO@3", wide.stdout)
    row = re.search(rf"^orders\s+0\s+{orders['leader']}\s+\d+\s+(\S+)\s+1\s+1\s+1\s+1\s*$", wide.stdout, re.M)
    assert row is not None, wide.stdout

    # A broker that crashed is shown as down, in the broker list and in its LEO column.
    doomed = next(n for n in info.nodes if n.node_id == 3)
    os.kill(doomed.pid, signal.SIGKILL)
    wait_until(lambda: not broker_alive(doomed.pid), 10, "broker 3 to die")
    table = cli_cluster.run("cluster", "status", "-o", "wide")
    assert table.exit_code == 0, table.output
    assert re.search(r"^\s*3\s+broker\s+\d+\s+\S+\s+\S+\s+down \(process gone\)\s*$", table.stdout, re.M)
    assert re.search(r"^orders\s+0\s+.*\s+down\s*$", table.stdout, re.M)

    down = cli_cluster.run("cluster", "down")
    assert down.exit_code == 0, down.output
    for node in info.nodes:
        expected = "already down" if node is doomed else "stopped"
        assert re.search(rf"^\s*{node.node_id}\s+{node.pid}\s+{expected}\s*$", down.stdout, re.M), down.stdout
        assert not broker_alive(node.pid)
        assert Path(node.data_dir).is_dir()
    assert down.stdout.splitlines()[-2:] == [
        "nodes 1,2 stopped (controlled shutdown); node 3 already down",
        f"data and logs kept in {cli_cluster.directory}",
    ]
    assert not (cli_cluster.directory / CLUSTER_FILE).exists()

    # The data outlives `down`: a new cluster in the same directory (on new ports) still has the record.
    up = cli_cluster.up()
    assert up.returncode == 0, up.stdout + up.stderr
    orders = wait_until(replicated_orders, CONVERGE_S, "orders-0 back on all three brokers")
    assert sorted(orders["replicas"]) == [1, 2, 3]
    restarted = read_cluster_info(cli_cluster.directory)
    purged = cli_cluster.run("cluster", "down", "--purge")
    assert purged.exit_code == 0, purged.output
    assert purged.stdout.splitlines()[-1] == f"purged: deleted the data and logs in {cli_cluster.directory}"
    for node in restarted.nodes:
        assert not broker_alive(node.pid)
        assert not Path(node.data_dir).exists()
        assert not Path(node.log_file).exists()


# --- tierlog trace ----------------------------------------------------------------------------------------


def test_trace_shows_one_record_replicating_as_in_seed_000(cluster_factory: ClusterFactory, kafka: Any) -> None:
    cluster = cluster_factory(OVERRIDES, brokers=3)
    http = {node_id: cluster.http_address(node_id) for node_id in cluster.node_ids}
    create_topic(cluster.bootstrap, "seed-000")
    assert kafka.produce(cluster.bootstrap, "seed-000", [{"value": b"one message"}]) == [(0, 0)]  # acks=all
    # acks=all returns once the leader's HW passed the record; the followers learn the new HW on
    # their next fetch.
    state = wait_until(lambda: replicated(http, "seed-000", 1), CONVERGE_S, "HW 1 on every replica")
    leader = state["leader"]
    followers = [n for n in cluster.node_ids if n != leader]

    addresses = [arg for address in http.values() for arg in ("--http", address)]
    result = CliRunner().invoke(cli, ["trace", "seed-000", "0", *addresses, "--no-follow", "--timeout", "10"])
    assert result.exit_code == 0, result.output
    rows = [re.split(r" {2,}", line.strip()) for line in result.stdout.splitlines()]
    assert rows[0] == ["time", "broker", "attribute", "phase", "old", "new", "why"]
    changes = [(int(row[1]), row[2], row[4], row[5]) for row in rows[1:]]

    assert (leader, "Leader LEO", "0", "1") in changes, result.stdout
    assert (leader, "Leader HW", "0", "1") in changes, result.stdout
    assert changes.index((leader, "Leader LEO", "0", "1")) < changes.index((leader, "Leader HW", "0", "1"))
    for follower in followers:
        assert (leader, f"Remote LEO (broker {follower})", "0", "1") in changes, result.stdout
        assert (follower, "Follower LEO", "0", "1") in changes, result.stdout
        assert (follower, "Follower HW", "0", "1") in changes, result.stdout
    times = [row[0] for row in rows[1:]]
    assert times == sorted(times)

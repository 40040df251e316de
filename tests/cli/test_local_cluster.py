"""BrokerProcess and LocalCluster: the lifecycle the demo, `tierlog cluster`, the tests and the benchmarks rely
on (the probes they wait with are tests/client/test_probes.py's)."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest

from tierlog.client.probes import api_versions_answered
from tierlog.testing.local_cluster import (
    BrokerProcess,
    BrokerStartError,
    LocalCluster,
    broker_settings_like,
    free_ports,
    next_broker_id,
)


@pytest.mark.cluster
def test_broker_process_lifecycle(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "broker-1") as broker:
        assert broker.running
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert (tmp_path / "broker-1" / "meta.properties").exists()

        # A paused broker keeps its socket but answers nothing, like a process stuck in a long pause.
        broker.pause()
        assert not api_versions_answered("127.0.0.1", broker.port, timeout_s=0.5)
        broker.resume()
        assert api_versions_answered("127.0.0.1", broker.port, timeout_s=5)

        first_pid = broker.pid
        broker.restart()
        assert broker.pid != first_pid
        assert api_versions_answered("127.0.0.1", broker.port, timeout_s=5)

        broker.kill()
        assert not broker.running
        assert broker.stop() == -signal.SIGKILL
        broker.start()
        broker.wait_ready(30)
    assert not broker.running
    assert (tmp_path / "broker-1.log").exists()


@pytest.mark.cluster
def test_stop_of_a_paused_broker_is_still_a_clean_shutdown(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "broker-1") as broker:
        broker.pause()
        assert broker.stop() == 0


@pytest.mark.cluster
def test_a_broker_that_cannot_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker-1", overrides={"num.partitions": "many"})
    broker.start()
    try:
        with pytest.raises(BrokerStartError, match=r"exited with code 1(.|\n)*num\.partitions"):
            broker.wait_ready(30)
    finally:
        broker.stop()


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20


def _settings(broker: BrokerProcess) -> dict[str, str]:
    args = broker.command()
    return dict(value.split("=", 1) for flag, value in itertools.pairwise(args) if flag == "--override")


def test_cluster_nodes_are_configured_as_kraft_nodes(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=3, overrides={"min.insync.replicas": "2"})
    controller = cluster.controller_address
    node1, node2 = _settings(cluster.broker(1)), _settings(cluster.broker(2))
    assert node1["process.roles"] == "broker,controller"
    assert node1["listeners"] == f"PLAINTEXT://{cluster.broker(1).bootstrap},CONTROLLER://{controller}"
    assert node2["process.roles"] == "broker"
    assert node2["listeners"] == f"PLAINTEXT://{cluster.broker(2).bootstrap}"
    for node_id, settings in ((1, node1), (2, node2)):
        assert settings["node.id"] == str(node_id)
        assert settings["controller.listener.names"] == "CONTROLLER"
        assert settings["controller.quorum.voters"] == f"1@{controller}"
        assert settings["tierlog.http.listener"] == cluster.http_address(node_id)
        assert settings["log.dirs"] == str(tmp_path / f"broker-{node_id}")
        assert settings["min.insync.replicas"] == "2"
    assert cluster.broker(3).log_file == tmp_path / "broker-3.log"
    assert cluster.bootstrap == ",".join(cluster.broker(n).bootstrap for n in (1, 2, 3))
    addresses = [cluster.controller_address] + [cluster.broker(n).bootstrap for n in (1, 2, 3)]
    addresses += [cluster.http_address(n) for n in (1, 2, 3)]
    assert len(set(addresses)) == 7


def test_cluster_refuses_to_override_per_node_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"listeners, node\.id is set per node"):
        LocalCluster(tmp_path, overrides={"node.id": "4", "listeners": "PLAINTEXT://:1"})
    with pytest.raises(KeyError, match=r"no node 4 in this cluster \(nodes \[1, 2, 3\]\)"):
        LocalCluster(tmp_path).broker(4)


def test_dedicated_controllers_are_nodes_3000_and_up_and_every_node_lists_them_as_voters(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=2, controllers=3)
    assert cluster.node_ids == [1, 2, 3000, 3001, 3002]
    assert cluster.broker_ids == [1, 2]
    voters = ",".join(
        f"{node_id}@{address}"
        for node_id, address in zip((3000, 3001, 3002), cluster.controller_addresses, strict=True)
    )
    for node_id in (3000, 3001, 3002):
        settings = _settings(cluster.broker(node_id))
        assert settings["process.roles"] == "controller"
        assert settings["listeners"] == f"CONTROLLER://{cluster.broker(node_id).bootstrap}"
        assert settings["controller.quorum.voters"] == voters
        assert settings["log.dirs"] == str(tmp_path / f"controller-{node_id}")
        assert "tierlog.http.listener" not in settings
        assert cluster.broker(node_id).log_file == tmp_path / f"controller-{node_id}.log"
    for node_id in (1, 2):
        settings = _settings(cluster.broker(node_id))
        assert settings["process.roles"] == "broker"
        assert settings["listeners"] == f"PLAINTEXT://{cluster.broker(node_id).bootstrap}"
        assert settings["controller.quorum.voters"] == voters
    assert cluster.bootstrap == ",".join(cluster.broker(n).bootstrap for n in (1, 2))
    addresses = cluster.controller_addresses + [cluster.broker(n).bootstrap for n in (1, 2)]
    addresses += [cluster.http_address(n) for n in (1, 2)]
    assert len(set(addresses)) == 7


def test_combined_voters_are_the_first_brokers(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=4, controllers=3, combined=True)
    assert cluster.node_ids == [1, 2, 3, 4]
    voters = ",".join(
        f"{node_id}@{address}" for node_id, address in zip((1, 2, 3), cluster.controller_addresses, strict=True)
    )
    for node_id in (1, 2, 3):
        settings = _settings(cluster.broker(node_id))
        assert settings["process.roles"] == "broker,controller"
        assert settings["listeners"] == (
            f"PLAINTEXT://{cluster.broker(node_id).bootstrap},CONTROLLER://{cluster.controller_addresses[node_id - 1]}"
        )
        assert settings["controller.quorum.voters"] == voters
    assert _settings(cluster.broker(4))["process.roles"] == "broker"
    with pytest.raises(ValueError, match="combined controllers are brokers too: 1 to 2 of them, not 3"):
        LocalCluster(tmp_path, brokers=2, controllers=3, combined=True)


def test_an_added_broker_is_like_the_others_on_ports_of_its_own() -> None:
    # The template is a combined broker and controller of a secured cluster: the new one is a broker only, with
    # every other listener on a new port.
    template = {
        "process.roles": "broker,controller",
        "node.id": "3",
        "listeners": "SASL_SSL://127.0.0.1:9001,INTERNAL://127.0.0.1:9002,CONTROLLER://127.0.0.1:9003",
        "controller.quorum.voters": "1@127.0.0.1:9000,3@127.0.0.1:9003",
        "tierlog.http.listener": "127.0.0.1:9004",
        "remote.log.storage.system.enable": "true",
    }
    added = broker_settings_like(template, 4)
    listeners = added.settings["listeners"].split(",")
    assert [listener.split("://")[0] for listener in listeners] == ["SASL_SSL", "INTERNAL"]
    assert listeners == [f"SASL_SSL://127.0.0.1:{added.port}", f"INTERNAL://127.0.0.1:{added.probe_port}"]
    assert added.settings["tierlog.http.listener"] == f"127.0.0.1:{added.http_port}"
    assert len({added.port, added.probe_port, added.http_port} & {9000, 9001, 9002, 9003, 9004}) == 0
    assert added.settings["process.roles"] == "broker"
    assert added.settings["node.id"] == "4"
    assert added.settings["controller.quorum.voters"] == template["controller.quorum.voters"]
    assert added.settings["remote.log.storage.system.enable"] == "true"
    # Without an INTERNAL listener the probes ask the client port.
    plain = broker_settings_like({**template, "listeners": "PLAINTEXT://127.0.0.1:9001"}, 4)
    assert plain.probe_port == plain.port


def test_the_next_broker_id_skips_the_dedicated_controllers() -> None:
    assert next_broker_id([1, 2, 3, 3000, 3001]) == 4
    assert next_broker_id([1, 2, 5]) == 6


@pytest.mark.cluster
def test_add_broker_joins_a_running_cluster(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, brokers=2, controllers=1) as cluster:
        assert cluster.add_broker() == 3
        assert cluster.broker_ids == [1, 2, 3]
        assert all(ids == {1, 2, 3} for ids in cluster.metadata_views().values())
        assert _settings(cluster.broker(3))["log.dirs"] == str(tmp_path / "broker-3")
        assert cluster.broker(3).bootstrap in cluster.bootstrap.split(",")
        assert cluster.http_address(3) not in (cluster.http_address(1), cluster.http_address(2))

"""BrokerProcess and LocalCluster: the lifecycle the demo, `tierlog cluster`, the tests and the benchmarks rely
on, and the probes they wait with."""

from __future__ import annotations

import itertools
import signal
import socket
import struct
import threading
from pathlib import Path

import pytest

from tierlog.testing.local_cluster import (
    BrokerProcess,
    BrokerStartError,
    LocalCluster,
    api_versions_answered,
    free_port,
    free_ports,
    metadata_broker_ids,
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


def test_nothing_answers_on_a_free_port() -> None:
    assert not api_versions_answered("127.0.0.1", free_port(), timeout_s=0.5)


def _metadata_v1_answer(correlation_id: int, brokers: list[tuple[int, str, int, str | None]]) -> bytes:
    body = struct.pack(">ii", correlation_id, len(brokers))
    for node_id, host, port, rack in brokers:
        body += struct.pack(">ih", node_id, len(host)) + host.encode() + struct.pack(">i", port)
        body += struct.pack(">h", -1) if rack is None else struct.pack(">h", len(rack)) + rack.encode()
    body += struct.pack(">ii", 1, 0)  # controller id, no topics
    return struct.pack(">i", len(body)) + body


def test_metadata_probe_reads_the_broker_ids() -> None:
    requests: list[tuple[int, int]] = []

    def serve(server: socket.socket) -> None:
        connection, _ = server.accept()
        with connection:
            (size,) = struct.unpack(">i", connection.recv(4))
            request = connection.recv(size)
            api_key, version, correlation_id = struct.unpack_from(">hhi", request)
            requests.append((api_key, version))
            brokers = [(1, "127.0.0.1", 9092, None), (3, "broker-3.local", 9094, "rack-b")]
            connection.sendall(_metadata_v1_answer(correlation_id, brokers))

    with socket.create_server(("127.0.0.1", 0)) as server:
        thread = threading.Thread(target=serve, args=(server,), daemon=True)
        thread.start()
        assert metadata_broker_ids("127.0.0.1", server.getsockname()[1], timeout_s=5) == {1, 3}
        thread.join(5)
    assert requests == [(3, 1)]


def test_metadata_probe_of_nothing_is_none() -> None:
    assert metadata_broker_ids("127.0.0.1", free_port(), timeout_s=0.5) is None


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
    with pytest.raises(KeyError, match=r"no broker 4 in this cluster \(nodes \[1, 2, 3\]\)"):
        LocalCluster(tmp_path).broker(4)

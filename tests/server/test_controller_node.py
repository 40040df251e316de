"""A dedicated controller (process.roles=controller, server/controller_node.py): it serves the controller's APIs on
its controller listener only, brokers register with it and follow its metadata log, and a bad configuration of
one ends the start with Kafka's one line (docs/configuration.md#dedicated-controllers)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import ClusterFactory, send_request
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.client.requests import api_versions_request
from tierlog.config import parse_properties
from tierlog.testing.local_cluster import FIRST_DEDICATED_CONTROLLER_ID, free_port, wait_until

REFUSAL_TIMEOUT_S = 30.0
API_PRODUCE, API_FETCH, API_BROKER_REGISTRATION, API_BROKER_HEARTBEAT = 0, 1, 62, 63


def cluster_id_in(directory: Path) -> str:
    return parse_properties((directory / "meta.properties").read_text())["cluster.id"]


def test_brokers_register_with_a_dedicated_controller_and_create_topics_through_it(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(brokers=2, controllers=1)
    controller_id = FIRST_DEDICATED_CONTROLLER_ID
    assert cluster.node_ids == [1, 2, controller_id]
    assert cluster.roles(controller_id) == "controller"
    assert cluster.roles(1) == "broker"
    # Registered and unfenced: every broker's Metadata lists both brokers, and never the controller.
    assert cluster.metadata_views() == {1: {1, 2}, 2: {1, 2}}

    controller = cluster.broker(controller_id)
    versions = send_request(controller.bootstrap, api_versions_request())
    served = {entry.api_key for entry in versions.api_keys}
    assert {API_BROKER_REGISTRATION, API_BROKER_HEARTBEAT, API_FETCH} <= served
    assert API_PRODUCE not in served, "a dedicated controller has no partitions to produce to"
    log = controller.log_file.read_text()
    assert f"[ControllerNode id={controller_id}] started, serving CONTROLLER://{controller.bootstrap}" in log
    assert "[Broker id=" not in log

    # One cluster: the controller's meta.properties and every broker's name the same cluster id.
    cluster_id = cluster_id_in(controller.log_dir)
    assert {cluster_id_in(cluster.broker(node_id).log_dir) for node_id in cluster.broker_ids} == {cluster_id}

    # CreateTopics reaches the controller through a broker (forwarded), and both brokers see the topic.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("on-a-dedicated-controller", 2, 2)])["on-a-dedicated-controller"].result(timeout=30)
    for node_id in cluster.broker_ids:
        one = AdminClient({"bootstrap.servers": cluster.broker(node_id).bootstrap})
        wait_until(
            lambda one=one: "on-a-dedicated-controller" in one.list_topics(timeout=5).topics,
            30,
            f"broker {node_id} to see the topic",
        )

    # A crash of the controller (kill -9) and a restart: same cluster id, and the brokers are still registered.
    controller.kill()
    controller.start()
    controller.wait_ready(30)
    assert cluster_id_in(controller.log_dir) == cluster_id
    cluster.wait_for_brokers(2, timeout_s=30)


def run_node(log_dir: Path, settings: dict[str, str]) -> tuple[int, list[str]]:
    args = [sys.executable, "-m", "tierlog", "broker", "--override", f"log.dirs={log_dir}"]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return done.returncode, (done.stdout + done.stderr).splitlines()


@pytest.mark.parametrize(
    ("settings", "first_line"),
    [
        (
            {"listeners": "CONTROLLER://127.0.0.1:{port}"},
            "Error: process.roles=controller needs controller.quorum.voters listing this node, e.g. "
            "controller.quorum.voters=3000@host:9093",
        ),
        (
            {
                "listeners": "PLAINTEXT://127.0.0.1:{port}",
                "controller.quorum.voters": "3000@127.0.0.1:{port}",
            },
            "Error: controller.listener.names must contain at least one value appearing in the 'listeners' "
            "configuration when running the KRaft controller role",
        ),
        (
            {
                "listeners": "CONTROLLER://127.0.0.1:{port},PLAINTEXT://127.0.0.1:{other}",
                "controller.quorum.voters": "3000@127.0.0.1:{port}",
            },
            "Error: The listeners config must only contain KRaft controller listeners from controller.listener.names "
            "when process.roles=controller",
        ),
        (
            {
                "listeners": "CONTROLLER://127.0.0.1:{port}",
                "advertised.listeners": "CONTROLLER://127.0.0.1:{port}",
                "controller.quorum.voters": "3000@127.0.0.1:{port}",
            },
            "Error: The advertised.listeners config must be empty when process.roles=controller",
        ),
        (
            {"listeners": "CONTROLLER://127.0.0.1:{port}", "controller.quorum.voters": "1@127.0.0.1:{port}"},
            "Error: If process.roles contains the 'controller' role, the node id 3000 must be included in the set of "
            "voters controller.quorum.voters=1@127.0.0.1:{port}",
        ),
    ],
)
def test_a_dedicated_controller_that_cannot_work_ends_the_start_with_one_line(
    tmp_path: Path, settings: dict[str, str], first_line: str
) -> None:
    port, other = free_port(), free_port()
    log_dir = tmp_path / "data"
    code, lines = run_node(
        log_dir,
        {"process.roles": "controller", "node.id": "3000"}
        | {key: value.format(port=port, other=other) for key, value in settings.items()},
    )
    assert code != 0, lines
    assert lines == [first_line.format(port=port)]
    assert not log_dir.exists()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "nothing may listen on the controller port"

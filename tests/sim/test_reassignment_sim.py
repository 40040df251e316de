"""Reassignments in the simulator (docs/simulation.md, docs/reassignment.md): a partition moved by hand ends on
its new brokers only, moves under the faults keep every invariant, and two breaks of the rules on purpose are
caught: a move completed before its new replicas caught up, and a broker keeping a replica it lost."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from sim_helpers import SHORT, first_failing_run, run_until, started_cluster

import tierlog.controller.controller as controller_module
from tierlog.common import TopicPartition
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.sim.controller_node import active_controller
from tierlog.sim.run import TOPIC, SimConfig
from tierlog.storage.log_manager import LogManager

FOUR_BROKERS = replace(SHORT, brokers=4)
# CI's sweep of moves under faults: short schedules, so that the sweep takes about a minute.
MOVING = replace(SimConfig(), brokers=4, reassignments=True, workload_ms=20_000)
MOVING_SEEDS = 40


def test_a_moved_partition_ends_on_its_new_brokers_only(tmp_path: Path) -> None:
    with started_cluster(7, FOUR_BROKERS, tmp_path, {"min.insync.replicas": "2"}) as cluster:
        for producer in cluster.producers:
            producer.start()
        run_until(cluster, cluster.converged, 30_000)
        tp = TopicPartition(TOPIC, 0)
        controller = cluster.controller
        assert controller is not None
        before = controller.metadata.topics[TOPIC].partitions[0].replicas
        leaving = before[0]  # the leader: its leadership must move too
        (arriving,) = set(cluster.brokers) - set(before)
        target = [arriving, *before[1:]]
        active = active_controller(cluster.controllers)
        assert active is not None and active.reassign({tp: target})
        run_until(
            cluster,
            lambda: cluster.converged() and cluster.brokers[leaving].replica_manager.partitions.get(tp) is None,  # type: ignore[union-attr]
            30_000,
        )
        registration = controller.metadata.topics[TOPIC].partitions[0]
        assert registration.replicas == target and not registration.is_reassigning
        assert registration.leader in target
        assert cluster.brokers[leaving].replica_manager.log_manager.get_log(tp) is None  # type: ignore[union-attr]
        for producer in cluster.producers:
            producer.running = False


@pytest.mark.timeout(900)
def test_moves_and_cancellations_under_faults_keep_every_invariant(tmp_path: Path) -> None:
    report = tmp_path / "runs.json"
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "tierlog", "sim", "--runs", str(MOVING_SEEDS), "--jobs", "2", "--brokers", "4"),
            *("--reassign", "--seconds", str(MOVING.workload_ms // 1000), "--json", str(report)),
        ],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    runs = json.loads(report.read_text())
    assert len(runs) == MOVING_SEEDS
    # Moves really happened, several per run, while the faults struck.
    assert sum(run["stats"]["reassignments"] for run in runs) > 3 * MOVING_SEEDS
    assert sum(run["acknowledged"] for run in runs) > 50 * MOVING_SEEDS


def complete_at_once(
    replicas: Sequence[int], adding: Sequence[int], removing: Sequence[int], isr: Sequence[int]
) -> tuple[list[int], list[int]] | None:
    """A controller that does not wait for the new replicas to join the ISR: the target replicas are declared in
    sync the moment the move starts."""
    if not adding and not removing:
        return None
    target = [r for r in replicas if r not in removing]
    return target, target


@pytest.mark.timeout(900)
def test_completing_a_move_before_the_new_replicas_caught_up_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "_completed_reassignment", complete_at_once)
    seed, result = first_failing_run("moves completed at once", MOVING, seeds=MOVING_SEEDS)
    data_rules = ("acknowledged write lost", "a record read is gone", "replicas disagree below the HW", "beyond")
    assert any(rule in v for v in result.violations for rule in data_rules), result.report()
    print(f"caught at seed {seed}:\n{result.report()}")


@pytest.mark.timeout(900)
def test_a_broker_keeping_a_replica_it_lost_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that never lets go of a replica it is no longer assigned: it stops following it, but neither
    deletes its log nor sets it aside."""
    monkeypatch.setattr(ReplicaManager, "_remove_partition", lambda self, tp: self._stop_fetching(tp))
    monkeypatch.setattr(LogManager, "mark_stray", lambda self, tp: self.get_log(tp))
    seed, result = first_failing_run("removed replicas kept", MOVING, seeds=MOVING_SEEDS)
    assert any("replica left behind" in v for v in result.violations), result.report()
    print(f"caught at seed {seed}:\n{result.report()}")

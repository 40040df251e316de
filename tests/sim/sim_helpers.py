"""What the simulator's tests share: CI's seeds, a short run's config, a cluster started by hand with its topic,
running it until a condition holds, and finding the first seed whose run a deliberate break makes fail."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from tierlog.sim.controller_node import active_controller
from tierlog.sim.run import TOPIC, Cluster, RunResult, SimConfig, simulate

# CI's seeds (TIERLOG_SIM_SEEDS overrides): the deliberate breaks must each be caught within them.
SEEDS = int(os.environ.get("TIERLOG_SIM_SEEDS", "300"))
SHORT = replace(SimConfig(), workload_ms=15_000)


def run_until(cluster: Cluster, condition: Callable[[], bool], limit_ms: int) -> None:
    deadline = cluster.sim.now + limit_ms
    while not condition() and cluster.sim.now < deadline:
        cluster.sim.run_until(cluster.sim.now + 100, cluster.after_step)
    assert condition(), f"not within {limit_ms} virtual ms: {cluster.describe()}"


def first_failing_run(mutation: str, config: SimConfig | None = None, seeds: int = SEEDS) -> tuple[int, RunResult]:
    """The first of the seeds whose run breaks an invariant, and its result; the test fails if no seed does."""
    for seed in range(1, seeds + 1):
        result = simulate(seed, config or SimConfig())
        if not result.ok:
            return seed, result
    pytest.fail(f"{seeds} seeds ran with {mutation} and no invariant noticed")


@contextmanager
def started_cluster(seed: int, config: SimConfig, directory: Path, topic_config: dict[str, str]) -> Iterator[Cluster]:
    """A cluster for scenarios built by hand: no scheduled faults and no message lost or duplicated at
    random (one would stall a client for its 30 s timeout), every node started, every broker unfenced and TOPIC
    created (2 partitions, 3 replicas) by the active controller; every node still up is crashed on leaving."""
    cluster = Cluster(seed, replace(config, faults=False), directory)
    cluster.network.conditions.drop = cluster.network.conditions.duplicate = 0.0
    for node in [*cluster.controllers.values(), *cluster.brokers.values()]:
        node.start()
    run_until(cluster, lambda: all(not b.fenced for b in cluster.brokers.values()), 30_000)
    active = active_controller(cluster.controllers)
    assert active is not None
    active.create_topic(TOPIC, 2, 3, topic_config)
    try:
        yield cluster
    finally:
        for node in cluster.nodes:
            if node.up:
                node.crash()

"""What the simulator's tests share: CI's seeds, a short run's config, running a cluster until a condition holds,
and finding the first seed whose run a deliberate break makes fail."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import pytest

from tierlog.sim.run import Cluster, RunResult, SimConfig, simulate

# CI's seeds (TIERLOG_SIM_SEEDS overrides): the deliberate breaks must each be caught within them.
SEEDS = int(os.environ.get("TIERLOG_SIM_SEEDS", "300"))
SHORT = replace(SimConfig(), workload_ms=15_000)


def run_until(cluster: Cluster, condition: Callable[[], bool], limit_ms: int) -> None:
    deadline = cluster.sim.now + limit_ms
    while not condition() and cluster.sim.now < deadline:
        cluster.sim.run_until(cluster.sim.now + 100, cluster.after_step)
    assert condition(), f"not within {limit_ms} virtual ms: {cluster.describe()}"


def first_failing_run(mutation: str) -> tuple[int, RunResult]:
    """The first of the seeds whose run breaks an invariant, and its result; the test fails if no seed does."""
    for seed in range(1, SEEDS + 1):
        result = simulate(seed)
        if not result.ok:
            return seed, result
    pytest.fail(f"{SEEDS} seeds ran with {mutation} and no invariant noticed")

"""A real 3-broker cluster under the seeded nemesis keeps a valid transactional history: transactional producers
committing and aborting across partitions, consume-transform-produce with its offsets in the transaction, and
read_committed readers (tierlog/faults/txn_workload.py, docs/transactions.md#proof)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.faults.txn_workload import transactional_fault_run

FAULT_SECONDS = 40
# The plain run's seed (tests/faults/test_jepsen_history.py): every kind of fault within 40 s, on any voter and on
# the active controller.
SEED = 330


@pytest.mark.cluster  # transactional_fault_run starts and stops its own ProxiedCluster
@pytest.mark.timeout(600)
def test_a_real_cluster_under_a_nemesis_keeps_a_valid_transactional_history(tmp_path: Path) -> None:
    history, verdict = transactional_fault_run(tmp_path, seconds=FAULT_SECONDS, seed=SEED, say=print)
    print(verdict.summary())
    for kind, examples in verdict.examples.items():
        print(f"{kind}: {examples}")
    assert verdict.ok, verdict.summary()
    kinds = {what.split(" ")[0] for _, what in history.faults}
    assert {"kill", "SIGSTOP", "cut", "isolate"} <= kinds, history.faults
    stats = verdict.stats
    # Enough of every kind of transaction that each check had something to find.
    assert stats["committed"] >= 50 and stats["aborted on purpose"] >= 10, stats
    assert stats["aborted records in the log"] > 0, stats
    assert stats["inputs processed exactly once"] >= 100, stats
    assert stats["polled"] >= stats["committed records"], stats

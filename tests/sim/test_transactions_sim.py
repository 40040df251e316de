"""Transactions in the simulator (docs/simulation.md#transactions): transactional writers commit and abort over both
partitions while the faults strike, a read_committed consumer reads, and every transactional invariant holds over
CI's seeds; the consumer's filter is Kafka's; two breaks of the log's transactional rules are caught."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from sim_helpers import first_failing_run

from tierlog.cli.sim import _replay_options
from tierlog.records.codec import build_batch
from tierlog.records.control_batch import ControlRecordType
from tierlog.sim.clients import read_committed_records
from tierlog.sim.run import SimConfig
from tierlog.storage.log import Log
from tierlog.storage.producer_state import CompletedTxn, ProducerStateManager
from tierlog.storage.segment import LogSegment
from tierlog.storage.transaction_index import AbortedTxn

# CI's sweep: short schedules, so that it takes well under a minute on two cores.
TRANSACTIONS = replace(SimConfig(), transactions=True, workload_ms=20_000)
TRANSACTION_SEEDS = 30


def data(base_offset: int, producer_id: int, *values: str, transactional: bool = True) -> bytes:
    return build_batch(
        [(None, value.encode(), [], 0) for value in values],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        transactional=transactional,
    )


def marker(offset: int, producer_id: int, control_type: ControlRecordType) -> bytes:
    return build_batch(
        [(struct.pack(">hh", 0, control_type), struct.pack(">hi", 0, 0), [], 0)],
        base_offset=offset,
        producer_id=producer_id,
        producer_epoch=0,
        control=True,
        transactional=True,
    )


def test_read_committed_drops_aborted_batches_and_control_batches_as_kafkas_consumer() -> None:
    # Producer 1 aborts a transaction at 0..1 (marker at 4), producer 2 commits one at 2..3 (marker at 5), then
    # producer 1 commits another at 6 (marker at 7), and a plain batch at 8.
    first = data(0, 1, "a1", "a2")
    log = b"".join(
        [
            first,
            data(2, 2, "c1", "c2"),
            marker(4, 1, ControlRecordType.ABORT),
            marker(5, 2, ControlRecordType.COMMIT),
            data(6, 1, "n1"),
            marker(7, 1, ControlRecordType.COMMIT),
            data(8, -1, "plain", transactional=False),
        ]
    )
    aborted = [AbortedTxn(1, 0, 4, 2)]
    read = read_committed_records(log, 0, aborted)
    # After its ABORT marker, producer 1's next transaction is not aborted.
    assert read.records == [(2, "c1"), (3, "c2"), (6, "n1"), (8, "plain")]
    assert read.next_offset == 9
    # Without the aborted transaction listed, its records are handed over (what a broker's missing entry does).
    assert [v for _, v in read_committed_records(log, 0, []).records][:2] == ["a1", "a2"]
    # A fetch from inside a batch (the answer starts at the batch holding the offset) skips the records below it.
    assert read_committed_records(log[len(first) :], 3, aborted).records[0] == (3, "c2")


def test_transactions_under_faults_keep_every_invariant(tmp_path: Path) -> None:
    report = tmp_path / "runs.json"
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "tierlog", "sim", "--transactions", "--runs", str(TRANSACTION_SEEDS)),
            *("--jobs", "2", "--seconds", str(TRANSACTIONS.workload_ms // 1000), "--json", str(report)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("seed 1: ok (") and " transactions, " in lines[0], lines[0]
    assert "transactions committed" in lines[-1]
    runs = json.loads(report.read_text())
    assert len(runs) == TRANSACTION_SEEDS
    # Transactions really ended, both ways, in every run, under the faults (a run whose faults stall the writers
    # may end only a couple, all committed).
    assert all(run["stats"]["transactions committed"] > 0 for run in runs)
    assert sum(run["stats"]["transactions committed"] for run in runs) > 20 * TRANSACTION_SEEDS
    assert sum(run["stats"]["transactions aborted"] for run in runs) > 5 * TRANSACTION_SEEDS


def test_a_failed_runs_replay_line_keeps_the_transactions() -> None:
    assert _replay_options(TRANSACTIONS) == " --seconds 20 --transactions"


def test_markers_not_indexed_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log whose ABORT markers complete the transaction but never reach the .txnindex: a read_committed answer
    lists no aborted transaction and the consumer hands the aborted records over."""

    def complete_without_index(self: LogSegment, producer_state: ProducerStateManager, txn: CompletedTxn) -> None:
        producer_state.complete_txn(txn)

    monkeypatch.setattr(LogSegment, "complete_txn", complete_without_index)
    seed, result = first_failing_run("markers not indexed", TRANSACTIONS, seeds=TRANSACTION_SEEDS)
    assert any("read_committed saw an aborted transaction" in v for v in result.violations), result.report()
    print(f"caught at seed {seed}:\n{result.report()}")


def test_reads_past_the_lso_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log whose LSO is its HW (open transactions ignored): read_committed reads undecided records."""
    monkeypatch.setattr(Log, "last_stable_offset", property(lambda self: self.high_watermark))
    seed, result = first_failing_run("the LSO ignored", TRANSACTIONS, seeds=TRANSACTION_SEEDS)
    assert any("read_committed saw an undecided transaction" in v for v in result.violations), result.report()
    print(f"caught at seed {seed}:\n{result.report()}")

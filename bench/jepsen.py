"""Soak: long Jepsen-style fault runs against a real 3-broker cluster whose brokers are the 3 voters of the
controller quorum (tierlog/faults), each with its own seeded nemesis (on any voter and on the active controller),
checked for lost writes, duplicates, inconsistent offsets, poll skips and non-monotonic polls (the transactional
workload: for aborted, dirty and torn reads, lost commits and consume-transform-produce exactly once).

    python bench/jepsen.py                  # 3 runs of 300 s (about 20 minutes), `make soak`
    python bench/jepsen.py --quick          # 1 run of 60 s
    python bench/jepsen.py --workload transactions   # transactional producers, consume-transform-produce and
                                                     # read_committed consumers (tierlog/faults/txn_workload.py)

Writes bench/results/jepsen.json (jepsen-transactions.json for the transactional workload): per run the seed,
the fault schedule, the checker's counts and examples, every leader and epoch of the quorum seen (DescribeQuorum)
and, per fault on the active controller, the election it caused.
Exits 1 if any run's history is invalid.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from common import argument_parser, machine_info

from tierlog.faults.txn_workload import transactional_fault_run
from tierlog.faults.workload import controller_failovers, fault_run

RUNS = {"plain": ("jepsen", fault_run), "transactions": ("jepsen-transactions", transactional_fault_run)}


def main() -> int:
    parser = argument_parser(__doc__, "jepsen", "1 run of 60 s")
    parser.add_argument("--seconds", type=float, default=300.0, help="seconds of faults per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--workload", choices=sorted(RUNS), default="plain")
    args = parser.parse_args()
    name, run = RUNS[args.workload]
    seconds, runs = (60.0, 1) if args.quick else (args.seconds, args.runs)
    reports = []
    for seed in range(args.first_seed, args.first_seed + runs):
        print(f"run seed {seed}: {seconds:.0f} s of faults", flush=True)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="tierlog-jepsen-") as directory:
            history, verdict = run(Path(directory), seconds, seed, say=lambda line: print(line, flush=True))
        print(f"seed {seed}: {verdict.summary()}", flush=True)
        reports.append(
            {
                "seed": seed,
                "fault_seconds": seconds,
                "wall_seconds": round(time.monotonic() - started, 1),
                "valid": verdict.ok,
                "anomalies": verdict.counts,
                "examples": verdict.examples,
                "stats": verdict.stats,
                "faults": history.faults,
                "quorum": history.quorum,
                "controller_failovers": controller_failovers(history),
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_info(), "runs": reports}
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    valid = sum(r["valid"] for r in reports)
    print(f"{valid} of {len(reports)} runs valid; written to {args.out / f'{name}.json'}")
    return 0 if valid == len(reports) else 1


if __name__ == "__main__":
    sys.exit(main())

"""`tierlog sim`: run the deterministic simulator (tierlog/sim) for one seed, or explore many."""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import click

from tierlog.sim.run import RunResult, SimConfig, simulate


@click.command()
@click.option("--seed", type=int, help="Run this one seed and show its whole story (replays a failure exactly).")
@click.option("--runs", type=click.IntRange(min=1), default=100, show_default=True, help="Seeds to explore.")
@click.option("--first-seed", type=int, default=1, show_default=True, help="The first seed explored.")
@click.option(
    "--seconds",
    type=click.IntRange(min=1),
    default=40,
    show_default=True,
    help="Virtual seconds of workload and faults per run (healing and the checks follow).",
)
@click.option(
    "--controllers",
    type=click.Choice(["1", "3", "5"]),
    default="3",
    show_default=True,
    help="Voters of the controller quorum (controller.quorum.voters).",
)
@click.option("--brokers", type=click.IntRange(min=3), default=3, show_default=True)
@click.option("--partitions", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--reassign",
    is_flag=True,
    help="Also move partitions between brokers, and cancel moves, while the faults strike (use --brokers 4 or more "
    "for moves that add and remove replicas).",
)
@click.option(
    "--transactions",
    is_flag=True,
    help="Also run transactional writers (commit or abort over every partition, markers as the coordinator writes "
    "them) and a read_committed consumer, and check the transactional invariants.",
)
@click.option("--no-faults", is_flag=True, help="Run the workload without faults.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Runs at once (processes).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write every run's result here.")
@click.option("--keep", type=click.Path(path_type=Path), help="With --seed: keep the simulated disks in this dir.")
def sim(
    seed: int | None,
    runs: int,
    first_seed: int,
    seconds: int,
    controllers: str,
    brokers: int,
    partitions: int,
    reassign: bool,
    transactions: bool,
    no_faults: bool,
    jobs: int,
    json_path: Path | None,
    keep: Path | None,
) -> None:
    """Run brokers, a quorum of controllers and clients in one process under a virtual clock, with a seeded
    schedule of crashes, power losses, pauses, network cuts, drops and duplicates, and check the replication and
    quorum invariants (docs/simulation.md). Exits 1 if any run breaks one; `--seed N` replays that run event for
    event."""
    config = replace(
        SimConfig(),
        workload_ms=seconds * 1000,
        controllers=int(controllers),
        brokers=brokers,
        partitions=partitions,
        reassignments=reassign,
        transactions=transactions,
        faults=not no_faults,
    )
    if seed is not None:
        result = simulate(seed, config, keep_dir=keep)
        click.echo(result.report())
        if result.ok:
            click.echo("faults:")
            for fault in result.faults:
                click.echo(f"  {fault}")
        _write_json(json_path, [result])
        sys.exit(0 if result.ok else 1)
    seeds = range(first_seed, first_seed + runs)
    started = time.monotonic()
    results: list[RunResult] = []
    with multiprocessing.get_context("fork").Pool(jobs) if jobs > 1 else _InProcess() as pool:
        for result in pool.imap(_run_seed, [(s, config) for s in seeds]):
            results.append(result)
            click.echo(result.report() if not result.ok else f"seed {result.seed}: ok ({_summary(result)})")
    failed = [r for r in results if not r.ok]
    faults = sum(len(r.faults) for r in results)
    acknowledged = sum(r.acknowledged for r in results)
    balanced = sum(r.stats["leaders balanced"] for r in results)
    epochs = sum(r.stats["controller epochs"] for r in results)
    moves = sum(r.stats["reassignments"] for r in results)
    committed = sum(r.stats["transactions committed"] for r in results)
    aborted = sum(r.stats["transactions aborted"] for r in results)
    click.echo(
        f"{len(results)} runs in {time.monotonic() - started:.0f} s: {len(results) - len(failed)} ok, {len(failed)} "
        f"failed; {faults} faults, {acknowledged} acknowledged writes, {sum(r.reads for r in results)} reads checked, "
        f"{balanced} leaders moved back to their preferred replicas, {epochs} controller epochs led"
        + (f", {moves} reassignments and cancellations accepted" if reassign else "")
        + (f", {committed} transactions committed and {aborted} aborted" if transactions else "")
    )
    for result in failed:
        click.echo(f"replay: tierlog sim --seed {result.seed}{_replay_options(config)}", err=True)
    _write_json(json_path, results)
    sys.exit(1 if failed else 0)


def _replay_options(config: SimConfig) -> str:
    """The options that make `tierlog sim --seed N` run exactly the configuration explored."""
    default = SimConfig()
    options = [f"--seconds {config.workload_ms // 1000}"]
    for name in ("controllers", "brokers", "partitions"):
        if getattr(config, name) != getattr(default, name):
            options.append(f"--{name} {getattr(config, name)}")
    if config.reassignments:
        options.append("--reassign")
    if config.transactions:
        options.append("--transactions")
    if not config.faults:
        options.append("--no-faults")
    return "".join(f" {option}" for option in options)


def _run_seed(args: tuple[int, SimConfig]) -> RunResult:
    seed, config = args
    return simulate(seed, config)


def _summary(result: RunResult) -> str:
    moves = result.stats["reassignments"]
    txns = result.stats["transactions committed"] + result.stats["transactions aborted"]
    return (
        f"{len(result.faults)} faults, {result.acknowledged} acked, {result.reads} read, "
        f"{f'{txns} transactions, ' if txns else ''}"
        f"{result.stats['leaders balanced']} leaders balanced, {result.stats['controller epochs']} controller epochs, "
        f"{f'{moves} reassignments, ' if moves else ''}{result.scenario}"
    )


def _write_json(path: Path | None, results: list[RunResult]) -> None:
    if path is not None:
        path.write_text(json.dumps([asdict(r) for r in results], indent=1))


class _InProcess:
    """The Pool interface, run in this process (one job needs no fork)."""

    def __enter__(self) -> _InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def imap(self, function, items):  # type: ignore[no-untyped-def]
        return map(function, items)

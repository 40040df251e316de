"""`tierlog cluster rebalance|add-broker|decommission`: growing and shrinking a cluster (docs/operations.md#scaling).

`rebalance` plans an even spread of every topic's replicas and preferred leaders over the registered brokers with
the fewest moves (`tierlog.cli.reassignment_plan`), shows it, and with --execute starts it as
kafka-reassign-partitions.sh --execute would (throttles included); --wait follows each partition's copy (the
adding brokers' DescribeLogDirs against the leader's size) until the controller has finished every reassignment,
then removes the throttles and elects the preferred leaders. `add-broker` starts one more broker in a cluster of
`tierlog cluster up`; `decommission` moves everything off a broker, stops it and unregisters it."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

import click
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    admin_client,
    client_options,
    output_console,
    read_client_settings,
    timeout_option,
)
from tierlog.cli.cluster import (
    ALREADY_DOWN,
    KILLED,
    NodeInfo,
    dir_option,
    find_node,
    human_bytes,
    read_cluster_info,
    start_node,
    stop_node,
    write_cluster_info,
)
from tierlog.cli.reassignment import (
    ClusterView,
    NotServed,
    alter_reassignments,
    clear_throttles,
    cluster_view,
    elect_preferred_leaders,
    leader_sizes,
    list_reassignments,
    log_dir_sizes,
    renewed,
    set_throttles,
    unregister_broker,
)
from tierlog.cli.reassignment_plan import (
    COMPLETE,
    InProgress,
    Plan,
    PlanError,
    partition_moves,
    partition_states,
    plan_even_spread,
    sorted_partitions,
    throttles_of,
)
from tierlog.cli.tables import plain_table
from tierlog.common import TopicPartition
from tierlog.testing.local_cluster import broker_settings_like, next_broker_id

_POLL_S = 0.5
_ELECTION_RETRY_S = 30.0
DEFAULT_WAIT_S = 600.0


def _ids(ids: Collection[int]) -> str:
    return ",".join(map(str, sorted(ids)))


def _partitions(count: int) -> str:
    return f"{count} partition{'s' if count != 1 else ''}"


# --- rebalance ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rebalance:
    """What `rebalance` is asked to do."""

    excluded: tuple[int, ...] = ()
    throttle: int | None = None
    execute: bool = False
    wait: bool = False
    wait_timeout_s: float = DEFAULT_WAIT_S


def _plan(view: ClusterView, excluded: Collection[int], client: ClientOptions) -> Plan:
    holders = {b for replicas in view.replicas.values() for b in replicas}
    unknown = sorted(set(excluded) - set(view.brokers) - holders)
    if unknown:
        raise CliError(
            f"--exclude-broker {unknown[0]} is not a registered, unfenced broker (those are {_ids(view.brokers)})"
        )
    # A broker down for a moment must not be emptied by a plan that only misses it: emptying one is asked for.
    absent = sorted(holders - set(view.brokers) - set(excluded))
    if absent:
        raise CliError(
            f"broker {absent[0]} holds replicas but is not registered and unfenced (down?): start it, or "
            f"--exclude-broker {absent[0]} to move its replicas to the others"
        )
    brokers = sorted(set(view.brokers) - set(excluded))
    try:
        sizes = leader_sizes(view, view.replicas, client)
    except NotServed:
        sizes = {}  # a cluster without DescribeLogDirs: the plan shows no sizes
    try:
        return plan_even_spread(view.replicas, brokers, sizes)
    except PlanError as e:
        raise CliError(str(e)) from None


def _show_plan(console: Console, plan: Plan, view: ClusterView, brokers: list[int]) -> None:
    table = plain_table("PARTITION", "CURRENT", "TARGET", "SIZE TO MOVE", right=("SIZE TO MOVE",))
    for tp in sorted_partitions(plan.targets):
        moved = plan.bytes_to_move(tp)
        table.add_row(
            str(tp),
            ",".join(map(str, plan.current[tp])),
            ",".join(map(str, plan.targets[tp])),
            "-" if not plan.adding(tp) else human_bytes(moved) if moved is not None else "?",
        )
    console.print(table)
    console.print()
    after = {tp: plan.targets.get(tp, replicas) for tp, replicas in view.replicas.items()}
    console.print("Per broker, now -> planned:")
    counts = plain_table("BROKER", "REPLICAS", "LEADERS", right=("BROKER",))
    for broker in sorted(set(view.brokers) | {b for r in view.replicas.values() for b in r}):
        replicas_now = sum(broker in r for r in view.replicas.values())
        replicas_after = sum(broker in r for r in after.values())
        leaders_now = sum(r[:1] == [broker] for r in view.replicas.values())
        leaders_after = sum(r[:1] == [broker] for r in after.values())
        counts.add_row(
            str(broker) + ("" if broker in brokers else " (excluded)"),
            f"{replicas_now} -> {replicas_after}",
            f"{leaders_now} -> {leaders_after}",
        )
    console.print(counts)
    known = [plan.bytes_to_move(tp) for tp in plan.targets if plan.adding(tp)]
    total = "?" if any(b is None for b in known) else human_bytes(sum(b or 0 for b in known))
    leaders_only = sum(not plan.adding(tp) for tp in plan.targets)
    console.print(
        f"\n{plan.replica_moves} replica move{'s' if plan.replica_moves != 1 else ''} ({total} to copy) and "
        f"{leaders_only} preferred leader change{'s' if leaders_only != 1 else ''} only, in "
        f"{_partitions(len(plan.targets))}, over brokers {_ids(brokers)}",
        highlight=False,
    )


def run_rebalance(request: Rebalance, client: ClientOptions, console: Console) -> Plan:
    """Plan, show and (request.execute) start the spread; with request.wait follow it to the end, remove the
    throttles and elect the preferred leaders. The plan."""
    admin = admin_client(client)
    view = cluster_view(admin, client)
    if request.wait and not request.execute:
        return _follow_in_progress(admin, view, request, client, console)
    brokers = sorted(set(view.brokers) - set(request.excluded))
    plan = _plan(view, request.excluded, client)
    if not plan.targets:
        console.print(
            f"The replicas and preferred leaders are spread evenly over brokers {_ids(brokers)}: nothing to move.",
            highlight=False,
        )
        return plan
    _show_plan(console, plan, view, brokers)
    if not request.execute:
        console.print("Nothing started: --execute starts it (--throttle BYTES_PER_S caps the copying).")
        return plan
    in_progress = list_reassignments(None, client)
    if in_progress:
        raise CliError(
            f"reassignments are already in progress ({','.join(map(str, sorted_partitions(in_progress)))}): "
            "let them finish (tierlog topic reassign --verify) or cancel them first"
        )
    if request.throttle is not None:
        set_throttles(admin, throttles_of(partition_moves(plan.targets, view.replicas, {})), request.throttle, client)
        console.print(f"The inter-broker throttle limit was set to {request.throttle} B/s", highlight=False)
    failed = {tp: error for tp, error in alter_reassignments(plan.targets, client).items() if error is not None}
    if failed:
        raise CliError(
            "Error reassigning partition(s): " + "; ".join(f"{tp}: {failed[tp]}" for tp in sorted_partitions(failed))
        )
    console.print(f"Started the reassignment of {_partitions(len(plan.targets))}.", highlight=False)
    if not request.wait:
        console.print(
            "It goes on in the cluster: `tierlog cluster rebalance --wait` follows it to the end"
            + (", then removes the throttles." if request.throttle is not None else "."),
            highlight=False,
        )
        return plan
    _follow(plan, view, request, client, console)
    _finish(admin, plan, request.throttle is not None, client, console)
    return plan


def _follow_in_progress(
    admin: AdminClient, view: ClusterView, request: Rebalance, client: ClientOptions, console: Console
) -> Plan:
    """`--wait` alone: follow the reassignments in progress (whoever started them) to their end, then remove the
    replication throttles, as kafka-reassign-partitions.sh --verify does once nothing moves, and elect the
    preferred leaders. A reassignment lists its target first, then the replicas it removes."""
    in_progress = list_reassignments(None, client)
    if not in_progress:
        console.print("No reassignment in progress.")
        return Plan({}, {})
    plan = Plan(
        current={tp: [b for b in r.replicas if b not in r.adding] for tp, r in in_progress.items()},
        targets={tp: [b for b in r.replicas if b not in r.removing] for tp, r in in_progress.items()},
    )
    try:
        sizes = leader_sizes(view, plan.targets, client)
    except NotServed:
        sizes = {}
    plan = replace(plan, sizes=sizes)
    console.print(f"Following the reassignment of {_partitions(len(plan.targets))}.", highlight=False)
    _follow(plan, view, request, client, console)
    _finish(admin, plan, True, client, console)
    return plan


def _bytes_progress(console: Console) -> Progress:
    """Like `progress_bar`, for bytes: description, bar, bytes copied of the total, time elapsed."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),  # as the plan's sizes
        TimeElapsedColumn(),
        console=console,
    )


def _follow(plan: Plan, view: ClusterView, request: Rebalance, client: ClientOptions, console: Console) -> None:
    """Show each partition's copy until the controller lists none of the plan's reassignments; CliError after
    request.wait_timeout_s. A broker or controller that does not answer for a while (one restarting) is asked
    again at the next poll."""
    # Any broker can answer: the one the command started with may be the one that goes away.
    everywhere = replace(client, bootstrap=",".join(view.brokers.values()))
    partitions = sorted_partitions(plan.targets)
    deadline = time.monotonic() + request.wait_timeout_s
    last_error = ""
    with _bytes_progress(console) as progress:
        # A partition of unknown size (no DescribeLogDirs) gets a bar without a total until it is done.
        tasks: dict[TopicPartition, TaskID] = {
            tp: progress.add_task(str(tp), total=plan.bytes_to_move(tp) or None) for tp in partitions
        }
        done: set[TopicPartition] = set()
        while True:
            try:
                in_progress = list_reassignments(partitions, renewed(everywhere))
                for tp in partitions:
                    if tp not in in_progress and tp not in done:
                        done.add(tp)
                        task = progress.tasks[tasks[tp]]
                        end = task.total if task.total is not None else task.completed
                        progress.update(tasks[tp], total=end, completed=end)
                _update_copied(progress, tasks, in_progress, view, everywhere)
                last_error = ""
            except CliError as e:
                last_error = e.message
            if len(done) == len(partitions):
                return
            if time.monotonic() >= deadline:
                left = ",".join(str(tp) for tp in partitions if tp not in done)
                why = f" (last error: {last_error})" if last_error else ""
                raise CliError(
                    f"the reassignment did not finish within {request.wait_timeout_s:g}s: {left} still in progress, "
                    f"and it goes on in the cluster{why}"
                )
            time.sleep(_POLL_S)


def _update_copied(
    progress: Progress,
    tasks: dict[TopicPartition, TaskID],
    in_progress: dict[TopicPartition, InProgress],
    view: ClusterView,
    client: ClientOptions,
) -> None:
    """Each moving partition's bytes on its adding brokers, against its size on the leader (known or asked)."""
    adding: dict[int, list[TopicPartition]] = {}
    for tp, reassignment in in_progress.items():
        if tp in tasks:
            for broker in reassignment.adding:
                adding.setdefault(broker, []).append(tp)
    copied: Counter[TopicPartition] = Counter()
    for broker, tps in adding.items():
        if broker not in view.brokers:
            continue
        try:
            found = log_dir_sizes(view.brokers[broker], tps, renewed(client))
        except CliError:
            continue  # a broker restarting: asked again next time
        for tp in tps:
            copied[tp] += found.get(tp, 0)
    for tp, amount in copied.items():
        total = progress.tasks[tasks[tp]].total
        # Done only once the controller says so: a copy as large as the leader's log is not yet in the ISR.
        progress.update(tasks[tp], completed=amount if total is None else min(amount, total - 1))


def _finish(admin: AdminClient, plan: Plan, throttled: bool, client: ClientOptions, console: Console) -> None:
    """Once nothing moves: remove the throttles (`throttled`), check every partition has its target replicas and
    elect the preferred leaders."""
    client = renewed(client)
    now = cluster_view(admin, client, sorted({tp.topic for tp in plan.targets}))
    states = partition_states(plan.targets, now.replicas, {})
    not_done = [str(tp) for tp, state in states.items() if state.state != COMPLETE]
    if throttled:
        brokers = set(now.brokers) | {b for r in plan.targets.values() for b in r}
        clear_throttles(admin, brokers, {tp.topic for tp in plan.targets}, client)
        console.print(f"Removed the replication throttles of brokers {_ids(brokers)}", highlight=False)
    if not_done:
        raise CliError(f"{len(not_done)} partition(s) did not get their target replicas: {', '.join(not_done)}")
    # A preferred replica that has just restarted is not in the ISR yet (PREFERRED_LEADER_NOT_AVAILABLE): its
    # partitions are asked again for a while.
    deadline = time.monotonic() + _ELECTION_RETRY_S
    elected: list[TopicPartition] = []
    pending: Collection[TopicPartition] = list(plan.targets)
    while True:
        newly, failed = elect_preferred_leaders(admin, pending, renewed(client))
        elected += newly
        if not failed or time.monotonic() >= deadline:
            break
        pending = list(failed)
        time.sleep(_POLL_S)
    console.print(
        f"Reassignment of {_partitions(len(plan.targets))} complete; preferred leader elected for {len(elected)}",
        highlight=False,
    )
    if failed:
        reasons = "; ".join(f"{tp}: {why}" for tp, why in failed.items())
        raise CliError(f"preferred leader election failed for {len(failed)} partition(s): {reasons}")


@click.command()
@click.option(
    "--exclude-broker",
    "excluded",
    type=int,
    multiple=True,
    metavar="ID",
    help="Plan with this broker emptied (repeatable): before decommissioning it.",
)
@click.option(
    "--throttle",
    type=click.IntRange(min=0),
    metavar="BYTES_PER_S",
    help="--execute: cap the copying at this rate on every broker involved (removed at the end of --wait).",
)
@click.option("--execute", is_flag=True, help="Start the plan (without it: only show it).")
@click.option(
    "--wait",
    is_flag=True,
    help="Follow the moves to the end, then remove the throttles and elect the preferred leaders (without "
    "--execute: the reassignments in progress).",
)
@click.option(
    "--wait-timeout",
    "wait_timeout_s",
    type=click.FloatRange(min=1),
    default=DEFAULT_WAIT_S,
    show_default=True,
    help="Seconds --wait waits at most.",
)
@client_options
def rebalance(
    excluded: tuple[int, ...],
    throttle: int | None,
    execute: bool,
    wait: bool,
    wait_timeout_s: float,
    client: ClientOptions,
) -> None:
    """Spread every topic's replicas and preferred leaders evenly over the registered brokers, moving as few
    replicas as possible.

    Shows the plan: per partition the current and target replicas and the bytes to copy, per broker its replicas
    and leaders now and after. --execute starts it (AlterPartitionReassignments), --wait follows it."""
    if throttle is not None and not execute:
        raise click.UsageError("--throttle goes with --execute")
    run_rebalance(Rebalance(excluded, throttle, execute, wait, wait_timeout_s), client, output_console())


# --- a local cluster's brokers ------------------------------------------------------------------------------


def _local_client(directory: Path, bootstrap: str, timeout_s: float) -> ClientOptions:
    """The client options of the local cluster in `directory`: its bootstrap and, when secured, its settings."""
    info = read_cluster_info(directory)
    settings, origins = read_client_settings((), Path(info.client_config) if info.client_config else None)
    return ClientOptions(bootstrap, timeout_s, time.monotonic() + timeout_s, settings, origins)


@click.command(name="add-broker")
@dir_option()
@click.option("-n", "--count", type=click.IntRange(min=1), default=1, show_default=True, help="Brokers to add.")
@timeout_option(60.0, "Seconds to wait for each broker to register.", minimum=1)
def add_broker(directory: Path, count: int, timeout_s: float) -> None:
    """Start more brokers in the cluster `tierlog cluster up` started: the next node ids, the settings of its
    brokers (controllers, overrides, remote storage) on ports of their own. They hold no replica until a
    rebalance moves some there."""
    console = output_console()
    for _ in range(count):
        info = read_cluster_info(directory)
        brokers = [n for n in info.nodes if n.is_broker and n.overrides is not None]
        if not brokers:
            raise CliError(f"the cluster in {directory} records no broker settings to copy: restart it with `up`")
        template = max(brokers, key=lambda n: n.node_id)
        node_id = next_broker_id([n.node_id for n in info.nodes])
        added = broker_settings_like(template.overrides or {}, node_id)
        base = Path(template.data_dir).parent
        node = NodeInfo(
            node_id=node_id,
            pid=0,
            roles="broker",
            kafka=f"127.0.0.1:{added.port}",
            http=added.settings["tierlog.http.listener"],
            data_dir=str(base / f"broker-{node_id}"),
            log_file=str(base / f"broker-{node_id}.log"),
            overrides=added.settings,
            internal=f"127.0.0.1:{added.probe_port}" if template.internal is not None else None,
        )
        pid, seconds = start_node(directory, node, timeout_s)
        console.print(
            f"broker {node_id} added (registered in {seconds:.1f}s): pid {pid}, {node.kafka}", highlight=False
        )
    info = read_cluster_info(directory)
    secured = f" --command-config {info.client_config}" if info.client_config else ""
    console.print(
        f"next: spread the replicas onto the new brokers: tierlog cluster rebalance -b {info.bootstrap}{secured} "
        "--execute --wait",
        highlight=False,
    )


@click.command()
@click.argument("node_id", metavar="NODE", type=int)
@dir_option()
@click.option(
    "--throttle", type=click.IntRange(min=0), metavar="BYTES_PER_S", help="Cap the copying at this rate per broker."
)
@click.option(
    "--wait-timeout",
    "wait_timeout_s",
    type=click.FloatRange(min=1),
    default=DEFAULT_WAIT_S,
    show_default=True,
    help="Seconds the moves may take at most.",
)
@timeout_option(15.0, "Seconds for each request, and for the broker's controlled shutdown (then SIGKILL).")
def decommission(node_id: int, directory: Path, throttle: int | None, wait_timeout_s: float, timeout_s: float) -> None:
    """Remove broker NODE from the cluster `tierlog cluster up` started: move its replicas to the others (a
    rebalance without it, waited for), stop it (controlled shutdown), unregister it (UnregisterBroker) and delete
    its data; its log stays."""
    node = find_node(directory, node_id)
    if not node.is_broker or node.is_controller:
        raise CliError(f"node {node_id} is a controller ({node.roles}): only a broker that is not a voter can go")
    info = read_cluster_info(directory)
    others = [n for n in info.nodes if n.is_broker and n.node_id != node_id]
    if not others:
        raise CliError(f"node {node_id} is the cluster's only broker")
    client = _local_client(directory, ",".join(n.kafka for n in others), timeout_s)
    console = output_console()
    run_rebalance(Rebalance((node_id,), throttle, True, True, wait_timeout_s), client, console)
    outcome, seconds = stop_node(node, timeout_s)
    how = {KILLED: f"killed after {timeout_s:g}s", ALREADY_DOWN: "was already down"}.get(
        outcome, f"stopped (controlled shutdown in {seconds:.1f}s)"
    )
    unregister_broker(node_id, renewed(client))
    info = read_cluster_info(directory)
    remaining = [n for n in info.nodes if n.node_id != node_id]
    write_cluster_info(
        directory,
        replace(info, nodes=remaining, bootstrap=",".join(n.kafka for n in remaining if n.is_broker)),
    )
    shutil.rmtree(node.data_dir, ignore_errors=True)
    console.print(
        f"broker {node_id} decommissioned: {how}, unregistered, its data deleted (its log kept: {node.log_file})",
        highlight=False,
    )

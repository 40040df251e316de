"""`tierlog topic reassign`: kafka-reassign-partitions.sh's --generate, --execute, --verify and --cancel, with its
JSON files, its words and its throttles (docs/operations.md#moving-partitions)."""

from __future__ import annotations

from pathlib import Path

import click
from confluent_kafka.admin import AdminClient

from tierlog.cli.clients import ClientOptions, CliError, admin_client, client_options
from tierlog.cli.reassignment import (
    alter_reassignments,
    clear_throttles,
    cluster_view,
    list_reassignments,
    set_throttles,
)
from tierlog.cli.reassignment_plan import (
    FAILED,
    PlanError,
    parse_broker_list,
    parse_reassignment,
    parse_topics_to_move,
    partition_moves,
    partition_states,
    plan_even_spread,
    reassignment_json,
    sorted_partitions,
    throttles_of,
)
from tierlog.common import TopicPartition

_ACTIONS = ("generate", "execute", "verify", "cancel")
# Kafka's warning when a throttle is set: only --verify (or --cancel) removes it.
VERIFY_WARNING = (
    "Warning: You must run --verify periodically, until the reassignment completes, to ensure the throttle is removed."
)


def _read(path: Path | None, option: str, action: str) -> str:
    if path is None:
        raise click.UsageError(f"--{action} needs {option}")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read {path}: {e}") from None


def _joined(partitions: list[TopicPartition]) -> str:
    return ",".join(str(tp) for tp in sorted_partitions(partitions))


@click.command(name="reassign")
@click.option("--generate", is_flag=True, help="Propose an even spread of the topics' replicas over --broker-list.")
@click.option("--execute", is_flag=True, help="Start the reassignment of --reassignment-json-file.")
@click.option("--verify", is_flag=True, help="Tell each partition's state; remove the throttles once all are done.")
@click.option("--cancel", is_flag=True, help="Cancel the reassignments in progress of --reassignment-json-file.")
@click.option(
    "--topics-to-move-json-file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help='--generate: the topics, {"topics": [{"topic": "foo"}], "version": 1}.',
)
@click.option("--broker-list", metavar="ID,ID,...", help="--generate: the brokers to spread the replicas over.")
@click.option(
    "--reassignment-json-file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help='The target replicas, {"version": 1, "partitions": [{"topic", "partition", "replicas", "log_dirs"}]}.',
)
@click.option(
    "--throttle",
    type=click.IntRange(min=0),
    metavar="BYTES_PER_S",
    help="--execute: cap the replication of the moving replicas at this rate on every broker involved.",
)
@click.option("--additional", is_flag=True, help="--execute: start even though other reassignments are in progress.")
@click.option("--preserve-throttles", is_flag=True, help="--verify, --cancel: leave the throttles in place.")
@client_options
def reassign(
    generate: bool,
    execute: bool,
    verify: bool,
    cancel: bool,
    topics_to_move_json_file: Path | None,
    broker_list: str | None,
    reassignment_json_file: Path | None,
    throttle: int | None,
    additional: bool,
    preserve_throttles: bool,
    client: ClientOptions,
) -> None:
    """Move partitions' replicas between brokers, as kafka-reassign-partitions.sh.

    --generate prints the current assignment and a proposed one (Kafka's JSON); save the proposal to a file,
    --execute it, and --verify until every partition is complete. The current assignment --execute prints is
    the file that moves the partitions back."""
    chosen = [name for name, given in zip(_ACTIONS, (generate, execute, verify, cancel), strict=True) if given]
    if len(chosen) != 1:
        raise click.UsageError(f"give exactly one of {', '.join('--' + a for a in _ACTIONS)}")
    action = chosen[0]
    if throttle is not None and action != "execute":
        raise click.UsageError("--throttle goes with --execute")
    try:
        if action == "generate":
            if broker_list is None:
                raise click.UsageError("--generate needs --broker-list")
            topics = parse_topics_to_move(_read(topics_to_move_json_file, "--topics-to-move-json-file", action))
            _generate(topics, parse_broker_list(broker_list), client)
            return
        targets = parse_reassignment(_read(reassignment_json_file, "--reassignment-json-file", action))
    except PlanError as e:
        raise CliError(str(e)) from None
    if action == "execute":
        _execute(targets, throttle, additional, client)
    elif action == "verify":
        _verify(targets, preserve_throttles, client)
    else:
        _cancel(targets, preserve_throttles, client)


def _generate(topics: list[str], brokers: list[int], client: ClientOptions) -> None:
    view = cluster_view(admin_client(client), client, topics)
    unknown = [b for b in brokers if b not in view.brokers]
    if unknown:
        raise CliError(
            f"broker {unknown[0]} of --broker-list is not a registered, unfenced broker "
            f"(those are {','.join(map(str, view.brokers)) or 'none'})"
        )
    try:
        plan = plan_even_spread(view.replicas, brokers)
    except PlanError as e:
        raise CliError(str(e)) from None
    click.echo(f"Current partition replica assignment\n{reassignment_json(view.replicas)}\n")
    click.echo(f"Proposed partition reassignment configuration\n{reassignment_json(plan.targets)}")


def _execute(
    targets: dict[TopicPartition, list[int]], throttle: int | None, additional: bool, client: ClientOptions
) -> None:
    in_progress = list_reassignments(None, client)
    if in_progress and not additional:
        raise CliError(
            f"Cannot execute because there is an existing partition assignment ({_joined(list(in_progress))}): "
            "use --additional to add this one to it"
        )
    admin = admin_client(client)
    view = cluster_view(admin, client, sorted({tp.topic for tp in targets}))
    unknown = sorted({b for replicas in targets.values() for b in replicas} - set(view.brokers))
    if unknown:
        raise CliError(f"Unknown broker id {unknown[0]}")
    missing = [tp for tp in sorted_partitions(targets) if tp not in view.replicas]
    if missing:
        raise CliError(f"Unable to find partition: {', '.join(map(str, missing))}")
    current = {tp: view.replicas[tp] for tp in targets}
    click.echo(f"Current partition replica assignment\n\n{reassignment_json(current)}\n")
    click.echo("Save this to use as the --reassignment-json-file option during rollback")
    if throttle is not None:
        click.echo(VERIFY_WARNING)
        set_throttles(admin, throttles_of(partition_moves(targets, view.replicas, in_progress)), throttle, client)
        click.echo(f"The inter-broker throttle limit was set to {throttle} B/s")
    outcome = alter_reassignments(targets, client)
    failed = {tp: error for tp, error in outcome.items() if error is not None}
    if failed:
        raise CliError(
            "Error reassigning partition(s): " + "; ".join(f"{tp}: {failed[tp]}" for tp in sorted_partitions(failed))
        )
    plural = "s" if len(targets) > 1 else ""
    click.echo(f"Successfully started partition reassignment{plural} for {_joined(list(targets))}")


def _verify(targets: dict[TopicPartition, list[int]], preserve_throttles: bool, client: ClientOptions) -> None:
    in_progress = list_reassignments(None, client)
    admin = admin_client(client)
    view = cluster_view(admin, client, sorted({tp.topic for tp in targets}))
    states = partition_states(targets, view.replicas, in_progress)
    click.echo("Status of partition reassignment:")
    for tp, state in states.items():
        click.echo(state.line(tp))
    # As Kafka: only once no reassignment at all is in progress, since the throttles may serve another one.
    if not in_progress and not preserve_throttles:
        _clear(
            admin, set(view.brokers) | {b for r in targets.values() for b in r}, {tp.topic for tp in targets}, client
        )
    failed = [tp for tp, state in states.items() if state.state == FAILED]
    if failed:
        raise CliError(f"{len(failed)} partition(s) do not have their target replicas: {_joined(failed)}")


def _cancel(targets: dict[TopicPartition, list[int]], preserve_throttles: bool, client: ClientOptions) -> None:
    active = [tp for tp in sorted_partitions(list_reassignments(list(targets), client)) if tp in targets]
    if active:
        outcome = alter_reassignments(dict.fromkeys(active), client)
        failed = {tp: error for tp, error in outcome.items() if error is not None}
        if failed:
            raise CliError(
                "Error cancelling partition reassignment(s): "
                + "; ".join(f"{tp}: {failed[tp]}" for tp in sorted_partitions(failed))
            )
        plural = "s" if len(active) > 1 else ""
        click.echo(f"Successfully cancelled partition reassignment{plural} for: {_joined(active)}")
    else:
        click.echo("None of the specified partition reassignments are active.")
    if not preserve_throttles:
        admin = admin_client(client)
        view = cluster_view(admin, client, sorted({tp.topic for tp in targets}))
        _clear(
            admin, set(view.brokers) | {b for r in targets.values() for b in r}, {tp.topic for tp in targets}, client
        )


def _clear(admin: AdminClient, brokers: set[int], topics: set[str], client: ClientOptions) -> None:
    plural_b = "s" if len(brokers) > 1 else ""
    click.echo(f"Clearing broker-level throttles on broker{plural_b} {','.join(map(str, sorted(brokers)))}")
    plural_t = "s" if len(topics) > 1 else ""
    click.echo(f"Clearing topic-level throttles on topic{plural_t} {','.join(sorted(topics))}")
    clear_throttles(admin, brokers, topics, client)

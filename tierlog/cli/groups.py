"""`tierlog groups list|describe|delete`: consumer groups, as `kafka-consumer-groups.sh` and `rpk group`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import click
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription, ListConsumerGroupsResult, OffsetSpec
from rich.text import Text

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    admin_client,
    client_options,
    future_result,
    kafka_error_message,
    output_console,
    results_or_errors,
)
from tierlog.cli.tables import WIDE, output_option, plain_table, print_status_table

_NONE = "-"


@click.group()
def groups() -> None:
    """List, describe and delete consumer groups."""


@groups.command(name="list")
@client_options
def list_(client: ClientOptions) -> None:
    """List the consumer groups with their state."""
    admin = admin_client(client)
    result: ListConsumerGroupsResult = future_result(
        admin.list_consumer_groups(request_timeout=client.remaining_s()), "listing groups", client
    )
    if result.errors and not result.valid:
        # No broker answered: nothing to show, and an empty table would say there are no groups.
        first = result.errors[0]
        error = first.args[0] if isinstance(first, KafkaException) else first
        raise CliError(kafka_error_message(error, "listing groups"))
    console = output_console()
    table = plain_table("GROUP", "STATE")
    for listing in sorted(result.valid, key=lambda g: g.group_id):
        table.add_row(listing.group_id, _state(listing.state))
    console.print(table)
    for error in result.errors:
        # Listing asks every broker; one that did not answer is told, the groups of the others are shown.
        console.print(Text(f"% {error}", style="red"))


@dataclass(frozen=True)
class _Row:
    topic: str
    partition: int
    committed: int | None
    log_end: int | str
    member: str
    host: str
    client_id: str

    @property
    def lag(self) -> str:
        if self.committed is None or not isinstance(self.log_end, int):
            return _NONE
        return str(max(self.log_end - self.committed, 0))


@groups.command()
@click.argument("group")
@output_option
@client_options
def describe(group: str, output: str, client: ClientOptions) -> None:
    """Show a group's state, members, and per partition its committed offset, log end offset and lag.

    As kafka-consumer-groups.sh --describe: a partition is listed when a member is assigned it or the group
    has an offset committed for it; LAG is how far the committed offset is behind the log end. Each member
    follows with the partitions it is assigned; `-o wide` puts the member (CONSUMER-ID, HOST, CLIENT-ID)
    in each partition's row instead, and lists only the members without partitions."""
    admin = admin_client(client)
    subject = f"group {group!r}"
    description: ConsumerGroupDescription = future_result(
        admin.describe_consumer_groups([group], request_timeout=client.remaining_s())[group], subject, client
    )
    request = [ConsumerGroupTopicPartitions(group)]
    listed = future_result(
        admin.list_consumer_group_offsets(request, request_timeout=client.remaining_s())[group], subject, client
    )
    committed = {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions if tp.offset >= 0}
    if description.state == ConsumerGroupState.DEAD and not committed:
        raise CliError(f"{subject} does not exist (`tierlog groups list` shows the groups)")

    owners: dict[tuple[str, int], tuple[str, str, str]] = {}
    for member in description.members:
        for tp in member.assignment.topic_partitions:
            owners[(tp.topic, tp.partition)] = (member.member_id, member.host, member.client_id)
    partitions = sorted(set(owners) | set(committed))
    log_ends = _log_end_offsets(admin, partitions, client)
    rows = [
        _Row(t, p, committed.get((t, p)), log_ends[(t, p)], *owners.get((t, p), (_NONE, _NONE, _NONE)))
        for t, p in partitions
    ]

    console = output_console()
    coordinator = description.coordinator
    console.print(
        f"[bold]{group}[/bold]  state {_state(description.state)}, {len(description.members)} members, "
        f"assignor {description.partition_assignor or _NONE}, coordinator {coordinator.id} "
        f"({coordinator.host}:{coordinator.port})"
    )
    wide = output == WIDE
    # A consumer id is the client id and a UUID (~50 characters): in an 80-column terminal it has no room in
    # the table, so by default each member gets a line below it.
    member_columns = ("CONSUMER-ID", "HOST", "CLIENT-ID") if wide else ()
    table = plain_table(
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        *member_columns,
        right=("PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"),
    )
    for row in rows:
        log_end = str(row.log_end) if isinstance(row.log_end, int) else Text(row.log_end, style="red")
        current = _NONE if row.committed is None else str(row.committed)
        members = (row.member, row.host, row.client_id) if wide else ()
        table.add_row(row.topic, str(row.partition), current, log_end, row.lag, *members)
    console.print(table)
    for member in description.members:
        assigned = _assignment(member.assignment.topic_partitions)
        if not wide or not assigned:
            # More members than partitions: kafka-consumer-groups.sh lists them with no partition, as here.
            console.print(f"{member.member_id} ({member.client_id}, {member.host})", highlight=False)
            console.print(f"  {'assigned ' + assigned if assigned else 'no partition assigned'}", highlight=False)


def _assignment(partitions: Iterable[TopicPartition]) -> str:
    """ "orders 0,1; payments 2": a member's partitions, per topic."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return "; ".join(f"{topic} {','.join(map(str, sorted(ids)))}" for topic, ids in sorted(by_topic.items()))


def _log_end_offsets(
    admin: AdminClient, partitions: Iterable[tuple[str, int]], client: ClientOptions
) -> dict[tuple[str, int], int | str]:
    """(topic, partition) -> log end offset, or the one-line error of a partition that could not be asked
    (its leader down, the topic deleted), so one unavailable partition does not hide the others."""
    wanted = {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions}
    if not wanted:
        return {}
    futures = admin.list_offsets(wanted, request_timeout=client.remaining_s())
    ends = results_or_errors(futures, lambda tp: f"{tp.topic}-{tp.partition}", client)
    return {(tp.topic, tp.partition): end if isinstance(end, str) else end.offset for tp, end in ends.items()}


@groups.command()
@click.argument("names", metavar="GROUP...", nargs=-1, required=True)
@client_options
def delete(names: tuple[str, ...], client: ClientOptions) -> None:
    """Delete consumer groups and their committed offsets. A group with members cannot be deleted."""
    admin = admin_client(client)
    futures = admin.delete_consumer_groups(list(names), request_timeout=client.remaining_s())
    print_status_table("GROUP", results_or_errors(futures, lambda name: f"group {name!r}", client), "deleted")


def _state(state: ConsumerGroupState | None) -> str:
    """Kafka's own spelling of the state (Stable, PreparingRebalance, ...), as kafka-consumer-groups.sh."""
    names = {
        ConsumerGroupState.STABLE: "Stable",
        ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
        ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
        ConsumerGroupState.EMPTY: "Empty",
        ConsumerGroupState.DEAD: "Dead",
    }
    return names.get(state, "Unknown") if state is not None else "Unknown"

"""`tierlog topic create|list|describe|delete|alter-config`: topic administration, as `rpk topic`."""

from __future__ import annotations

import click
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from rich.text import Text

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    admin_client,
    client_options,
    future_result,
    kafka_error_message,
    output_console,
    parse_key_values,
    results_or_errors,
    topic_metadata,
)
from tierlog.cli.tables import (
    WIDE,
    add_column,
    include_internal_option,
    is_internal,
    output_option,
    plain_table,
    print_status_table,
)


def _topic_subject(name: str) -> str:
    """How a one-line error names the topic it is about."""
    return f"topic {name!r}"


@click.group()
def topic() -> None:
    """Create, list, describe, delete and configure topics."""


@topic.command()
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@click.option(
    "-p", "--partitions", type=int, default=-1, show_default=True, help="Partition count (-1: num.partitions)."
)
@click.option(
    "-r",
    "--replication-factor",
    type=int,
    default=-1,
    show_default=True,
    help="Replicas per partition (-1: default.replication.factor).",
)
@click.option("-c", "--config", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config (repeatable).")
@client_options
def create(
    names: tuple[str, ...],
    partitions: int,
    replication_factor: int,
    configs: tuple[str, ...],
    client: ClientOptions,
) -> None:
    """Create topics."""
    topic_configs = dict(parse_key_values(configs, "--config"))
    admin = admin_client(client)
    new_topics = [
        NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=topic_configs)
        for name in names
    ]
    futures = admin.create_topics(
        new_topics, request_timeout=client.remaining_s(), operation_timeout=client.remaining_s()
    )
    print_status_table("TOPIC", results_or_errors(futures, _topic_subject, client), "created")


@topic.command(name="list")
@include_internal_option
@client_options
def list_(include_internal: bool, client: ClientOptions) -> None:
    """List topics with their partition and replica counts."""
    admin = admin_client(client)
    try:
        metadata = admin.list_topics(timeout=client.remaining_s())
    except KafkaException as e:
        raise CliError(kafka_error_message(e.args[0], "listing topics")) from None
    console = output_console()
    table = plain_table("NAME", "PARTITIONS", "REPLICAS", right=("PARTITIONS", "REPLICAS"))
    for name in sorted(metadata.topics):
        if is_internal(name) and not include_internal:
            continue
        partitions = metadata.topics[name].partitions
        replicas = max((len(p.replicas) for p in partitions.values()), default=0)
        table.add_row(name, str(len(partitions)), str(replicas))
    console.print(table)


@topic.command()
@click.argument("name")
@output_option
@client_options
def describe(name: str, output: str, client: ClientOptions) -> None:
    """Show a topic's partitions, offsets and configs.

    Per partition: leader, replicas, ISR, earliest and latest offset; then the non-default configs, with
    where each comes from (SOURCE) in `-o wide`."""
    admin = admin_client(client)
    metadata = topic_metadata(admin, name, client.remaining_s())
    partitions = [metadata.partitions[p] for p in sorted(metadata.partitions)]
    earliest = _list_offsets(admin, name, [p.id for p in partitions], OffsetSpec.earliest(), client)
    latest = _list_offsets(admin, name, [p.id for p in partitions], OffsetSpec.latest(), client)
    resource = ConfigResource(ResourceType.TOPIC, name)
    configs = admin.describe_configs([resource], request_timeout=client.remaining_s())[resource]
    entries: dict[str, ConfigEntry] = future_result(configs, f"configs of topic {name!r}", client)

    replication_factor = max((len(p.replicas) for p in partitions), default=0)
    console = output_console()
    console.print(f"[bold]{name}[/bold]  partitions {len(partitions)}, replication factor {replication_factor}")
    table = plain_table(
        "PARTITION",
        "LEADER",
        "REPLICAS",
        "ISR",
        "EARLIEST",
        "LATEST",
        right=("PARTITION", "LEADER", "EARLIEST", "LATEST"),
        title="PARTITIONS",
    )
    has_errors = any(p.error is not None for p in partitions)
    if has_errors:
        add_column(table, "ERROR")
    for p in partitions:
        row: list[str | Text] = [
            str(p.id),
            str(p.leader),
            ",".join(map(str, p.replicas)),
            ",".join(map(str, p.isrs)),
            earliest[p.id],
            latest[p.id],
        ]
        if has_errors:
            row.append(Text(p.error.str(), style="red") if p.error is not None else "")
        table.add_row(*row)
    console.print(table)

    overrides = sorted((e for e in entries.values() if not e.is_default), key=lambda e: e.name)
    wide = output == WIDE
    configs_table = plain_table("NAME", "VALUE", *(["SOURCE"] if wide else []), title="CONFIGS (non-default)")
    for entry in overrides:
        value = "<sensitive>" if entry.is_sensitive else (entry.value or "")
        # librdkafka hands the source over as a plain int.
        configs_table.add_row(entry.name, value, *([ConfigSource(entry.source).name] if wide else []))
    console.print()
    console.print(configs_table if overrides else "CONFIGS: all defaults")


def _list_offsets(
    admin: AdminClient, topic_name: str, partitions: list[int], spec: OffsetSpec, client: ClientOptions
) -> dict[int, str | Text]:
    """partition -> offset as text; a partition whose leader cannot answer shows its error instead, so one
    unavailable partition does not hide the others."""
    if not partitions:
        return {}
    futures = admin.list_offsets(
        {TopicPartition(topic_name, p): spec for p in partitions}, request_timeout=client.remaining_s()
    )
    found = results_or_errors(futures, lambda tp: f"offsets of {topic_name}-{tp.partition}", client)
    return {
        tp.partition: Text(offset, style="red") if isinstance(offset, str) else str(offset.offset)
        for tp, offset in found.items()
    }


@topic.command()
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@client_options
def delete(names: tuple[str, ...], client: ClientOptions) -> None:
    """Delete topics and all their data."""
    admin = admin_client(client)
    futures = admin.delete_topics(
        list(names), request_timeout=client.remaining_s(), operation_timeout=client.remaining_s()
    )
    print_status_table("TOPIC", results_or_errors(futures, _topic_subject, client), "deleted")


@topic.command(name="alter-config")
@click.argument("name")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a topic config (repeatable).")
@click.option(
    "--delete", "deletes", multiple=True, metavar="KEY", help="Remove an override: back to the default (repeatable)."
)
@client_options
def alter_config(name: str, sets: tuple[str, ...], deletes: tuple[str, ...], client: ClientOptions) -> None:
    """Set or remove topic configs.

    Incremental (IncrementalAlterConfigs): overrides not named here stay as they are."""
    if not sets and not deletes:
        raise click.UsageError("nothing to change: give --set KEY=VALUE and/or --delete KEY")
    changes = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in parse_key_values(sets, "--set")
    ]
    changes += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in deletes]
    admin = admin_client(client)
    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=changes)
    future = admin.incremental_alter_configs([resource], request_timeout=client.remaining_s())[resource]
    future_result(future, _topic_subject(name), client)
    console = output_console()
    table = plain_table("CONFIG", "NEW VALUE")
    for entry in changes:
        new_value = "(default)" if entry.incremental_operation == AlterConfigOpType.DELETE else entry.value
        table.add_row(entry.name, new_value)
    console.print(f"Updated topic [bold]{name}[/bold]:")
    console.print(table)

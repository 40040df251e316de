"""`tierlog cluster elect-leaders`: ElectLeaders (KIP-460), as `kafka-leader-election.sh` sends it and words its
answer: leaders back on their preferred replicas, or offline partitions given a leader outside the ISR."""

from __future__ import annotations

import click
from confluent_kafka import ElectionType, KafkaError, TopicPartition

from tierlog.cli.clients import ClientOptions, CliError, admin_client, client_options, future_result, topic_metadata

_TYPES = {"preferred": ElectionType.PREFERRED, "unclean": ElectionType.UNCLEAN}


@click.command(name="elect-leaders")
@click.option(
    "--type",
    "election",
    type=click.Choice(sorted(_TYPES)),
    default="preferred",
    show_default=True,
    help="preferred: each partition's first replica leads again if it is in sync; unclean: an offline partition "
    "gets any live replica as leader, losing what that replica lacks.",
)
@click.option("--topic", help="Only this topic's partitions (default: every partition of every topic).")
@click.option("--partition", type=click.IntRange(min=0), help="Only this partition of --topic.")
@client_options
def elect_leaders(election: str, topic: str | None, partition: int | None, client: ClientOptions) -> None:
    """Elect partition leaders (ElectLeaders, as kafka-leader-election.sh).

    Prints the partitions whose leader changed, those already led by the replica asked for, and one line per
    partition that could not be elected (then exits 1)."""
    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    admin = admin_client(client)
    partitions: list[TopicPartition] | None = None
    if topic is not None:
        ids = (
            [partition]
            if partition is not None
            else sorted(topic_metadata(admin, topic, client.remaining_s()).partitions)
        )
        partitions = [TopicPartition(topic, p) for p in ids]
    kind = _TYPES[election]
    # confluent-kafka 2.16's binding refuses the request_timeout and operation_timeout it documents (a C argument
    # format bug), so librdkafka's own timeout applies and future_result bounds the wait by --timeout.
    future = admin.elect_leaders(kind, partitions)
    # Each partition's error comes as a KafkaError (confluent-kafka's docstring says KafkaException).
    results: dict[TopicPartition, KafkaError | None] = future_result(future, "leader election", client)
    elected, not_needed, failed = [], [], []
    for tp in sorted(results, key=lambda tp: (tp.topic, tp.partition)):
        error = results[tp]
        name = f"{tp.topic}-{tp.partition}"
        if error is None:
            elected.append(name)
        elif error.code() == KafkaError.ELECTION_NOT_NEEDED:
            not_needed.append(name)
        else:
            failed.append(
                f"Error completing leader election ({kind.name}) for partition {name}: {error.str()} ({error.name()})"
            )
    if elected:
        click.echo(f"Successfully completed leader election ({kind.name}) for partitions {', '.join(elected)}")
    if not_needed:
        click.echo(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    if not results:
        click.echo(f"No partition needed a leader election ({kind.name})")
    for line in failed:
        click.echo(line)
    if failed:
        raise CliError(f"{len(failed)} partition(s) could not be elected")

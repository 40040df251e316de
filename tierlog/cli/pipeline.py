"""`tierlog pipeline run|backfill`: the Spark ETL jobs (tierlog.spark.pipeline) from the command line.

tierlog.spark is imported inside the commands: pyspark takes a second to import, and every other `tierlog`
command (and `--help`) should not pay for it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tierlog.cli.clients import CliError, bootstrap_option, ensure_reachable, parse_key_values
from tierlog.config import parse_properties

RSM_PREFIX = "rsm.config."


def remote_storage_settings(remote: tuple[str, ...], broker_config: Path | None) -> dict[str, str]:
    """The remote tier's rsm.config.* settings, from a broker's server.properties and/or --remote flags (which
    win), without the prefix."""
    settings: dict[str, str] = {}
    if broker_config is not None:
        try:
            properties = parse_properties(broker_config.read_text())
        except OSError as e:
            raise CliError(f"cannot read {broker_config}: {e.strerror}") from None
        settings |= {k[len(RSM_PREFIX) :]: v for k, v in properties.items() if k.startswith(RSM_PREFIX)}
    for key, value in parse_key_values(remote, "--remote"):
        settings[key.removeprefix(RSM_PREFIX)] = value
    return settings


def _common(command: Any) -> Any:
    options = [
        bootstrap_option,
        click.option("-t", "--topic", required=True, help="Topic of JSON events to read."),
        click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Parquet table directory."),
        click.option(
            "--schema",
            "event_schema",
            default=None,
            metavar="DDL",
            help="The events' JSON schema as Spark DDL (default: the demo's events).",
        ),
        click.option(
            "--remote",
            multiple=True,
            metavar="KEY=VALUE",
            help="A remote tier setting as the brokers have it (rsm.config.KEY=VALUE, repeatable): the remote "
            "tier is then read straight from object storage.",
        ),
        click.option(
            "--broker-config",
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help="A broker's server.properties to take the remote tier settings (rsm.config.*) from.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _config(
    bootstrap: str,
    topic: str,
    output: Path,
    event_schema: str | None,
    remote: tuple[str, ...],
    broker_config: Path | None,
    max_offsets_per_trigger: int | None = None,
) -> Any:
    from tierlog.spark.pipeline import DEFAULT_EVENT_SCHEMA, PipelineConfig

    ensure_reachable(bootstrap, 10.0)
    return PipelineConfig(
        bootstrap_servers=bootstrap,
        topic=topic,
        output=str(output.resolve()),
        event_schema=event_schema or DEFAULT_EVENT_SCHEMA,
        remote_storage=remote_storage_settings(remote, broker_config),
        max_offsets_per_trigger=max_offsets_per_trigger,
    )


@click.group()
def pipeline() -> None:
    """Spark ETL jobs over a topic: JSON events into a Parquet table partitioned by date and hour."""


@pipeline.command()
@_common
@click.option(
    "-c", "--checkpoint", type=click.Path(path_type=Path), help="Checkpoint directory (default: OUTPUT/_checkpoint)."
)
@click.option(
    "--trigger",
    default=None,
    metavar="INTERVAL",
    help="Run continuously, a micro-batch every INTERVAL (e.g. '10 seconds'); default: read what the topic "
    "holds now and stop (Trigger.AvailableNow).",
)
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), help="At most this many records a batch.")
def run(
    bootstrap: str,
    topic: str,
    output: Path,
    event_schema: str | None,
    remote: tuple[str, ...],
    broker_config: Path | None,
    checkpoint: Path | None,
    trigger: str | None,
    max_offsets_per_trigger: int | None,
) -> None:
    """Stream TOPIC from its earliest offset (the remote tier included) into a partitioned Parquet table.

    Exactly-once across restarts: the offsets live in the checkpoint and Spark's file sink commits each batch's
    files atomically; run it again with the same checkpoint to continue where it stopped."""
    config = _config(bootstrap, topic, output, event_schema, remote, broker_config, max_offsets_per_trigger)
    checkpoint_dir = str((checkpoint or output / "_checkpoint").resolve())
    console = Console()
    from tierlog.spark.pipeline import spark_session, stream_to_parquet, watch

    with console.status("starting Spark (local)"):
        spark = spark_session("tierlog-pipeline")
    reads = "directly from the remote tier" if config.remote_storage else "through the brokers"
    console.print(f"streaming [bold]{topic}[/bold] from the earliest offset ({reads}) into {config.output}")
    query = stream_to_parquet(spark, config, checkpoint_dir, trigger)
    totals = {"rows": 0}

    def report(progress: dict[str, Any]) -> None:
        rows = int(progress["numInputRows"])
        totals["rows"] += rows
        ends = {}
        for source in progress["sources"]:
            if source.get("endOffset"):
                ends = source["endOffset"] if isinstance(source["endOffset"], dict) else {}
        if rows:
            console.print(f"batch {progress['batchId']}: {rows:,} rows, offsets now {_offsets_text(ends)}")

    try:
        watch(query, report)
    except KeyboardInterrupt:
        console.print("stopping the query (the checkpoint keeps its place)")
        query.stop()
    except RuntimeError as e:
        raise CliError(str(e)) from None
    finally:
        spark.stop()
    console.print(f"{totals['rows']:,} rows written to {config.output} (checkpoint {checkpoint_dir})")


def _offsets_text(ends: Any) -> str:
    if isinstance(ends, str):
        ends = json.loads(ends)
    parts = [f"{topic}-{p}:{o}" for topic, partitions in sorted(ends.items()) for p, o in sorted(partitions.items())]
    return ", ".join(parts) if parts else "-"


def _timestamp_ms(text: str, option: str) -> int:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO-8601 time like 2026-11-22T10:00", param_hint=option) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a time without a zone is UTC, as the table's partitions
    return int(moment.timestamp() * 1000)


@pipeline.command()
@_common
@click.option("--from", "from_time", required=True, metavar="TIME", help="Start, inclusive (ISO-8601; UTC if no zone).")
@click.option("--to", "to_time", required=True, metavar="TIME", help="End, exclusive (ISO-8601; UTC if no zone).")
def backfill(
    bootstrap: str,
    topic: str,
    output: Path,
    event_schema: str | None,
    remote: tuple[str, ...],
    broker_config: Path | None,
    from_time: str,
    to_time: str,
) -> None:
    """Rebuild the table's date/hour partitions from the records of TOPIC with timestamps in [--from, --to).

    A batch job: only the partitions it writes are replaced. Give it its own OUTPUT rather than the streaming
    job's table (a streaming table lists its files in _spark_metadata, so files written beside them are not read)."""
    from_ms, to_ms = _timestamp_ms(from_time, "--from"), _timestamp_ms(to_time, "--to")
    if to_ms <= from_ms:
        raise click.BadParameter("must be after --from", param_hint="--to")
    config = _config(bootstrap, topic, output, event_schema, remote, broker_config)
    console = Console()
    from tierlog.spark.pipeline import backfill as run_backfill
    from tierlog.spark.pipeline import spark_session

    with console.status("starting Spark (local)"):
        spark = spark_session("tierlog-backfill")
    try:
        with console.status(f"reading {topic} from {from_time} to {to_time} and writing {config.output}"):
            rows = run_backfill(spark, config, from_ms, to_ms)
        table = Table("date", "hour", "rows")
        summary = spark.read.parquet(config.output).groupBy("date", "hour").count().orderBy("date", "hour")
        for row in summary.collect():
            table.add_row(str(row["date"]), str(row["hour"]), f"{row['count']:,}")
    finally:
        spark.stop()
    console.print(table)
    console.print(f"{rows:,} rows written to {config.output}")

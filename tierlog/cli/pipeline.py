"""`tierlog pipeline run|backfill`: the Spark ETL jobs (tierlog.spark.pipeline) from the command line.

tierlog.spark is imported inside the commands: pyspark takes a second to import, and every other `tierlog`
command (and `--help`) should not pay for it. What can be checked without Spark (the broker answers, the topic
exists, the remote tier takes the settings) is checked before Spark starts, which takes ~20 s.

Spark's own output (the JVM's log, the tracebacks of its Python workers) goes to a log file, not the terminal:
a failure is told in one line naming the cause and that file; Ctrl-C stops the job in one line, exit code 130.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import click
from confluent_kafka import KafkaException
from rich.console import Console
from rich.table import Table

from tierlog.cli.clients import (
    DEFAULT_TIMEOUT_S,
    ClientOptions,
    CliError,
    admin_client,
    bootstrap_option,
    client_settings_options,
    output_console,
    parse_key_values,
    read_client_settings,
    take_bootstrap,
    topic_metadata,
)
from tierlog.config import read_properties
from tierlog.config_def import ConfigException

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tierlog.spark.pipeline import Offsets, PipelineConfig

RSM_PREFIX = "rsm.config."
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a job stopped by Ctrl-C
# A batch line names each partition whose offsets moved, up to this many; a wider topic gets a count beyond.
SHOWN_PARTITIONS = 8

F = TypeVar("F", bound=Callable[..., Any])


def remote_storage_settings(remote: tuple[str, ...], broker_config: Path | None) -> dict[str, str]:
    """The remote tier's rsm.config.* settings, from a broker's server.properties and/or --remote flags (which
    win), without the prefix."""
    settings: dict[str, str] = {}
    if broker_config is not None:
        try:
            properties = read_properties(broker_config)
        except ConfigException as e:
            raise CliError(str(e)) from None
        settings |= {k[len(RSM_PREFIX) :]: v for k, v in properties.items() if k.startswith(RSM_PREFIX)}
        if not settings:
            raise CliError(f"{broker_config} has no {RSM_PREFIX}* settings: is it a broker with a remote tier?")
    for key, value in parse_key_values(remote, "--remote"):
        settings[key.removeprefix(RSM_PREFIX)] = value
    return settings


@dataclass(frozen=True)
class JobOptions:
    """The options every pipeline command takes."""

    bootstrap: str
    topic: str
    output: Path
    event_schema: str | None
    remote: tuple[str, ...]
    broker_config: Path | None
    spark_log: Path | None
    spark_ui: bool
    # Spark's master URL (local[*] or a cluster's) and the Spark properties of --conf.
    master: str
    spark_conf: dict[str, str]
    # -X and --command-config: librdkafka settings (security among them) for the check and for Spark's clients.
    client_settings: dict[str, str]
    client_origins: dict[str, str]


def _job_options(command: F) -> F:
    """The options every pipeline command takes, handed to it as `job: JobOptions`."""

    @functools.wraps(command)
    def with_job(
        *args: Any,
        bootstrap: str,
        topic: str,
        output: Path,
        event_schema: str | None,
        remote: tuple[str, ...],
        broker_config: Path | None,
        spark_log: Path | None,
        spark_ui: bool,
        master: str,
        spark_conf: tuple[str, ...],
        client_settings: tuple[str, ...],
        command_config: Path | None,
        **kwargs: Any,
    ) -> Any:
        settings, origins = read_client_settings(client_settings, command_config)
        bootstrap = take_bootstrap(settings, bootstrap)
        job = JobOptions(
            bootstrap,
            topic,
            output,
            event_schema,
            remote,
            broker_config,
            spark_log,
            spark_ui,
            master,
            dict(parse_key_values(spark_conf, "--conf")),
            settings,
            origins,
        )
        return command(*args, job=job, **kwargs)

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
        click.option(
            "--spark-log",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Write Spark's own log (the JVM's, its Python workers') here and keep it (default: a temporary "
            "file, kept and named only when the job fails).",
        ),
        click.option("--spark-ui", is_flag=True, help="Serve Spark's web UI (on SPARK_LOCAL_IP, default 127.0.0.1)."),
        click.option(
            "--master",
            default="local[*]",
            show_default=True,
            metavar="URL",
            help="Spark's master: local[*], or a cluster's (spark://HOST:7077, yarn, k8s://...), to whose executors "
            "tierlog is shipped; OUTPUT must then be a path every worker reaches (docs/spark.md#on-a-spark-cluster).",
        ),
        click.option(
            "--conf",
            "spark_conf",
            multiple=True,
            metavar="KEY=VALUE",
            help="A Spark property, as spark-submit's --conf (repeatable), e.g. spark.executor.memory=4g.",
        ),
        client_settings_options,
    ]
    decorated: Any = with_job
    for option in reversed(options):
        decorated = option(decorated)
    return cast(F, decorated)


def _config(job: JobOptions, max_offsets_per_trigger: int | None = None) -> PipelineConfig:
    """The job's configuration, checked as far as it can be without Spark: the broker answers, the topic
    exists (the job never creates it), and the remote tier, if given, takes the settings."""
    remote_storage = remote_storage_settings(job.remote, job.broker_config)
    deadline = time.monotonic() + DEFAULT_TIMEOUT_S
    client = ClientOptions(job.bootstrap, DEFAULT_TIMEOUT_S, deadline, job.client_settings, job.client_origins)
    topic_metadata(admin_client(client), job.topic, client.remaining_s())
    if remote_storage:
        from tierlog.spark.remote_tier import RemoteTierError, check_remote_tier

        try:
            check_remote_tier(remote_storage)
        except RemoteTierError as e:
            raise CliError(str(e)) from None
    from tierlog.spark.pipeline import DEFAULT_EVENT_SCHEMA, PipelineConfig

    return PipelineConfig(
        bootstrap_servers=job.bootstrap,
        topic=job.topic,
        output=str(job.output.resolve()),
        event_schema=job.event_schema or DEFAULT_EVENT_SCHEMA,
        remote_storage=remote_storage,
        max_offsets_per_trigger=max_offsets_per_trigger,
        client_settings=job.client_settings,
    )


@contextmanager
def _ctrl_c_stops(stopped: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C anywhere in the body ends the command with `stopped()` on stderr and exit code 130, no traceback."""
    try:
        yield
    except KeyboardInterrupt:
        _exit_interrupted(stopped)


def _exit_interrupted(stopped: Callable[[], str], at_once: bool = False) -> NoReturn:
    sys.stderr.write(stopped() + "\n")
    sys.stderr.flush()
    if at_once:
        os._exit(INTERRUPTED_EXIT_CODE)
    raise SystemExit(INTERRUPTED_EXIT_CODE)


@contextmanager
def _spark(app_name: str, job: JobOptions, console: Console, stopped: Callable[[], str]) -> Iterator[SparkSession]:
    """A Spark (local, or a cluster's driver) for the body of the `with`, stopped after it, its output in a log file.

    A Spark failure becomes a one-line CliError naming the cause and the log. On Ctrl-C the running query is
    stopped, then Spark, before the KeyboardInterrupt goes on to _ctrl_c_stops; a second Ctrl-C meanwhile ends
    the process at once (the checkpoint is consistent at any moment)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    from tierlog.spark.pipeline import PipelineError, spark_failure, spark_session

    if job.spark_log is None:
        descriptor, name = tempfile.mkstemp(prefix=f"{app_name}-", suffix=".log")
        os.close(descriptor)
        log_path, keep_log = Path(name), False
    else:
        log_path, keep_log = job.spark_log.resolve(), True
    try:
        jvm_output = log_path.open("ab")
    except OSError as e:
        raise CliError(f"cannot write Spark's log to {log_path}: {e.strerror}") from None
    # py4j logs a call broken by Ctrl-C or by the JVM stopping through the root logger (which would print it to
    # stderr): into Spark's log with the rest.
    python_log = logging.FileHandler(log_path)
    logging.getLogger().addHandler(python_log)
    spark: SparkSession | None = None
    try:
        with jvm_output:
            try:
                with console.status(f"starting Spark ({job.master})"):
                    spark = spark_session(
                        app_name, job.master, jvm_output=jvm_output, ui=job.spark_ui, spark_conf=job.spark_conf
                    )
                # PySpark's SIGINT handler cancels every job through py4j from inside the handler, re-entering the
                # py4j call the main thread is blocked in. Python's own raises KeyboardInterrupt, and stopping the
                # query cancels its jobs.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                if job.spark_ui:
                    console.print(f"Spark UI: {spark.sparkContext.uiWebUrl}")
                yield spark
            except KeyboardInterrupt:
                if not keep_log:  # now: a second Ctrl-C ends the process without running the `finally`
                    log_path.unlink(missing_ok=True)
                signal.signal(signal.SIGINT, lambda *_: _exit_interrupted(stopped, at_once=True))
                _stop(spark)
                raise
            except (PipelineError, PySparkException, Py4JError) as e:
                cause = str(e) if isinstance(e, PipelineError) else spark_failure(e)
                _stop(spark)
                keep_log = True
                raise CliError(f"{cause} (Spark's log: {log_path})") from None
            _stop(spark)
    finally:
        logging.getLogger().removeHandler(python_log)
        python_log.close()
        if not keep_log:
            log_path.unlink(missing_ok=True)


def _stop(spark: SparkSession | None) -> None:
    """Stop the running queries (their checkpoints keep their place), then Spark; quietly, as the JVM may be
    the reason for stopping."""
    if spark is None:
        return
    # Spark's stop ends a query that would not stop; and the JVM exits with this process anyway (its stdin
    # closes), so neither failing is worth a word.
    with suppress(Exception):
        for query in spark.streams.active:
            query.stop()
    with suppress(Exception):
        spark.stop()


@click.group()
def pipeline() -> None:
    """Spark ETL jobs over a topic: JSON events into a Parquet table partitioned by date and hour."""


@pipeline.command()
@_job_options
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
def run(job: JobOptions, checkpoint: Path | None, trigger: str | None, max_offsets_per_trigger: int | None) -> None:
    """Stream TOPIC from its earliest offset (the remote tier included) into a partitioned Parquet table.

    Exactly-once across restarts: the offsets live in the checkpoint and Spark's file sink commits each batch's
    files atomically; run it again with the same checkpoint to continue where it stopped (Ctrl-C included)."""
    checkpoint_dir = str((checkpoint or job.output / "_checkpoint").resolve())

    def stopped() -> str:
        from tierlog.spark.pipeline import checkpoint_position

        position = checkpoint_position(checkpoint_dir)
        if position is None:
            return "stopped; no batch was committed: the next run starts from the earliest offsets"
        at = "" if position[1] is None else f" at {_offsets_text(position[1])}"
        return f"stopped; the next run resumes from the checkpoint {checkpoint_dir}{at}"

    with _ctrl_c_stops(stopped):
        config = _config(job, max_offsets_per_trigger)
        _stream(job, config, checkpoint_dir, trigger, stopped)


def _stream(
    job: JobOptions, config: PipelineConfig, checkpoint_dir: str, trigger: str | None, stopped: Callable[[], str]
) -> None:
    from tierlog.spark.offsets import partition_states
    from tierlog.spark.options import parse_stream_options
    from tierlog.spark.pipeline import checkpoint_position, offsets_from_json, stream_to_parquet, watch

    console = output_console()
    try:
        states = partition_states(parse_stream_options(config.source_options()))
    except KafkaException as e:
        raise CliError(f"topic {config.topic!r}: {e.args[0].str()}") from None
    earliest = {(s.topic, s.partition): s.earliest for s in states}
    ends = {(s.topic, s.partition): s.latest for s in states}
    reads = (
        f"the remote tier read straight from {config.remote_storage.get('url', 'object storage')}"
        if config.remote_storage
        else "every offset read through the brokers"
    )
    console.print(f"streaming {config.topic} into {config.output} ({reads})")
    resume = checkpoint_position(checkpoint_dir)
    if resume is None:
        console.print(
            f"starting from the earliest offsets {_offsets_text(earliest)}; the topic ends at {_offsets_text(ends)}"
        )
    else:
        batch, resume_offsets = resume
        at = "its offsets unreadable here" if resume_offsets is None else f"at {_offsets_text(resume_offsets)}"
        console.print(
            f"resuming from checkpoint {checkpoint_dir} after batch {batch}, {at}; the topic ends at "
            f"{_offsets_text(ends)}"
        )
    totals = {"rows": 0, "batches": 0, "last": -1}

    def report(progress: dict[str, Any]) -> None:
        sources = progress["sources"] or [{}]
        start = offsets_from_json(sources[0].get("startOffset"))
        end = offsets_from_json(sources[0].get("endOffset"))
        moved = {tp: (start.get(tp, earliest.get(tp, 0)), to) for tp, to in end.items() if start.get(tp) != to}
        # Spark also reports triggers that found nothing new (under the number of the next batch): not batches.
        if not moved or progress["batchId"] <= totals["last"]:
            return
        rows = int(progress["numInputRows"])
        totals["last"] = progress["batchId"]
        totals["rows"] += rows
        totals["batches"] += 1
        console.print(f"batch {progress['batchId']}: {rows:,} rows, {_ranges_text(moved)}")

    with _spark("tierlog-pipeline", job, console, stopped) as spark:
        query = stream_to_parquet(spark, config, checkpoint_dir, trigger)
        watch(query, report)
    position = checkpoint_position(checkpoint_dir)
    at = "" if position is None or position[1] is None else f" at {_offsets_text(position[1])}"
    batches = f"{totals['batches']} batch" + ("" if totals["batches"] == 1 else "es")
    console.print(f"{totals['rows']:,} rows in {batches} written to {config.output}; checkpoint {checkpoint_dir}{at}")


def _offsets_text(offsets: Offsets) -> str:
    """`events-0 23, events-1 7`: each partition's offset."""
    return _shown(f"{topic}-{partition} {offset}" for (topic, partition), offset in sorted(offsets.items()))


def _ranges_text(ranges: dict[tuple[str, int], tuple[int, int]]) -> str:
    """`events-0 0->40, events-1 0->40`: each partition's offsets [from, to)."""
    return _shown(f"{t}-{p} {start}->{end}" for (t, p), (start, end) in sorted(ranges.items()))


def _shown(items: Iterator[str]) -> str:
    parts = list(items)
    if not parts:
        return "-"
    more = len(parts) - SHOWN_PARTITIONS
    return ", ".join(parts[:SHOWN_PARTITIONS]) + (f" and {more} more partitions" if more > 0 else "")


def _timestamp_ms(text: str, option: str) -> int:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO-8601 time like 2026-11-22T10:00", param_hint=option) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a time without a zone is UTC, as the table's partitions
    return int(moment.timestamp() * 1000)


@pipeline.command()
@_job_options
@click.option("--from", "from_time", required=True, metavar="TIME", help="Start, inclusive (ISO-8601; UTC if no zone).")
@click.option("--to", "to_time", required=True, metavar="TIME", help="End, exclusive (ISO-8601; UTC if no zone).")
def backfill(job: JobOptions, from_time: str, to_time: str) -> None:
    """Rebuild the table's date/hour partitions from the records of TOPIC with timestamps in [--from, --to).

    A batch job: only the partitions it writes are replaced. Give it its own OUTPUT rather than the streaming
    job's table (a streaming table lists its files in _spark_metadata, so files written beside them are not read)."""
    from_ms, to_ms = _timestamp_ms(from_time, "--from"), _timestamp_ms(to_time, "--to")
    if to_ms <= from_ms:
        raise click.BadParameter("must be after --from", param_hint="--to")

    def stopped() -> str:
        return "stopped before the backfill finished; run it again to rebuild the range"

    with _ctrl_c_stops(stopped):
        config = _config(job)
        console = output_console()
        from tierlog.spark.pipeline import backfill as run_backfill

        with _spark("tierlog-backfill", job, console, stopped) as spark:
            with console.status(f"reading {job.topic} from {from_time} to {to_time} and writing {config.output}"):
                rows = run_backfill(spark, config, from_ms, to_ms)
            table = Table("date", "hour", "rows")
            summary = spark.read.parquet(config.output).groupBy("date", "hour").count().orderBy("date", "hour")
            for row in summary.collect():
                table.add_row(str(row["date"]), str(row["hour"]), f"{row['count']:,}")
        console.print(table)
        console.print(f"{rows:,} rows written to {config.output}")

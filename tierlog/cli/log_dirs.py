"""`tierlog log-dirs describe`: each broker's log dirs and the partitions in them, as `kafka-log-dirs.sh --describe`
shows them (docs/replication.md#log-dirs).

As Kafka's LogDirsCommand: the brokers are those DescribeCluster lists (all of them, or those of --broker-list, each
of which must be one of them); each is asked DescribeLogDirs for every partition (null topics) on a connection of
its own, and --topic-list keeps the partitions of those topics. A table by default (a dir holding none of the
partitions is one row without a partition; a dir the broker cannot read shows its error), `-o json` Kafka's
document: {"version": 1, "brokers": [{"broker", "logDirs": [{"logDir", "error", "partitions": [{"partition",
"size", "offsetLag", "isFuture"}]}]}]} (the error is Kafka's error name, where Kafka prints its exception's class).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import click
from rich.text import Text

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    bootstrap_addresses,
    client_options,
    ensure_reachable,
    output_console,
)
from tierlog.cli.tables import TABLE, WIDE, plain_table
from tierlog.client.connection import ApiNotServedError, KafkaConnection, KafkaConnectionError, ask_once
from tierlog.client.requests import (
    API_DESCRIBE_LOG_DIRS,
    DESCRIBE_LOG_DIRS_VERSION,
    describe_cluster_request,
    describe_log_dirs_request,
)
from tierlog.client.security import ClientSecurity
from tierlog.protocol.errors import error_code

CLIENT_ID = "log-dirs-tool"  # Kafka's LogDirsCommand's client.id
JSON = "json"


@dataclass(frozen=True)
class ReplicaInfo:
    """One partition's log in a log dir (Kafka's ReplicaInfo)."""

    topic: str
    partition: int
    size: int
    offset_lag: int
    is_future: bool


@dataclass(frozen=True)
class LogDirInfo:
    path: str
    error: str | None  # Kafka's error name (KAFKA_STORAGE_ERROR), None when the dir could be described
    replicas: list[ReplicaInfo]
    total_bytes: int  # -1: unknown (a broker answering DescribeLogDirs before v4)
    usable_bytes: int


class LogDirsError(Exception):
    """A broker's answer that describes no log dirs; one line for a person."""


def log_dirs_of(response: Any) -> list[LogDirInfo]:
    """The log dirs a DescribeLogDirs response (any version) describes; LogDirsError for a top-level error (v3+)."""
    top_level = getattr(response, "error_code", error_code(None))
    if top_level != error_code(None):
        raise LogDirsError(top_level.name.upper())
    return [
        LogDirInfo(
            path=str(result.log_dir),
            error=None if result.error_code == error_code(None) else result.error_code.name.upper(),
            replicas=[
                ReplicaInfo(
                    topic=str(topic.name),
                    partition=int(p.partition_index),
                    size=int(p.partition_size),
                    offset_lag=int(p.offset_lag),
                    is_future=bool(p.is_future_key),
                )
                for topic in result.topics
                for p in topic.partitions
            ],
            total_bytes=int(getattr(result, "total_bytes", -1)),
            usable_bytes=int(getattr(result, "usable_bytes", -1)),
        )
        for result in response.results
    ]


def keep_topics(log_dirs: list[LogDirInfo], topics: set[str]) -> list[LogDirInfo]:
    """--topic-list: only the partitions of `topics` (every partition when it is empty), every dir still listed."""
    if not topics:
        return log_dirs
    return [
        LogDirInfo(d.path, d.error, [r for r in d.replicas if r.topic in topics], d.total_bytes, d.usable_bytes)
        for d in log_dirs
    ]


def kafka_document(described: dict[int, list[LogDirInfo]]) -> dict[str, Any]:
    """kafka-log-dirs.sh --describe's JSON (its third line)."""
    return {
        "version": 1,
        "brokers": [
            {
                "broker": broker,
                "logDirs": [
                    {
                        "logDir": d.path,
                        "error": d.error,
                        "partitions": [
                            {
                                "partition": f"{r.topic}-{r.partition}",
                                "size": r.size,
                                "offsetLag": r.offset_lag,
                                "isFuture": r.is_future,
                            }
                            for r in d.replicas
                        ],
                    }
                    for d in log_dirs
                ],
            }
            for broker, log_dirs in described.items()
        ],
    }


COLUMNS = ("BROKER", "DIR", "PARTITION", "SIZE", "OFFSET-LAG", "FUTURE")
WIDE_COLUMNS = (*COLUMNS, "DIR-TOTAL", "DIR-USABLE")


def table_rows(described: dict[int, list[LogDirInfo]], wide: bool) -> list[list[str | Text]]:
    rows: list[list[str | Text]] = []
    for broker, log_dirs in described.items():
        for d in log_dirs:
            dir_columns = [_bytes(d.total_bytes), _bytes(d.usable_bytes)] if wide else []
            if d.error is not None:
                rows.append([str(broker), d.path, Text(d.error, style="red"), "", "", "", *dir_columns])
                continue
            if not d.replicas:
                rows.append([str(broker), d.path, "-", "", "", "", *dir_columns])
            for r in sorted(d.replicas, key=lambda r: (r.topic, r.partition, r.is_future)):
                rows.append(
                    [
                        str(broker),
                        d.path,
                        f"{r.topic}-{r.partition}",
                        str(r.size),
                        str(r.offset_lag),
                        str(r.is_future).lower(),
                        *dir_columns,
                    ]
                )
    return rows


def _bytes(value: int) -> str:
    return "-" if value < 0 else str(value)


# --- asking ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


async def cluster_brokers(bootstrap: str, security: ClientSecurity, timeout_s: float) -> list[BrokerAddress]:
    """The brokers DescribeCluster lists, asked of the first bootstrap server that answers."""
    said = []
    for host, port in bootstrap_addresses(bootstrap):
        try:
            connection = await KafkaConnection.open(
                host, port, client_id=CLIENT_ID, timeout_s=timeout_s, security=security
            )
        except KafkaConnectionError as e:
            said.append(f"{host}:{port}: {e}")
            continue
        try:
            response = await connection.send(describe_cluster_request(), timeout_s=timeout_s)
        except KafkaConnectionError as e:
            said.append(f"{host}:{port}: {e}")
            continue
        finally:
            await connection.close()
        if response.error_code != error_code(None):
            raise CliError(f"cannot list the brokers: {response.error_code.name.upper()}")
        return sorted(
            (BrokerAddress(int(b.broker_id), str(b.host), int(b.port)) for b in response.brokers),
            key=lambda b: b.node_id,
        )
    raise CliError(f"cannot list the brokers: {'; '.join(said)}")


async def describe_broker(broker: BrokerAddress, security: ClientSecurity, timeout_s: float) -> list[LogDirInfo]:
    response = await ask_once(
        broker.host,
        broker.port,
        API_DESCRIBE_LOG_DIRS,
        lambda version: describe_log_dirs_request(None, version=version),
        DESCRIBE_LOG_DIRS_VERSION,
        client_id=CLIENT_ID,
        timeout_s=timeout_s,
        security=security,
    )
    return log_dirs_of(response)


async def describe_log_dirs(
    bootstrap: str, security: ClientSecurity, asked: list[int], timeout_s: float
) -> dict[int, list[LogDirInfo]]:
    """{broker id: its log dirs} of every broker (those `asked`, when given), all asked at once; CliError for a
    broker not in the cluster or one that cannot answer."""
    brokers = await cluster_brokers(bootstrap, security, timeout_s)
    known = {b.node_id: b for b in brokers}
    unknown = [node_id for node_id in asked if node_id not in known]
    if unknown:
        raise CliError(
            f"the given brokers do not exist from --broker-list: {_ids(unknown)}. "
            f"Current existent brokers: {_ids(list(known))}"
        )
    chosen = [known[node_id] for node_id in dict.fromkeys(asked)] if asked else brokers

    async def ask(broker: BrokerAddress) -> list[LogDirInfo]:
        try:
            return await describe_broker(broker, security, timeout_s)
        except (KafkaConnectionError, ApiNotServedError, LogDirsError) as e:
            raise CliError(f"broker {broker.node_id} ({broker.host}:{broker.port}): {e}") from None

    answers = await asyncio.wait_for(asyncio.gather(*(ask(b) for b in chosen)), timeout_s)
    return {broker.node_id: answer for broker, answer in zip(chosen, answers, strict=True)}


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))


def _int_list(value: str, option: str) -> list[int]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not all(item.isdigit() for item in items):
        raise CliError(f"{option} must be broker ids separated by commas (0,1,2), not {value!r}")
    return [int(item) for item in items]


@click.group(name="log-dirs")
def log_dirs() -> None:
    """The brokers' log directories, as kafka-log-dirs.sh describes them."""


@log_dirs.command()
@client_options
@click.option("--broker-list", default="", metavar="ID[,...]", help="The brokers to ask (default: every broker).")
@click.option("--topic-list", default="", metavar="TOPIC[,...]", help="Only these topics' partitions (default: all).")
@click.option(
    "-o",
    "--output",
    type=click.Choice([TABLE, WIDE, JSON]),
    default=TABLE,
    show_default=True,
    help="wide: also each dir's file system's total and usable bytes; json: kafka-log-dirs.sh's document.",
)
def describe(client: ClientOptions, broker_list: str, topic_list: str, output: str) -> None:
    """Each broker's log dirs and the partitions in them: size in bytes (local segments), offset lag and whether
    it is a future log being moved in (kafka-log-dirs.sh --describe)."""
    asked = _int_list(broker_list, "--broker-list")
    topics = {topic.strip() for topic in topic_list.split(",") if topic.strip()}
    security = client.security()
    ensure_reachable(client.bootstrap, client.remaining_s(), security)
    try:
        described = asyncio.run(describe_log_dirs(client.bootstrap, security, asked, client.remaining_s()))
    except TimeoutError:
        raise CliError(f"no answer from every broker within --timeout ({client.timeout_s:g}s)") from None
    described = {broker: keep_topics(dirs, topics) for broker, dirs in described.items()}
    if output == JSON:
        click.echo(json.dumps(kafka_document(described)))
        return
    columns = WIDE_COLUMNS if output == WIDE else COLUMNS
    table = plain_table(*columns, right=("BROKER", "SIZE", "OFFSET-LAG", "DIR-TOTAL", "DIR-USABLE"))
    for row in table_rows(described, wide=output == WIDE):
        table.add_row(*row)
    output_console().print(table)

"""What every client command shares: the bootstrap option, bounded calls, and one-line errors.

The client commands (`topic`, `produce`, `consume`) use confluent-kafka (librdkafka), the client most
Kafka users run, so they exercise the broker the way real applications do.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import click
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, TopicMetadata
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tierlog.cli.local_cluster import api_versions_answered

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "TIERLOG_BOOTSTRAP"
DEFAULT_TIMEOUT_S = 10.0
_UNWRAPPED_WIDTH = 100_000

# librdkafka logs every failed connection attempt to stderr; our commands report failures themselves in
# one line, so its log goes to a logger without output.
_RDKAFKA_LOG = logging.getLogger("tierlog.cli.rdkafka")
_RDKAFKA_LOG.addHandler(logging.NullHandler())
_RDKAFKA_LOG.propagate = False

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class CliError(click.ClickException):
    """A failure told to a person in one line (click prints `Error: <message>` and exits with 1)."""


def timeout_option(default: float, help: str, minimum: float = 0.1) -> Callable[[F], F]:
    """`--timeout SECONDS`, passed to the command as `timeout_s`; every command's bound is spelt so."""
    return click.option(
        "--timeout", "timeout_s", type=click.FloatRange(min=minimum), default=default, show_default=True, help=help
    )


# `-b/--bootstrap-server`, passed to the command as `bootstrap` (also $TIERLOG_BOOTSTRAP).
bootstrap_option = click.option(
    "-b",
    "--bootstrap-server",
    "bootstrap",
    envvar=BOOTSTRAP_ENV,
    default=DEFAULT_BOOTSTRAP,
    show_default=True,
    metavar="HOST:PORT[,...]",
    help=f"Broker(s) to connect to (also ${BOOTSTRAP_ENV}).",
)


def client_options(command: F) -> F:
    """`-b/--bootstrap-server` and `--timeout`, as flags of the command itself so they go anywhere on the
    line, as in rpk."""
    command = timeout_option(DEFAULT_TIMEOUT_S, "Seconds to wait for the broker before giving up.")(command)
    return bootstrap_option(command)


def ensure_reachable(bootstrap: str, timeout_s: float) -> None:
    """Fail fast, in one line, when no bootstrap broker answers; librdkafka alone would retry until the
    timeout and then report a generic transport error."""
    addresses = []
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"bootstrap server {address.strip()!r} is not of the form host:port")
        addresses.append((host, int(port)))
    for host, port in addresses:
        if api_versions_answered(host, port, timeout_s=timeout_s):
            return
    if any(_accepts_connections(host, port) for host, port in addresses):
        raise CliError(
            f"{bootstrap} accepts connections but did not answer a Kafka request within {timeout_s:g}s: "
            "is the broker paused or overloaded? (see its log, or raise --timeout)"
        )
    raise CliError(f"cannot reach {bootstrap}: is a broker running? start one with `tierlog broker`")


def _accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def client_config(bootstrap: str, **settings: Any) -> dict[str, Any]:
    """librdkafka settings shared by the admin client, the producer and the consumer."""
    return {"bootstrap.servers": bootstrap, "client.id": "tierlog-cli", "logger": _RDKAFKA_LOG, **settings}


def admin_client(bootstrap: str, timeout_s: float) -> AdminClient:
    """An admin client of a reachable cluster (a one-line CliError otherwise)."""
    ensure_reachable(bootstrap, timeout_s)
    # librdkafka's admin handle is a producer underneath, whose metadata requests would auto-create any
    # topic they name (auto.create.topics.enable): describing a typo must not create it.
    return AdminClient(client_config(bootstrap, **{"allow.auto.create.topics": False}))


def future_result(future: Future[T], subject: str, timeout_s: float) -> T:
    """The admin future's value, or a one-line CliError. The wait is bounded even if librdkafka's own
    request timeout were not honoured."""
    try:
        return future.result(timeout=timeout_s + 1)
    except KafkaException as e:
        raise CliError(kafka_error_message(e.args[0], subject)) from None
    except FutureTimeout:
        raise CliError(f"{subject}: the broker did not answer within {timeout_s:g}s") from None


def kafka_error_message(error: KafkaError, subject: str) -> str:
    """One line for a Kafka error about `subject` (e.g. "topic 'orders'"), with what to do where we know."""
    code = error.code()
    if code == KafkaError.TOPIC_ALREADY_EXISTS:
        return f"{subject} already exists"
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_TOPIC_ID):
        return f"{subject} does not exist (`tierlog topic list` shows the topics)"
    if code == KafkaError._UNKNOWN_PARTITION:
        return f"{subject} has no such partition (`tierlog topic describe` shows its partitions)"
    if code == KafkaError.NON_EMPTY_GROUP:
        return f"{subject} has active members: stop its consumers first"
    if code == KafkaError.GROUP_ID_NOT_FOUND:
        return f"{subject} does not exist (`tierlog groups list` shows the groups)"
    if code in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT):
        return f"{subject}: the broker did not answer in time (raise --timeout, or check the broker's log)"
    return f"{subject}: {error.str()} ({error.name()})"


def topic_metadata(client: AdminClient | Consumer, name: str, timeout_s: float) -> TopicMetadata:
    """One topic's metadata, or a one-line CliError when it does not exist or the broker reports an error
    for it."""
    subject = f"topic {name!r}"
    try:
        metadata = client.list_topics(topic=name, timeout=timeout_s)
    except KafkaException as e:
        raise CliError(kafka_error_message(e.args[0], subject)) from None
    topic = metadata.topics.get(name)
    if topic is None:
        raise CliError(kafka_error_message(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), subject))
    if topic.error is not None:
        raise CliError(kafka_error_message(topic.error, subject))
    return topic


def parse_key_values(values: tuple[str, ...], option: str) -> list[tuple[str, str]]:
    """`key=value` items of a repeatable option, in order (headers may repeat a key)."""
    pairs = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not of the form key=value", param_hint=option)
        pairs.append((key.strip(), value.strip()))
    return pairs


_ESCAPES = {"\\t": "\t", "\\n": "\n", "\\r": "\r", "\\\\": "\\"}


def unescape(text: str) -> str:
    r"""Turn `\t`, `\n`, `\r` and `\\` typed on a command line into the characters, as kcat does for its
    delimiters and formats (a literal tab is awkward to type in a shell)."""
    return re.sub(r"\\[tnr\\]", lambda m: _ESCAPES[m.group()], text)


def output_console() -> Console:
    """Rich output on stdout. Tables fit a terminal; piped into grep or a file, lines are never wrapped
    (rich would otherwise wrap at 80 columns and split a topic name over two lines)."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=_UNWRAPPED_WIDTH)
    return console


def progress_bar(console: Console) -> Progress:
    """A rich progress display for counted work: description, bar, done/total, time elapsed."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    )

"""What every client command shares: where the brokers are, the user's librdkafka settings, bounded calls,
and one-line errors.

The client commands (`topic`, `groups`, `produce`, `consume`) use confluent-kafka (librdkafka), the client
most Kafka users run, so they exercise the broker the way real applications do. `-X key=value` and
`--command-config FILE` pass librdkafka settings through, as kcat -X and Kafka's tools' --command-config do.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import queue
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, TopicMetadata
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tierlog.client.probes import answers_api_versions
from tierlog.client.security import ClientSecurity
from tierlog.client.security_settings import SecuritySettingError, client_security
from tierlog.config import parse_properties
from tierlog.security.authorizer import STANDARD_AUTHORIZER

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "TIERLOG_BOOTSTRAP"
DEFAULT_TIMEOUT_S = 10.0
_UNWRAPPED_WIDTH = 100_000
# librdkafka reads a timeout of 0 as "none": what is left of a spent deadline is this instead.
_MIN_WAIT_S = 0.01
# An admin future is waited for this much past the request's own timeout, so librdkafka's timeout error,
# which names the request, is the one told.
_FUTURE_GRACE_S = 0.5


# librdkafka starts each log line with the thread that wrote it.
_THREAD_PREFIX = re.compile(r"^\[thrd:[^\]]*\]: ")


class _ConfigWarnings(logging.Handler):
    """librdkafka logs every failed connection attempt; our commands report failures themselves in one line,
    so its log is dropped, except its CONFWARN lines (a setting this kind of client ignores, a deprecated
    one), which a person who passed -X or --command-config needs to see, as kcat shows them."""

    def emit(self, record: logging.LogRecord) -> None:
        # confluent-kafka logs ("%s [%s] %s", facility, client name, message).
        args = record.args
        if isinstance(args, tuple) and len(args) == 3 and args[0] == "CONFWARN":
            click.echo(f"% {_THREAD_PREFIX.sub('', str(args[2]))}", err=True)


class _BrokerRefusals:
    """The brokers' refusals of the client's credentials or TLS, which librdkafka reports only to error_cb (served
    by poll) while the call that failed says `Broker transport failure` or times out: kept so that the one line
    a command ends with can name the real cause."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget earlier commands' clients (one process may run several: the tests' CliRunner)."""
        self._handles: list[Producer | Consumer | AdminClient] = []
        self._first: str | None = None

    def record(self, error: KafkaError) -> None:
        if self._first is None and error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            what = "authentication failed" if error.code() == KafkaError._AUTHENTICATION else "TLS failed"
            self._first = f"{what}: {error.str()}"

    def watch(self, handle: Producer | Consumer | AdminClient) -> None:
        self._handles.append(handle)

    def reason(self) -> str | None:
        """The first refusal reported so far (the command is failing: serving callbacks now loses nothing)."""
        for handle in self._handles:
            with contextlib.suppress(RuntimeError):  # a consumer the command has closed already
                handle.poll(0)
        return self._first


_REFUSALS = _BrokerRefusals()


def broker_refusal() -> str | None:
    """Why the brokers refused this command's clients (credentials, TLS), if they did: for a failure librdkafka
    reports as no answer."""
    return _REFUSALS.reason()


_RDKAFKA_LOG = logging.getLogger("tierlog.cli.rdkafka")
_RDKAFKA_LOG.addHandler(_ConfigWarnings())
_RDKAFKA_LOG.propagate = False
# For the clients made only to find which setting librdkafka refuses: their warnings are not the user's.
_SILENT_LOG = logging.getLogger("tierlog.cli.rdkafka.silent")
_SILENT_LOG.addHandler(logging.NullHandler())
_SILENT_LOG.propagate = False

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
K = TypeVar("K")
C = TypeVar("C", Producer, Consumer, AdminClient)


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


@dataclass(frozen=True)
class ClientOptions:
    """What every client command is given: where the brokers are, the deadline of the whole call, and the
    user's librdkafka settings (--command-config, then -X over it) with where each came from."""

    bootstrap: str
    timeout_s: float
    deadline: float  # time.monotonic() by which the call must be done
    settings: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # setting -> "-X" or "--command-config FILE"

    def remaining_s(self) -> float:
        """What is left of --timeout."""
        return max(self.deadline - time.monotonic(), _MIN_WAIT_S)

    def config(
        self,
        defaults: Mapping[str, Any] | None = None,
        given: Mapping[str, Any] | None = None,
        required: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One client's librdkafka settings, later layers winning as in Kafka's console tools: the command's
        `defaults` (its flags' defaults among them), --command-config, -X, the command's flags `given` on the
        line, and what the command cannot work without (`required`; a user setting against one of them is
        an error). librdkafka applies them in this order, so of two aliases (compression.codec and
        compression.type) the later one wins too."""
        for key, value in (required or {}).items():
            if key in self.settings and self.settings[key].lower() != str(value).lower():
                raise CliError(f"{self.describe(key)}: this command needs {key}={str(value).lower()}")
        layers: list[Mapping[str, Any]] = [
            {"client.id": "tierlog-cli"},
            defaults or {},
            self.settings,
            given or {},
            {"bootstrap.servers": self.bootstrap, "logger": _RDKAFKA_LOG, "error_cb": _REFUSALS.record},
            required or {},
        ]
        merged: dict[str, Any] = {}
        for layer in layers:
            for key, value in layer.items():
                merged.pop(key, None)  # re-inserted at the end, where librdkafka will apply it
                merged[key] = value
        return merged

    def describe(self, key: str) -> str:
        """A user setting as a person wrote it: `client setting linger.ms=5 (-X)`."""
        return f"client setting {key}={self.settings[key]} ({self.origins[key]})"

    def security(self) -> ClientSecurity:
        """The user's security.protocol, sasl.* and ssl.* settings as tierlog's own connections take them (the
        reachability probe's TLS handshake); a one-line CliError naming a setting that cannot be used."""

        def describe(key: str) -> str:
            return self.describe(key) if key in self.settings else f"client setting {key} (not set)"

        try:
            return client_security(self.settings, describe)
        except SecuritySettingError as e:
            raise CliError(str(e)) from None


def client_options(command: F) -> F:
    """`-b/--bootstrap-server`, `--timeout`, `-X KEY=VALUE` and `--command-config FILE`, as options of the
    command itself so they go anywhere on the line (as in rpk), handed to it as `client: ClientOptions`.

    Precedence is Kafka's console tools': an option given on the command line beats -X, -X beats the
    --command-config file, and the file beats an option's default (built in, or $TIERLOG_BOOTSTRAP for
    -b). So `-X bootstrap.servers=...` is used unless -b is on the line."""

    @functools.wraps(command)
    def with_client(
        *args: Any,
        bootstrap: str,
        timeout_s: float,
        client_settings: tuple[str, ...],
        command_config: Path | None,
        **kwargs: Any,
    ) -> Any:
        deadline = time.monotonic() + timeout_s
        _REFUSALS.reset()
        settings, origins = read_client_settings(client_settings, command_config)
        bootstrap = take_bootstrap(settings, bootstrap)
        return command(*args, client=ClientOptions(bootstrap, timeout_s, deadline, settings, origins), **kwargs)

    decorated = client_settings_options(with_client)
    decorated = timeout_option(DEFAULT_TIMEOUT_S, "Seconds the whole call may take before it gives up.")(decorated)
    return bootstrap_option(decorated)  # type: ignore[return-value]


def client_settings_options(command: F) -> F:
    """`-X KEY=VALUE` and `--command-config FILE`, passed to the command as `client_settings` and
    `command_config` (`read_client_settings` reads them)."""
    decorated = click.option(
        "--command-config",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        metavar="FILE",
        help="A .properties file of librdkafka settings, as Kafka's tools' --command-config (kcat -F's too).",
    )(command)
    return click.option(
        "-X",
        "client_settings",
        multiple=True,
        metavar="KEY=VALUE",
        help="A librdkafka setting, e.g. -X linger.ms=50 or -X security.protocol=SASL_SSL (repeatable, as kcat "
        "-X; wins over --command-config).",
    )(decorated)


def read_client_settings(
    client_settings: tuple[str, ...], command_config: Path | None
) -> tuple[dict[str, str], dict[str, str]]:
    """The user's librdkafka settings, --command-config's then -X's over them, and where each came from."""
    settings: dict[str, str] = {}
    origins: dict[str, str] = {}
    if command_config is not None:
        try:
            from_file = parse_properties(command_config.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise click.BadParameter(f"cannot read {command_config}: {e}", param_hint="--command-config") from None
        settings.update(from_file)
        origins.update(dict.fromkeys(from_file, f"--command-config {command_config}"))
    for key, value in parse_key_values(client_settings, "-X"):
        settings.pop(key, None)  # re-inserted after the file's: librdkafka applies it after their aliases
        settings[key] = value
        origins[key] = "-X"
    return settings, origins


def take_bootstrap(settings: dict[str, str], bootstrap: str) -> str:
    """The brokers to use: -b if it is on the line, else bootstrap.servers from the settings (which it leaves
    them without), else -b's default."""
    # metadata.broker.list is librdkafka's alias of bootstrap.servers (kcat's -b sets it).
    listed = [settings.pop(key) for key in ("metadata.broker.list", "bootstrap.servers") if key in settings]
    return listed[-1] if listed and not flag_given("bootstrap") else bootstrap


def flag_given(param: str) -> bool:
    """Whether the current command's option `param` is on the command line (not a default, nor from an
    environment variable: those yield to -X and --command-config)."""
    return click.get_current_context().get_parameter_source(param) == ParameterSource.COMMANDLINE


def flag_settings(flags: Mapping[str, tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the command's options that stand for librdkafka settings ({setting: (option, value)}) into the
    `defaults` and `given` of `ClientOptions.config`; an option without a value sets nothing."""
    defaults: dict[str, Any] = {}
    given: dict[str, Any] = {}
    for key, (param, value) in flags.items():
        if value is not None:
            (given if flag_given(param) else defaults)[key] = value
    return defaults, given


def connect(factory: Callable[[dict[str, Any]], C], client: ClientOptions, config: dict[str, Any]) -> C:
    """A librdkafka client (`factory(config)`) of a reachable cluster, or a one-line CliError. The settings
    are checked first (the security ones by tierlog, which names the setting, then all by librdkafka), so a
    refused one is told even when no broker is up."""
    security = client.security()
    try:
        handle = factory(config)
    except KafkaException as e:
        raise CliError(_refusal(factory, client, config, e.args[0])) from None
    ensure_reachable(client.bootstrap, client.remaining_s(), security)
    _REFUSALS.watch(handle)
    return handle


def _refusal(
    factory: Callable[[dict[str, Any]], Any], client: ClientOptions, config: dict[str, Any], error: KafkaError
) -> str:
    """The line for settings librdkafka refused: which of the user's settings (tried one at a time with the
    command's own, since librdkafka's message may name an alias or another setting) and librdkafka's reason."""
    reason = error.str()
    own = {key: value for key, value in config.items() if key not in client.settings and key != "bootstrap.servers"}
    own["logger"] = _SILENT_LOG
    for key, value in client.settings.items():
        try:
            factory({**own, key: value})
        except KafkaException:
            return f"{client.describe(key)}: {reason}"
    return f"librdkafka refused the client settings: {reason}"


def admin_client(client: ClientOptions) -> AdminClient:
    """An admin client of a reachable cluster (a one-line CliError otherwise)."""
    # librdkafka's admin handle is a producer underneath, whose metadata requests would auto-create any
    # topic they name (auto.create.topics.enable): describing a typo must not create it.
    return connect(AdminClient, client, client.config(defaults={"allow.auto.create.topics": False}))


def client_config(bootstrap: str, **settings: Any) -> dict[str, Any]:
    """librdkafka settings of a client that tierlog itself configures (the demo's), without -X."""
    return {"bootstrap.servers": bootstrap, "client.id": "tierlog-cli", "logger": _RDKAFKA_LOG, **settings}


# --- reachability ------------------------------------------------------------------------------------------


class _Reach(enum.Enum):
    ANSWERED = "answered"
    UNRESOLVED = "unresolved"  # DNS has no address for the host
    REFUSED = "refused"  # nothing listens there (or a firewall rejects)
    SILENT = "silent"  # accepts the connection, no Kafka answer
    TLS_FAILED = "tls-failed"  # the TLS handshake failed (an untrusted certificate, not a TLS listener)
    UNCONNECTED = "unconnected"  # no answer to connecting in time: a host down, or a firewall dropping


@dataclass(frozen=True)
class _Probe:
    host: str
    port: int
    reach: _Reach = _Reach.UNCONNECTED
    detail: str = ""  # the resolver's or the socket's reason
    final: bool = True  # False: connected, the Kafka answer still awaited (SILENT should the time run out)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def phrase(self, timeout_s: str) -> str:
        if self.reach is _Reach.UNRESOLVED:
            return f"cannot resolve {self.host} ({self.detail})"
        if self.reach is _Reach.REFUSED:
            return self.detail.lower()
        if self.reach is _Reach.SILENT:
            return "accepts connections but did not answer a Kafka request"
        if self.reach is _Reach.TLS_FAILED:
            return f"TLS handshake failed ({self.detail})"
        return f"no answer to connecting within {timeout_s}s"


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """The distinct host:port pairs of a bootstrap list; a one-line CliError for one that is not."""
    addresses = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"bootstrap server {item.strip()!r} is not of the form host:port")
        addresses.append((host.strip("[]"), int(port)))  # [::1]:9092: the brackets are not the host's
    return list(dict.fromkeys(addresses))


def ensure_reachable(bootstrap: str, timeout_s: float, security: ClientSecurity) -> None:
    """Return once one bootstrap server answers ApiVersions (over TLS when `security` says so: Kafka answers
    it before any SASL authentication); else fail in one line saying what each did. librdkafka alone would
    retry until its timeout and then report a generic transport error.

    Every address is probed at once, so `timeout_s` bounds the whole probe however many there are and
    however they fail (a name that does not resolve, a refused or dropped connection, a silent listener)."""
    addresses = bootstrap_addresses(bootstrap)
    deadline = time.monotonic() + timeout_s
    answers: queue.SimpleQueue[_Probe] = queue.SimpleQueue()
    for host, port in addresses:
        # Daemon threads: one stuck in the resolver or in connect must not keep the command alive after it
        # gave up.
        threading.Thread(target=_probe, args=(host, port, deadline, security, answers.put), daemon=True).start()
    latest: dict[tuple[str, int], _Probe] = {}
    finished = 0
    while finished < len(addresses):
        try:
            probe = answers.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            break
        if probe.reach is _Reach.ANSWERED:
            return
        latest[(probe.host, probe.port)] = probe
        finished += probe.final
    probes = [latest.get(address, _Probe(*address)) for address in addresses]
    raise CliError(_unreachable(probes, bootstrap, f"{round(timeout_s, 1):g}", security))


def _probe(host: str, port: int, deadline: float, security: ClientSecurity, report: Callable[[_Probe], None]) -> None:
    """Probe one address, `report`ing its outcome (and, first, that it accepted the connection)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        report(_Probe(host, port, _Reach.UNRESOLVED, e.strerror or str(e)))
        return
    failure = _Probe(host, port)
    for family, kind, proto, _, sockaddr in infos:  # an IPv6 and an IPv4 address of localhost, say
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(remaining)
                sock.connect(sockaddr)
                report(_Probe(host, port, _Reach.SILENT, final=False))
                if security.ssl_context is not None:
                    try:
                        with security.ssl_context.wrap_socket(sock, server_hostname=host) as tls:
                            answered = answers_api_versions(tls)
                    except ssl.SSLError as e:
                        report(_Probe(host, port, _Reach.TLS_FAILED, _tls_reason(e)))
                        return
                    except (TimeoutError, ConnectionError):  # no handshake from the peer: silent, as in plaintext
                        report(_Probe(host, port, _Reach.SILENT))
                        return
                else:
                    answered = answers_api_versions(sock)
                report(_Probe(host, port, _Reach.ANSWERED if answered else _Reach.SILENT))
                return
        except TimeoutError:
            failure = _Probe(host, port)
        except OSError as e:
            failure = _Probe(host, port, _Reach.REFUSED, e.strerror or str(e))
    report(failure)


def _tls_reason(error: ssl.SSLError) -> str:
    """OpenSSL's reason without Python's decoration: `certificate verify failed: self-signed certificate`."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {error.verify_message}"
    return str(error.reason or error.strerror or error).lower().replace("_", " ")


def _unreachable(probes: list[_Probe], bootstrap: str, timeout_s: str, security: ClientSecurity) -> str:
    """One line for bootstrap servers none of which answered: what they all did, or what each did."""
    reaches = {probe.reach for probe in probes}
    if reaches == {_Reach.UNRESOLVED}:
        hosts = ", ".join(dict.fromkeys(probe.host for probe in probes))
        return f"cannot resolve {hosts} ({probes[0].detail}): is the bootstrap server's host name right?"
    if reaches == {_Reach.REFUSED}:
        return f"cannot reach {bootstrap}: is a broker running? start one with `tierlog broker`"
    if reaches == {_Reach.SILENT}:
        if security.ssl_context is None:
            return (
                f"{bootstrap} accepts connections but did not answer a Kafka request within {timeout_s}s: is it "
                "a TLS listener (then set -X security.protocol=SSL or SASL_SSL), or is the broker paused or "
                "overloaded? (see its log, or raise --timeout)"
            )
        return (
            f"{bootstrap} accepts connections but did not answer a Kafka request within {timeout_s}s: "
            "is the broker paused or overloaded? (see its log, or raise --timeout)"
        )
    if reaches == {_Reach.TLS_FAILED}:
        return (
            f"TLS handshake with {bootstrap} failed ({probes[0].detail}): is it a TLS listener, and does "
            "ssl.ca.location hold the CA that signed its certificate?"
        )
    if reaches == {_Reach.UNCONNECTED}:
        return (
            f"cannot reach {bootstrap}: no answer to connecting within {timeout_s}s "
            "(is the host down, or a firewall dropping the connection?)"
        )
    return "cannot reach any bootstrap server: " + "; ".join(f"{p.address} {p.phrase(timeout_s)}" for p in probes)


def future_result(future: Future[T], subject: str, client: ClientOptions) -> T:
    """The admin future's value, or a one-line CliError. The wait ends with the call's deadline even if
    librdkafka's own request timeout were not honoured."""
    try:
        return future.result(timeout=client.remaining_s() + _FUTURE_GRACE_S)
    except KafkaException as e:
        raise CliError(kafka_error_message(e.args[0], subject)) from None
    except FutureTimeout:
        raise CliError(f"{subject}: the broker did not answer within {client.timeout_s:g}s") from None


def results_or_errors(
    futures: Mapping[K, Future[T]], subject: Callable[[K], str], client: ClientOptions
) -> dict[K, T | str]:
    """Each admin future's value, or its one-line error (future_result's, about `subject(key)`), so one failed
    topic, group or partition does not hide the others."""
    outcome: dict[K, T | str] = {}
    for key, future in futures.items():
        try:
            outcome[key] = future_result(future, subject(key), client)
        except CliError as e:
            outcome[key] = e.message
    return outcome


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
    if code == KafkaError.RESOURCE_NOT_FOUND:
        return f"{subject} does not exist"
    if code == KafkaError.SECURITY_DISABLED:
        return f"{subject}: the broker has no authorizer (set authorizer.class.name={STANDARD_AUTHORIZER} to use ACLs)"
    if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT):
        refusal = broker_refusal()
        if refusal is not None:
            return f"{subject}: {refusal}"
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

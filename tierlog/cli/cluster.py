"""`tierlog cluster up|status|down|start|stop|kill|restart`: a local multi-broker cluster for trying
replication, as `rpk container`.

`up` starts the brokers detached and records them in `<dir>/cluster.json`; `status`, `down`, the commands on
one node (`start`, `stop`, `kill`, `restart`) and `tierlog trace --dir` find them there, and `start` and
`restart` record the new process there. `status` asks every broker's HTTP listener for its partitions and
merges the answers: the leader's view of a partition is the authoritative one (ISR, HW, remote LEOs, and
the two tiers of KIP-405 tiered storage), while each replica's LEO comes from that replica's own report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tierlog.cli.clients import CliError, output_console, parse_key_values, progress_bar, timeout_option
from tierlog.cli.tables import WIDE, add_column, include_internal_option, is_internal, output_option, plain_table
from tierlog.client.probes import api_versions_answered
from tierlog.testing.local_cluster import (
    BrokerProcess,
    BrokerStartError,
    LocalCluster,
    StartProgress,
)
from tierlog.testing.local_security import CLIENT_LISTENER, SASL_MECHANISM, LocalSecurity

DEFAULT_DIR = Path("/tmp/tierlog-cluster")
CLUSTER_FILE = "cluster.json"
# Where `up --secure` writes the CA, the broker key store and the client settings, inside the cluster's dir.
SECURITY_DIR = "security"
_FILE_VERSION = 1
_STOP_POLL_S = 0.05
# How long a SIGKILLed process may take to disappear before we call it stuck.
_KILL_WAIT_S = 5.0

F = TypeVar("F", bound=Callable[..., Any])


# --- cluster.json -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    node_id: int
    pid: int
    roles: str  # process.roles
    # host:port of the client listener (PLAINTEXT, or SASL_SSL in a secured cluster); a dedicated controller's
    # controller listener, its only one.
    kafka: str
    http: str  # "" for a dedicated controller, which serves no HTTP
    data_dir: str
    log_file: str
    # The broker's server.properties overrides, so `cluster start` runs it again as `up` did. None in a file
    # written before `cluster start` existed.
    overrides: dict[str, str] | None = None
    # A secured cluster's PLAINTEXT inter-broker listener (127.0.0.1), where `cluster start` asks if it is up.
    internal: str | None = None

    def describe(self) -> str:
        return f"pid {self.pid}, {self.kafka}"

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles.split(",")

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles.split(",")


@dataclass(frozen=True)
class ClusterInfo:
    """What `cluster up` started: everything `status`, `down` and `trace` need to find the brokers."""

    bootstrap: str
    controller: str  # every voter's controller listener, host:port,... (`quorum status --bootstrap-controller`)
    nodes: list[NodeInfo]
    # A secured cluster's client settings (librdkafka's names), for `--command-config`; None when PLAINTEXT.
    client_config: str | None = None

    @classmethod
    def of(cls, cluster: LocalCluster) -> ClusterInfo:
        nodes = []
        for node_id in cluster.node_ids:
            broker = cluster.broker(node_id)
            if broker.pid is None:
                raise RuntimeError(f"broker {node_id} was never started")
            is_broker = node_id in cluster.broker_ids
            nodes.append(
                NodeInfo(
                    node_id=node_id,
                    pid=broker.pid,
                    roles=cluster.roles(node_id),
                    kafka=broker.bootstrap,
                    http=cluster.http_address(node_id) if is_broker else "",
                    data_dir=str(broker.log_dir),
                    log_file=str(broker.log_file),
                    overrides=broker.overrides,
                    internal=f"127.0.0.1:{broker.probe_port}" if cluster.security is not None and is_broker else None,
                )
            )
        client_config = None if cluster.security is None else str(cluster.security.client_config_file)
        return cls(cluster.bootstrap, ",".join(cluster.controller_addresses), nodes, client_config)

    def to_json(self) -> str:
        return json.dumps({"version": _FILE_VERSION, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterInfo:
        document = json.loads(text)
        if document.get("version") != _FILE_VERSION:
            raise ValueError(f"unknown version {document.get('version')!r}")
        return cls(
            bootstrap=document["bootstrap"],
            controller=document["controller"],
            nodes=[NodeInfo(**node) for node in document["nodes"]],
            client_config=document.get("client_config"),
        )


def cluster_file(directory: Path) -> Path:
    return directory / CLUSTER_FILE


def write_cluster_info(directory: Path, info: ClusterInfo) -> None:
    """Replace `directory`'s cluster.json at once: a command reading it meanwhile sees the old or the new one."""
    path = cluster_file(directory)
    partial = path.with_name(path.name + ".new")
    partial.write_text(info.to_json())
    partial.replace(path)


def read_cluster_info(directory: Path) -> ClusterInfo:
    """The cluster recorded in `directory`, or a one-line CliError saying how to start one."""
    path = cluster_file(directory)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CliError(f"no cluster in {directory} (no {CLUSTER_FILE}): start one with `tierlog cluster up`") from None
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from None
    try:
        return ClusterInfo.from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"{path} is not a cluster file written by `tierlog cluster up` ({e})") from None


def broker_alive(pid: int) -> bool:
    """True while `pid` is a live tierlog process. A zombie is not, nor is a pid the OS has since given to
    another program: `down` must never signal a stranger."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass  # not our child: the usual case, as the `cluster up` that started it has exited
    proc = Path("/proc")
    if proc.is_dir():
        try:
            # The state follows the parenthesised command name, which may itself contain spaces.
            state = (proc / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
            cmdline = (proc / str(pid) / "cmdline").read_bytes()
        except (OSError, IndexError):
            return False
        return state != "Z" and b"tierlog" in cmdline
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --- HTTP (the brokers' tierlog.http.listener) -------------------------------------------------------------


class HttpError(Exception):
    """A broker's HTTP listener could not be reached or did not answer 200; the message is one line."""


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not of the form host:port")
    return host, int(port)


@asynccontextmanager
async def http_get(address: str, path: str, timeout_s: float) -> AsyncIterator[AsyncIterator[bytes]]:
    """GET `path` from `address` with aiohttp's client; the context is the body, read as it arrives, and the
    connection is closed on leaving it.

    Connecting and the answer's head are bounded by `timeout_s` (HttpError, as for an answer other than
    200); the body is not, since a trace stream never ends: the caller bounds it. A connection lost
    mid-body raises ConnectionError."""
    # Imported here: aiohttp takes about 0.15 s to import, which only the commands that use HTTP should pay.
    import aiohttp

    host, port = split_address(address)
    url = f"http://{host}:{port}{path}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        try:
            async with asyncio.timeout(timeout_s):
                response = await session.get(url)
        except TimeoutError:
            raise HttpError(f"{address} did not answer GET {path} within {timeout_s:g}s") from None
        except aiohttp.ClientConnectorError as e:
            raise HttpError(f"cannot reach {address}: {e.strerror or e}") from None
        except aiohttp.ServerDisconnectedError as e:
            raise HttpError(f"{address} closed the connection before answering GET {path} ({e})") from None
        except aiohttp.ClientError as e:
            raise HttpError(f"{address} did not answer GET {path} in HTTP ({e})") from None

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_any():
                    yield chunk
            except aiohttp.ClientError as e:
                raise ConnectionError(f"the answer to GET {path} broke off ({e})") from e

        async with response:
            if response.status != 200:
                raise HttpError(f"{address} answered GET {path} with HTTP {response.status} {response.reason}")
            yield body()


async def http_get_json(address: str, path: str, timeout_s: float) -> Any:
    """The JSON document at `path`, the whole exchange bounded by `timeout_s`; HttpError otherwise."""
    try:
        async with asyncio.timeout(timeout_s), http_get(address, path, timeout_s) as body:
            document = b"".join([chunk async for chunk in body])
    except TimeoutError:
        raise HttpError(f"{address} did not send GET {path} within {timeout_s:g}s") from None
    except (OSError, asyncio.IncompleteReadError) as e:
        raise HttpError(f"{address} broke off GET {path} ({e})") from None
    try:
        return json.loads(document)
    except ValueError:
        raise HttpError(f"{address} answered GET {path} with something that is not JSON") from None


# --- status: merging every broker's /v1/partitions ---------------------------------------------------------


@dataclass(frozen=True)
class BrokerReport:
    """One broker's answer to GET /v1/partitions, or why there is none."""

    node_id: int
    http: str
    partitions: list[dict[str, Any]] | None
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.partitions is not None


@dataclass(frozen=True)
class PartitionStatus:
    """A partition as the cluster sees it. `view_of` is the broker whose report gave leader, epochs, ISR
    and HW: the leader's, or the most recent follower's when no leader reported. `log_end_offsets` has one
    entry per replica and per other broker that reported the partition, each from that broker's own report
    (None: a replica that did not report it).

    The tiers (docs/tiered-storage.md#offsets) are the view's too: the log spans [Rx, Lz), the remote tier
    holds [Rx, Ry] and the view broker's disk [Lx, Lz), with Ly the HW (the LSO without transactions). So
    Rx = `log_start_offset`, Ly = `high_watermark`, Lx = `local_log_start_offset`, Lz = `log_end_offset` (the
    view broker's own LEO), Ry = `highest_offset_in_remote_storage` (-1 before the first copy). The remote
    fields are None when the remote tier is off for the partition (and every new field when a broker's report
    predates them)."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: list[int]
    isr: list[int]
    high_watermark: int
    log_start_offset: int
    view_of: int
    log_end_offsets: dict[int, int | None]
    remote_log_end_offsets: dict[int, int] = field(default_factory=dict)
    local_log_start_offset: int | None = None
    log_end_offset: int | None = None
    local_size_bytes: int | None = None
    highest_offset_in_remote_storage: int | None = None
    remote_size_bytes: int | None = None
    remote_segments: int | None = None
    copy_lag_bytes: int | None = None

    @property
    def remote_tier(self) -> bool:
        """Whether the view broker has the remote tier on for this partition."""
        return self.remote_size_bytes is not None


def merge_partition_reports(reports: Sequence[BrokerReport]) -> list[PartitionStatus]:
    """One PartitionStatus per partition any broker reported, sorted by topic and partition."""
    views: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for report in reports:
        for entry in report.partitions or []:
            views.setdefault((entry["topic"], entry["partition"]), {})[report.node_id] = entry
    merged = []
    for (topic, partition), by_broker in sorted(views.items()):
        # The newest view wins: a deposed leader that has not heard of its successor still says "leader",
        # with an older epoch than the followers already know.
        view_of, view = max(
            by_broker.items(),
            key=lambda item: (item[1]["leader_epoch"], item[1]["partition_epoch"], item[1]["role"] == "leader"),
        )
        replicas = list(view["replicas"])
        # A broker that reports the partition without being among the view's replicas (a stale one, or a
        # view that lists none) still has a log whose LEO is worth seeing.
        holders = replicas + sorted(set(by_broker) - set(replicas))
        log_end_offsets: dict[int, int | None] = {
            broker: by_broker[broker]["log_end_offset"] if broker in by_broker else None for broker in holders
        }
        remote = (view.get("remote_replicas") or {}) if view["role"] == "leader" else {}
        # A broker reports the remote tier's sizes only for partitions it has the tier on for.
        tiered = "remote_size_bytes" in view
        merged.append(
            PartitionStatus(
                topic=topic,
                partition=partition,
                leader=view["leader"],
                leader_epoch=view["leader_epoch"],
                partition_epoch=view["partition_epoch"],
                replicas=replicas,
                isr=list(view["isr"]),
                high_watermark=view["high_watermark"],
                log_start_offset=view["log_start_offset"],
                view_of=view_of,
                log_end_offsets=log_end_offsets,
                remote_log_end_offsets={int(b): state["log_end_offset"] for b, state in remote.items()},
                local_log_start_offset=view.get("local_log_start_offset"),
                log_end_offset=view.get("log_end_offset"),
                local_size_bytes=view.get("local_size_bytes"),
                highest_offset_in_remote_storage=view.get("highest_offset_in_remote_storage") if tiered else None,
                remote_size_bytes=view.get("remote_size_bytes"),
                remote_segments=view.get("remote_segments"),
                copy_lag_bytes=view.get("copy_lag_bytes"),
            )
        )
    return merged


def status_document(
    reports: Sequence[BrokerReport], statuses: Sequence[PartitionStatus], controllers: Mapping[int, bool] | None = None
) -> dict[str, Any]:
    """What `cluster status --json` prints (JSON object keys are strings, so broker ids become "1", "2");
    `controllers`: each dedicated controller, whether it is up."""
    return {
        "brokers": [
            {"node_id": r.node_id, "http": r.http, "up": r.up, "error": r.error}
            for r in sorted(reports, key=lambda r: r.node_id)
        ],
        "controllers": [{"node_id": node_id, "up": up} for node_id, up in sorted((controllers or {}).items())],
        "partitions": [asdict(status) for status in statuses],
    }


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


_TIER_COLUMNS = ("Rx", "Ry", "Lx", "Ly", "Lz", "LOCAL", "REMOTE", "COPY-LAG")


def _offset(value: int | None) -> str:
    return "-" if value is None else str(value)


def human_bytes(size: int | None) -> str:
    """1023 -> "1023B", 16384 -> "16.0KiB", None -> "-"; no space, so a table row splits into one word per cell."""
    if size is None:
        return "-"
    if size < 1024:
        return f"{size}B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"


def _tier_cells(status: PartitionStatus) -> list[str]:
    """Rx Ry Lx Ly Lz, local bytes, remote bytes, copy lag; "-" for what a partition without the remote tier
    (or a broker whose report predates these fields) lacks."""
    remote = status.remote_tier
    return [
        str(status.log_start_offset) if remote else "-",
        _offset(status.highest_offset_in_remote_storage),
        _offset(status.local_log_start_offset),
        str(status.high_watermark),
        _offset(status.log_end_offset),
        human_bytes(status.local_size_bytes),
        human_bytes(status.remote_size_bytes),
        human_bytes(status.copy_lag_bytes),
    ]


def status_table(
    reports: Sequence[BrokerReport],
    statuses: Sequence[PartitionStatus],
    *,
    leo_columns: bool = True,
    tier_columns: bool = True,
) -> Table:
    """TOPIC PARTITION LEADER EPOCH ISR HW, what fits an 80-column terminal with 5 brokers and 30-character
    topic names. `leo_columns` adds one LEO column per broker: blank where the broker holds no replica, yellow
    for a replica outside the ISR, red "down" where the broker did not answer. `tier_columns` adds, when any
    partition has the remote tier on, the tiers as the view broker has them (PartitionStatus): Rx Ry Lx Ly
    Lz, LOCAL and REMOTE bytes, and COPY-LAG (rolled local bytes below the HW not yet copied)."""
    up = {r.node_id: r.up for r in reports}
    tiered = tier_columns and any(status.remote_tier for status in statuses)
    table = plain_table(
        "TOPIC", "PARTITION", "LEADER", "EPOCH", "ISR", "HW", right=("PARTITION", "LEADER", "EPOCH", "HW")
    )
    if leo_columns:
        for node_id in sorted(up):
            add_column(table, f"LEO@{node_id}", right=True)
    if tiered:
        for name in _TIER_COLUMNS:
            add_column(table, name, right=True)
    for status in statuses:
        leader = Text(str(status.leader)) if status.leader >= 0 else Text("none", style="red")
        cells: list[Text | str] = [
            status.topic,
            str(status.partition),
            leader,
            str(status.leader_epoch),
            _ids(status.isr),
            str(status.high_watermark),
        ]
        if leo_columns:
            for node_id in sorted(up):
                if node_id not in status.log_end_offsets:
                    cells.append("")
                elif not up[node_id]:
                    cells.append(Text("down", style="red"))
                else:
                    leo = status.log_end_offsets[node_id]
                    cells.append(
                        Text("?" if leo is None else str(leo), style="" if node_id in status.isr else "yellow")
                    )
        if tiered:
            cells.extend(_tier_cells(status))
        table.add_row(*cells)
    return table


def broker_state(report: BrokerReport, process_alive: bool, *, wide: bool) -> Text:
    """up; down when the process is gone (whatever answers on its ports); not answering when the process runs
    but its HTTP listener does not answer (paused, overloaded, starting), with the reason when `wide`."""
    if not process_alive:
        return Text("down (process gone)", style="red")
    if report.up:
        return Text("up", style="green")
    return Text(f"not answering ({report.error})" if wide else "not answering", style="red")


def broker_table(info: ClusterInfo, states: Mapping[int, Text], *, wide: bool) -> Table:
    """NODE ROLES PID KAFKA STATE; `wide` adds HTTP (the listener `status` and `trace` ask)."""
    columns = ["NODE", "ROLES", "PID", "KAFKA", "HTTP", "STATE"] if wide else ["NODE", "ROLES", "PID", "KAFKA", "STATE"]
    table = plain_table(*columns, right=("NODE", "PID"))
    for node in info.nodes:
        cells: list[str | Text] = [str(node.node_id), node.roles, str(node.pid), node.kafka]
        if wide:
            cells.append(node.http)
        table.add_row(*cells, states[node.node_id])
    return table


async def gather_reports(addresses: Mapping[int, str], timeout_s: float) -> list[BrokerReport]:
    """Every broker's /v1/partitions, asked concurrently, each bounded by `timeout_s`."""

    async def one(node_id: int, address: str) -> BrokerReport:
        try:
            document = await http_get_json(address, "/v1/partitions", timeout_s)
            return BrokerReport(node_id, address, list(document["partitions"]))
        except HttpError as e:
            return BrokerReport(node_id, address, None, str(e))
        except (KeyError, TypeError):
            return BrokerReport(node_id, address, None, "its /v1/partitions has no partitions list")

    return list(await asyncio.gather(*(one(node_id, address) for node_id, address in addresses.items())))


def cluster_reports(info: ClusterInfo, alive: Mapping[int, bool], timeout_s: float) -> list[BrokerReport]:
    """The reports of the brokers whose process runs; a broker whose process is gone is down, whatever answers on
    its HTTP port now (another program, or a stale reading). Dedicated controllers have no partitions to report."""
    brokers = [n for n in info.nodes if n.is_broker]
    running = {n.node_id: n.http for n in brokers if alive[n.node_id]}
    reports = asyncio.run(gather_reports(running, timeout_s)) if running else []
    gone = [BrokerReport(n.node_id, n.http, None, f"process {n.pid} is gone") for n in brokers if not alive[n.node_id]]
    return sorted(reports + gone, key=lambda r: r.node_id)


def controller_state(node: NodeInfo, process_alive: bool, timeout_s: float) -> Text:
    """A dedicated controller: up when it answers ApiVersions on its controller listener, down when its process
    is gone, not answering otherwise."""
    if not process_alive:
        return Text("down (process gone)", style="red")
    host, port = split_address(node.kafka)
    if api_versions_answered(host, port, timeout_s):
        return Text("up", style="green")
    return Text("not answering", style="red")


# --- stopping recorded processes ---------------------------------------------------------------------------

STOPPED = "stopped"
KILLED = "killed"
ALREADY_DOWN = "already down"


def stop_processes(pids: Sequence[int], timeout_s: float) -> dict[int, str]:
    """SIGTERM every live pid at once, wait up to `timeout_s`, SIGKILL the rest. pid -> what happened:
    STOPPED, KILLED or ALREADY_DOWN."""
    outcome: dict[int, str] = {}
    for pid in pids:
        if not broker_alive(pid):
            outcome[pid] = ALREADY_DOWN
            continue
        try:
            # SIGCONT first: a paused (SIGSTOPped) broker acts on SIGTERM only once it runs again.
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
            outcome[pid] = STOPPED
        except ProcessLookupError:
            outcome[pid] = ALREADY_DOWN
    _wait_gone([pid for pid in pids if outcome[pid] == STOPPED], timeout_s)
    for pid in pids:
        if outcome[pid] == STOPPED and broker_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                outcome[pid] = KILLED
    _wait_gone([pid for pid in pids if outcome[pid] == KILLED], _KILL_WAIT_S)
    return outcome


def kill_process(pid: int) -> bool:
    """SIGKILL `pid` and wait until it is gone (a CliError if it is not within _KILL_WAIT_S); False when it
    was not running."""
    if not broker_alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not _wait_gone([pid], _KILL_WAIT_S):
        raise CliError(f"pid {pid} is still there {_KILL_WAIT_S:g}s after SIGKILL")
    return True


def _wait_gone(pids: Sequence[int], timeout_s: float) -> bool:
    """Wait up to `timeout_s` until none of `pids` is alive; whether none is."""
    deadline = time.monotonic() + timeout_s
    while any(broker_alive(pid) for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_STOP_POLL_S)
    return True


# --- the commands ------------------------------------------------------------------------------------------


def dir_option(help: str = "Directory of the cluster: data, broker logs and cluster.json.") -> Callable[[F], F]:
    """`--dir`, the directory `cluster up` records its cluster in, passed to the command as `directory`."""
    return click.option(
        "--dir",
        "directory",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_DIR,
        show_default=True,
        help=help,
    )


@click.group()
def cluster() -> None:
    """Run a local multi-broker cluster: up, status, down; start, stop, kill or restart one node; add brokers or
    decommission one; elect leaders and rebalance replicas (of any cluster, through -b)."""


def node_command(command: F) -> click.Command:
    """A `cluster` command on one node: NODE and --dir, passed to it as `node_id` and `directory`."""
    return cluster.command()(click.argument("node_id", metavar="NODE", type=int)(dir_option()(command)))


@cluster.command()
@click.option("-n", "--brokers", type=click.IntRange(min=1), default=3, show_default=True, help="Number of brokers.")
@click.option(
    "--controllers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Number of controller quorum voters: dedicated controller processes (nodes 3000, 3001, ...), or with "
    "--combined the first brokers; 0: node 1 is broker and controller.",
)
@click.option(
    "--combined", is_flag=True, help="The --controllers voters are brokers too (process.roles=broker,controller)."
)
@dir_option()
@click.option(
    "--override",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="A server.properties value for every broker (repeatable), e.g. default.replication.factor=3.",
)
@click.option(
    "--secure",
    is_flag=True,
    help="Serve clients on SASL_SSL (PLAIN, a generated admin user; a generated CA and broker certificate) and "
    "write their settings to DIR/security/client.properties; brokers talk to each other on PLAINTEXT, "
    "127.0.0.1 only.",
)
@timeout_option(60.0, "Seconds to wait for every broker to register.", minimum=1)
def up(
    brokers: int,
    controllers: int,
    combined: bool,
    directory: Path,
    overrides: tuple[str, ...],
    secure: bool,
    timeout_s: float,
) -> None:
    """Start BROKERS brokers in the background (node 1 is also the controller, unless --controllers) and wait
    until all serve."""
    if combined and not 1 <= controllers <= brokers:
        raise click.BadParameter(
            f"--combined makes {controllers} of the {brokers} brokers voters: give 1 to {brokers}",
            param_hint="--controllers",
        )
    path = cluster_file(directory)
    if path.exists():
        running = [node for node in read_cluster_info(directory).nodes if broker_alive(node.pid)]
        if running:
            raise CliError(
                f"a cluster is already running in {directory} (pids {_ids([n.pid for n in running])}): "
                f"stop it with `tierlog cluster down --dir {directory}`"
            )
    settings = dict(parse_key_values(overrides, "--override"))
    security = LocalSecurity.generate(directory / SECURITY_DIR) if secure else None
    try:
        local = LocalCluster(
            directory, brokers, settings, detached=True, security=security, controllers=controllers, combined=combined
        )
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--override") from None

    console = output_console()
    directory.mkdir(parents=True, exist_ok=True)
    # Recorded before the wait, so `cluster down` finds the brokers even if this command is interrupted.
    local.launch()
    write_cluster_info(directory, ClusterInfo.of(local))
    progress = progress_bar(console)
    try:
        with progress:
            dedicated = len(local.node_ids) - brokers
            controllers_up = progress.add_task("controllers answering", total=dedicated) if dedicated else None
            answering = progress.add_task("brokers answering", total=brokers)
            registered = progress.add_task("brokers registered", total=brokers)

            def show(state: StartProgress) -> None:
                if controllers_up is not None:
                    progress.update(controllers_up, completed=state.controllers_answering)
                progress.update(answering, completed=state.answering)
                progress.update(registered, completed=state.registered)

            local.start(timeout_s, show)
    except BrokerStartError as e:
        path.unlink(missing_ok=True)
        _print_log_tail(e)
        raise CliError(f"{e.reason} (its log: {e.log_file}); the cluster was stopped") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise

    info = ClusterInfo.of(local)
    console.print(broker_table(info, {n.node_id: Text("up", style="green") for n in info.nodes}, wide=True))
    voters = f"{len(local.controller_ids)} controller{'s' if len(local.controller_ids) > 1 else ''}"
    console.print(f"\n{brokers} brokers and {voters} are up; data and logs in {directory}")
    console.print(f"bootstrap: [bold]{info.bootstrap}[/bold]")
    console.print(f"controllers (controller.quorum.voters): {local.quorum_voters}", highlight=False)
    if local.security is None:
        console.print(
            f"next: tierlog topic create NAME -r {min(3, brokers)} -b {info.bootstrap}; "
            f"tierlog cluster status --dir {directory}"
        )
        return
    for line in secure_cluster_lines(local.security, local.internal_bootstrap):
        console.print(line, highlight=False)
    console.print(
        f"next: tierlog topic create NAME -r {min(3, brokers)} -b {info.bootstrap} "
        f"--command-config {local.security.client_config_file}; tierlog cluster status --dir {directory}",
        highlight=False,
    )


def secure_cluster_lines(security: LocalSecurity, internal_bootstrap: str) -> list[str]:
    """What a client of a secured local cluster needs, and what is not secured: for `cluster up` and the demo."""
    return [
        f"clients: {CLIENT_LISTENER} with SASL/{SASL_MECHANISM}, user {security.username} (password in the "
        f"files below), TLS certificate signed by the CA {security.ca_file}",
        f"client settings (librdkafka: tierlog --command-config FILE, kcat -F FILE): {security.client_config_file}",
        f"client settings (Java: Kafka's tools' --command-config FILE): {security.java_client_config_file}",
        f"brokers talk to each other unencrypted and unauthenticated on PLAINTEXT {internal_bootstrap}, bound to "
        "127.0.0.1 only (listener INTERNAL)",
    ]


@cluster.command()
@dir_option()
@output_option
@include_internal_option
@click.option("--json", "as_json", is_flag=True, help="Print every broker and partition as JSON (all fields).")
@timeout_option(3.0, "Seconds to wait for each broker's answer.")
def status(directory: Path, output: str, include_internal: bool, as_json: bool, timeout_s: float) -> None:
    """Brokers (a broker whose process is gone is down), and per partition: leader, epoch, ISR and HW.

    `-o wide` adds every replica's LEO and, with tiered storage, the remote and local offsets
    (Rx Ry Lx Ly Lz), the bytes in each tier and the copy lag."""
    info = read_cluster_info(directory)
    alive = {n.node_id: broker_alive(n.pid) for n in info.nodes}
    reports = cluster_reports(info, alive, timeout_s)
    statuses = merge_partition_reports(reports)
    controllers = {n.node_id: controller_state(n, alive[n.node_id], timeout_s) for n in info.nodes if not n.is_broker}
    if as_json:
        controllers_up = {node_id: state.plain == "up" for node_id, state in controllers.items()}
        click.echo(json.dumps(status_document(reports, statuses, controllers_up), indent=2))
        return
    wide = output == WIDE
    console = output_console()
    by_id = {r.node_id: r for r in reports}
    states = {
        n.node_id: broker_state(by_id[n.node_id], alive[n.node_id], wide=wide)
        if n.is_broker
        else controllers[n.node_id]
        for n in info.nodes
    }
    console.print(broker_table(info, states, wide=wide))
    console.print()
    if not any(r.up for r in reports):
        raise CliError(f"no broker of the cluster in {directory} answers: start it with `tierlog cluster up`")
    shown = [s for s in statuses if include_internal or not is_internal(s.topic)]
    if shown:
        console.print(status_table(reports, shown, leo_columns=wide, tier_columns=wide))
    else:
        secured = f" --command-config {info.client_config}" if info.client_config else ""
        console.print(f"no topics yet: tierlog topic create NAME -r 3 -b {info.bootstrap}{secured}", highlight=False)
    hidden = sorted({s.topic for s in statuses} - {s.topic for s in shown})
    if hidden:
        console.print(f"not shown: internal topics {', '.join(hidden)} (-i shows them)")


@cluster.command()
@dir_option()
@click.option("--purge", is_flag=True, help="Also delete the brokers' data directories and logs.")
@timeout_option(15.0, "Seconds a broker gets for its controlled shutdown before it is killed.")
def down(directory: Path, purge: bool, timeout_s: float) -> None:
    """Stop every broker the cluster recorded (SIGTERM, then SIGKILL after --timeout), including those
    `cluster start` started again; the data stays unless --purge."""
    info = read_cluster_info(directory)
    # Brokers first: their controlled shutdown asks the controller, which must still be there.
    brokers = [n for n in info.nodes if not n.is_controller]
    controllers = [n for n in info.nodes if n.is_controller]
    outcome = stop_processes([n.pid for n in brokers], timeout_s)
    outcome.update(stop_processes([n.pid for n in controllers], timeout_s))
    cluster_file(directory).unlink(missing_ok=True)
    console = output_console()
    table = plain_table("NODE", "PID", "STATUS", right=("NODE", "PID"))
    for node in info.nodes:
        text = outcome[node.pid]
        table.add_row(str(node.node_id), str(node.pid), Text(text, style="yellow" if text == KILLED else ""))
    console.print(table)
    by_outcome = {
        what: [n.node_id for n in info.nodes if outcome[n.pid] == what] for what in (STOPPED, KILLED, ALREADY_DOWN)
    }
    said = []
    if by_outcome[STOPPED]:
        said.append(f"{_nodes(by_outcome[STOPPED])} stopped (controlled shutdown)")
    if by_outcome[KILLED]:
        said.append(f"{_nodes(by_outcome[KILLED])} killed (no controlled shutdown within {timeout_s:g}s)")
    if by_outcome[ALREADY_DOWN]:
        said.append(f"{_nodes(by_outcome[ALREADY_DOWN])} already down")
    console.print("; ".join(said))
    if purge:
        for node in info.nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
            Path(node.log_file).unlink(missing_ok=True)
        console.print(f"purged: deleted the data and logs in {directory}")
    else:
        console.print(f"data and logs kept in {directory}")


def _nodes(node_ids: Sequence[int]) -> str:
    return f"node {node_ids[0]}" if len(node_ids) == 1 else f"nodes {_ids(node_ids)}"


# --- one node of the cluster --------------------------------------------------------------------------------


def find_node(directory: Path, node_id: int) -> NodeInfo:
    info = read_cluster_info(directory)
    for node in info.nodes:
        if node.node_id == node_id:
            return node
    raise CliError(
        f"no node {node_id} in the cluster in {directory} (its nodes: {_ids([n.node_id for n in info.nodes])})"
    )


def record_pid(directory: Path, node: NodeInfo, pid: int) -> None:
    """Record `node`'s new process in cluster.json (a node it does not have yet, a broker `add-broker` started,
    joins its nodes and its bootstrap), read again so a concurrent change to another node stays."""
    info = read_cluster_info(directory)
    if any(n.node_id == node.node_id for n in info.nodes):
        nodes = [replace(n, pid=pid) if n.node_id == node.node_id else n for n in info.nodes]
        write_cluster_info(directory, replace(info, nodes=nodes))
        return
    bootstrap = ",".join([*info.bootstrap.split(","), node.kafka])
    write_cluster_info(directory, replace(info, bootstrap=bootstrap, nodes=[*info.nodes, replace(node, pid=pid)]))


def stop_node(node: NodeInfo, timeout_s: float) -> tuple[str, float]:
    """Controlled shutdown (SIGTERM), SIGKILL after `timeout_s`: (STOPPED, KILLED or ALREADY_DOWN, seconds)."""
    started = time.monotonic()
    outcome = stop_processes([node.pid], timeout_s)[node.pid]
    return outcome, time.monotonic() - started


def start_node(directory: Path, node: NodeInfo, timeout_s: float) -> tuple[int, float]:
    """Start `node`'s process as `up` did (same settings, ports, data and log file, detached; or, for a broker
    `add-broker` made up, its first start), record its pid, and wait until it is registered with the controller
    (a dedicated controller: until it answers): (pid, seconds)."""
    if node.overrides is None:
        raise CliError(
            f"{cluster_file(directory)} does not record the brokers' settings (an older tierlog wrote it): "
            f"restart the whole cluster with `tierlog cluster down` and `tierlog cluster up`"
        )
    broker = BrokerProcess(
        Path(node.data_dir),
        node_id=node.node_id,
        port=split_address(node.kafka)[1],
        overrides=node.overrides,
        log_file=Path(node.log_file),
        detached=True,
        probe_port=None if node.internal is None else split_address(node.internal)[1],
    )
    started = time.monotonic()
    broker.start()
    if broker.pid is None:
        raise RuntimeError(f"broker {node.node_id} has no pid after starting")
    # Recorded before the wait, so `status` and `down` see the process even if this command is interrupted.
    record_pid(directory, node, broker.pid)
    try:
        broker.wait_ready(timeout_s)
        if node.is_broker:
            broker.wait_registered(max(0.1, timeout_s - (time.monotonic() - started)))
    except BrokerStartError as e:
        _print_log_tail(e)
        still = f"; it still runs (pid {broker.pid})" if broker.running else ""
        raise CliError(f"node {node.node_id}: {e.reason}{still} (its log: {e.log_file})") from None
    return broker.pid, time.monotonic() - started


def _ready(node: NodeInfo) -> str:
    """What `start` waited for: a broker to register, a dedicated controller to answer."""
    return "registered" if node.is_broker else "answering"


def _print_log_tail(error: BrokerStartError) -> None:
    Console(stderr=True).print(Text(f"last lines of {error.log_file}:\n{error.log_tail}", style="dim"))


@node_command
@timeout_option(60.0, "Seconds to wait for the node to register with the controller.", minimum=1)
def start(node_id: int, directory: Path, timeout_s: float) -> None:
    """Start NODE again (same settings, ports and data) and wait until it is back in the cluster."""
    node = find_node(directory, node_id)
    if broker_alive(node.pid):
        click.echo(f"node {node_id} is already running: {node.describe()}")
        return
    pid, seconds = start_node(directory, node, timeout_s)
    click.echo(f"node {node_id} started ({_ready(node)} in {seconds:.1f}s): {replace(node, pid=pid).describe()}")


@node_command
@timeout_option(15.0, "Seconds the node gets for its controlled shutdown before it is killed.")
def stop(node_id: int, directory: Path, timeout_s: float) -> None:
    """Stop NODE with a controlled shutdown (SIGTERM), killing it (SIGKILL) after --timeout."""
    node = find_node(directory, node_id)
    outcome, seconds = stop_node(node, timeout_s)
    if outcome == STOPPED:
        click.echo(f"node {node_id} stopped (controlled shutdown in {seconds:.1f}s): {node.describe()}")
    elif outcome == KILLED:
        click.echo(f"node {node_id} killed (no controlled shutdown within {timeout_s:g}s): {node.describe()}")
    else:
        click.echo(f"node {node_id} was already down: {node.describe()}")


@node_command
def kill(node_id: int, directory: Path) -> None:
    """Kill NODE with SIGKILL, as `kill -9`: a crash, no controlled shutdown."""
    node = find_node(directory, node_id)
    if kill_process(node.pid):
        click.echo(f"node {node_id} killed (SIGKILL): {node.describe()}")
    else:
        click.echo(f"node {node_id} was already down: {node.describe()}")


@node_command
@timeout_option(60.0, "Seconds for each step: the controlled shutdown (then SIGKILL), and the start.", minimum=1)
def restart(node_id: int, directory: Path, timeout_s: float) -> None:
    """Stop NODE (controlled shutdown, as `stop`), start it again and wait until it is back in the cluster."""
    node = find_node(directory, node_id)
    outcome, stop_seconds = stop_node(node, timeout_s)
    pid, start_seconds = start_node(directory, node, timeout_s)
    if outcome == ALREADY_DOWN:
        started = replace(node, pid=pid).describe()
        click.echo(f"node {node_id} was down; started ({_ready(node)} in {start_seconds:.1f}s): {started}")
    else:
        how = "" if outcome == STOPPED else f", SIGKILL after {timeout_s:g}s"
        where = f"pid {pid} (was {node.pid}), {node.kafka}"
        click.echo(f"node {node_id} restarted in {stop_seconds + start_seconds:.1f}s{how}: {where}")

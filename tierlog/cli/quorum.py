"""`tierlog quorum status`: the controller quorum (KRaft's metadata quorum, docs/quorum.md#tools) as
`kafka-metadata-quorum.sh describe --status` and `--replication` show it.

It sends DescribeQuorum (API 55) for `__cluster_metadata` partition 0, as the Admin client's
describeMetadataQuorum does: to a broker (`-b/--bootstrap-server`), which forwards it to the controller, or
straight to the controllers (`--bootstrap-controller`), all at once, taking the answer of the one that leads the
quorum. The numbers are Kafka's: a replica's Lag is the leader's log end offset minus the replica's,
MaxFollowerLag the largest of the voters', MaxFollowerLagTimeMs how far the most lagging voter's last caught-up
time is behind the leader's (0 when that voter is the leader, -1 when a time is unknown).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.text import Text

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    bootstrap_addresses,
    client_options,
    ensure_reachable,
    flag_given,
    output_console,
)
from tierlog.cli.tables import plain_table
from tierlog.client.connection import ApiNotServedError, KafkaConnection, KafkaConnectionError
from tierlog.client.requests import (
    API_DESCRIBE_QUORUM,
    DESCRIBE_QUORUM_VERSION,
    describe_cluster_request,
    describe_quorum_request,
)
from tierlog.client.security import ClientSecurity
from tierlog.protocol.errors import error_code
from tierlog.raft.raft_log import METADATA_TOPIC

CLIENT_ID = "tierlog-quorum"
UNKNOWN = -1  # Kafka's "unknown" for an offset or a timestamp of DescribeQuorum
LEADER, FOLLOWER, OBSERVER = "Leader", "Follower", "Observer"


class QuorumError(Exception):
    """An answer that describes no quorum (an error code, no leader); one line for a person."""


@dataclass(frozen=True)
class ReplicaState:
    """One replica of the metadata log as the leader sees it (DescribeQuorum's ReplicaState)."""

    node_id: int
    log_end_offset: int  # -1: unknown
    last_fetch_timestamp: int  # ms since the epoch, -1: unknown (always -1 for the leader)
    last_caught_up_timestamp: int  # ms since the epoch, -1: unknown


@dataclass(frozen=True)
class QuorumStatus:
    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: list[ReplicaState]
    observers: list[ReplicaState]
    endpoints: dict[int, list[str]]  # node id -> its listeners, NAME://host:port (DescribeQuorum v2's Nodes)
    cluster_id: str | None = None  # asked of a broker (DescribeCluster); None with --bootstrap-controller

    @property
    def leader(self) -> ReplicaState:
        return next(voter for voter in self.voters if voter.node_id == self.leader_id)

    def lag(self, replica: ReplicaState) -> int:
        return self.leader.log_end_offset - replica.log_end_offset

    @property
    def max_follower_lag(self) -> int:
        return self.lag(self._most_lagging_voter())

    @property
    def max_follower_lag_time_ms(self) -> int:
        laggard = self._most_lagging_voter()
        if laggard.node_id == self.leader_id:
            return 0
        if UNKNOWN in (self.leader.last_caught_up_timestamp, laggard.last_caught_up_timestamp):
            return UNKNOWN
        return self.leader.last_caught_up_timestamp - laggard.last_caught_up_timestamp

    def _most_lagging_voter(self) -> ReplicaState:
        # The first voter with the smallest log end offset, in the answer's order (Kafka's Stream.min).
        return min(self.voters, key=lambda voter: voter.log_end_offset)

    def rows(self) -> list[tuple[ReplicaState, str]]:
        """The leader, the other voters, the observers (kafka-metadata-quorum.sh --replication's order)."""
        return (
            [(self.leader, LEADER)]
            + [(voter, FOLLOWER) for voter in self.voters if voter.node_id != self.leader_id]
            + [(observer, OBSERVER) for observer in self.observers]
        )


def quorum_status_of(response: Any, cluster_id: str | None = None) -> QuorumStatus:
    """The quorum a DescribeQuorum response (any version) describes; QuorumError for an error or no leader."""
    if response.error_code != error_code(None):
        raise QuorumError(_error_text(response.error_code, response))
    partitions = [p for topic in response.topics if topic.topic_name == METADATA_TOPIC for p in topic.partitions]
    if not partitions:
        raise QuorumError(f"the answer does not describe {METADATA_TOPIC}")
    partition = partitions[0]
    if partition.error_code != error_code(None):
        raise QuorumError(_error_text(partition.error_code, partition))
    voters = [_replica(state) for state in partition.current_voters]
    if partition.leader_id not in {voter.node_id for voter in voters}:
        raise QuorumError(f"the quorum has no leader (epoch {partition.leader_epoch})")
    endpoints = {
        int(node.node_id): [f"{listener.name}://{listener.host}:{listener.port}" for listener in node.listeners]
        for node in getattr(response, "nodes", ())
    }
    return QuorumStatus(
        leader_id=int(partition.leader_id),
        leader_epoch=int(partition.leader_epoch),
        high_watermark=int(partition.high_watermark),
        voters=voters,
        observers=[_replica(state) for state in partition.observers],
        endpoints=endpoints,
        cluster_id=cluster_id,
    )


def _replica(state: Any) -> ReplicaState:
    # v0 has no timestamps: unknown, as Kafka's Admin client reports them.
    return ReplicaState(
        node_id=int(state.replica_id),
        log_end_offset=int(state.log_end_offset),
        last_fetch_timestamp=int(getattr(state, "last_fetch_timestamp", UNKNOWN)),
        last_caught_up_timestamp=int(getattr(state, "last_caught_up_timestamp", UNKNOWN)),
    )


def _error_text(code: Any, entity: Any) -> str:
    message = getattr(entity, "error_message", None)
    return f"{code.name.upper()}{f' ({message})' if message else ''}"


# --- what is printed -----------------------------------------------------------------------------------------


def _replica_list(status: QuorumStatus, replicas: list[ReplicaState]) -> str:
    """Kafka 3.9's CurrentVoters / CurrentObservers: [{"id": 3000, "endpoints": ["CONTROLLER://host:9093"]}, ...]."""
    entries = []
    for replica in replicas:
        endpoints = status.endpoints.get(replica.node_id)
        listed = f', "endpoints": [{", ".join(json.dumps(e) for e in endpoints)}]' if endpoints else ""
        entries.append(f'{{"id": {replica.node_id}{listed}}}')
    return f"[{', '.join(entries)}]"


def summary_lines(status: QuorumStatus) -> list[str]:
    """kafka-metadata-quorum.sh describe --status, line for line (ClusterId only when a broker was asked)."""
    fields = [("ClusterId", status.cluster_id)] if status.cluster_id is not None else []
    fields += [
        ("LeaderId", status.leader_id),
        ("LeaderEpoch", status.leader_epoch),
        ("HighWatermark", status.high_watermark),
        ("MaxFollowerLag", status.max_follower_lag),
        ("MaxFollowerLagTimeMs", status.max_follower_lag_time_ms),
        ("CurrentVoters", _replica_list(status, status.voters)),
        ("CurrentObservers", _replica_list(status, status.observers)),
    ]
    return [f"{name + ':':<24}{value}" for name, value in fields]


def _timestamp(value: int, human_readable: bool, now_ms: int) -> str:
    if value == UNKNOWN or not human_readable:
        return str(value)
    return f"{max(0, now_ms - value)} ms ago"


def replication_rows(status: QuorumStatus, human_readable: bool, now_ms: int) -> list[list[str]]:
    """kafka-metadata-quorum.sh describe --replication's rows: NodeId LogEndOffset Lag LastFetchTimestamp
    LastCaughtUpTimestamp Status."""
    return [
        [
            str(replica.node_id),
            str(replica.log_end_offset),
            str(status.lag(replica)),
            _timestamp(replica.last_fetch_timestamp, human_readable, now_ms),
            _timestamp(replica.last_caught_up_timestamp, human_readable, now_ms),
            role,
        ]
        for replica, role in status.rows()
    ]


REPLICATION_COLUMNS = ("NodeId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp", "Status")


def status_document(status: QuorumStatus) -> dict[str, Any]:
    """What `quorum status --json` prints: the summary's fields and every replica with its lag and role."""
    return {
        "cluster_id": status.cluster_id,
        "leader_id": status.leader_id,
        "leader_epoch": status.leader_epoch,
        "high_watermark": status.high_watermark,
        "max_follower_lag": status.max_follower_lag,
        "max_follower_lag_time_ms": status.max_follower_lag_time_ms,
        "replicas": [
            {
                **asdict(replica),
                "lag": status.lag(replica),
                "status": role,
                "endpoints": status.endpoints.get(replica.node_id, []),
            }
            for replica, role in status.rows()
        ],
    }


# --- asking ----------------------------------------------------------------------------------------------------


async def describe_quorum(
    addresses: list[tuple[str, int]], security: ClientSecurity, *, ask_cluster_id: bool, timeout_s: float
) -> QuorumStatus:
    """The quorum as the first of `addresses` that can describe it answers (a broker forwards the request to the
    controller; a controller that does not lead answers NOT_LEADER_OR_FOLLOWER). All are asked at once, so one
    that does not answer (a voter that just lost its leader, say) costs no more than --timeout; CliError naming
    what each said when none can. `ask_cluster_id`: also DescribeCluster (brokers only)."""
    said = dict.fromkeys((f"{host}:{port}" for host, port in addresses), "no answer within --timeout")

    async def attempt(host: str, port: int) -> QuorumStatus | None:
        try:
            return await _ask(host, port, security, ask_cluster_id, timeout_s)
        except (KafkaConnectionError, ApiNotServedError, QuorumError) as e:
            said[f"{host}:{port}"] = str(e)
            return None

    asks = [asyncio.create_task(attempt(host, port)) for host, port in addresses]
    try:
        for finished in asyncio.as_completed(asks, timeout=timeout_s):
            status = await finished
            if status is not None:
                return status
    except TimeoutError:
        pass
    finally:
        for task in asks:
            task.cancel()
        await asyncio.gather(*asks, return_exceptions=True)
    raise CliError(f"cannot describe the controller quorum: {'; '.join(f'{a}: {why}' for a, why in said.items())}")


async def _ask(host: str, port: int, security: ClientSecurity, ask_cluster_id: bool, timeout_s: float) -> QuorumStatus:
    connection = await KafkaConnection.open(host, port, client_id=CLIENT_ID, timeout_s=timeout_s, security=security)
    try:
        response = await connection.send_negotiated(
            API_DESCRIBE_QUORUM,
            lambda version: describe_quorum_request(METADATA_TOPIC, version=version),
            DESCRIBE_QUORUM_VERSION,
            timeout_s=timeout_s,
        )
        cluster_id = None
        if ask_cluster_id:
            cluster_id = str((await connection.send(describe_cluster_request(), timeout_s=timeout_s)).cluster_id)
        return quorum_status_of(response, cluster_id)
    finally:
        await connection.close()


@click.group()
def quorum() -> None:
    """The controller quorum (KRaft's metadata quorum), as kafka-metadata-quorum.sh describes it."""


@quorum.command()
@client_options
@click.option(
    "--bootstrap-controller",
    metavar="HOST:PORT[,...]",
    help="Ask the controllers (their controller listeners) instead of a broker; all are asked at once and the "
    "leader's answer is taken.",
)
@click.option("--human-readable", is_flag=True, help="Times as how long ago they were (`1500 ms ago`).")
@click.option("--json", "as_json", is_flag=True, help="Print the quorum as JSON (every field).")
def status(client: ClientOptions, bootstrap_controller: str | None, human_readable: bool, as_json: bool) -> None:
    """Leader, epoch, high watermark and the followers' lag, then each replica of the metadata log: its log end
    offset, lag behind the leader, last fetch and last caught-up time (`describe --status` and `--replication` of
    kafka-metadata-quorum.sh)."""
    if bootstrap_controller is not None and flag_given("bootstrap"):
        raise CliError("give --bootstrap-server or --bootstrap-controller, not both")
    bootstrap = bootstrap_controller if bootstrap_controller is not None else client.bootstrap
    security = client.security()
    addresses = bootstrap_addresses(bootstrap)
    ensure_reachable(bootstrap, client.remaining_s(), security)
    quorum_status = asyncio.run(
        describe_quorum(
            addresses, security, ask_cluster_id=bootstrap_controller is None, timeout_s=client.remaining_s()
        )
    )
    if as_json:
        click.echo(json.dumps(status_document(quorum_status), indent=2))
        return
    console = output_console()
    for line in summary_lines(quorum_status):
        console.print(Text(line))
    console.print()
    table = plain_table(*REPLICATION_COLUMNS, right=REPLICATION_COLUMNS[:5])
    for row in replication_rows(quorum_status, human_readable, int(time.time() * 1000)):
        table.add_row(*row)
    console.print(table)

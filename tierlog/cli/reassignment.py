"""What `tierlog topic reassign` and `tierlog cluster rebalance|decommission` ask of a cluster: the partitions'
replicas and the registered brokers (Metadata, through confluent-kafka), reassignments (AlterPartitionReassignments
and ListPartitionReassignments, API 45 and 46, which librdkafka does not send: tierlog's own client sends them to a
broker, which forwards them to the controller), each broker's partition sizes (DescribeLogDirs, API 35), the
replication throttles (IncrementalAlterConfigs) and UnregisterBroker (API 64). The plans themselves are in
`tierlog.cli.reassignment_plan`."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import ElectionType, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    bootstrap_addresses,
    ensure_reachable,
    future_result,
    kafka_error_message,
    results_or_errors,
)
from tierlog.cli.reassignment_plan import (
    BROKER_THROTTLES,
    TOPIC_THROTTLES,
    Assignment,
    InProgress,
    Throttles,
    sorted_partitions,
)
from tierlog.client.connection import ApiNotServedError, KafkaConnection, KafkaConnectionError
from tierlog.client.requests import (
    ALTER_PARTITION_REASSIGNMENTS_VERSION,
    API_ALTER_PARTITION_REASSIGNMENTS,
    API_DESCRIBE_LOG_DIRS,
    API_LIST_PARTITION_REASSIGNMENTS,
    API_UNREGISTER_BROKER,
    DESCRIBE_LOG_DIRS_VERSION,
    LIST_PARTITION_REASSIGNMENTS_VERSION,
    UNREGISTER_BROKER_VERSION,
    alter_partition_reassignments_request,
    describe_log_dirs_request,
    list_partition_reassignments_request,
    unregister_broker_request,
)
from tierlog.common import TopicPartition
from tierlog.protocol.api_versions import api_name
from tierlog.protocol.errors import error_code

CLIENT_ID = "tierlog-reassign"


class NotServed(CliError):
    """The broker does not serve the API (one that has not learnt it yet)."""


def renewed(client: ClientOptions) -> ClientOptions:
    """`client` with a fresh --timeout: each step of a long wait gets the whole bound again."""
    return dataclasses.replace(client, deadline=time.monotonic() + client.timeout_s)


# --- tierlog's own requests ---------------------------------------------------------------------------------


async def _send(
    address: tuple[str, int], api_key: int, build: Callable[[int], Any], newest: int, client: ClientOptions
) -> Any:
    host, port = address
    timeout_s = client.remaining_s()
    connection = await KafkaConnection.open(
        host, port, client_id=CLIENT_ID, timeout_s=timeout_s, security=client.security()
    )
    try:
        return await connection.send_negotiated(api_key, build, newest, timeout_s=client.remaining_s())
    except ApiNotServedError as e:
        raise NotServed(f"the broker at {host}:{port} {e}") from None
    finally:
        await connection.close()


def send(
    api_key: int, build: Callable[[int], Any], newest: int, client: ClientOptions, address: str | None = None
) -> Any:
    """The response to `build(version)` (the newest version up to `newest` the broker serves) from the broker at
    `address`, else from the first bootstrap server that answers; a one-line CliError when none does or the broker
    does not serve the API."""
    target = address if address is not None else client.bootstrap
    # The client commands' one line for servers that do not answer (refused, silent, TLS, DNS), within --timeout.
    ensure_reachable(target, client.remaining_s(), client.security())
    failures = []
    for host, port in bootstrap_addresses(target):
        try:
            return asyncio.run(_send((host, port), api_key, build, newest, client))
        except KafkaConnectionError as e:
            failures.append(str(e))
    raise CliError(f"{api_name(api_key)}: {'; '.join(failures)}")


def _failed(code: Any, message: str | None) -> str | None:
    """None for NONE, else the error's name and the broker's message."""
    if code == error_code(None):
        return None
    return f"{code.name.upper()}{f' ({message})' if message else ''}"


def alter_reassignments(
    targets: Mapping[TopicPartition, Sequence[int] | None], client: ClientOptions
) -> dict[TopicPartition, str | None]:
    """Start (a replica list) or cancel (None) each partition's reassignment: each partition's error, or None."""
    response = send(
        API_ALTER_PARTITION_REASSIGNMENTS,
        lambda version: alter_partition_reassignments_request(
            targets, timeout_ms=int(client.timeout_s * 1000), version=version
        ),
        ALTER_PARTITION_REASSIGNMENTS_VERSION,
        client,
    )
    refused = _failed(response.error_code, response.error_message)
    if refused is not None:
        raise CliError(f"the controller refused the reassignment: {refused}")
    outcome: dict[TopicPartition, str | None] = {}
    for topic in response.responses:
        for partition in topic.partitions:
            tp = TopicPartition(topic.name, int(partition.partition_index))
            outcome[tp] = _failed(partition.error_code, partition.error_message)
    return outcome


def list_reassignments(
    partitions: Iterable[TopicPartition] | None, client: ClientOptions
) -> dict[TopicPartition, InProgress]:
    """The reassignments in progress, of `partitions` or of every partition."""
    response = send(
        API_LIST_PARTITION_REASSIGNMENTS,
        lambda version: list_partition_reassignments_request(
            partitions, timeout_ms=int(client.timeout_s * 1000), version=version
        ),
        LIST_PARTITION_REASSIGNMENTS_VERSION,
        client,
    )
    refused = _failed(response.error_code, response.error_message)
    if refused is not None:
        raise CliError(f"listing the reassignments in progress: {refused}")
    return {
        TopicPartition(topic.name, int(p.partition_index)): InProgress(
            [int(b) for b in p.replicas], [int(b) for b in p.adding_replicas], [int(b) for b in p.removing_replicas]
        )
        for topic in response.topics
        for p in topic.partitions
    }


def log_dir_sizes(
    address: str, partitions: Iterable[TopicPartition] | None, client: ClientOptions
) -> dict[TopicPartition, int]:
    """The bytes each partition takes in the log dirs of the broker at `address` (DescribeLogDirs)."""
    response = send(
        API_DESCRIBE_LOG_DIRS,
        lambda version: describe_log_dirs_request(partitions, version=version),
        DESCRIBE_LOG_DIRS_VERSION,
        client,
        address,
    )
    refused = _failed(response.error_code, None)
    if refused is not None:
        raise CliError(f"DescribeLogDirs of {address}: {refused}")
    sizes: dict[TopicPartition, int] = {}
    for result in response.results:
        for topic in result.topics:
            for p in topic.partitions:
                if not p.is_future_key:
                    tp = TopicPartition(topic.name, int(p.partition_index))
                    sizes[tp] = sizes.get(tp, 0) + int(p.partition_size)
    return sizes


def unregister_broker(broker_id: int, client: ClientOptions) -> None:
    response = send(
        API_UNREGISTER_BROKER,
        lambda version: unregister_broker_request(broker_id, version=version),
        UNREGISTER_BROKER_VERSION,
        client,
    )
    refused = _failed(response.error_code, response.error_message)
    if refused is not None:
        raise CliError(f"unregistering broker {broker_id}: {refused}")


# --- through confluent-kafka --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """The registered, unfenced brokers (the Metadata answer's) with their addresses, and every partition's
    replicas and leader."""

    brokers: dict[int, str]  # id -> host:port
    replicas: Assignment
    leaders: dict[TopicPartition, int]


def cluster_view(admin: AdminClient, client: ClientOptions, topics: Collection[str] | None = None) -> ClusterView:
    """The cluster's metadata; of `topics` only (a one-line CliError naming one that does not exist)."""
    try:
        metadata = admin.list_topics(timeout=client.remaining_s())
    except Exception as e:  # KafkaException; its first argument is the KafkaError
        raise CliError(kafka_error_message(e.args[0], "the cluster's metadata")) from None
    names = sorted(metadata.topics) if topics is None else list(topics)
    missing = [t for t in names if t not in metadata.topics]
    if missing:
        raise CliError(kafka_error_message(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), f"topic {missing[0]!r}"))
    replicas: Assignment = {}
    leaders: dict[TopicPartition, int] = {}
    for name in names:
        topic = metadata.topics[name]
        if topic.error is not None:
            raise CliError(kafka_error_message(topic.error, f"topic {name!r}"))
        for p in topic.partitions.values():
            tp = TopicPartition(name, p.id)
            replicas[tp] = list(p.replicas)
            leaders[tp] = p.leader
    brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    return ClusterView(dict(sorted(brokers.items())), dict(sorted(replicas.items())), leaders)


def leader_sizes(
    view: ClusterView, partitions: Collection[TopicPartition], client: ClientOptions
) -> dict[TopicPartition, int]:
    """Each partition's size on its leader (what a new replica copies); partitions whose leader is not known or
    does not answer are left out."""
    by_leader: dict[int, list[TopicPartition]] = {}
    for tp in partitions:
        leader = view.leaders.get(tp, -1)
        if leader in view.brokers:
            by_leader.setdefault(leader, []).append(tp)
    sizes: dict[TopicPartition, int] = {}
    for leader, tps in by_leader.items():
        found = log_dir_sizes(view.brokers[leader], tps, client)
        sizes.update({tp: found[tp] for tp in tps if tp in found})
    return sizes


def _alter_configs(admin: AdminClient, resources: list[ConfigResource], client: ClientOptions) -> None:
    """IncrementalAlterConfigs of `resources`: the topics in one call, each broker in a call of its own (a broker's
    configs go to that broker, and librdkafka takes one per call); CliError naming the first refused."""
    topics = [r for r in resources if r.restype != ResourceType.BROKER]
    calls = [[r] for r in resources if r.restype == ResourceType.BROKER] + ([topics] if topics else [])
    for call in calls:
        futures = admin.incremental_alter_configs(call, request_timeout=client.remaining_s())
        outcome = results_or_errors(futures, lambda r: f"configs of {r.restype.name.lower()} {r.name}", client)
        errors = [e for e in outcome.values() if isinstance(e, str)]
        if errors:
            raise CliError(errors[0])


def set_throttles(admin: AdminClient, throttles: Throttles, rate: int, client: ClientOptions) -> None:
    """The brokers' replication rates and the topics' throttled replicas, as Kafka's tool sets them."""
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()
            ],
        )
        for topic, configs in throttles.topic_replicas.items()
    ]
    resources += [
        ConfigResource(
            ResourceType.BROKER,
            str(broker),
            incremental_configs=[
                ConfigEntry(name, str(rate), incremental_operation=AlterConfigOpType.SET) for name in BROKER_THROTTLES
            ],
        )
        for broker in throttles.brokers
    ]
    _alter_configs(admin, resources, client)


def clear_throttles(admin: AdminClient, brokers: Iterable[int], topics: Iterable[str], client: ClientOptions) -> None:
    """Remove the replication throttles of `brokers` and `topics`, as Kafka's tool does once a reassignment is done."""
    resources = [
        ConfigResource(
            ResourceType.BROKER,
            str(broker),
            incremental_configs=[
                ConfigEntry(n, None, incremental_operation=AlterConfigOpType.DELETE) for n in BROKER_THROTTLES
            ],
        )
        for broker in sorted(set(brokers))
    ]
    resources += [
        ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(n, None, incremental_operation=AlterConfigOpType.DELETE) for n in TOPIC_THROTTLES
            ],
        )
        for topic in sorted(set(topics))
    ]
    _alter_configs(admin, resources, client)


def elect_preferred_leaders(
    admin: AdminClient, partitions: Iterable[TopicPartition], client: ClientOptions
) -> tuple[list[TopicPartition], dict[TopicPartition, str]]:
    """ElectLeaders PREFERRED for `partitions`: those whose leader changed, and why each failure failed (a
    partition already led by its preferred replica is neither)."""
    wanted = [KafkaTopicPartition(tp.topic, tp.partition) for tp in sorted_partitions(partitions)]
    if not wanted:
        return [], {}
    results = future_result(admin.elect_leaders(ElectionType.PREFERRED, wanted), "preferred leader election", client)
    elected: list[TopicPartition] = []
    failed: dict[TopicPartition, str] = {}
    for ktp, error in sorted(results.items(), key=lambda item: (item[0].topic, item[0].partition)):
        tp = TopicPartition(ktp.topic, ktp.partition)
        if error is None:
            elected.append(tp)
        elif error.code() != KafkaError.ELECTION_NOT_NEEDED:
            failed[tp] = f"{error.str()} ({error.name()})"
    return elected, failed

"""What the tests of real multi-broker clusters share: each broker's own view of its partitions (GET
/v1/partitions on its tierlog.http.listener), a partition as Metadata describes it, and the tails of the
brokers' logs, printed when a test ends because that is where a failure's reason usually is."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, PartitionMetadata

from tierlog.testing.local_cluster import LocalCluster

HTTP_TIMEOUT_S = 2.0


def http_get(address: str, path: str, timeout_s: float = HTTP_TIMEOUT_S) -> bytes:
    """The body of GET `path` from a broker's HTTP listener at `address` (OSError if it does not answer)."""
    with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout_s) as response:
        body: bytes = response.read()
        return body


def partition_states(cluster: LocalCluster, node_id: int, topic: str) -> dict[int, dict[str, Any]] | None:
    """partition -> broker `node_id`'s own state of its replica of `topic`-partition, as its /v1/partitions
    reports it (role, leader, epochs, ISR, HW, LEO, remote replicas); None if the broker does not answer."""
    try:
        document = json.loads(http_get(cluster.http_address(node_id), "/v1/partitions"))
    except (OSError, ValueError):
        return None
    return {p["partition"]: p for p in document["partitions"] if p["topic"] == topic}


def metadata_partition(bootstrap: str, topic: str, partition: int, timeout_s: float) -> PartitionMetadata | None:
    """`topic`-`partition` as a Metadata answer from `bootstrap` describes it (a fresh client each time, so
    nothing is cached); None if no broker answers in time or the partition is unknown."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return None
    if metadata is None or metadata.error is not None:
        return None
    return metadata.partitions.get(partition)


def confirmed_leader(cluster: LocalCluster, topic: str, partition: int) -> tuple[int, int] | None:
    """(leader, leader epoch) once Metadata names a leader that itself reports being leader with every broker
    of the cluster in its ISR; None meanwhile (a broker just killed may be asked first: callers poll)."""
    named = metadata_partition(cluster.bootstrap, topic, partition, timeout_s=5)
    leader = -1 if named is None else named.leader
    if leader not in cluster.node_ids or not cluster.broker(leader).running:
        return None
    state = (partition_states(cluster, leader, topic) or {}).get(partition)
    if state is None or state["role"] != "leader" or sorted(state["isr"]) != sorted(cluster.node_ids):
        return None
    return leader, int(state["leader_epoch"])


def partition_views(cluster: LocalCluster, topic: str) -> dict[int, dict[int, dict[str, Any]] | None]:
    """node -> its own view of `topic`'s partitions; None for a broker that is down or does not answer."""
    return {n: partition_states(cluster, n, topic) if cluster.broker(n).running else None for n in cluster.node_ids}


def describe_partitions(cluster: LocalCluster, topic: str) -> str:
    """One line of every broker's role, leader, epoch, ISR, HW and LEO per partition, for wait messages."""
    rows = []
    for node, partitions in partition_views(cluster, topic).items():
        if partitions is None:
            rows.append(f"broker {node}: no answer")
            continue
        for p, s in sorted(partitions.items()):
            rows.append(
                f"broker {node} p{p}: {s['role']} leader={s['leader']} epoch={s['leader_epoch']} isr={s['isr']} "
                f"hw={s['high_watermark']} leo={s['log_end_offset']}"
            )
    return "; ".join(rows)


def print_log_tails(cluster: LocalCluster, lines: int = 40) -> None:
    for node_id in cluster.node_ids:
        broker = cluster.broker(node_id)
        print(f"\n---- last lines of {broker.log_file} ----\n{broker.log_tail(lines)}")

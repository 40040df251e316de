"""Replication throttles on real brokers (docs/replication.md#throttles): a follower that comes back far behind
fetches a throttled topic no faster than the rate its own broker (follower.replication.throttled.rate) or the
leader's (leader.replication.throttled.rate) allows, and catches up once IncrementalAlterConfigs removes it.

Only upper bounds are timed: a loaded machine makes the follower slower, never faster, so the throttled phase
cannot flake; the catch-up is a bounded wait."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_helpers import http_get, replica_state, wait_confirmed_leader
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from tierlog.testing.local_cluster import LocalCluster, wait_until

TIMEOUT_S = 30.0
TOPIC = "moving"
LEADER, FOLLOWER = 1, 2
THROTTLE_BYTES_PER_S = 200_000
# Small fetches, so the throttle paces the follower in small steps: each fetch may overshoot the rate by one.
FETCH_MAX_BYTES = 65_536
# The window spans the whole throttled phase: no sample expires, so the follower's bytes since its start stay
# within the rate times the time since then, plus one fetch, plus one window's worth: Kafka's SimpleRate divides by
# at least one whole sample, so the first second lets a burst of a second's bytes through at once, and the fetch
# that crosses the rate is answered whole (a CI run saw 6 fetches, 363 KB, 1.3 s after the restart).
WINDOW_SECONDS = 40
SLACK_S = 1.0
RECORDS, RECORD_BYTES = 800, 10_000
THROTTLED_PHASE_S = 12.0


def segment_bytes(cluster: LocalCluster, node_id: int) -> int:
    """The bytes of the partition's records on `node_id`'s disk: a follower stores the leader's batches as they are."""
    directory = cluster.broker(node_id).log_dir / f"{TOPIC}-0"
    return sum(path.stat().st_size for path in Path(directory).glob("*.log"))


def alter_rate(cluster: LocalCluster, side: str, broker: int, value: str | None, op: AlterConfigOpType) -> None:
    """Set or delete `broker`'s own `side`.replication.throttled.rate; a per-broker config goes to its broker. A
    new client each time: one that saw the broker down dropped it from its metadata, and librdkafka's admin waits
    for it to reappear there rather than refreshing (a client matter, as against Kafka)."""
    admin = AdminClient({"bootstrap.servers": cluster.broker(broker).bootstrap})
    entry = ConfigEntry(f"{side}.replication.throttled.rate", value, incremental_operation=op)
    resource = ConfigResource("broker", str(broker), incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=TIMEOUT_S)


@pytest.mark.parametrize(
    ("side", "throttled_replicas", "throttling_broker"),
    [
        # The follower's own replicas of the topic, every one.
        ("follower", "*", FOLLOWER),
        # Partition 0 where broker 1 leads it: the leader holds back a follower outside the ISR.
        ("leader", f"0:{LEADER}", LEADER),
    ],
)
def test_a_throttled_follower_lags_under_the_rate_and_catches_up_once_the_throttle_is_removed(
    cluster_factory: Callable[..., LocalCluster], side: str, throttled_replicas: str, throttling_broker: int
) -> None:
    cluster = cluster_factory(
        {"replica.fetch.max.bytes": str(FETCH_MAX_BYTES), "replication.quota.window.num": str(WINDOW_SECONDS)},
        brokers=2,
    )
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    config = {f"{side}.replication.throttled.replicas": throttled_replicas}
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[LEADER, FOLLOWER]], config=config)
    admin.create_topics([topic])[TOPIC].result(timeout=TIMEOUT_S)
    assert wait_confirmed_leader(cluster, TOPIC, 0, TIMEOUT_S)[0] == LEADER
    # Set while every broker runs; it is kept in the metadata log.
    alter_rate(cluster, side, throttling_broker, str(THROTTLE_BYTES_PER_S), AlterConfigOpType.SET)

    cluster.broker(FOLLOWER).stop()
    producer = Producer(
        {
            "bootstrap.servers": cluster.broker(LEADER).bootstrap,
            "acks": 1,
            "linger.ms": 5,
            "compression.type": "none",
            # Batches well under one fetch: a fetch returns at least one whole batch, whatever its size.
            "batch.size": 2 * RECORD_BYTES,
        }
    )
    for _ in range(RECORDS):
        producer.produce(TOPIC, os.urandom(RECORD_BYTES), partition=0)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    total = segment_bytes(cluster, LEADER)
    assert total >= RECORDS * RECORD_BYTES
    before = segment_bytes(cluster, FOLLOWER)

    started = time.monotonic()
    cluster.broker(FOLLOWER).start()
    cluster.broker(FOLLOWER).wait_ready(60)
    samples = []
    while True:
        elapsed = time.monotonic() - started
        fetched = segment_bytes(cluster, FOLLOWER) - before
        allowed = THROTTLE_BYTES_PER_S * (elapsed + SLACK_S) + FETCH_MAX_BYTES
        samples.append((round(elapsed, 1), fetched))
        assert fetched <= allowed, f"the follower fetched {fetched} bytes in {elapsed:.1f}s: {samples}"
        if elapsed >= THROTTLED_PHASE_S:
            break
        time.sleep(0.5)
    # Paced, not stopped, and still far behind: the throttle, not the records, ended its progress.
    assert samples[-1][1] > 0, samples
    assert segment_bytes(cluster, FOLLOWER) < total - RECORDS * RECORD_BYTES // 2, samples
    metrics = http_get(cluster.http_address(throttling_broker), "/metrics").decode()
    (rate_line,) = [line for line in metrics.splitlines() if line.startswith(f"kafka_server_{side}replication")]
    assert float(rate_line.split()[-1]) > 0

    alter_rate(cluster, side, throttling_broker, None, AlterConfigOpType.DELETE)
    wait_until(
        lambda: segment_bytes(cluster, FOLLOWER) == total,
        60,
        lambda: f"the follower to catch up ({segment_bytes(cluster, FOLLOWER)} of {total} bytes)",
    )
    wait_until(
        lambda: (state := replica_state(cluster, LEADER, TOPIC)) is not None and sorted(state["isr"]) == [1, 2],
        TIMEOUT_S,
        lambda: f"the follower back in the ISR ({replica_state(cluster, LEADER, TOPIC)})",
    )

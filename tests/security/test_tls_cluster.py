"""Three brokers whose inter-broker listener and controller listener are SSL: registration, heartbeats,
metadata and replica fetches all go over TLS, and a topic with replication factor 3 takes acks=all writes and
keeps every replica in sync."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from tls_helpers import broker_tls_settings, make_tls_files

from tierlog.testing.local_cluster import LocalCluster, wait_until

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0


def test_a_cluster_replicates_over_an_ssl_inter_broker_listener(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path / "tls")
    overrides = {
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "SSL",
        "ssl.client.auth": "required",
        **broker_tls_settings(files),
    }
    with LocalCluster(tmp_path / "cluster", brokers=3, overrides=overrides, extra_listeners=("SSL",)) as cluster:
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("replicated", 1, 3, config={"min.insync.replicas": "3"})])["replicated"].result(
            TIMEOUT_S
        )
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 30000})
        for i in range(200):
            producer.produce("replicated", b"r%d" % i)
        assert producer.flush(TIMEOUT_S) == 0

        def fully_replicated() -> bool:
            partition = admin.list_topics("replicated", timeout=5).topics["replicated"].partitions[0]
            return sorted(partition.isrs) == [1, 2, 3]

        wait_until(fully_replicated, timeout_s=TIMEOUT_S, what="all three replicas in the ISR")
        # A client that bootstraps from any broker's SSL listener (with a certificate: client auth is required)
        # reads every record back.
        for node_id in cluster.node_ids:
            consumer = Consumer(
                {
                    "bootstrap.servers": cluster.listener_address("SSL", node_id),
                    "security.protocol": "SSL",
                    "ssl.ca.location": str(files.ca_path),
                    "ssl.certificate.location": str(files.client_cert_path),
                    "ssl.key.location": str(files.client_key_path),
                    "group.id": f"reader-{node_id}",
                    "auto.offset.reset": "earliest",
                }
            )
            values = []
            try:
                consumer.subscribe(["replicated"])
                while len(values) < 200:
                    message = consumer.poll(TIMEOUT_S)
                    assert message is not None and message.error() is None
                    values.append(message.value())
            finally:
                consumer.close()
            assert values == [b"r%d" % i for i in range(200)]

"""A three-broker cluster per test module, set up as Kafka users set one up for consumer-group tests
(CLUSTER_OVERRIDES: no initial rebalance delay, a small __consumer_offsets on every broker); tests share it
and work on topics and groups of their own. The brokers' log tails are printed when the module ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from group_helpers import CLUSTER_OVERRIDES, warm_up_offsets_topic

from tierlog.testing.local_cluster import LocalCluster

CLUSTER_START_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three started brokers (node 1 is also the controller) with __consumer_offsets created and led."""
    started = LocalCluster(tmp_path_factory.mktemp("groups"), brokers=3, overrides=CLUSTER_OVERRIDES)
    try:
        started.start(CLUSTER_START_S)
        warm_up_offsets_topic(started)
        yield started
    finally:
        try:
            started.stop(timeout_s=10)
        finally:
            for node_id in started.node_ids:
                broker = started.broker(node_id)
                print(f"\n---- last lines of {broker.log_file} ----\n{broker.log_tail(40)}")

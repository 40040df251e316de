"""A three-broker cluster per test module, set up as Kafka users set one up for consumer-group tests
(CLUSTER_OVERRIDES: no initial rebalance delay, a small __consumer_offsets on every broker); tests share it
and work on topics and groups of their own."""

from __future__ import annotations

import pytest
from cluster_helpers import ClusterFactory
from group_helpers import CLUSTER_OVERRIDES, warm_up_offsets_topic

from tierlog.testing.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: ClusterFactory) -> LocalCluster:
    """Three started brokers (node 1 is also the controller) with __consumer_offsets created and led."""
    started = module_cluster_factory(CLUSTER_OVERRIDES, brokers=3)
    warm_up_offsets_topic(started)
    return started

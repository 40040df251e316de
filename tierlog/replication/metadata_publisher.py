"""Kafka's BrokerMetadataPublisher, the part every world shares: what a broker does with each metadata image its
loader publishes (metadata/loader.py). The first image loads the logs of the log dirs (recovering them after a
crash; their topic configs come from the image); every image is then applied to the replicas, which takes up
leaderships, starts and moves fetchers, and creates and deletes logs.
"""

from __future__ import annotations

from tierlog.metadata.image import ClusterMetadata
from tierlog.replication.replica_manager import ReplicaManager


class BrokerMetadataPublisher:
    def __init__(self, replica_manager: ReplicaManager) -> None:
        self._replica_manager = replica_manager
        self.logs_loaded = False

    def publish(self, image: ClusterMetadata, now_ms: int) -> None:
        if not self.logs_loaded:
            topic_configs = {name: topic.configs for name, topic in image.topics.items()}
            self._replica_manager.log_manager.startup(topic_configs, now_ms)
            self.logs_loaded = True
        self._replica_manager.apply_metadata(image, now_ms)

"""AutoTopicCreationManager (Kafka's class of that name): topics the broker creates on its own behalf.

A Metadata request may name a topic that does not exist (`auto.create.topics.enable`), and the group
coordinator and the remote log metadata manager need their internal topics (`__consumer_offsets`,
`__remote_log_metadata`). Each becomes a CreateTopics decided by the controller, as a client's would be.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tierlog.client.requests import create_topics_request
from tierlog.config import KafkaConfig
from tierlog.controller.controller import validate_topic_name
from tierlog.controller.errors import ControllerError
from tierlog.metadata.image import ClusterMetadata, TopicMetadata
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.server.controller_apis import API_CREATE_TOPICS
from tierlog.server.forwarding_manager import ForwardingManager

logger = logging.getLogger(__name__)


class AutoTopicCreationManager:
    def __init__(
        self, config: KafkaConfig, image: Callable[[], ClusterMetadata], forwarding_manager: ForwardingManager
    ) -> None:
        self._config = config
        self._image = image
        self._forwarding_manager = forwarding_manager

    async def create_topic(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> str | None:
        """Create a topic (an internal one, with its own settings); the error name or None."""
        body = create_topics_request(name, partitions, replication_factor, configs, timeout_ms=30_000)
        request = Request(API_CREATE_TOPICS, body.__version__, 0, "broker", body, 0)
        result = (await self._forwarding_manager.forward(request)).topics[0]
        if result.error_code == error_code(None):
            return None
        return str(result.error_code.name).upper()

    async def auto_create(self, name: str) -> tuple[TopicMetadata | None, str | None]:
        """A topic a Metadata request named, created with the broker defaults (num.partitions,
        default.replication.factor): the topic, or why the client gets none yet."""
        error = check_topic_name(name)
        if error is not None:
            return None, error
        error = await self.create_topic(
            name, self._config.get_int("num.partitions"), self._config.get_int("default.replication.factor"), {}
        )
        if error not in (None, "TOPIC_ALREADY_EXISTS"):
            return None, error
        topic = self._image().topics.get(name)
        if topic is None:
            # Created, but not yet in this broker's metadata: the client retries, as with Kafka.
            return None, "LEADER_NOT_AVAILABLE"
        logger.info("auto-created topic %s with %d partitions", name, len(topic.partitions))
        return topic, None


def check_topic_name(name: str) -> str | None:
    """The error name for an illegal topic name, else None."""
    try:
        validate_topic_name(name)
    except ControllerError as e:
        return e.error_name
    return None

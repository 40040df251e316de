"""KafkaApis in process: requests that name topics by id (DeleteTopics v6, Metadata v12) resolve them
through the controller, and unknown ids get UNKNOWN_TOPIC_ID / UNKNOWN_TOPIC_OR_PARTITION."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.delete_topics.v6 import request as delete_topics_v6
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_v12

from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller
from tierlog.controller.metadata import FileMetadataStore
from tierlog.protocol.codec import Request
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.server.kafka_apis import API_DELETE_TOPICS, API_METADATA, KafkaApis
from tierlog.storage.log_manager import LogManager

NOW = 1_700_000_000_000


@pytest.fixture
def apis(tmp_path: Path) -> KafkaApis:
    config = KafkaConfig({"log.dirs": str(tmp_path), "auto.create.topics.enable": "false"})
    controller = Controller(FileMetadataStore(tmp_path), lambda: [1])
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    replica_manager = ReplicaManager(1, log_manager)
    controller.create_topic("events", 2, 1, {})
    replica_manager.apply_metadata(controller.metadata, NOW)
    return KafkaApis(config, controller, replica_manager, arm_timer=lambda _deadline: None)


def call(apis: KafkaApis, api_key: int, version: int, body: Any) -> Any:
    return asyncio.run(apis.handle(Request(api_key, version, 7, "test", body, 0)))


def test_metadata_by_topic_id_names_the_topic(apis: KafkaApis) -> None:
    topic_id = apis.controller.metadata.topics["events"].topic_id
    request = metadata_v12.MetadataRequest(
        topics=(metadata_v12.MetadataRequestTopic(topic_id=topic_id, name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (topic,) = call(apis, API_METADATA, 12, request).topics
    assert (topic.name, topic.error_code, len(topic.partitions)) == ("events", ErrorCode.none, 2)


def test_delete_topics_by_id_deletes_the_topic_and_unknown_ids_are_reported(apis: KafkaApis) -> None:
    topic_id = apis.controller.metadata.topics["events"].topic_id
    unknown = uuid.uuid4()
    request = delete_topics_v6.DeleteTopicsRequest(
        topics=(
            delete_topics_v6.DeleteTopicState(name=None, topic_id=topic_id),
            delete_topics_v6.DeleteTopicState(name=None, topic_id=unknown),
        ),
        timeout=datetime.timedelta(seconds=5),
    )
    deleted, missing = call(apis, API_DELETE_TOPICS, 6, request).responses
    assert (deleted.name, deleted.topic_id, deleted.error_code) == ("events", topic_id, ErrorCode.none)
    assert (missing.topic_id, missing.error_code) == (unknown, ErrorCode.unknown_topic_id)
    assert apis.controller.topic("events") is None
    assert apis.controller.topic_by_id(topic_id) is None

"""KafkaApis in process: requests that name topics by id (DeleteTopics v6, Metadata v12) resolve them
through the broker's metadata image, and unknown ids get UNKNOWN_TOPIC_ID / UNKNOWN_TOPIC_OR_PARTITION;
ElectLeaders answers every version with Kafka's per-partition and top-level errors."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kio.schema.delete_topics.v6 import request as delete_topics_v6
from kio.schema.elect_leaders.v0 import request as elect_leaders_v0
from kio.schema.elect_leaders.v2 import request as elect_leaders_v2
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_v12

from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.server.broker import Broker
from tierlog.server.controller_apis import API_DELETE_TOPICS, API_ELECT_LEADERS
from tierlog.server.kafka_apis import API_METADATA, KafkaApis


def run_with_broker(tmp_path: Path, test: Callable[[KafkaApis], Awaitable[None]]) -> None:
    """A whole broker (controller included) in this process on free ports; the test calls its KafkaApis."""

    async def main() -> None:
        config = KafkaConfig(
            {
                "log.dirs": str(tmp_path),
                "listeners": "PLAINTEXT://127.0.0.1:0",
                "auto.create.topics.enable": "false",
            }
        )
        broker = Broker(config)
        async with asyncio.timeout(30):
            await broker.start()
        try:
            controller = broker.controller_server.controller
            controller.create_topic("events", 2, 1, {})
            await broker.forwarding_manager.sync_metadata()
            await test(broker.apis)
        finally:
            await broker.stop()

    asyncio.run(main())


async def call(apis: KafkaApis, api_key: int, version: int, body: Any) -> Any:
    return await apis.handle(Request(api_key, version, 7, "test", body, 0))


def test_metadata_by_topic_id_names_the_topic(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        topic_id = apis.image.topics["events"].topic_id
        request = metadata_v12.MetadataRequest(
            topics=(metadata_v12.MetadataRequestTopic(topic_id=topic_id, name=None),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        (topic,) = (await call(apis, API_METADATA, 12, request)).topics
        assert (topic.name, topic.error_code, len(topic.partitions)) == ("events", ErrorCode.none, 2)

    run_with_broker(tmp_path, test)


def test_delete_topics_by_id_deletes_the_topic_and_unknown_ids_are_reported(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        topic_id = apis.image.topics["events"].topic_id
        unknown = uuid.uuid4()
        request = delete_topics_v6.DeleteTopicsRequest(
            topics=(
                delete_topics_v6.DeleteTopicState(name=None, topic_id=topic_id),
                delete_topics_v6.DeleteTopicState(name=None, topic_id=unknown),
            ),
            timeout=datetime.timedelta(seconds=5),
        )
        deleted, missing = (await call(apis, API_DELETE_TOPICS, 6, request)).responses
        assert (deleted.name, deleted.topic_id, deleted.error_code) == ("events", topic_id, ErrorCode.none)
        assert (missing.topic_id, missing.error_code) == (unknown, ErrorCode.unknown_topic_id)
        # The broker's own image (not only the controller's) no longer has the topic when the response leaves.
        assert "events" not in apis.image.topics
        assert apis.image.topic_by_id(topic_id) is None

    run_with_broker(tmp_path, test)


def _results(response: Any) -> dict[str, list[tuple[int, ErrorCode]]]:
    return {
        r.topic: [(p.partition_id, p.error_code) for p in r.partition_result] for r in response.replica_election_results
    }


def test_elect_leaders_names_each_partition_needing_no_election_or_unknown(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        request = elect_leaders_v2.ElectLeadersRequest(
            election_type=0,
            topic_partitions=(
                elect_leaders_v2.TopicPartitions(topic="events", partitions=(0, 1, 5)),
                elect_leaders_v2.TopicPartitions(topic="nope", partitions=(0,)),
            ),
        )
        response = await call(apis, API_ELECT_LEADERS, 2, request)
        assert response.error_code == ErrorCode.none
        assert _results(response) == {
            "events": [
                (0, ErrorCode.election_not_needed),
                (1, ErrorCode.election_not_needed),
                (5, ErrorCode.unknown_topic_or_partition),
            ],
            "nope": [(0, ErrorCode.unknown_topic_or_partition)],
        }
        unclean = elect_leaders_v2.ElectLeadersRequest(
            election_type=1, topic_partitions=(elect_leaders_v2.TopicPartitions(topic="events", partitions=(0,)),)
        )
        assert _results(await call(apis, API_ELECT_LEADERS, 2, unclean)) == {
            "events": [(0, ErrorCode.election_not_needed)]
        }

    run_with_broker(tmp_path, test)


def test_elect_leaders_answers_every_partition_of_a_topic_named_twice(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        request = elect_leaders_v2.ElectLeadersRequest(
            election_type=0,
            topic_partitions=(
                elect_leaders_v2.TopicPartitions(topic="events", partitions=(0,)),
                elect_leaders_v2.TopicPartitions(topic="events", partitions=(1,)),
            ),
        )
        assert _results(await call(apis, API_ELECT_LEADERS, 2, request)) == {
            "events": [(0, ErrorCode.election_not_needed), (1, ErrorCode.election_not_needed)]
        }

    run_with_broker(tmp_path, test)


def test_elect_leaders_of_every_partition_leaves_out_those_needing_none_and_v0_is_preferred(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        request = elect_leaders_v0.ElectLeadersRequest(topic_partitions=None)
        response = await call(apis, API_ELECT_LEADERS, 0, request)
        assert _results(response) == {"events": []}

    run_with_broker(tmp_path, test)


def test_elect_leaders_of_an_unknown_type_fails_the_request_and_every_partition_named(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        request = elect_leaders_v2.ElectLeadersRequest(
            election_type=7, topic_partitions=(elect_leaders_v2.TopicPartitions(topic="events", partitions=(0, 1)),)
        )
        response = await call(apis, API_ELECT_LEADERS, 2, request)
        assert response.error_code == ErrorCode.invalid_request
        assert _results(response) == {"events": [(0, ErrorCode.invalid_request), (1, ErrorCode.invalid_request)]}
        assert response.replica_election_results[0].partition_result[0].error_message == "Unknown election type 7"

    run_with_broker(tmp_path, test)

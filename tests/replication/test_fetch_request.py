"""A Fetch request into the ReplicaManager (the translation both the asyncio shell and the simulator use): a
follower's request records its position and moves the HW, and the broker's fetch.max.bytes caps the response."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from replication_helpers import TP, Cluster, to_response

from tierlog.replication.fetch_request import FetchAnswer, fetch_messages_for_request
from tierlog.replication.fetch_session import FetchManager, FetchRequestPartition, FetchSessionCache
from tierlog.replication.fetcher import FetchRequestData

BIG = 1 << 20


def fetch_manager() -> FetchManager:
    return FetchManager(FetchSessionCache(1000, 120_000, random.Random(0)), lambda _: None)


def consumer_fetch(offset: int, max_bytes: int = BIG) -> FetchRequestData:
    partition = FetchRequestPartition(TP, uuid.UUID(int=0), offset, -1, -1, -1, BIG)
    return FetchRequestData(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, partitions=[partition])


def test_a_followers_fetch_request_records_its_position_and_moves_the_hw(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2])
    cluster.publish()
    cluster.produce(1, b"a", acks=1)
    fetcher = cluster.managers[2].fetchers[1]
    sessions = fetch_manager()
    for _ in range(2):  # the first fetch takes the record, the second tells the leader the follower has it
        request = fetcher.build_fetch_request(cluster.now)
        assert request is not None
        answers: list[FetchAnswer] = []
        fetch_messages_for_request(
            cluster.managers[1], sessions, request, cluster.now, answers.append, fetch_max_bytes=BIG
        )
        if not answers:  # nothing new to read: parked until its wait ends
            cluster.advance(request.max_wait_ms)
        fetcher.process_fetch_response(
            [to_response(result) for _, result in answers[0].partitions], cluster.now, session_id=answers[0].session_id
        )
    assert cluster.log(1).high_watermark == 1


def test_fetch_max_bytes_caps_what_a_request_asks_for(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1])
    cluster.publish()
    cluster.produce(1, b"first", acks=1)
    cluster.produce(1, b"second", acks=1)
    first_batch = cluster.log(1).read(0, BIG, max_offset=1, min_one_message=True).records
    assert first_batch is not None
    answers: list[FetchAnswer] = []
    fetch_messages_for_request(
        cluster.managers[1],
        fetch_manager(),
        consumer_fetch(0),
        cluster.now,
        answers.append,
        fetch_max_bytes=first_batch.size,
    )
    ((result,),) = [[r for _, r in answer.partitions] for answer in answers]
    assert result.read is not None and result.read.size == first_batch.size
    answers.clear()
    fetch_messages_for_request(
        cluster.managers[1], fetch_manager(), consumer_fetch(0), cluster.now, answers.append, fetch_max_bytes=BIG
    )
    ((result,),) = [[r for _, r in answer.partitions] for answer in answers]
    assert result.read is not None and result.read.size > first_batch.size

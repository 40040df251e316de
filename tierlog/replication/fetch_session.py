"""Fetch sessions (KIP-227, Kafka's FetchSession.scala and FetchSessionHandler.java) without a clock: the leader's
session cache and the fetcher's side of a session (docs/performance.md#fetch-sessions).

A fetcher that asks for a session (Fetch v7+, session id 0 and epoch 0) sends every partition once; the leader
caches them under a new session id. Later fetches of that session (epoch 1, 2, ...) send only the partitions added
or changed and name the ones to forget; the leader reads every partition of the session and answers only those
with something new. So a fetch of many idle partitions costs what its changes cost, not what its partitions do.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tierlog.common import TopicPartition

INVALID_SESSION_ID = 0
# A full fetch that asks for a new session, and the epoch of the first incremental fetch after it.
INITIAL_EPOCH = 0
# A full fetch without a session (the only kind before v7), or an incremental one that closes its session.
FINAL_EPOCH = -1

FETCH_SESSION_ID_NOT_FOUND = "FETCH_SESSION_ID_NOT_FOUND"
INVALID_FETCH_SESSION_EPOCH = "INVALID_FETCH_SESSION_EPOCH"
FETCH_SESSION_TOPIC_ID_ERROR = "FETCH_SESSION_TOPIC_ID_ERROR"
# The errors of a whole Fetch that refuse its session: the fetcher falls back to a full fetch.
FETCH_SESSION_ERRORS = frozenset(
    {FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR}
)

# How a session names a partition: by topic id from Fetch v13 on, by topic name before.
SessionKey = tuple[uuid.UUID | str, int]


def next_epoch(epoch: int) -> int:
    """Kafka's FetchMetadata.nextEpoch: FINAL stays FINAL, and the epoch wraps to 1, never back to 0."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 2**31 - 1 else epoch + 1


@dataclass(frozen=True, slots=True)
class FetchRequestPartition:
    """What a fetch asks of one partition (Kafka's FetchRequest.PartitionData). On the leader, the topic is ""
    when the topic id names no topic it knows."""

    topic_partition: TopicPartition
    topic_id: uuid.UUID
    fetch_offset: int
    current_leader_epoch: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int

    def key(self, uses_topic_ids: bool) -> SessionKey:
        tp = self.topic_partition
        return (self.topic_id if uses_topic_ids else tp.topic, tp.partition)


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """What an answer says of one partition, as far as a session compares it (Kafka's maybeUpdateResponseData)."""

    records_size: int
    high_watermark: int
    log_start_offset: int
    error: str | None
    diverging: bool
    preferred_read_replica: int = -1


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: the request as last sent, and the HW and log start as last answered."""

    request: FetchRequestPartition
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_respond(self, answer: PartitionAnswer) -> bool:
        """Kafka's CachedPartition.maybeUpdateResponseData: records, a new HW or log start, a preferred replica, an
        error or a diverging epoch go in an incremental answer; a partition that says nothing new is left out. An
        error resets the cached HW, so the partition is answered again once the error is gone."""
        must = (
            answer.records_size > 0
            or answer.high_watermark != self.high_watermark
            or answer.log_start_offset != self.log_start_offset
            or answer.preferred_read_replica >= 0
            or answer.error is not None
            or answer.diverging
        )
        self.high_watermark = -1 if answer.error is not None else answer.high_watermark
        self.log_start_offset = answer.log_start_offset
        return must


@dataclass(slots=True)
class FetchSession:
    id: int
    # A follower's session (Kafka's privileged): only a privileged one evicts it while it is new.
    privileged: bool
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    # The epoch the next incremental fetch must carry.
    epoch: int
    # In fetch order: a partition that answered records moves to the end, so the next fetch's bytes go to others
    # first (as Kafka's session rotates them).
    partitions: dict[SessionKey, CachedPartition] = field(default_factory=dict)
    # Where the cache last filed it for eviction (Kafka's EvictableKey uses the size as of the last touch).
    cached_size: int = 0
    evictable_by_privileged: bool = False
    evictable_by_all: bool = False

    def eviction_rank(self) -> tuple[bool, int, int]:
        """Kafka's EvictableKey order: unprivileged before privileged, then smaller before larger, then by id."""
        return (self.privileged, self.cached_size, self.id)


class FetchSessionCache:
    """Kafka's FetchSessionCacheShard: at most `max_entries` sessions (max.incremental.fetch.session.cache.slots).
    A new session takes a free slot; with none free it evicts a session unused for longer than `eviction_ms`
    (min.incremental.fetch.session.eviction.ms), else the least valuable one it may: a session younger than
    `eviction_ms` is protected, from everyone if it is a follower's, from consumers otherwise; among the rest a
    consumer's before a follower's, then the one with fewer partitions. Time comes in as `now_ms`."""

    def __init__(self, max_entries: int, eviction_ms: int, rng: random.Random) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        # Session ids are random (as Kafka's), so a fetcher's stale id is unlikely to name another's session.
        self._rng = rng
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    @property
    def total_partitions(self) -> int:
        return sum(session.cached_size for session in self.sessions.values())

    def maybe_create_session(
        self,
        now_ms: int,
        privileged: bool,
        partitions: dict[SessionKey, CachedPartition],
        uses_topic_ids: bool,
    ) -> int:
        """A new session of `partitions` if there is room (or room can be made); its id, or INVALID_SESSION_ID."""
        if len(self.sessions) >= self.max_entries and not self._try_evict(privileged, len(partitions), now_ms):
            return INVALID_SESSION_ID
        session = FetchSession(
            self._new_session_id(), privileged, uses_topic_ids, now_ms, now_ms, next_epoch(INITIAL_EPOCH), partitions
        )
        self.sessions[session.id] = session
        self.touch(session, now_ms)
        return session.id

    def _new_session_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, 2**31 - 1)
            if session_id not in self.sessions:
                return session_id

    def _try_evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Kafka's tryEvict: the least recently used session if it is stale, else the first evictable one if it is
        worth less than the session that wants its slot."""
        if not self.sessions:
            return False
        least_recent = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - least_recent.last_used_ms > self.eviction_ms:
            self._evict(least_recent)
            return True
        candidates = [
            s for s in self.sessions.values() if (s.evictable_by_privileged if privileged else s.evictable_by_all)
        ]
        if not candidates:
            return False
        victim = min(candidates, key=FetchSession.eviction_rank)
        # Kafka's proposed key has id 0, so it ties below any session of the same privilege and size.
        if (privileged, size, 0) < victim.eviction_rank():
            return False
        self._evict(victim)
        return True

    def _evict(self, session: FetchSession) -> None:
        self.remove(session.id)
        self.evictions += 1

    def remove(self, session_id: int) -> FetchSession | None:
        return self.sessions.pop(session_id, None)

    def touch(self, session: FetchSession, now_ms: int) -> None:
        """Kafka's touch: the session was used now; re-file it for eviction with its current size."""
        session.last_used_ms = now_ms
        session.cached_size = len(session.partitions)
        old_enough = now_ms - session.creation_ms > self.eviction_ms
        session.evictable_by_privileged = not session.privileged or old_enough
        session.evictable_by_all = old_enough


@dataclass(frozen=True, slots=True)
class SessionAnswer:
    """The top level of a Fetch answer: the session error (None if there is none) and the session id."""

    error: str | None
    session_id: int


class FetchContext:
    """Kafka's FetchContext: which partitions a fetch reads, and which of their answers it sends."""

    def partitions(self) -> list[FetchRequestPartition]:
        raise NotImplementedError

    def answer(
        self, answers: Sequence[tuple[FetchRequestPartition, PartitionAnswer]], now_ms: int
    ) -> tuple[SessionAnswer, list[bool]]:
        """The answer's top level, and for each of `answers` whether it is sent."""
        raise NotImplementedError


class SessionErrorContext(FetchContext):
    """The session named cannot be used: the answer is that error alone, with no partition."""

    def __init__(self, error: str) -> None:
        self.error = error

    def partitions(self) -> list[FetchRequestPartition]:
        return []

    def answer(
        self, answers: Sequence[tuple[FetchRequestPartition, PartitionAnswer]], now_ms: int
    ) -> tuple[SessionAnswer, list[bool]]:
        return SessionAnswer(self.error, INVALID_SESSION_ID), [False] * len(answers)


class SessionlessFetchContext(FetchContext):
    """A fetch without a session (before v7, or session id 0 with epoch -1): every partition, every time."""

    def __init__(self, fetch_data: list[FetchRequestPartition]) -> None:
        self._fetch_data = fetch_data

    def partitions(self) -> list[FetchRequestPartition]:
        return self._fetch_data

    def answer(
        self, answers: Sequence[tuple[FetchRequestPartition, PartitionAnswer]], now_ms: int
    ) -> tuple[SessionAnswer, list[bool]]:
        return SessionAnswer(None, INVALID_SESSION_ID), [True] * len(answers)


class FullFetchContext(FetchContext):
    """A full fetch that asks for a session: every partition is answered and cached in a new session, if the
    cache has room for it."""

    def __init__(
        self, cache: FetchSessionCache, fetch_data: list[FetchRequestPartition], uses_topic_ids: bool, privileged: bool
    ) -> None:
        self._cache = cache
        self._fetch_data = fetch_data
        self._uses_topic_ids = uses_topic_ids
        self._privileged = privileged

    def partitions(self) -> list[FetchRequestPartition]:
        return self._fetch_data

    def answer(
        self, answers: Sequence[tuple[FetchRequestPartition, PartitionAnswer]], now_ms: int
    ) -> tuple[SessionAnswer, list[bool]]:
        cached: dict[SessionKey, CachedPartition] = {}
        for request, response in answers:
            partition = CachedPartition(request)
            partition.must_respond(response)
            cached[request.key(self._uses_topic_ids)] = partition
        session_id = self._cache.maybe_create_session(now_ms, self._privileged, cached, self._uses_topic_ids)
        return SessionAnswer(None, session_id), [True] * len(answers)


class IncrementalFetchContext(FetchContext):
    """A fetch of an existing session: reads every partition of the session as cached, answers only those with
    something new (CachedPartition.must_respond)."""

    def __init__(self, session: FetchSession, topic_name: Callable[[uuid.UUID], str | None]) -> None:
        self._session = session
        self._expected_epoch = session.epoch
        self._topic_name = topic_name

    def partitions(self) -> list[FetchRequestPartition]:
        session = self._session
        requests = []
        for key, cached in session.partitions.items():
            request = cached.request
            if session.uses_topic_ids and not request.topic_partition.topic:
                # A topic id unknown when it was added may be known by now (Kafka's maybeResolveUnknownName).
                name = self._topic_name(request.topic_id)
                if name is not None:
                    request = _with_topic(request, name)
                    session.partitions[key].request = request
            requests.append(request)
        return requests

    def answer(
        self, answers: Sequence[tuple[FetchRequestPartition, PartitionAnswer]], now_ms: int
    ) -> tuple[SessionAnswer, list[bool]]:
        session = self._session
        if session.epoch != self._expected_epoch:
            # Another fetch of this session came while this one was parked (a duplicate request).
            return SessionAnswer(INVALID_FETCH_SESSION_EPOCH, session.id), [False] * len(answers)
        answered_records = []

        def must_respond(item: tuple[FetchRequestPartition, PartitionAnswer]) -> bool:
            request, response = item
            key = request.key(session.uses_topic_ids)
            cached = session.partitions.get(key)
            if cached is None:  # forgotten by a later fetch of this session: not answered
                return False
            if response.records_size > 0:
                answered_records.append(key)
            return cached.must_respond(response)

        sent = [must_respond(item) for item in answers]
        for key in answered_records:
            session.partitions[key] = session.partitions.pop(key)
        return SessionAnswer(None, session.id), sent


def _with_topic(request: FetchRequestPartition, topic: str) -> FetchRequestPartition:
    return dataclasses.replace(request, topic_partition=TopicPartition(topic, request.topic_partition.partition))


class FetchManager:
    """Kafka's FetchManager.newContext: the context of one Fetch from its session id and epoch."""

    def __init__(self, cache: FetchSessionCache, topic_name: Callable[[uuid.UUID], str | None]) -> None:
        self.cache = cache
        self._topic_name = topic_name

    def new_context(
        self,
        *,
        uses_topic_ids: bool,
        session_id: int,
        session_epoch: int,
        is_follower: bool,
        fetch_data: list[FetchRequestPartition],
        forgotten: Iterable[SessionKey],
        now_ms: int,
    ) -> FetchContext:
        if session_epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            # A full fetch closes the session it names.
            if session_id != INVALID_SESSION_ID:
                self.cache.remove(session_id)
            if session_epoch == FINAL_EPOCH:
                return SessionlessFetchContext(fetch_data)
            return FullFetchContext(self.cache, fetch_data, uses_topic_ids, is_follower)
        session = self.cache.get(session_id)
        if session is None:
            return SessionErrorContext(FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != session_epoch:
            return SessionErrorContext(INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != uses_topic_ids:
            return SessionErrorContext(FETCH_SESSION_TOPIC_ID_ERROR)
        for request in fetch_data:
            key = request.key(uses_topic_ids)
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = CachedPartition(request)
            else:
                cached.request = request
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            self.cache.remove(session.id)
            return SessionlessFetchContext(fetch_data)
        self.cache.touch(session, now_ms)
        session.epoch = next_epoch(session.epoch)
        return IncrementalFetchContext(session, self._topic_name)


@dataclass(frozen=True, slots=True)
class SessionFetch:
    """What the fetcher's side of a session sends next: the partitions (all of them in a full fetch, the added
    and changed ones in an incremental one), the partitions to forget, and the session id and epoch."""

    partitions: list[FetchRequestPartition]
    forgotten: list[TopicPartition]
    session_id: int
    session_epoch: int


class FetchSessionHandler:
    """Kafka's FetchSessionHandler: the fetcher's side of its session with one leader. A full fetch (epoch 0)
    asks for a session; once the leader gave one, each fetch sends only what changed since the last (a partition
    added, or its fetch offset, epochs, log start or bytes changed) and forgets what it no longer fetches. A session
    error or a lost answer falls back to a full fetch."""

    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        # What the leader's session holds, as this side last sent it.
        self.session_partitions: dict[TopicPartition, FetchRequestPartition] = {}

    @property
    def is_full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)

    def build(self, wanted: list[FetchRequestPartition]) -> SessionFetch | None:
        """The next fetch of `wanted`; None if there is nothing to fetch and nothing for the leader to forget."""
        if self.is_full:
            self.session_partitions = {p.topic_partition: p for p in wanted}
            if not wanted:
                return None
            return SessionFetch(wanted, [], self.session_id, self.epoch)
        wanted_by_tp = {p.topic_partition: p for p in wanted}
        changed: list[FetchRequestPartition] = []
        forgotten: list[TopicPartition] = []
        for tp, sent in list(self.session_partitions.items()):
            now_wanted = wanted_by_tp.pop(tp, None)
            if now_wanted is None:
                del self.session_partitions[tp]
                forgotten.append(tp)
            elif now_wanted != sent:
                self.session_partitions[tp] = now_wanted
                changed.append(now_wanted)
        for tp, added in wanted_by_tp.items():
            self.session_partitions[tp] = added
        if not self.session_partitions and not forgotten:
            return None
        return SessionFetch(list(wanted_by_tp.values()) + changed, forgotten, self.session_id, self.epoch)

    def handle_response(self, session_id: int) -> None:
        """The leader answered without a session error: `session_id` is the session it created or continued (or
        INVALID_SESSION_ID: none, so the next fetch is full again)."""
        if session_id == INVALID_SESSION_ID:
            self.session_id, self.epoch = INVALID_SESSION_ID, INITIAL_EPOCH
        elif self.is_full:
            self.session_id, self.epoch = session_id, next_epoch(INITIAL_EPOCH)
        else:
            self.epoch = next_epoch(self.epoch)

    def handle_session_error(self, error: str) -> None:
        """The leader refused the session: an unknown id starts over; any other error closes the session with the
        next (full) fetch."""
        if error == FETCH_SESSION_ID_NOT_FOUND:
            self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH

    def handle_error(self) -> None:
        """No answer came (connection lost, timeout): the leader's session may be ahead of this side, so the next
        fetch is full and closes it (Kafka's nextCloseExisting)."""
        self.epoch = INITIAL_EPOCH

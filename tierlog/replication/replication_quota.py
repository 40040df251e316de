"""Kafka's replication throttles (KIP-73, docs/replication.md#throttles): a byte rate a broker allows for the
replication of throttled replicas, one quota for what it serves as leader and one for what it fetches as
follower, so that moving replicas does not starve producers and consumers.

A `ReplicationQuotaManager` knows which partitions are throttled on this broker (the topic configs
`leader.replication.throttled.replicas` / `follower.replication.throttled.replicas`: `*` or a list of
`partitionId:brokerId`, the entries naming this broker) and measures the bytes replicated for them over a
window of `replication.quota.window.num` samples of `replication.quota.window.size.seconds` each, as Kafka's
SimpleRate does. It never reads a clock: every call takes `now_ms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.config_def import LONG_MAX
from tierlog.storage.log_config import ALL_REPLICAS, throttled_partitions_of

LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
# Kafka's QuotaConfig.QUOTA_BYTES_PER_SECOND_DEFAULT: no limit.
UNLIMITED_RATE = LONG_MAX
# Kafka's defaults of replication.quota.window.num and replication.quota.window.size.seconds.
DEFAULT_WINDOW_NUM = 11
DEFAULT_WINDOW_SIZE_SECONDS = 1


@dataclass(frozen=True, slots=True)
class ReplicationQuotaConfig:
    """Kafka's ReplicationQuotaManagerConfig: the broker configs replication.quota.window.num and
    replication.quota.window.size.seconds."""

    window_num: int = DEFAULT_WINDOW_NUM
    window_size_seconds: int = DEFAULT_WINDOW_SIZE_SECONDS


class _Sample:
    __slots__ = ("last_event_ms", "start_ms", "value")

    def __init__(self, now_ms: int) -> None:
        self.reset(now_ms)

    def reset(self, now_ms: int) -> None:
        self.start_ms = now_ms
        self.last_event_ms = now_ms
        self.value = 0.0


class WindowedRate:
    """Kafka's SimpleRate over a WindowedSum: the bytes of the samples still in the window, divided by the time
    since the oldest sample started, but never by less than one sample's span (so a first burst does not read
    as an enormous rate). `window_num` samples are kept plus the one being filled, as Kafka's SampledStat."""

    def __init__(self, window_num: int, window_ms: int) -> None:
        self._window_num = window_num
        self._window_ms = window_ms
        self._samples: list[_Sample] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        sample = self._current_sample(now_ms)
        if now_ms - sample.start_ms >= self._window_ms:
            sample = self._advance(now_ms)
        sample.value += value
        sample.last_event_ms = now_ms

    def measure(self, now_ms: int) -> float:
        """Bytes per second at `now_ms`."""
        self._purge_obsolete(now_ms)
        total = sum(sample.value for sample in self._samples)
        oldest_start = min((sample.start_ms for sample in self._samples), default=now_ms)
        elapsed_ms = max(now_ms - oldest_start, self._window_ms)
        return total / (elapsed_ms / 1000)

    def _current_sample(self, now_ms: int) -> _Sample:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return self._samples[self._current]

    def _advance(self, now_ms: int) -> _Sample:
        self._current = (self._current + 1) % (self._window_num + 1)
        if self._current >= len(self._samples):
            self._samples.append(_Sample(now_ms))
        else:
            self._samples[self._current].reset(now_ms)
        return self._samples[self._current]

    def _purge_obsolete(self, now_ms: int) -> None:
        # A sample with no event in the whole window no longer counts; one that overlaps it still does.
        expire_age_ms = self._window_num * self._window_ms
        for sample in self._samples:
            if now_ms - sample.last_event_ms >= expire_age_ms:
                sample.reset(now_ms)


class ReplicationQuotaManager:
    """Kafka's ReplicationQuotaManager for one side (leader or follower) of this broker."""

    def __init__(self, config: ReplicationQuotaConfig, broker_id: int, throttled_replicas_config: str) -> None:
        self.broker_id = broker_id
        # The topic config that names this side's throttled replicas.
        self.throttled_replicas_config = throttled_replicas_config
        self.bytes_per_second = UNLIMITED_RATE
        self._rate = WindowedRate(config.window_num, config.window_size_seconds * 1000)
        self._throttled: dict[str, frozenset[int] | str] = {}

    def update_quota(self, bytes_per_second: int) -> None:
        self.bytes_per_second = bytes_per_second

    def update_throttled_partitions(self, topic_configs: Mapping[str, Mapping[str, str]]) -> None:
        """Take the throttled replicas of every topic from its configs (topic name -> overrides), replacing
        what was throttled before: a topic without the config, or deleted, is no longer throttled."""
        throttled: dict[str, frozenset[int] | str] = {}
        for topic, configs in topic_configs.items():
            value = configs.get(self.throttled_replicas_config, "")
            if value.strip():
                throttled[topic] = throttled_partitions_of(value, self.broker_id)
        self._throttled = throttled

    def is_throttled(self, tp: TopicPartition) -> bool:
        partitions = self._throttled.get(tp.topic)
        return partitions is not None and (partitions == ALL_REPLICAS or tp.partition in partitions)

    def is_quota_exceeded(self, now_ms: int) -> bool:
        """Whether the measured rate is above the quota (Kafka's Quota.upperBound: a rate equal to it is fine)."""
        return self._rate.measure(now_ms) > self.bytes_per_second

    def record(self, num_bytes: int, now_ms: int) -> None:
        """Count bytes replicated for throttled partitions, whether or not the quota is exceeded."""
        self._rate.record(num_bytes, now_ms)

    def byte_rate(self, now_ms: int) -> float:
        """The measured rate (Kafka's LeaderReplication / FollowerReplication byte-rate metric)."""
        return self._rate.measure(now_ms)

"""The broker's Prometheus metrics, on prometheus_client.

Each broker has a `CollectorRegistry` of its own (never the library's global REGISTRY), so several brokers in
one process, as in the tests, keep their metrics apart. Requests are counted and timed with the library's
Counter and Histogram. Values the broker already keeps (ReplicaManager's ISR change counts, each partition's
HW and LEO, the remote tier's counts) are read at scrape time by a `ScrapeCollector`, a custom collector,
rather than copied on every change, so the hot paths pay nothing for them.

Metric names follow Kafka's JMX names (`kafka.server:type=ReplicaManager,name=IsrShrinksPerSec` becomes
`kafka_server_replicamanager_isrshrinks_total`), so dashboards built for Kafka need only small edits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.validation import METRIC_LABEL_NAME_RE, METRIC_NAME_RE

from tierlog.protocol.api_versions import SUPPORTED_APIS

__all__ = [
    "LATENCY_BUCKETS_S",
    "BrokerMetrics",
    "ScrapeCollector",
    "ScrapedMetric",
    "broker_metrics",
    "metrics_route",
]

logger = logging.getLogger(__name__)

# The library adds a `<name>_created` series (the creation time) to every counter and histogram; the broker
# exposes exactly the series it documents, as before. The setting is the library's, for the whole process.
disable_created_metrics()

# Request latency from half a millisecond (a metadata request on a warm broker) to ten seconds (beyond a
# long-polled Fetch's default fetch.max.wait.ms of 500 ms, and a Produce waiting for acks=all).
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# What the callback of a labelled metric returns: one (labels, value) pair per sample, labels naming every
# label name. An unlabelled metric's callback returns just the value.
Samples = Iterable[tuple[Mapping[str, str], float]]
Callback = Callable[[], float] | Callable[[], Samples]


class ScrapedMetric:
    """A counter or gauge family whose samples `callback` reads at every scrape, from state kept elsewhere.

    Until a callback is set the family has no samples."""

    def __init__(
        self, kind: Literal["counter", "gauge"], name: str, documentation: str, labelnames: Sequence[str] = ()
    ) -> None:
        # Names outside Prometheus' classic character set would be exposed with the offending characters
        # replaced by underscores: refused, so that every series is named exactly as written here.
        if not METRIC_NAME_RE.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not METRIC_LABEL_NAME_RE.match(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} of metric {name}")
        if kind == "counter" and not name.endswith("_total"):
            # The library would expose the samples as <name>_total.
            raise ValueError(f"counter name {name!r} must end in _total")
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self._callback: Callback | None = None

    def callback(self, read: Callback) -> ScrapedMetric:
        """Read the value from `read` at every scrape; with labels, `read` returns every sample, e.g. one per
        partition: [({"topic": "t", "partition": "0"}, 42), ...]."""
        self._callback = read
        return self

    def _family(self) -> CounterMetricFamily | GaugeMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Metric:
        family = self._family()
        if self._callback is None:
            return family
        try:
            result: Any = self._callback()
            samples: Samples = result if self.labelnames else [({}, result)]
            rows = [(self._label_values(labels), float(value)) for labels, value in samples]
        except Exception:
            # One broken callback must not take the whole scrape down; the family renders without samples.
            logger.exception("metrics callback of %s failed", self.name)
            return family
        for label_values, value in rows:
            family.add_metric(label_values, value)
        return family

    def _label_values(self, labels: Mapping[str, str]) -> list[str]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, callback gave {sorted(labels)}")
        return [labels[name] for name in self.labelnames]


class ScrapeCollector:
    """A prometheus_client collector of `ScrapedMetric`s: register it once with all its metrics, so the
    registry knows their names (a name taken twice is refused)."""

    def __init__(self, metrics: Iterable[ScrapedMetric]) -> None:
        self.metrics = list(metrics)
        names = [metric.name for metric in self.metrics]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            # The registry refuses a name another collector has, not one named twice in the same collector.
            raise ValueError(f"metric names given twice: {twice}")

    def describe(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric._family()

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.collect()


@dataclass(frozen=True, slots=True)
class BrokerMetrics:
    """The broker's metrics: KafkaApis calls `observe_request` per request; `broker_metrics.wire_broker_metrics`
    points the callbacks of the rest at the state the broker already keeps."""

    # labels: request (the Kafka API name, "Produce")
    requests_total: Counter
    request_latency_seconds: Histogram
    # callbacks: ReplicaManager's running counts
    isr_shrinks_total: ScrapedMetric
    isr_expands_total: ScrapedMetric
    under_replicated_partitions: ScrapedMetric
    # callbacks: the replication throttles' measured rates (docs/replication.md#throttles)
    leader_replication_byte_rate: ScrapedMetric
    follower_replication_byte_rate: ScrapedMetric
    # callbacks returning one sample per partition, labels: topic, partition
    partition_high_watermark: ScrapedMetric
    partition_log_end_offset: ScrapedMetric
    partition_hw_lag: ScrapedMetric
    partition_log_start_offset: ScrapedMetric
    partition_local_log_start_offset: ScrapedMetric
    partition_local_log_size_bytes: ScrapedMetric
    # callbacks returning one sample per partition with the remote tier on (KIP-405), labels: topic, partition
    partition_remote_log_end_offset: ScrapedMetric
    partition_remote_log_size_bytes: ScrapedMetric
    partition_remote_copy_lag_bytes: ScrapedMetric
    # callbacks: the RemoteLogManager's running counts (0 without a remote tier). Kafka's RemoteCopyBytesPerSec
    # and the like are meters; Prometheus takes counters and the scraper computes the rates.
    remote_copy_bytes_total: ScrapedMetric
    remote_copy_segments_total: ScrapedMetric
    remote_copy_errors_total: ScrapedMetric
    remote_fetch_bytes_total: ScrapedMetric
    remote_fetch_requests_total: ScrapedMetric
    remote_fetch_errors_total: ScrapedMetric
    remote_fetch_prefetch_bytes_total: ScrapedMetric
    remote_fetch_chunk_cache_hit_bytes_total: ScrapedMetric
    remote_delete_segments_total: ScrapedMetric
    remote_delete_errors_total: ScrapedMetric
    # The children of each API key, so a request costs two updates rather than two label look-ups.
    _by_api: dict[int, tuple[Counter, Histogram]] = field(default_factory=dict, init=False, repr=False)

    def observe_request(self, api_key: int, seconds: float) -> None:
        """Count one request of `api_key` and the time it took to answer."""
        children = self._by_api.get(api_key)
        if children is None:
            api = SUPPORTED_APIS.get(api_key)
            request = api.name if api is not None else str(api_key)
            children = self._by_api[api_key] = (
                self.requests_total.labels(request=request),
                self.request_latency_seconds.labels(request=request),
            )
        requests, latency = children
        requests.inc()
        latency.observe(seconds)


def broker_metrics(registry: CollectorRegistry) -> BrokerMetrics:
    """Create the broker's metrics in `registry` (callbacks unset: `broker_metrics.wire_broker_metrics` sets them)."""
    partition_labels = ("topic", "partition")

    def counter(name: str, documentation: str) -> ScrapedMetric:
        return ScrapedMetric("counter", name, documentation)

    def partition_gauge(name: str, documentation: str) -> ScrapedMetric:
        return ScrapedMetric("gauge", name, documentation, partition_labels)

    requests_total = Counter(
        "kafka_network_requestmetrics_requests_total",
        "Requests received, by Kafka API.",
        ("request",),
        registry=registry,
    )
    request_latency_seconds = Histogram(
        "kafka_network_requestmetrics_totaltime_seconds",
        "Time to answer a request, from its arrival to its response, by Kafka API.",
        ("request",),
        registry=registry,
        buckets=LATENCY_BUCKETS_S,
    )
    metrics = BrokerMetrics(
        requests_total=requests_total,
        request_latency_seconds=request_latency_seconds,
        isr_shrinks_total=counter(
            "kafka_server_replicamanager_isrshrinks_total", "ISR shrinks of partitions this broker leads."
        ),
        isr_expands_total=counter(
            "kafka_server_replicamanager_isrexpands_total", "ISR expansions of partitions this broker leads."
        ),
        under_replicated_partitions=ScrapedMetric(
            "gauge",
            "kafka_server_replicamanager_underreplicatedpartitions",
            "Partitions this broker leads whose ISR is smaller than their replica set.",
        ),
        leader_replication_byte_rate=ScrapedMetric(
            "gauge",
            "kafka_server_leaderreplication_byte_rate",
            "Bytes/s this broker serves as leader for throttled replicas (Kafka's LeaderReplication byte-rate).",
        ),
        follower_replication_byte_rate=ScrapedMetric(
            "gauge",
            "kafka_server_followerreplication_byte_rate",
            "Bytes/s this broker fetches as follower for throttled replicas (Kafka's FollowerReplication byte-rate).",
        ),
        partition_high_watermark=partition_gauge(
            "kafka_cluster_partition_highwatermark", "High watermark of each local replica."
        ),
        partition_log_end_offset=partition_gauge("kafka_log_log_logendoffset", "Log end offset of each local replica."),
        partition_hw_lag=partition_gauge(
            "tierlog_partition_hw_lag",
            "Log end offset minus high watermark of each local replica: records not yet committed.",
        ),
        partition_log_start_offset=partition_gauge(
            "tierlog_log_start_offset",
            "Log start offset of each local replica (Rx: with the remote tier on, the log starts there).",
        ),
        partition_local_log_start_offset=partition_gauge(
            "tierlog_local_log_start_offset", "First offset of each local replica on this broker's disk (Lx)."
        ),
        partition_local_log_size_bytes=partition_gauge(
            "tierlog_local_log_size_bytes", "Bytes of each local replica's segments on this broker's disk."
        ),
        partition_remote_log_end_offset=partition_gauge(
            "tierlog_remote_log_end_offset",
            "Highest offset in remote storage (Ry, inclusive; -1 before the first copy) of each local "
            "replica with the remote tier on.",
        ),
        partition_remote_log_size_bytes=partition_gauge(
            "tierlog_remote_log_size_bytes",
            "Bytes of the copied remote segments of each local replica with the remote tier on "
            "(Kafka's RemoteLogSizeBytes).",
        ),
        partition_remote_copy_lag_bytes=partition_gauge(
            "tierlog_remote_copy_lag_bytes",
            "Bytes of rolled local segments below the high watermark not yet in remote storage, of each "
            "local replica with the remote tier on (Kafka's RemoteCopyLagBytes).",
        ),
        remote_copy_bytes_total=counter(
            "tierlog_remote_copy_bytes_total",
            "Bytes of segments copied to remote storage (Kafka's RemoteCopyBytesPerSec).",
        ),
        remote_copy_segments_total=counter(
            "tierlog_remote_copy_segments_total",
            "Segments copied to remote storage (Kafka's RemoteCopyRequestsPerSec).",
        ),
        remote_copy_errors_total=counter(
            "tierlog_remote_copy_errors_total",
            "Segment copies to remote storage that failed (Kafka's RemoteCopyErrorsPerSec).",
        ),
        remote_fetch_bytes_total=counter(
            "tierlog_remote_fetch_bytes_total",
            "Bytes read from remote storage for fetches below the local log start (Kafka's RemoteFetchBytesPerSec).",
        ),
        remote_fetch_requests_total=counter(
            "tierlog_remote_fetch_requests_total",
            "Reads from remote storage for fetches below the local log start (Kafka's RemoteFetchRequestsPerSec).",
        ),
        remote_fetch_errors_total=counter(
            "tierlog_remote_fetch_errors_total",
            "Reads from remote storage that failed (Kafka's RemoteFetchErrorsPerSec).",
        ),
        remote_fetch_prefetch_bytes_total=counter(
            "tierlog_remote_fetch_prefetch_bytes_total",
            "Bytes the remote reads' chunk cache read ahead from remote storage (docs/performance.md#remote-reads).",
        ),
        remote_fetch_chunk_cache_hit_bytes_total=counter(
            "tierlog_remote_fetch_chunk_cache_hit_bytes_total",
            "Bytes of cached chunks (loaded or loading) remote reads used instead of reading them; a chunk counts "
            "once per read that uses it.",
        ),
        remote_delete_segments_total=counter(
            "tierlog_remote_delete_segments_total",
            "Remote segments deleted by remote retention (Kafka's RemoteDeleteRequestsPerSec).",
        ),
        remote_delete_errors_total=counter(
            "tierlog_remote_delete_errors_total",
            "Remote segment deletions that failed (Kafka's RemoteDeleteErrorsPerSec).",
        ),
    )
    scraped = (getattr(metrics, f.name) for f in fields(metrics))
    registry.register(ScrapeCollector(metric for metric in scraped if isinstance(metric, ScrapedMetric)))
    return metrics


def metrics_route(registry: CollectorRegistry) -> web.RouteDef:
    """`GET /metrics`: `registry` in the Prometheus text format 0.0.4."""

    async def handle(_request: web.Request) -> web.Response:
        body = []
        for family in registry.collect():
            body.append(generate_latest(_Families([family])))
            # One family at a time (a few milliseconds for a thousand partitions), with the requests that came
            # meanwhile served in between, so that a scrape never holds the event loop for long.
            await asyncio.sleep(0)
        return web.Response(body=b"".join(body), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    return web.get("/metrics", handle)


@dataclass(frozen=True, slots=True)
class _Families:
    """Metric families collected already, as the collector `generate_latest` takes."""

    families: list[Metric]

    def collect(self) -> list[Metric]:
        return self.families

"""A small Prometheus registry (text exposition format 0.0.4) and the broker's metric set.

No dependency: the broker needs counters, gauges and one histogram, rendered on `GET /metrics`. Values the
broker already keeps (ReplicaManager's ISR change counts, each partition's HW and LEO) are read at scrape
time through callbacks rather than copied on every change, so the hot paths pay nothing for them.

Metric names follow Kafka's JMX names (`kafka.server:type=ReplicaManager,name=IsrShrinksPerSec` becomes
`kafka_server_replicamanager_isrshrinks_total`), so dashboards built for Kafka need only small edits.

Everything runs on the event loop's thread, so nothing is locked.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from tierlog.protocol.api_versions import SUPPORTED_APIS

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS_S",
    "BrokerMetrics",
    "Counter",
    "Gauge",
    "Histogram",
    "MetricsRegistry",
    "broker_metrics",
]

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Request latency from half a millisecond (a metadata request on a warm broker) to ten seconds (beyond a
# long-polled Fetch's default fetch.max.wait.ms of 500 ms, and a Produce waiting for acks=all).
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# What the callback of a labelled metric returns: one (labels, value) pair per sample, labels naming every
# labelname. An unlabelled metric's callback returns just the value.
Samples = Iterable[tuple[Mapping[str, str], float]]
Callback = Callable[[], float] | Callable[[], Samples]

ChildT = TypeVar("ChildT")
MetricT = TypeVar("MetricT", bound="_Metric[Any]")


class _Metric(Generic[ChildT]):
    """One metric family: its name, help, label names, and either stored children (one per label-value
    combination) or a callback read at scrape time, never both."""

    type_name: ClassVar[str]

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            # Names starting with __ are reserved for Prometheus' own use.
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} of metric {name}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"duplicate label names of metric {name}: {list(labelnames)}")
        self.name = name
        self.help = help
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self._children: dict[tuple[str, ...], ChildT] = {}
        self._callback: Callback | None = None

    def labels(self, **labels: str) -> ChildT:
        """The child of these label values (all of `labelnames`, no other), created on first use."""
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}")
        return self._child(tuple(labels[name] for name in self.labelnames))

    def _unlabelled(self) -> ChildT:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels {list(self.labelnames)}: use .labels(...)")
        return self._child(())

    def _child(self, key: tuple[str, ...]) -> ChildT:
        if self._callback is not None:
            raise ValueError(f"{self.name} is computed by a callback and cannot be set directly")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def _new_child(self) -> ChildT:
        raise NotImplementedError

    def _set_callback(self, callback: Callback) -> None:
        if self._children:
            raise ValueError(f"{self.name} already has values set directly; it cannot also have a callback")
        self._callback = callback

    def _callback_samples(self) -> Samples:
        assert self._callback is not None
        result: Any = self._callback()
        return result if self.labelnames else [({}, result)]

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.type_name}"]
        if self._callback is None:
            for key, child in self._children.items():
                lines.extend(self._render_child(dict(zip(self.labelnames, key, strict=True)), child))
            return lines
        try:
            samples = [
                _sample_line(self.name, self._checked_labels(labels), value)
                for labels, value in self._callback_samples()
            ]
        except Exception:
            # One broken callback must not take the whole scrape down; the family renders without samples.
            logger.exception("metrics callback of %s failed", self.name)
            return lines
        return lines + samples

    def _checked_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, callback gave {sorted(labels)}")
        return {name: labels[name] for name in self.labelnames}

    def _render_child(self, labels: dict[str, str], child: ChildT) -> Iterator[str]:
        raise NotImplementedError


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, n: float = 1) -> None:
        if n < 0:
            raise ValueError(f"a counter only goes up; inc({n})")
        self.value += n


class Counter(_Metric[_CounterChild]):
    """A monotonically increasing count; its name must end in `_total` (the exposition convention)."""

    type_name = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter name {name!r} must end in _total")
        super().__init__(name, help, labelnames)

    def inc(self, n: float = 1) -> None:
        self._unlabelled().inc(n)

    def callback(self, fn: Callback) -> None:
        """Read the value from `fn` at every scrape (a count the broker already keeps); with labels, `fn`
        returns every sample: [(labels, value), ...]."""
        self._set_callback(fn)

    def _new_child(self) -> _CounterChild:
        return _CounterChild()

    def _render_child(self, labels: dict[str, str], child: _CounterChild) -> Iterator[str]:
        yield _sample_line(self.name, labels, child.value)


class _GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value


class Gauge(_Metric[_GaugeChild]):
    """A value that goes up and down: set directly, or computed at scrape time by a callback."""

    type_name = "gauge"

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def callback(self, fn: Callback) -> None:
        """Read the value from `fn` at every scrape; with labels, `fn` returns every sample, e.g. one per
        partition: [({"topic": "t", "partition": "0"}, 42), ...]."""
        self._set_callback(fn)

    def _new_child(self) -> _GaugeChild:
        return _GaugeChild()

    def _render_child(self, labels: dict[str, str], child: _GaugeChild) -> Iterator[str]:
        yield _sample_line(self.name, labels, child.value)


class _HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        # Per bucket, not cumulative (rendering accumulates), so an observation touches one slot; the last
        # slot is the +Inf bucket.
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # `le` buckets are inclusive: a value equal to a bound belongs to that bound's bucket.
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value


class Histogram(_Metric[_HistogramChild]):
    """Observations counted into cumulative `le` buckets (plus +Inf), with their sum and count."""

    type_name = "histogram"

    def __init__(self, name: str, help: str, buckets: Sequence[float], labelnames: Sequence[str] = ()) -> None:
        if "le" in labelnames:
            raise ValueError(f"histogram {name} cannot have a label named le")
        bounds = tuple(float(b) for b in buckets if b != math.inf)
        if not bounds or any(math.isnan(b) for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram {name} needs increasing, distinct bucket bounds, got {list(buckets)}")
        super().__init__(name, help, labelnames)
        self.buckets = bounds

    def observe(self, value: float) -> None:
        self._unlabelled().observe(value)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self.buckets)

    def _render_child(self, labels: dict[str, str], child: _HistogramChild) -> Iterator[str]:
        cumulative = 0
        for bound, count in zip((*self.buckets, math.inf), child.counts, strict=True):
            cumulative += count
            yield _sample_line(f"{self.name}_bucket", {**labels, "le": _format_value(bound)}, cumulative)
        yield _sample_line(f"{self.name}_sum", labels, child.sum)
        yield _sample_line(f"{self.name}_count", labels, cumulative)


class MetricsRegistry:
    """The metric families one `/metrics` endpoint renders, in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric[Any]] = {}

    def register(self, metric: MetricT) -> MetricT:
        """Add `metric` and return it; raises ValueError if its name is taken."""
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def render(self) -> str:
        lines = [line for metric in self._metrics.values() for line in metric.render()]
        return "".join(f"{line}\n" for line in lines)


def _sample_line(name: str, labels: Mapping[str, str], value: float) -> str:
    if not labels:
        return f"{name} {_format_value(value)}"
    rendered = ",".join(f'{key}="{_escape_label_value(val)}"' for key, val in labels.items())
    return f"{name}{{{rendered}}} {_format_value(value)}"


def _format_value(value: float) -> str:
    # Go's ParseFloat spellings, which is what Prometheus reads.
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


@dataclass(frozen=True, slots=True)
class BrokerMetrics:
    """The broker's metrics: KafkaApis calls `observe_request` per request; the broker wires the callbacks
    of the rest to the state it already keeps."""

    # labels: request (the Kafka API name, "Produce")
    requests_total: Counter
    request_latency_seconds: Histogram
    # callbacks: ReplicaManager's running counts
    isr_shrinks_total: Counter
    isr_expands_total: Counter
    under_replicated_partitions: Gauge
    # callbacks returning one sample per partition, labels: topic, partition
    partition_high_watermark: Gauge
    partition_log_end_offset: Gauge
    partition_hw_lag: Gauge
    partition_log_start_offset: Gauge
    partition_local_log_start_offset: Gauge
    partition_local_log_size_bytes: Gauge
    # callbacks returning one sample per partition with the remote tier on (KIP-405), labels: topic, partition
    partition_remote_log_end_offset: Gauge
    partition_remote_log_size_bytes: Gauge
    partition_remote_copy_lag_bytes: Gauge
    # callbacks: the RemoteLogManager's running counts (0 without a remote tier). Kafka's RemoteCopyBytesPerSec
    # and the like are meters; Prometheus takes counters and the scraper computes the rates.
    remote_copy_bytes_total: Counter
    remote_copy_segments_total: Counter
    remote_copy_errors_total: Counter
    remote_fetch_bytes_total: Counter
    remote_fetch_requests_total: Counter
    remote_fetch_errors_total: Counter
    remote_delete_segments_total: Counter
    remote_delete_errors_total: Counter
    # The children of each API key, so a request costs two increments rather than two label look-ups.
    _by_api: dict[int, tuple[_CounterChild, _HistogramChild]] = field(default_factory=dict, init=False, repr=False)

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


def broker_metrics(registry: MetricsRegistry) -> BrokerMetrics:
    """Create the broker's metrics in `registry` (callbacks unset: the broker wires them)."""
    partition_labels = ("topic", "partition")

    def counter(name: str, help: str) -> Counter:
        return registry.register(Counter(name, help))

    return BrokerMetrics(
        requests_total=registry.register(
            Counter(
                "kafka_network_requestmetrics_requests_total",
                "Requests received, by Kafka API.",
                ("request",),
            )
        ),
        request_latency_seconds=registry.register(
            Histogram(
                "kafka_network_requestmetrics_totaltime_seconds",
                "Time to answer a request, from its arrival to its response, by Kafka API.",
                LATENCY_BUCKETS_S,
                ("request",),
            )
        ),
        isr_shrinks_total=registry.register(
            Counter("kafka_server_replicamanager_isrshrinks_total", "ISR shrinks of partitions this broker leads.")
        ),
        isr_expands_total=registry.register(
            Counter("kafka_server_replicamanager_isrexpands_total", "ISR expansions of partitions this broker leads.")
        ),
        under_replicated_partitions=registry.register(
            Gauge(
                "kafka_server_replicamanager_underreplicatedpartitions",
                "Partitions this broker leads whose ISR is smaller than their replica set.",
            )
        ),
        partition_high_watermark=registry.register(
            Gauge("kafka_cluster_partition_highwatermark", "High watermark of each local replica.", partition_labels)
        ),
        partition_log_end_offset=registry.register(
            Gauge("kafka_log_log_logendoffset", "Log end offset of each local replica.", partition_labels)
        ),
        partition_hw_lag=registry.register(
            Gauge(
                "tierlog_partition_hw_lag",
                "Log end offset minus high watermark of each local replica: records not yet committed.",
                partition_labels,
            )
        ),
        partition_log_start_offset=registry.register(
            Gauge(
                "tierlog_log_start_offset",
                "Log start offset of each local replica (Rx: with the remote tier on, the log starts there).",
                partition_labels,
            )
        ),
        partition_local_log_start_offset=registry.register(
            Gauge(
                "tierlog_local_log_start_offset",
                "First offset of each local replica on this broker's disk (Lx).",
                partition_labels,
            )
        ),
        partition_local_log_size_bytes=registry.register(
            Gauge(
                "tierlog_local_log_size_bytes",
                "Bytes of each local replica's segments on this broker's disk.",
                partition_labels,
            )
        ),
        partition_remote_log_end_offset=registry.register(
            Gauge(
                "tierlog_remote_log_end_offset",
                "Highest offset in remote storage (Ry, inclusive; -1 before the first copy) of each local "
                "replica with the remote tier on.",
                partition_labels,
            )
        ),
        partition_remote_log_size_bytes=registry.register(
            Gauge(
                "tierlog_remote_log_size_bytes",
                "Bytes of the copied remote segments of each local replica with the remote tier on "
                "(Kafka's RemoteLogSizeBytes).",
                partition_labels,
            )
        ),
        partition_remote_copy_lag_bytes=registry.register(
            Gauge(
                "tierlog_remote_copy_lag_bytes",
                "Bytes of rolled local segments below the high watermark not yet in remote storage, of each "
                "local replica with the remote tier on (Kafka's RemoteCopyLagBytes).",
                partition_labels,
            )
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
        remote_delete_segments_total=counter(
            "tierlog_remote_delete_segments_total",
            "Remote segments deleted by remote retention (Kafka's RemoteDeleteRequestsPerSec).",
        ),
        remote_delete_errors_total=counter(
            "tierlog_remote_delete_errors_total",
            "Remote segment deletions that failed (Kafka's RemoteDeleteErrorsPerSec).",
        ),
    )

"""The Prometheus registry renders text exposition format 0.0.4 that a strict parser accepts, and the
broker's metric set has Kafka's JMX-derived names with values read from stub callbacks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pytest

from tierlog.server.metrics import (
    LATENCY_BUCKETS_S,
    Counter,
    Gauge,
    Histogram,
    MetricsRegistry,
    broker_metrics,
)

# --- a strict parser of the text format, so every test checks the whole output is well-formed ---------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"(?P<name>{_NAME})(?:\{{(?P<labels>.*)\}})? (?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\\n]|\\[\\"n])*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_GO_FLOAT = re.compile(r"[+-]?(?:Inf|NaN|\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)")


@dataclass
class Family:
    help: str
    type: str = ""
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        assert match, f"bad label at {text[position:]!r}"
        assert match["key"] not in labels, f"duplicate label {match['key']}"
        labels[match["key"]] = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m[0]], match["value"])
        position = match.end()
        if position < len(text):
            assert text[position] == ",", f"expected a comma at {text[position:]!r}"
            position += 1
    return labels


def parse(text: str) -> dict[str, Family]:
    """Every line is HELP, TYPE or a sample of the family declared just before; raises AssertionError."""
    assert text == "" or text.endswith("\n"), "the exposition ends with a newline"
    families: dict[str, Family] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            assert re.fullmatch(_NAME, name) and name not in families, line
            families[name] = Family(help=help_text.replace("\\n", "\n").replace("\\\\", "\\"))
            current = name
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            assert name == current and not families[name].type and not families[name].samples, line
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}, line
            families[name].type = kind
        else:
            match = _SAMPLE.fullmatch(line)
            assert match and current is not None, f"not a sample line: {line!r}"
            family = families[current]
            allowed = {current}
            if family.type == "histogram":
                allowed = {f"{current}_bucket", f"{current}_sum", f"{current}_count"}
            assert match["name"] in allowed, f"{match['name']} outside its family {current}"
            assert _GO_FLOAT.fullmatch(match["value"]), f"bad value in {line!r}"
            family.samples.append((match["name"], parse_labels(match["labels"] or ""), float(match["value"])))
    for name, family in families.items():
        assert family.type, f"{name} has no TYPE"
        if family.type == "counter":
            assert name.endswith("_total")
        if family.type == "histogram":
            check_histogram(name, family)
    return families


def check_histogram(name: str, family: Family) -> None:
    """Per label set: le buckets increasing and cumulative, ending at +Inf, whose count is _count."""
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    counts: dict[tuple[tuple[str, str], ...], float] = {}
    for sample_name, labels, value in family.samples:
        if sample_name == f"{name}_bucket":
            series_labels = {key: val for key, val in labels.items() if key != "le"}
            series.setdefault(tuple(series_labels.items()), []).append((float(labels["le"]), value))
        elif sample_name == f"{name}_count":
            counts[tuple(labels.items())] = value
    assert series.keys() == counts.keys()
    for key, buckets in series.items():
        bounds = [le for le, _ in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == math.inf
        values = [count for _, count in buckets]
        assert values == sorted(values), f"buckets of {name}{key} are not cumulative: {values}"
        assert values[-1] == counts[key]


# --- counters -----------------------------------------------------------------------------------------


def test_a_labelled_counter_renders_help_type_and_one_line_per_label_set() -> None:
    registry = MetricsRegistry()
    requests = registry.register(Counter("requests_total", "Requests.", ("request",)))
    requests.labels(request="Produce").inc()
    requests.labels(request="Produce").inc(2)
    requests.labels(request="Fetch").inc()
    assert registry.render() == (
        "# HELP requests_total Requests.\n"
        "# TYPE requests_total counter\n"
        'requests_total{request="Produce"} 3.0\n'
        'requests_total{request="Fetch"} 1.0\n'
    )
    parse(registry.render())


def test_label_values_and_help_are_escaped() -> None:
    registry = MetricsRegistry()
    counter = registry.register(Counter("odd_total", "A help\nwith a \\ backslash.", ("topic",)))
    counter.labels(topic='a "quoted"\\back\nline').inc()
    text = registry.render()
    assert "# HELP odd_total A help\\nwith a \\\\ backslash.\n" in text
    assert 'odd_total{topic="a \\"quoted\\"\\\\back\\nline"} 1.0\n' in text
    ((_, labels, value),) = parse(text)["odd_total"].samples
    assert labels == {"topic": 'a "quoted"\\back\nline'}
    assert value == 1.0


def test_counter_names_must_end_in_total_and_counters_only_go_up() -> None:
    with pytest.raises(ValueError, match="_total"):
        Counter("requests", "Requests.")
    counter = Counter("requests_total", "Requests.")
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1)


def test_labels_must_name_exactly_the_label_names() -> None:
    counter = Counter("requests_total", "Requests.", ("request",))
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels(api="Produce")
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels(request="Produce", extra="x")
    with pytest.raises(ValueError, match=r"use \.labels"):
        counter.inc()


def test_invalid_metric_and_label_names_are_refused() -> None:
    with pytest.raises(ValueError, match="invalid metric name"):
        Gauge("bad-name", "x")
    with pytest.raises(ValueError, match="invalid label name"):
        Gauge("ok", "x", ("bad-label",))
    with pytest.raises(ValueError, match="invalid label name"):
        Gauge("ok", "x", ("__reserved",))


def test_a_counter_callback_is_read_at_every_scrape() -> None:
    registry = MetricsRegistry()
    shrinks = [0]
    registry.register(Counter("shrinks_total", "Shrinks.")).callback(lambda: shrinks[0])
    assert "shrinks_total 0.0\n" in registry.render()
    shrinks[0] = 4
    assert "shrinks_total 4.0\n" in registry.render()


def test_a_metric_is_either_set_directly_or_computed_by_a_callback() -> None:
    counter = Counter("shrinks_total", "Shrinks.")
    counter.callback(lambda: 1)
    with pytest.raises(ValueError, match="callback"):
        counter.inc()
    gauge = Gauge("lag", "Lag.")
    gauge.set(1)
    with pytest.raises(ValueError, match="directly"):
        gauge.callback(lambda: 2)


# --- gauges -------------------------------------------------------------------------------------------


def test_a_gauge_renders_the_last_value_set() -> None:
    registry = MetricsRegistry()
    gauge = registry.register(Gauge("connections", "Open connections."))
    gauge.set(3)
    gauge.set(2.5)
    assert registry.render() == "# HELP connections Open connections.\n# TYPE connections gauge\nconnections 2.5\n"


def test_a_multi_sample_gauge_callback_renders_one_line_per_sample_in_label_order() -> None:
    registry = MetricsRegistry()
    gauge = registry.register(Gauge("hw", "High watermark.", ("topic", "partition")))
    gauge.callback(lambda: [({"partition": "0", "topic": "a"}, 10), ({"topic": "b", "partition": "1"}, 7)])
    assert registry.render().splitlines()[2:] == ['hw{topic="a",partition="0"} 10.0', 'hw{topic="b",partition="1"} 7.0']


def test_a_labelled_gauge_whose_callback_returns_a_bare_value_renders_no_samples(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = MetricsRegistry()
    registry.register(Gauge("hw", "High watermark.", ("topic",))).callback(lambda: 1)
    assert parse(registry.render())["hw"].samples == []
    assert "metrics callback of hw failed" in caplog.text


def test_a_failing_callback_leaves_its_family_empty_and_the_rest_of_the_scrape_intact(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = MetricsRegistry()
    registry.register(Gauge("broken", "Raises.")).callback(lambda: 1 / 0)
    wrong = registry.register(Gauge("wrong_labels", "Names a label it does not have.", ("topic",)))
    wrong.callback(lambda: [({"topic": "a", "partition": "0"}, 1)])
    registry.register(Gauge("fine", "Works.")).callback(lambda: 1)
    families = parse(registry.render())
    assert families["broken"].samples == []
    assert families["wrong_labels"].samples == []
    assert families["fine"].samples == [("fine", {}, 1.0)]
    assert "metrics callback of broken failed" in caplog.text


def test_special_values_use_prometheus_spellings() -> None:
    registry = MetricsRegistry()
    for name, value in [("nan", math.nan), ("pos", math.inf), ("neg", -math.inf), ("big", 1e20)]:
        registry.register(Gauge(name, name)).set(value)
    lines = [line for line in registry.render().splitlines() if not line.startswith("#")]
    assert lines == ["nan NaN", "pos +Inf", "neg -Inf", "big 1e+20"]
    parse(registry.render())


# --- histograms ---------------------------------------------------------------------------------------


def test_histogram_buckets_are_cumulative_inclusive_and_end_with_inf_sum_and_count() -> None:
    registry = MetricsRegistry()
    histogram = registry.register(Histogram("latency_seconds", "Latency.", (0.1, 1, 10), ("request",)))
    for value in (0.05, 0.1, 0.5, 1, 20):
        histogram.labels(request="Fetch").observe(value)
    assert registry.render().splitlines()[2:] == [
        'latency_seconds_bucket{request="Fetch",le="0.1"} 2.0',
        'latency_seconds_bucket{request="Fetch",le="1.0"} 4.0',
        'latency_seconds_bucket{request="Fetch",le="10.0"} 4.0',
        'latency_seconds_bucket{request="Fetch",le="+Inf"} 5.0',
        'latency_seconds_sum{request="Fetch"} 21.65',
        'latency_seconds_count{request="Fetch"} 5.0',
    ]
    parse(registry.render())


def test_an_unlabelled_histogram_renders_plain_sum_and_count() -> None:
    registry = MetricsRegistry()
    registry.register(Histogram("one_seconds", "One observation.", (1,))).observe(0.5)
    families = parse(registry.render())
    assert families["one_seconds"].samples == [
        ("one_seconds_bucket", {"le": "1.0"}, 1.0),
        ("one_seconds_bucket", {"le": "+Inf"}, 1.0),
        ("one_seconds_sum", {}, 0.5),
        ("one_seconds_count", {}, 1.0),
    ]


def test_histogram_buckets_must_increase_and_le_is_reserved() -> None:
    with pytest.raises(ValueError, match="increasing"):
        Histogram("h", "h", (1, 0.5))
    with pytest.raises(ValueError, match="increasing"):
        Histogram("h", "h", ())
    with pytest.raises(ValueError, match="le"):
        Histogram("h", "h", (1,), ("le",))


# --- registry -----------------------------------------------------------------------------------------


def test_a_name_registers_once() -> None:
    registry = MetricsRegistry()
    registry.register(Gauge("g", "g"))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Gauge("g", "other"))


def test_an_empty_registry_renders_nothing() -> None:
    assert MetricsRegistry().render() == ""


# --- the broker's metric set --------------------------------------------------------------------------


# The tiers of each partition and the RemoteLogManager's counts (issue 4).
REMOTE_TIER_FAMILIES = {
    "tierlog_log_start_offset": "gauge",
    "tierlog_local_log_start_offset": "gauge",
    "tierlog_local_log_size_bytes": "gauge",
    "tierlog_remote_log_end_offset": "gauge",
    "tierlog_remote_log_size_bytes": "gauge",
    "tierlog_remote_copy_lag_bytes": "gauge",
    "tierlog_remote_copy_bytes_total": "counter",
    "tierlog_remote_copy_segments_total": "counter",
    "tierlog_remote_copy_errors_total": "counter",
    "tierlog_remote_fetch_bytes_total": "counter",
    "tierlog_remote_fetch_requests_total": "counter",
    "tierlog_remote_fetch_errors_total": "counter",
    "tierlog_remote_delete_segments_total": "counter",
    "tierlog_remote_delete_errors_total": "counter",
}


def test_broker_metrics_render_kafka_names_from_stub_callbacks() -> None:
    registry = MetricsRegistry()
    metrics = broker_metrics(registry)
    partitions = {("orders", 0): (120, 100), ("orders", 1): (50, 50)}  # (log end offset, high watermark)
    metrics.isr_shrinks_total.callback(lambda: 2)
    metrics.isr_expands_total.callback(lambda: 1)
    metrics.under_replicated_partitions.callback(lambda: 1)
    metrics.partition_log_end_offset.callback(
        lambda: [({"topic": t, "partition": str(p)}, leo) for (t, p), (leo, _) in partitions.items()]
    )
    metrics.partition_high_watermark.callback(
        lambda: [({"topic": t, "partition": str(p)}, hw) for (t, p), (_, hw) in partitions.items()]
    )
    metrics.partition_hw_lag.callback(
        lambda: [({"topic": t, "partition": str(p)}, leo - hw) for (t, p), (leo, hw) in partitions.items()]
    )
    metrics.requests_total.labels(request="Produce").inc()
    metrics.request_latency_seconds.labels(request="Produce").observe(0.003)

    text = registry.render()
    families = parse(text)
    assert {name: family.type for name, family in families.items()} == {
        "kafka_network_requestmetrics_requests_total": "counter",
        "kafka_network_requestmetrics_totaltime_seconds": "histogram",
        "kafka_server_replicamanager_isrshrinks_total": "counter",
        "kafka_server_replicamanager_isrexpands_total": "counter",
        "kafka_server_replicamanager_underreplicatedpartitions": "gauge",
        "kafka_cluster_partition_highwatermark": "gauge",
        "kafka_log_log_logendoffset": "gauge",
        "tierlog_partition_hw_lag": "gauge",
        **REMOTE_TIER_FAMILIES,
    }
    for line in [
        'kafka_network_requestmetrics_requests_total{request="Produce"} 1.0',
        "kafka_server_replicamanager_isrshrinks_total 2.0",
        "kafka_server_replicamanager_isrexpands_total 1.0",
        "kafka_server_replicamanager_underreplicatedpartitions 1.0",
        'kafka_log_log_logendoffset{topic="orders",partition="0"} 120.0',
        'kafka_cluster_partition_highwatermark{topic="orders",partition="1"} 50.0',
        'tierlog_partition_hw_lag{topic="orders",partition="0"} 20.0',
        'tierlog_partition_hw_lag{topic="orders",partition="1"} 0.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{request="Produce",le="0.0025"} 0.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{request="Produce",le="0.005"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_count{request="Produce"} 1.0',
    ]:
        assert f"{line}\n" in text, line
    latency = families["kafka_network_requestmetrics_totaltime_seconds"]
    bounds = [labels["le"] for name, labels, _ in latency.samples if name.endswith("_bucket")]
    assert bounds == [repr(float(b)) for b in LATENCY_BUCKETS_S] + ["+Inf"]
    assert bounds[0] == "0.0005" and bounds[-2] == "10.0"


def test_broker_metrics_before_wiring_render_families_without_samples() -> None:
    registry = MetricsRegistry()
    broker_metrics(registry)
    families = parse(registry.render())
    assert len(families) == 8 + len(REMOTE_TIER_FAMILIES)
    assert all(family.samples == [] for family in families.values())


def test_observe_request_counts_and_times_requests_by_kafka_api_name() -> None:
    registry = MetricsRegistry()
    metrics = broker_metrics(registry)
    metrics.observe_request(0, 0.002)
    metrics.observe_request(0, 0.2)
    metrics.observe_request(1, 0.6)
    metrics.observe_request(9999, 0.001)  # not an API we know: named by its key rather than dropped
    text = registry.render()
    parse(text)
    for line in [
        'kafka_network_requestmetrics_requests_total{request="Produce"} 2.0',
        'kafka_network_requestmetrics_requests_total{request="Fetch"} 1.0',
        'kafka_network_requestmetrics_requests_total{request="9999"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{request="Produce",le="0.0025"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{request="Produce",le="0.25"} 2.0',
        'kafka_network_requestmetrics_totaltime_seconds_count{request="Produce"} 2.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{request="Fetch",le="0.5"} 0.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{request="Fetch",le="1.0"} 1.0',
    ]:
        assert f"{line}\n" in text, line


def test_broker_remote_tier_metrics_render_from_stub_callbacks() -> None:
    registry = MetricsRegistry()
    metrics = broker_metrics(registry)
    labels = {"topic": "orders", "partition": "0"}
    # Rx = 0, Lx = 40, Ry = 59: the log starts in the remote tier, which holds what is no longer local.
    for gauge, value in [
        (metrics.partition_log_start_offset, 0),
        (metrics.partition_local_log_start_offset, 40),
        (metrics.partition_local_log_size_bytes, 4096),
        (metrics.partition_remote_log_end_offset, 59),
        (metrics.partition_remote_log_size_bytes, 6144),
        (metrics.partition_remote_copy_lag_bytes, 1024),
    ]:
        gauge.callback(lambda value=value: [(labels, value)])
    for counter, value in [
        (metrics.remote_copy_bytes_total, 6144),
        (metrics.remote_copy_segments_total, 6),
        (metrics.remote_copy_errors_total, 1),
        (metrics.remote_fetch_bytes_total, 512),
        (metrics.remote_fetch_requests_total, 3),
        (metrics.remote_fetch_errors_total, 0),
        (metrics.remote_delete_segments_total, 2),
        (metrics.remote_delete_errors_total, 0),
    ]:
        counter.callback(lambda value=value: value)

    text = registry.render()
    families = parse(text)
    assert {name: families[name].type for name in REMOTE_TIER_FAMILIES} == REMOTE_TIER_FAMILIES
    for line in [
        'tierlog_log_start_offset{topic="orders",partition="0"} 0.0',
        'tierlog_local_log_start_offset{topic="orders",partition="0"} 40.0',
        'tierlog_local_log_size_bytes{topic="orders",partition="0"} 4096.0',
        'tierlog_remote_log_end_offset{topic="orders",partition="0"} 59.0',
        'tierlog_remote_log_size_bytes{topic="orders",partition="0"} 6144.0',
        'tierlog_remote_copy_lag_bytes{topic="orders",partition="0"} 1024.0',
        "tierlog_remote_copy_bytes_total 6144.0",
        "tierlog_remote_copy_segments_total 6.0",
        "tierlog_remote_copy_errors_total 1.0",
        "tierlog_remote_fetch_bytes_total 512.0",
        "tierlog_remote_fetch_requests_total 3.0",
        "tierlog_remote_fetch_errors_total 0.0",
        "tierlog_remote_delete_segments_total 2.0",
        "tierlog_remote_delete_errors_total 0.0",
    ]:
        assert f"{line}\n" in text, line
    assert "Kafka's RemoteCopyBytesPerSec" in families["tierlog_remote_copy_bytes_total"].help

"""The broker's Prometheus metrics on prometheus_client: scrape-time families (ScrapeCollector) render text
exposition format 0.0.4 that a strict parser accepts, the broker's metric set has Kafka's JMX-derived names with
values read from stub callbacks, each broker's registry is its own, and GET /metrics serves it."""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from typing import Any

import prometheus_client
import pytest
from asyncio_helpers import run_bounded
from prometheus_client import CollectorRegistry, generate_latest

from tierlog.server.http_server import HttpServer
from tierlog.server.metrics import (
    LATENCY_BUCKETS_S,
    ScrapeCollector,
    ScrapedMetric,
    broker_metrics,
    metrics_route,
)

HOST = "127.0.0.1"


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def scraped(*metrics: ScrapedMetric) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ScrapeCollector(metrics))
    return registry


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


# --- scrape-time families -------------------------------------------------------------------------------


def test_a_scraped_counter_renders_help_type_and_the_value_read_at_every_scrape() -> None:
    shrinks = [0]
    registry = scraped(ScrapedMetric("counter", "shrinks_total", "Shrinks.").callback(lambda: shrinks[0]))
    assert render(registry) == "# HELP shrinks_total Shrinks.\n# TYPE shrinks_total counter\nshrinks_total 0.0\n"
    shrinks[0] = 4
    assert "shrinks_total 4.0\n" in render(registry)
    parse(render(registry))


def test_a_labelled_gauge_renders_one_line_per_sample_its_callback_returns() -> None:
    registry = scraped(
        ScrapedMetric("gauge", "hw", "High watermark.", ("topic", "partition")).callback(
            lambda: [({"partition": "0", "topic": "a"}, 10), ({"topic": "b", "partition": "1"}, 7)]
        )
    )
    # The library writes label names in alphabetical order.
    assert render(registry).splitlines()[2:] == ['hw{partition="0",topic="a"} 10.0', 'hw{partition="1",topic="b"} 7.0']
    assert parse(render(registry))["hw"].samples == [
        ("hw", {"partition": "0", "topic": "a"}, 10.0),
        ("hw", {"partition": "1", "topic": "b"}, 7.0),
    ]


def test_label_values_and_help_are_escaped() -> None:
    registry = scraped(
        ScrapedMetric("counter", "odd_total", "A help\nwith a \\ backslash.", ("topic",)).callback(
            lambda: [({"topic": 'a "quoted"\\back\nline'}, 1)]
        )
    )
    text = render(registry)
    assert "# HELP odd_total A help\\nwith a \\\\ backslash.\n" in text
    assert 'odd_total{topic="a \\"quoted\\"\\\\back\\nline"} 1.0\n' in text
    ((_, labels, value),) = parse(text)["odd_total"].samples
    assert labels == {"topic": 'a "quoted"\\back\nline'}
    assert value == 1.0


def test_a_scraped_metric_without_a_callback_renders_no_samples() -> None:
    families = parse(render(scraped(ScrapedMetric("gauge", "lag", "Lag.", ("topic",)))))
    assert families["lag"] == Family(help="Lag.", type="gauge", samples=[])


def test_counter_names_must_end_in_total_and_names_must_be_classic_prometheus_names() -> None:
    with pytest.raises(ValueError, match="_total"):
        ScrapedMetric("counter", "requests", "Requests.")
    # The library would expose these with the offending characters replaced: refused instead.
    with pytest.raises(ValueError, match="invalid metric name"):
        ScrapedMetric("gauge", "bad-name", "x")
    with pytest.raises(ValueError, match="invalid label name"):
        ScrapedMetric("gauge", "ok", "x", ("bad-label",))
    with pytest.raises(ValueError, match="invalid label name"):
        ScrapedMetric("gauge", "ok", "x", ("__reserved",))


def test_a_labelled_gauge_whose_callback_returns_a_bare_value_renders_no_samples(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = scraped(ScrapedMetric("gauge", "hw", "High watermark.", ("topic",)).callback(lambda: 1))
    assert parse(render(registry))["hw"].samples == []
    assert "metrics callback of hw failed" in caplog.text


def test_a_failing_callback_leaves_its_family_empty_and_the_rest_of_the_scrape_intact(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = scraped(
        ScrapedMetric("gauge", "broken", "Raises.").callback(lambda: 1 / 0),
        ScrapedMetric("gauge", "wrong_labels", "Names a label it does not have.", ("topic",)).callback(
            lambda: [({"topic": "a", "partition": "0"}, 1)]
        ),
        ScrapedMetric("gauge", "fine", "Works.").callback(lambda: 1),
    )
    families = parse(render(registry))
    assert families["broken"].samples == []
    assert families["wrong_labels"].samples == []
    assert families["fine"].samples == [("fine", {}, 1.0)]
    assert "metrics callback of broken failed" in caplog.text
    assert "metrics callback of wrong_labels failed" in caplog.text


def test_special_values_use_prometheus_spellings() -> None:
    values = [("nan", math.nan), ("pos", math.inf), ("neg", -math.inf), ("big", 1e20)]
    registry = scraped(*(ScrapedMetric("gauge", name, name).callback(lambda v=value: v) for name, value in values))
    lines = [line for line in render(registry).splitlines() if not line.startswith("#")]
    assert lines == ["nan NaN", "pos +Inf", "neg -Inf", "big 1e+20"]
    parse(render(registry))


def test_a_name_registers_once() -> None:
    registry = scraped(ScrapedMetric("gauge", "g", "g"))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(ScrapeCollector([ScrapedMetric("gauge", "g", "other")]))
    with pytest.raises(ValueError, match=r"given twice: \['h'\]"):
        ScrapeCollector([ScrapedMetric("gauge", "h", "h"), ScrapedMetric("gauge", "h", "again")])
    # Nor may a component take a name of the broker's metric set.
    broker_metrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(ScrapeCollector([ScrapedMetric("gauge", "tierlog_partition_hw_lag", "again")]))


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
    "tierlog_remote_fetch_prefetch_bytes_total": "counter",
    "tierlog_remote_fetch_chunk_cache_hit_bytes_total": "counter",
    "tierlog_remote_delete_segments_total": "counter",
    "tierlog_remote_delete_errors_total": "counter",
}


def test_broker_metrics_render_kafka_names_from_stub_callbacks() -> None:
    registry = CollectorRegistry()
    metrics = broker_metrics(registry)
    partitions = {("orders", 0): (120, 100), ("orders", 1): (50, 50)}  # (log end offset, high watermark)
    metrics.isr_shrinks_total.callback(lambda: 2)
    metrics.isr_expands_total.callback(lambda: 1)
    metrics.under_replicated_partitions.callback(lambda: 1)
    metrics.leader_replication_byte_rate.callback(lambda: 2048.5)
    metrics.follower_replication_byte_rate.callback(lambda: 0)
    metrics.partition_log_end_offset.callback(
        lambda: [({"topic": t, "partition": str(p)}, leo) for (t, p), (leo, _) in partitions.items()]
    )
    metrics.partition_high_watermark.callback(
        lambda: [({"topic": t, "partition": str(p)}, hw) for (t, p), (_, hw) in partitions.items()]
    )
    metrics.partition_hw_lag.callback(
        lambda: [({"topic": t, "partition": str(p)}, leo - hw) for (t, p), (leo, hw) in partitions.items()]
    )
    metrics.observe_request(0, 0.003)

    text = render(registry)
    families = parse(text)
    assert {name: family.type for name, family in families.items()} == {
        "kafka_network_requestmetrics_requests_total": "counter",
        "kafka_network_requestmetrics_totaltime_seconds": "histogram",
        "kafka_server_replicamanager_isrshrinks_total": "counter",
        "kafka_server_replicamanager_isrexpands_total": "counter",
        "kafka_server_replicamanager_underreplicatedpartitions": "gauge",
        "kafka_server_leaderreplication_byte_rate": "gauge",
        "kafka_server_followerreplication_byte_rate": "gauge",
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
        "kafka_server_leaderreplication_byte_rate 2048.5",
        "kafka_server_followerreplication_byte_rate 0.0",
        'kafka_log_log_logendoffset{partition="0",topic="orders"} 120.0',
        'kafka_cluster_partition_highwatermark{partition="1",topic="orders"} 50.0',
        'tierlog_partition_hw_lag{partition="0",topic="orders"} 20.0',
        'tierlog_partition_hw_lag{partition="1",topic="orders"} 0.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="0.0025",request="Produce"} 0.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="0.005",request="Produce"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_count{request="Produce"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_sum{request="Produce"} 0.003',
    ]:
        assert f"{line}\n" in text, line
    latency = families["kafka_network_requestmetrics_totaltime_seconds"]
    bounds = [labels["le"] for name, labels, _ in latency.samples if name.endswith("_bucket")]
    assert bounds == [repr(float(b)) for b in LATENCY_BUCKETS_S] + ["+Inf"]
    assert bounds[0] == "0.0005" and bounds[-2] == "10.0"


def test_every_scrape_time_family_is_exposed_under_its_exact_name_and_type() -> None:
    metrics = broker_metrics(registry := CollectorRegistry())
    declared = {m.name: m.kind for m in vars_of(metrics) if isinstance(m, ScrapedMetric)}
    exposed = {name: family.type for name, family in parse(render(registry)).items()}
    assert declared.items() <= exposed.items()
    assert len(declared) == 8 + len(REMOTE_TIER_FAMILIES)


def vars_of(metrics: object) -> list[Any]:
    return [getattr(metrics, name) for name in type(metrics).__dataclass_fields__]


def test_broker_metrics_before_wiring_render_families_without_samples() -> None:
    registry = CollectorRegistry()
    broker_metrics(registry)
    families = parse(render(registry))
    assert len(families) == 10 + len(REMOTE_TIER_FAMILIES)
    assert all(family.samples == [] for family in families.values())


def test_observe_request_counts_and_times_requests_by_kafka_api_name() -> None:
    registry = CollectorRegistry()
    metrics = broker_metrics(registry)
    metrics.observe_request(0, 0.002)
    metrics.observe_request(0, 0.2)
    metrics.observe_request(1, 0.6)
    metrics.observe_request(1, 0.005)  # a bound belongs to its own bucket: le is "less or equal"
    metrics.observe_request(9999, 0.001)  # not an API we know: named by its key rather than dropped
    text = render(registry)
    parse(text)
    for line in [
        'kafka_network_requestmetrics_requests_total{request="Produce"} 2.0',
        'kafka_network_requestmetrics_requests_total{request="Fetch"} 2.0',
        'kafka_network_requestmetrics_requests_total{request="9999"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="0.0025",request="Produce"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="0.25",request="Produce"} 2.0',
        'kafka_network_requestmetrics_totaltime_seconds_count{request="Produce"} 2.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="0.0025",request="Fetch"} 0.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="0.005",request="Fetch"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="0.5",request="Fetch"} 1.0',
        'kafka_network_requestmetrics_totaltime_seconds_bucket{le="1.0",request="Fetch"} 2.0',
    ]:
        assert f"{line}\n" in text, line


def test_the_broker_exposes_only_the_series_it_documents() -> None:
    # prometheus_client would add a <name>_created series to every counter and histogram.
    registry = CollectorRegistry()
    broker_metrics(registry).observe_request(0, 0.001)
    assert "_created" not in render(registry)


def test_each_broker_has_a_registry_of_its_own() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    broker_metrics(first).observe_request(0, 0.001)
    broker_metrics(second)
    assert 'requests_total{request="Produce"} 1.0' in render(first)
    assert parse(render(second))["kafka_network_requestmetrics_requests_total"].samples == []
    # Nothing goes to the library's process-wide registry.
    assert "kafka_network_requestmetrics" not in render(prometheus_client.REGISTRY)


def test_broker_remote_tier_metrics_render_from_stub_callbacks() -> None:
    registry = CollectorRegistry()
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
        (metrics.remote_fetch_prefetch_bytes_total, 4096),
        (metrics.remote_fetch_chunk_cache_hit_bytes_total, 1024),
        (metrics.remote_delete_segments_total, 2),
        (metrics.remote_delete_errors_total, 0),
    ]:
        counter.callback(lambda value=value: value)

    text = render(registry)
    families = parse(text)
    assert {name: families[name].type for name in REMOTE_TIER_FAMILIES} == REMOTE_TIER_FAMILIES
    for line in [
        'tierlog_log_start_offset{partition="0",topic="orders"} 0.0',
        'tierlog_local_log_start_offset{partition="0",topic="orders"} 40.0',
        'tierlog_local_log_size_bytes{partition="0",topic="orders"} 4096.0',
        'tierlog_remote_log_end_offset{partition="0",topic="orders"} 59.0',
        'tierlog_remote_log_size_bytes{partition="0",topic="orders"} 6144.0',
        'tierlog_remote_copy_lag_bytes{partition="0",topic="orders"} 1024.0',
        "tierlog_remote_copy_bytes_total 6144.0",
        "tierlog_remote_copy_segments_total 6.0",
        "tierlog_remote_copy_errors_total 1.0",
        "tierlog_remote_fetch_bytes_total 512.0",
        "tierlog_remote_fetch_requests_total 3.0",
        "tierlog_remote_fetch_errors_total 0.0",
        "tierlog_remote_fetch_prefetch_bytes_total 4096.0",
        "tierlog_remote_fetch_chunk_cache_hit_bytes_total 1024.0",
        "tierlog_remote_delete_segments_total 2.0",
        "tierlog_remote_delete_errors_total 0.0",
    ]:
        assert f"{line}\n" in text, line
    assert "Kafka's RemoteCopyBytesPerSec" in families["tierlog_remote_copy_bytes_total"].help


# --- GET /metrics -------------------------------------------------------------------------------------------


async def request(port: int, head: str) -> tuple[str, bytes]:
    """Send one request head (Connection: close); the answer's head and body."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(f"{head}\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        answer = await reader.read()
    finally:
        writer.close()
    head_bytes, _, body = answer.partition(b"\r\n\r\n")
    return head_bytes.decode("latin-1"), body


def serve_metrics(registry: CollectorRegistry, *heads: str) -> list[tuple[str, bytes]]:
    async def scenario() -> list[tuple[str, bytes]]:
        server = HttpServer([metrics_route(registry)])
        port = await server.start(HOST, 0)
        try:
            return [await request(port, head) for head in heads]
        finally:
            await server.stop()

    result: list[tuple[str, bytes]] = run_bounded(scenario)
    return result


def test_get_metrics_answers_text_format_0_0_4_whatever_the_scraper_accepts() -> None:
    registry = CollectorRegistry()
    broker_metrics(registry).observe_request(0, 0.001)
    # Prometheus asks for OpenMetrics first; the broker answers the text format, as it always did.
    openmetrics = "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.3"
    for head, body in serve_metrics(registry, "GET /metrics HTTP/1.1", openmetrics):
        assert head.startswith("HTTP/1.1 200 OK\r\n")
        assert "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in head
        assert body == generate_latest(registry)
        assert 'kafka_network_requestmetrics_requests_total{request="Produce"} 1.0\n' in body.decode()
        parse(body.decode())


def test_head_metrics_answers_the_head_without_the_body() -> None:
    registry = CollectorRegistry()
    broker_metrics(registry).observe_request(0, 0.001)
    ((head, body),) = serve_metrics(registry, "HEAD /metrics HTTP/1.1")
    assert head.startswith("HTTP/1.1 200 OK\r\n")
    assert "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in head
    assert body == b""


def test_a_scrape_lets_the_event_loop_serve_others_between_families() -> None:
    # The second family's callback runs after the event loop has run what the first family's scheduled.
    ran_between: list[bool] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        other_work_done = asyncio.Event()

        def first() -> float:
            loop.call_soon(other_work_done.set)
            return 0

        def second() -> float:
            ran_between.append(other_work_done.is_set())
            return 0

        registry = scraped(
            ScrapedMetric("gauge", "first", "Schedules other work.").callback(first),
            ScrapedMetric("gauge", "second", "Sees whether it ran.").callback(second),
        )
        server = HttpServer([metrics_route(registry)])
        port = await server.start(HOST, 0)
        try:
            head, _ = await request(port, "GET /metrics HTTP/1.1")
            assert head.startswith("HTTP/1.1 200 OK")
        finally:
            await server.stop()

    run_bounded(scenario)
    assert ran_between == [True]

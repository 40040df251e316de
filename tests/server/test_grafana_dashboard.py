"""docs/grafana/tierlog-dashboard.json asks Prometheus only for series a real broker exposes: every metric name
in every panel's and template variable's PromQL is on the broker's /metrics."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tierlog.testing.local_cluster import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "tierlog-dashboard.json"
HTTP_TIMEOUT_S = 10.0

# What a PromQL expression names besides metrics: label matchers, strings, ranges, grouping clauses and the
# binary operators' keywords. Functions and aggregations are names followed by "(".
_GRAFANA_VARIABLE = re.compile(r"\$\{?\w+\}?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w.])[a-zA-Z_:][\w:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan"}
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<expr>.+),\s*)?(?P<label>\w+)\)$")
# The series a histogram family adds to its name.
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression (Grafana variables allowed) selects."""
    text = _GRAFANA_VARIABLE.sub("", expression)
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _NAME.finditer(text):
        followed_by = text[match.end() :].lstrip()[:1]
        if followed_by != "(" and match[0].lower() not in _KEYWORDS:
            names.add(match[0])
    return names


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target (rows included) and every query variable."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = _LABEL_VALUES.match(query)
        assert match is not None and match["expr"], f"variable {variable['name']}: not label_values(series, label)"
        yield f"variable {variable['name']}", match["expr"]


def exposed_names(exposition: str) -> set[str]:
    """Every series name a scrape of this text offers, from its TYPE lines (present even without samples)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.update([name + suffix for suffix in _HISTOGRAM_SUFFIXES] if kind == "histogram" else [name])
    return names


def test_metric_names_are_found_in_promql() -> None:
    expression = (
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_seconds_bucket{instance=~"$instance", '
        'request="Produce"}[$__rate_interval]))) / on (instance) group_left b_total + ignoring(x) c > bool 1e3'
    )
    assert metric_names(expression) == {"a_seconds_bucket", "b_total", "c"}
    assert metric_names('sum by (topic) (max by (topic, partition) (rate(d{topic=~"$topic"}[5m])))') == {"d"}


def test_every_dashboard_expression_uses_only_metrics_a_broker_exposes(broker_factory: Any) -> None:
    http = f"127.0.0.1:{free_port()}"
    broker_factory({"tierlog.http.listener": http})
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=HTTP_TIMEOUT_S) as answer:
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        exposed = exposed_names(answer.read().decode())

    dashboard = json.loads(DASHBOARD.read_text())
    found = list(expressions(dashboard))
    assert len(found) >= 30
    unknown = {}
    for where, expression in found:
        names = metric_names(expression)
        assert names, f"{where}: no metric name in {expression!r}"
        if names - exposed:
            unknown[where] = sorted(names - exposed)
    assert not unknown, f"the dashboard asks for series the broker does not expose: {unknown}"


def test_the_dashboard_takes_its_prometheus_datasource_as_a_template_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == datasource, panel["title"]
            assert all(target["datasource"] == datasource for target in panel["targets"]), panel["title"]


@pytest.mark.parametrize(
    "series",
    [
        "kafka_network_requestmetrics_requests_total",
        "kafka_network_requestmetrics_totaltime_seconds_bucket",
        "kafka_server_replicamanager_underreplicatedpartitions",
        "kafka_server_replicamanager_isrshrinks_total",
        "kafka_server_replicamanager_isrexpands_total",
        "tierlog_partition_hw_lag",
        "tierlog_remote_copy_bytes_total",
        "tierlog_remote_fetch_bytes_total",
        "tierlog_remote_copy_lag_bytes",
        "tierlog_log_cleaner_bytes_read_total",
        "kafka_coordinator_group_groupmetadatamanager_numgroups",
    ],
)
def test_the_dashboard_shows(series: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert any(series in metric_names(expression) for _, expression in expressions(dashboard))

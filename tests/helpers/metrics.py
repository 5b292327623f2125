"""Prometheus expositions read back: parsed into samples, scraped from a /metrics URL, and compared with the Stats
report they were made from."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from forge.prometheus import metric_name, part_label
from forge.v1 import common_pb2

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str, key: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(url, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def series(report: common_pb2.StatsReport, gauge: str) -> tuple[str, frozenset[tuple[str, str]]]:
    """The series a Stats gauge is exposed as."""
    base, slash, part = gauge.partition("/")
    labels = {"service": report.service, "instance": report.instance}
    if slash:
        labels[part_label(base)] = part
    return metric_name(report.service, base), frozenset(labels.items())


def assert_same(scraped: Samples, report: common_pb2.StatsReport, moving: set[str] = frozenset()) -> None:
    """Every Stats gauge is a series; those that do not move at rest have the very same value."""
    for gauge, value in report.gauges.items():
        key = series(report, gauge)
        assert key in scraped, (gauge, sorted(k for k, _ in scraped))
        if gauge not in moving:
            assert scraped[key] == pytest.approx(value, nan_ok=True), gauge
    ours = {k for k in scraped if k[0].startswith(f"forge_{report.service}_")}
    assert ours == {series(report, gauge) for gauge in report.gauges}
    info = [dict(labels) for name, labels in scraped if name == "forge_info"]
    assert info == [{"service": report.service, "instance": report.instance, "version": report.version,
                     **report.labels}]

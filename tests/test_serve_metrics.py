"""``/metrics``'s text, checked against Prometheus's exposition format."""

from __future__ import annotations

import re

from paralela.serving._serve_metrics import Histogram, Metrics


def test_histograms_are_cumulative_with_sum_and_count() -> None:
    histogram = Histogram((1, 2, 4))
    for value in (1, 1, 3, 9):
        histogram.observe(value)
    assert histogram.lines("h") == [
        'h_bucket{le="1"} 2',
        'h_bucket{le="2"} 2',
        'h_bucket{le="4"} 3',
        'h_bucket{le="+Inf"} 4',
        "h_sum 14",
        "h_count 4",
    ]


def test_the_page_declares_each_metric_once_with_its_type() -> None:
    metrics = Metrics()
    metrics.requests[200] += 3
    metrics.requests[503] += 1
    metrics.batch_size.observe(8)
    metrics.request_seconds.observe(0.012)
    page = metrics.render(queue_depth=5, workers=2, ready=1)
    assert page.endswith("\n")
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M))
    assert types == {
        "paralela_serve_requests_total": "counter",
        "paralela_serve_inputs_total": "counter",
        "paralela_serve_batch_size": "histogram",
        "paralela_serve_request_seconds": "histogram",
        "paralela_serve_batch_seconds": "histogram",
        "paralela_serve_queue_depth": "gauge",
        "paralela_serve_workers": "gauge",
        "paralela_serve_workers_ready": "gauge",
        "paralela_serve_worker_restarts_total": "counter",
    }
    assert 'paralela_serve_requests_total{code="503"} 1' in page
    assert "paralela_serve_queue_depth 5" in page
    assert "paralela_serve_workers_ready 1" in page
    assert 'paralela_serve_request_seconds_bucket{le="0.025"} 1' in page
    sample = re.compile(r'^[a-z_]+(\{[a-z]+="[^"]*"\})? -?[0-9.e+-]+$')
    for line in page.splitlines():
        assert line.startswith("# ") or sample.match(line), line

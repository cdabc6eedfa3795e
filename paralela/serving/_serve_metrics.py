"""``/metrics`` of ``paralela serve``, in Prometheus's text format (version 0.0.4).

::

    paralela_serve_requests_total{code="200"}     counter, by HTTP status
    paralela_serve_inputs_total                   counter, inputs predicted
    paralela_serve_batch_size                     histogram, inputs per batch
    paralela_serve_request_seconds                histogram, request latency
    paralela_serve_batch_seconds                  histogram, a batch's round trip to its worker
    paralela_serve_queue_depth                    gauge, inputs waiting
    paralela_serve_workers / _workers_ready       gauges
    paralela_serve_worker_restarts_total          counter

No dependency: the server's event loop is the only writer, so plain numbers do.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Sequence

__all__ = ["CONTENT_TYPE", "Histogram", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus histograms have."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bucket
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out = []
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            out.append(f'{name}_bucket{{le="{_number(bound)}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_number(self.total)}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    """What the server counts; :meth:`render` is the ``/metrics`` page."""

    def __init__(self) -> None:
        self.requests: collections.Counter[int] = collections.Counter()
        self.inputs = 0
        self.restarts = 0
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.request_seconds = Histogram(LATENCY_BUCKETS)
        self.batch_seconds = Histogram(LATENCY_BUCKETS)

    def render(self, queue_depth: int, workers: int, ready: int) -> str:
        out: list[str] = []

        def metric(name: str, kind: str, text: str, lines: Callable[[], list[str]]) -> None:
            out.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}", *lines()])

        metric(
            "paralela_serve_requests_total",
            "counter",
            "Requests answered, by HTTP status.",
            lambda: [
                f'paralela_serve_requests_total{{code="{code}"}} {n}'
                for code, n in sorted(self.requests.items())
            ],
        )
        metric(
            "paralela_serve_inputs_total",
            "counter",
            "Inputs predicted (a request may carry several).",
            lambda: [f"paralela_serve_inputs_total {self.inputs}"],
        )
        metric(
            "paralela_serve_batch_size",
            "histogram",
            "Inputs per batch sent to a model worker.",
            lambda: self.batch_size.lines("paralela_serve_batch_size"),
        )
        metric(
            "paralela_serve_request_seconds",
            "histogram",
            "Time from a request's arrival to its answer, in seconds.",
            lambda: self.request_seconds.lines("paralela_serve_request_seconds"),
        )
        metric(
            "paralela_serve_batch_seconds",
            "histogram",
            "Time of a batch's round trip to its model worker, in seconds.",
            lambda: self.batch_seconds.lines("paralela_serve_batch_seconds"),
        )
        metric(
            "paralela_serve_queue_depth",
            "gauge",
            "Inputs waiting for a model worker.",
            lambda: [f"paralela_serve_queue_depth {queue_depth}"],
        )
        metric(
            "paralela_serve_workers",
            "gauge",
            "Model workers the server runs.",
            lambda: [f"paralela_serve_workers {workers}"],
        )
        metric(
            "paralela_serve_workers_ready",
            "gauge",
            "Model workers that finished setup and take batches.",
            lambda: [f"paralela_serve_workers_ready {ready}"],
        )
        metric(
            "paralela_serve_worker_restarts_total",
            "counter",
            "Model workers started again after they died or hung.",
            lambda: [f"paralela_serve_worker_restarts_total {self.restarts}"],
        )
        return "\n".join(out) + "\n"


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))

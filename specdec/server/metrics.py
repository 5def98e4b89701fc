"""Prometheus metrics of one server, in a registry of its own (several apps may share a
process, as the tests do), and the ``speculative`` object of each response.

Exposed at ``GET /metrics``:

- ``specdec_requests_total{status}``: generation requests by outcome: ``success``,
  ``aborted`` (client went away), ``rejected`` (429, queue full), ``invalid`` (4xx),
  ``error`` (5xx)
- ``specdec_prompt_tokens_total``, ``specdec_generation_tokens_total``
- ``specdec_time_to_first_token_seconds``, ``specdec_request_latency_seconds`` (histograms)
- ``specdec_num_requests_running``, ``specdec_num_requests_waiting`` (engine's batch / queue)
- ``specdec_draft_tokens_total``, ``specdec_accepted_tokens_total`` and
  ``specdec_acceptance_rate`` (accepted / drafted over all finished requests; speculative
  methods only), ``specdec_ssd_hit_rate`` (mean over finished SSD requests) and
  ``specdec_ssd_metric{key}`` (mean of every numeric ``ssd_*`` request metric)
- ``specdec_engine_alive`` (1 while the engine thread runs), ``specdec_engine_busy_seconds``
  and ``specdec_engine_steps`` (time in and number of engine steps: busy / wall = utilisation)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: N811
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdec.metrics import RequestMetrics, aggregate

__all__ = ["CONTENT_TYPE", "ServerMetrics", "speculative_info"]

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Mean:
    def __init__(self):
        self.sum = 0.0
        self.count = 0

    def add(self, v: float) -> None:
        self.sum += v
        self.count += 1

    def value(self) -> float:
        return self.sum / self.count if self.count else 0.0


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self._lock = threading.Lock()
        self.requests = Counter(
            "specdec_requests", "Generation requests by outcome", ["status"], registry=r
        )
        for status in ("success", "aborted", "rejected", "invalid", "error"):
            self.requests.labels(status=status)
        self.prompt_tokens = Counter(
            "specdec_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter(
            "specdec_generation_tokens", "Generated tokens of finished requests", registry=r
        )
        self.ttft = Histogram(
            "specdec_time_to_first_token_seconds",
            "Time from arrival to the first generated token",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "specdec_request_latency_seconds",
            "Time from arrival to the last generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "specdec_num_requests_running", "Sequences in the running batch", registry=r
        )
        self.waiting = Gauge(
            "specdec_num_requests_waiting", "Sequences waiting for a batch slot", registry=r
        )
        self.alive = Gauge("specdec_engine_alive", "1 while the engine thread runs", registry=r)
        self.busy = Gauge(
            "specdec_engine_busy_seconds", "Seconds the engine thread spent in steps", registry=r
        )
        self.steps = Gauge("specdec_engine_steps", "Engine steps (rounds) run", registry=r)
        self.drafted = Counter(
            "specdec_draft_tokens", "Draft tokens proposed (speculative methods)", registry=r
        )
        self.accepted = Counter(
            "specdec_accepted_tokens", "Draft tokens accepted (speculative methods)", registry=r
        )
        self._drafted = 0
        self._accepted = 0
        self.acceptance = Gauge(
            "specdec_acceptance_rate",
            "Accepted / drafted tokens over all finished speculative requests",
            registry=r,
        )
        self.acceptance.set_function(lambda: self._accepted / self._drafted if self._drafted else 0)
        self._ssd_hit = _Mean()
        self.ssd_hit_rate = Gauge(
            "specdec_ssd_hit_rate", "Mean SSD hit rate over finished SSD requests", registry=r
        )
        self.ssd_hit_rate.set_function(self._ssd_hit.value)
        self._ssd: dict[str, _Mean] = {}
        self.ssd_metric = Gauge(
            "specdec_ssd_metric",
            "Mean of each numeric ssd_* request metric over finished requests",
            ["key"],
            registry=r,
        )

    def bind_engine(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        alive: Callable[[], bool],
        busy: Callable[[], float] = lambda: 0.0,
        steps: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.busy.set_function(busy)
        self.steps.set_function(steps)
        self.running.set_function(running)
        self.waiting.set_function(waiting)
        self.alive.set_function(lambda: 1.0 if alive() else 0.0)

    def count(self, status: str, n: int = 1) -> None:
        self.requests.labels(status=status).inc(n)

    def finished(self, m: RequestMetrics) -> None:
        """Record one finished request's metrics; any thread."""
        self.prompt_tokens.inc(m.prompt_tokens)
        self.generation_tokens.inc(m.generated_tokens)
        if m.time_to_first_token_s is not None:
            self.ttft.observe(m.time_to_first_token_s)
        self.latency.observe(m.wall_time_s)
        with self._lock:
            if m.speculation is not None and m.speculation.drafted_tokens:
                self._drafted += m.speculation.drafted_tokens
                self._accepted += m.speculation.accepted_tokens
                self.drafted.inc(m.speculation.drafted_tokens)
                self.accepted.inc(m.speculation.accepted_tokens)
            if m.ssd is not None:
                self._ssd_hit.add(m.ssd.hit_rate)
                for key, v in asdict(m.ssd).items():
                    if isinstance(v, int | float):
                        mean = self._ssd.setdefault(key, _Mean())
                        mean.add(float(v))
                        self.ssd_metric.labels(key=f"ssd_{key}").set(mean.value())

    def render(self) -> bytes:
        return generate_latest(self.registry)


# -- the request's speculative metrics --------------------------------------------------------
_KEYS = (
    "method",
    "tokens_per_s",
    "decode_tokens_per_s",
    "time_to_first_token_s",
    "wall_time_s",
    "rounds",
    "target_forwards",
    "drafted_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "mean_tokens_per_round",
    "per_position_acceptance",
)


def speculative_info(metrics: list[RequestMetrics], method: str) -> dict[str, Any]:
    """The ``speculative`` object of a response: one request's metrics (``method``, tokens/s,
    and for speculative methods acceptance rate, mean tokens per round and ``ssd_*``), or, for
    n > 1 choices, their totals (tokens/s over the slowest choice's time)."""
    if len(metrics) == 1:
        m = metrics[0]
    else:
        m = aggregate(metrics, max(x.wall_time_s for x in metrics), method)
    flat = m.as_dict()
    return {k: v for k, v in flat.items() if k in _KEYS or k.startswith("ssd_")}

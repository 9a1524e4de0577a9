"""Prometheus metrics, one prefix (headwise_), one registry per app so tests stay independent.

Under HEADWISE_WORKERS (service/http/workers.py) each worker writes its values to Prometheus's
multiprocess files (PROMETHEUS_MULTIPROC_DIR, set by the supervisor) and any worker's /metrics
adds every worker's up: counters and histograms summed, each gauge by its mode (a queue's depth
summed, readiness the least of them), memory the workers' resident bytes summed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from service.engine.batch_policy import BatchPolicy
from service.engine.cost import CostModel
from service.engine.memory import peak_rss_bytes, process_rss_bytes

# Geometric buckets: 100 µs ... ~60 s, ×2 per step.
DURATION_BUCKETS = tuple(round(0.0001 * 2**i, 6) for i in range(20))
SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512)
TOKEN_BUCKETS = tuple(2**i for i in range(4, 17))
RATIO_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
# A batch's actual time over its predicted time: 1 is a perfect prediction.
PREDICTION_BUCKETS = (0.5, 0.67, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0)
# The capacity gauge's reference batch: a full batch of texts this long.
CAPACITY_LENGTH = 128
COST_TERMS = ("batch", "token", "token_length")


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        folder = os.environ.get(MULTIPROC_ENV)
        # What /metrics shows: this registry, or under workers every worker's files.
        self.exposed = r if folder is None else workers_registry(Path(folder))
        self.requests = Counter(
            "headwise_requests",
            "HTTP requests by endpoint, model (empty when none was chosen) and status code",
            ["endpoint", "model", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "headwise_request_duration_seconds",
            "Whole request time",
            ["endpoint", "model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.tokenization_duration = Histogram(
            "headwise_tokenization_duration_seconds",
            "Tokenisation time per request",
            ["path", "model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "headwise_queue_duration_seconds",
            "Time a request's texts waited for a batch",
            ["path", "model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "headwise_inference_duration_seconds",
            "Graph run time per batch",
            ["path", "model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "headwise_batch_size",
            "Texts per batch",
            ["path", "model"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "headwise_batch_tokens",
            "Padded tokens (longest x count) per batch",
            ["path", "model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_padding = Histogram(
            "headwise_batch_padding_ratio",
            "Share of a batch's computed tokens that are padding",
            ["path", "model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "headwise_tokens", "Real tokens computed", ["path", "model"], registry=r
        )
        self.padded_tokens = Counter(
            "headwise_padded_tokens",
            "Tokens computed including padding",
            ["path", "model"],
            registry=r,
        )
        self.padding_ratio = Gauge(
            "headwise_padding_ratio",
            "Padding share of all computed tokens since start",
            ["path", "model"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.input_length = Histogram(
            "headwise_input_tokens",
            "Tokens per input after truncation",
            ["path", "model"],
            buckets=tuple(2**i for i in range(11)),
            registry=r,
        )
        self.truncated = Counter(
            "headwise_truncated_inputs",
            "Inputs cut at the model's max length",
            ["path", "model"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "headwise_queue_depth",
            "Texts waiting for a batch",
            ["path", "model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.rejected = Counter(
            "headwise_rejected",
            "Requests refused before inference, by reason",
            ["path", "model", "reason"],
            registry=r,
        )
        self.inflight = Gauge(
            "headwise_inflight_requests",
            "Requests being handled",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.finished = 0  # requests answered (a plain count: the heap trimmer's idle test)
        self.active = 0  # requests in flight (a plain count: the drain waits for 0)
        self.info = Gauge(
            "headwise_model_info",
            "The served model and where it runs (value 1)",
            ["model", "runtime", "provider", "device", "precision", "version"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.ready = Gauge(
            "headwise_ready",
            "1 when every model is loaded and warm",
            multiprocess_mode="livemin",
            registry=r,
        )
        # Memory: process_resident_memory_bytes (now) from prometheus_client's collector, and
        # the high-water mark, which a scrape every 15 s would miss.
        ProcessCollector(registry=r)
        if folder is None:  # under workers: WorkersMemory sums every worker's
            self.peak_rss = Gauge(
                "headwise_process_resident_memory_peak_bytes",
                "Highest resident set size since the process started",
                registry=r,
            )
            self.peak_rss.set_function(peak_rss_bytes)
        self.memory_bound = Gauge(
            "headwise_memory_bound_bytes",
            "The documented peak for these settings (GET /info: memory)",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.attention_inflight = Gauge(
            "headwise_attention_inflight_numbers",
            "layers x heads x tokens² of the /attention calls in flight (their shared budget)",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.capacity = Gauge(
            "headwise_capacity_tokens_per_second",
            f"Padded tokens a second of a full batch of {CAPACITY_LENGTH}-token texts, as the "
            "batcher's measured cost predicts it",
            ["path", "model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.capacity_cost = Gauge(
            "headwise_capacity_cost_seconds",
            "The batcher's fitted cost of a batch of r texts of n tokens, a + b r n + c r n²: "
            "term batch = a, token = b, token_length = c (seconds)",
            ["path", "model", "term"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.pace = Gauge(
            "headwise_device_pace",
            "Predicted seconds of batches the device works off a second of computing, recently "
            "(1: as predicted alone; admission divides the work ahead by it; the slowest worker's)",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.pace.set(1.0)
        self.prediction = Histogram(
            "headwise_batch_time_over_predicted",
            "A batch's time over the time admission predicted for it (1: exact)",
            ["path", "model"],
            buckets=PREDICTION_BUCKETS,
            registry=r,
        )

    def observer(self, path: str, model: str) -> BatchMetrics:
        return BatchMetrics(self, path, model)


class BatchMetrics:
    """What a DynamicBatcher reports, labelled by its path (encode, attention, ...) and model."""

    def __init__(self, metrics: Metrics, path: str, model: str) -> None:
        m = metrics
        labels = (path, model)
        self._size = m.batch_size.labels(*labels)
        self._tokens = m.batch_tokens.labels(*labels)
        self._padding = m.batch_padding.labels(*labels)
        self._inference = m.inference_duration.labels(*labels)
        self._real_total = m.tokens.labels(*labels)
        self._padded_total = m.padded_tokens.labels(*labels)
        self._ratio = m.padding_ratio.labels(*labels)
        self._depth = m.queue_depth.labels(*labels)
        self._depth.set(0)
        self._capacity = m.capacity.labels(*labels)
        self._cost = [m.capacity_cost.labels(*labels, term) for term in COST_TERMS]
        self._prediction = m.prediction.labels(*labels)
        self._pace = m.pace
        self._rejected = m.rejected
        self._labels = labels
        self._real = 0
        self._padded = 0

    def batch(self, size: int, padded: int, real: int, seconds: float) -> None:
        self._size.observe(size)
        self._tokens.observe(padded)
        self._padding.observe(1 - real / padded if padded else 0.0)
        self._inference.observe(seconds)
        self._real_total.inc(real)
        self._padded_total.inc(padded)
        self._real += real
        self._padded += padded
        self._ratio.set(1 - self._real / self._padded)

    def queue_depth(self, texts: int) -> None:
        self._depth.set(texts)

    def capacity(self, cost: CostModel, policy: BatchPolicy) -> None:
        f = cost.current
        if f is None:
            return
        for gauge, value in zip(self._cost, (f.batch_s, f.token_s, f.pair_s), strict=True):
            gauge.set(value)
        n = CAPACITY_LENGTH
        rows = max(1, min(policy.max_batch_size, policy.max_batch_tokens // n))
        seconds = f.seconds(rows, n)
        if seconds > 0:
            self._capacity.set(rows * n / seconds)

    def predicted(self, predicted_s: float, actual_s: float, pace: float) -> None:
        self._prediction.observe(actual_s / predicted_s)
        self._pace.set(pace)

    def rejected(self, reason: str) -> None:
        self._rejected.labels(*self._labels, reason).inc()


def workers_registry(folder: Path) -> CollectorRegistry:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
    registry.register(WorkersMemory(folder))
    return registry


class WorkersMemory:
    """The workers' resident memory, summed (now, and each one's peak): what the container's
    memory limit is measured against. The workers are the live processes with files in the
    multiprocess folder (the supervisor removes a dead one's live-gauge files)."""

    FILE = re.compile(r"_(\d+)\.db$")

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def pids(self) -> set[int]:
        found = {
            int(m.group(1)) for p in self.folder.glob("*.db") if (m := self.FILE.search(p.name))
        }
        return {pid for pid in found if Path(f"/proc/{pid}").exists()}

    def collect(self) -> Iterator[Metric]:
        now = peak = 0
        for pid in self.pids():
            rss, high = process_rss_bytes(pid)
            now += rss
            peak += high
        yield GaugeMetricFamily(
            "process_resident_memory_bytes", "Resident memory of every worker, summed", value=now
        )
        yield GaugeMetricFamily(
            "headwise_process_resident_memory_peak_bytes",
            "Each worker's highest resident set size since it started, summed",
            value=peak,
        )

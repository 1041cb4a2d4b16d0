"""Prometheus metrics of the operator and of what each resource measured.

A private registry keeps the exported set to what is declared here (the default registry would add
process and GC collectors of the operator itself, which a scrape config may already cover).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# `campaign`: the run's BenchCampaign (empty for a run of its own), so a campaign's series select as one.
RESULT_LABELS = ("namespace", "name", "kind", "accelerator", "campaign")
ResourceKey = tuple[str, str, str]  # namespace, name, kind


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reconciles = Counter(
            "accelbench_reconciles", "Reconciliations by kind and outcome.", ["kind", "outcome"], registry=r
        )
        self.reconcile_duration = Histogram(
            "accelbench_reconcile_duration_seconds", "Time spent in one reconciliation.", ["kind"], registry=r
        )
        self.resources = Gauge(
            "accelbench_resources", "Resources by kind and phase.", ["kind", "phase"], registry=r
        )
        self.api_requests = Counter(
            "accelbench_api_requests",
            "The operator's API requests by HTTP method and status code.",
            ["method", "code"],
            registry=r,
        )
        self.api_throttled = Gauge(
            "accelbench_api_throttled_seconds",
            "Seconds the operator's API requests waited in its client-side rate limit, in total.",
            registry=r,
        )
        self.result_gauges: dict[str, Gauge] = {
            name: Gauge(f"accelbench_{name}", help_, RESULT_LABELS, registry=r)
            for name, help_ in (
                ("tokens_per_second", "Trained tokens/s (fine-tune) or peak output tokens/s (bench)."),
                ("tokens_per_second_per_chip", "Tokens per second divided by chips."),
                ("mfu", "Model FLOPs utilisation of the fine-tune, 0..1."),
                (
                    "images_per_second",
                    "Super-resolution training images/s (FinetuneJob task superResolution).",
                ),
                ("images_per_second_per_chip", "Super-resolution images/s divided by chips."),
                ("psnr_db", "Mean PSNR of the held-out images (task superResolution), dB."),
                ("effective_bits", "Effective bits per weight of the quantized layers (task quantize)."),
                ("perplexity_increase", "Relative perplexity increase of the quantized model over bf16."),
                ("ttft_p50_seconds", "Median time to first token at SLO capacity (or the first cell)."),
                ("ttft_p99_seconds", "p99 time to first token at SLO capacity (or the first cell)."),
                ("capacity_concurrency", "Largest concurrency that met the SLO."),
                ("dollars_per_million_tokens", "Serving cost per million output tokens at capacity or peak."),
                ("cost_dollars", "Accelerator cost of the run so far."),
            )
        }
        self._phases: dict[ResourceKey, str] = {}
        self._result_labels: dict[ResourceKey, tuple[str, ...]] = {}
        # kopf runs sync handlers in a thread pool: the maps are shared between threads (the scale
        # benchmark hit "dictionary keys changed during iteration" without this lock).
        self._lock = threading.RLock()

    def observe_request(self, method: str, code: int) -> None:
        self.api_requests.labels(method=method, code=str(code)).inc()

    def observe_reconcile(self, kind: str, outcome: str, seconds: float) -> None:
        self.reconciles.labels(kind=kind, outcome=outcome).inc()
        self.reconcile_duration.labels(kind=kind).observe(seconds)

    def set_phase(self, namespace: str, name: str, kind: str, phase: str | None) -> None:
        key = (namespace, name, kind)
        with self._lock:
            if self._phases.get(key) == phase:
                return
            old = self._phases.pop(key, None)
            if phase:
                self._phases[key] = phase
            self._recount(kind, {old, phase})

    def _recount(self, kind: str, phases: set[str | None]) -> None:
        # Counted from the map, not incremented, so a missed event cannot drift the gauge.
        for phase in phases - {None}:
            count = sum(1 for (_, _, k), p in self._phases.items() if k == kind and p == phase)
            self.resources.labels(kind=kind, phase=phase).set(count)

    def set_results(
        self, namespace: str, name: str, kind: str, status: Mapping[str, Any], campaign: str = ""
    ) -> None:
        """Export a resource's status; series of an earlier accelerator label are removed first."""
        with self._lock:
            self._set_results(namespace, name, kind, status, campaign)

    def _set_results(
        self, namespace: str, name: str, kind: str, status: Mapping[str, Any], campaign: str
    ) -> None:
        key = (namespace, name, kind)
        labels = (namespace, name, kind, str(status.get("accelerator") or ""), campaign)
        values = result_values(kind, status)
        old = self._result_labels.get(key)
        if old is not None and old != labels:
            self._remove_series(old)
        for metric, gauge in self.result_gauges.items():
            if metric in values:
                gauge.labels(*labels).set(values[metric])
            elif old == labels:
                _remove(gauge, labels)
        self._result_labels[key] = labels

    def forget(self, namespace: str, name: str, kind: str) -> None:
        """On delete: no series of a deleted resource should linger until the operator restarts."""
        key = (namespace, name, kind)
        with self._lock:
            labels = self._result_labels.pop(key, None)
            if labels is not None:
                self._remove_series(labels)
            self.set_phase(namespace, name, kind, None)

    def _remove_series(self, labels: tuple[str, ...]) -> None:
        for gauge in self.result_gauges.values():
            _remove(gauge, labels)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never set for this resource
        gauge.remove(*labels)


def _capacity_cell(results: Mapping[str, Any]) -> Mapping[str, Any] | None:
    cells = results.get("cells") or []
    capacity = results.get("capacityConcurrency")
    at_capacity = [c for c in cells if capacity is not None and c.get("concurrency") == capacity]
    return (at_capacity or cells or [None])[0]


def result_values(kind: str, status: Mapping[str, Any]) -> dict[str, float]:
    """Metric name -> value for what the status holds; absent numbers give no series."""
    results = status.get("results") or {}
    values: dict[str, float | None] = {"cost_dollars": (status.get("cost") or {}).get("dollars")}
    if kind == "FinetuneJob":
        values |= {
            "tokens_per_second": results.get("tokensPerSecond"),
            "tokens_per_second_per_chip": results.get("tokensPerSecondPerChip"),
            "mfu": results.get("mfu"),
        }
        sr = results.get("superResolution") or {}
        quantization = results.get("quantization") or {}
        values |= {
            "images_per_second": sr.get("imagesPerSecond"),
            "images_per_second_per_chip": sr.get("imagesPerSecondPerChip"),
            "psnr_db": sr.get("psnr"),
            "effective_bits": quantization.get("effectiveBits"),
            "perplexity_increase": quantization.get("perplexityIncrease"),
        }
    else:
        peak = results.get("peakOutputTokensPerSecond")
        chips = (status.get("cost") or {}).get("chips") or (status.get("plan") or {}).get("chips")
        cell = _capacity_cell(results) or {}
        values |= {
            "tokens_per_second": peak,
            "tokens_per_second_per_chip": peak / chips if peak is not None and chips else None,
            "ttft_p50_seconds": _ms(cell.get("ttftP50Ms")),
            "ttft_p99_seconds": _ms(cell.get("ttftP99Ms")),
            "capacity_concurrency": results.get("capacityConcurrency"),
            "dollars_per_million_tokens": results.get("dollarsPerMillionTokensAtCapacity")
            or results.get("dollarsPerMillionTokensAtPeak"),
        }
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float)}


def _ms(value: Any) -> float | None:
    return value / 1000.0 if isinstance(value, int | float) else None


METRICS = Metrics()

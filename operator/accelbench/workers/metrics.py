"""Live progress over Prometheus: the operator scrapes rank 0, and a PodMonitor can too.

Gauge names are api.contract's GAUGE_*; the operator reads them back through PROGRESS_GAUGES. The
server also answers /healthz with 200 "ok". Each server has its own registry, so tests can run
several.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from ..api.contract import (
    ENV_METRICS_PORT,
    GAUGE_EVAL_LOSS,
    GAUGE_LOSS,
    GAUGE_MFU,
    GAUGE_STEP,
    GAUGE_TOKENS_PER_SECOND,
    GAUGE_TOTAL_STEPS,
)

log = logging.getLogger(__name__)


class WorkerMetrics:
    """A MetricsSink (see workers.finetune) backed by Prometheus gauges."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=self.registry)

        self.step = gauge(GAUGE_STEP, "Optimizer steps done.")
        self.total_steps = gauge(GAUGE_TOTAL_STEPS, "Optimizer steps planned.")
        self.loss = gauge(GAUGE_LOSS, "Training loss of the last step (sum(ce*mask)/sum(mask)).")
        self.tokens_per_second = gauge(GAUGE_TOKENS_PER_SECOND, "Trained tokens per second, steady state.")
        self.mfu = gauge(GAUGE_MFU, "Model FLOPs utilization (0..1), steady state.")
        self.eval_loss = gauge(GAUGE_EVAL_LOSS, "Held-out loss of the last evaluation.")

    def on_step(
        self, step: int, total_steps: int, loss: float, tokens_per_second: float | None, mfu: float | None
    ) -> None:
        self.step.set(step)
        self.total_steps.set(total_steps)
        self.loss.set(loss)
        if tokens_per_second is not None:
            self.tokens_per_second.set(tokens_per_second)
        if mfu is not None:
            self.mfu.set(mfu)

    def on_eval(self, step: int, eval_loss: float) -> None:
        self.eval_loss.set(eval_loss)


class BenchMetrics:
    """The load generator's progress under the same gauge names (status.progress reads them)."""

    def __init__(self, planned_cells: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.step = Gauge(GAUGE_STEP, "Cells measured (sweep and search).", registry=self.registry)
        self.total_steps = Gauge(
            GAUGE_TOTAL_STEPS,
            "Cells planned: the sweep's, plus the capacity search's measured so far.",
            registry=self.registry,
        )
        self.tokens_per_second = Gauge(
            GAUGE_TOKENS_PER_SECOND,
            "Output tokens per second of the last cell.",
            registry=self.registry,
        )
        self._planned, self._done, self._searched = planned_cells, 0, 0
        self.total_steps.set(planned_cells)

    def on_cell(self, cell: Mapping[str, Any]) -> None:
        self._done += 1
        self._searched += cell.get("phase") == "search"
        self.step.set(self._done)
        self.total_steps.set(self._planned + self._searched)
        self.tokens_per_second.set(float(cell.get("outputTokensPerSecond") or 0.0))


class MetricsServer:
    """An HTTP server on a daemon thread: /metrics (Prometheus text) and /healthz."""

    def __init__(self, metrics: WorkerMetrics | BenchMetrics, port: int = 0, host: str = "0.0.0.0") -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/healthz"):
                    body, ctype, code = b"ok\n", "text/plain; charset=utf-8", 200
                elif self.path.startswith("/metrics") or self.path == "/":
                    body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
                else:
                    body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # scrapes would flood the log
                return None

        self.metrics = metrics
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def metrics_port(env: Mapping[str, str] | None = None) -> int | None:
    """The port to serve on: ENV_METRICS_PORT (0 = any free port); None when unset."""
    env = os.environ if env is None else env
    value = env.get(ENV_METRICS_PORT)
    if value is None or value == "":
        return None
    return int(value)


def start_metrics_server(port: int, metrics: WorkerMetrics | BenchMetrics | None = None) -> MetricsServer:
    server = MetricsServer(metrics or WorkerMetrics(), port).start()
    log.info("metrics on port %d", server.port)
    return server

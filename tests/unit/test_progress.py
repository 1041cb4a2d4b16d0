"""status.progress from rank 0's metrics: which pod, which port, what the page says."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

from accelbench.controller.progress import (
    metrics_url,
    parse_progress,
    read_progress,
    same_progress,
    scrape,
)
from accelbench.workers.metrics import MetricsServer, WorkerMetrics

NOW = datetime(2026, 12, 2, 21, 0, tzinfo=UTC)


def pod(index: int | None = 0, phase: str = "Running", ip: str | None = "10.0.0.7", **meta: Any) -> dict:
    annotations = dict(meta.pop("annotations", {}))
    if index is not None:
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
    return {
        "metadata": {"name": f"p{index}", "annotations": annotations, **meta},
        "spec": {"containers": [{"name": "worker", "ports": [{"name": "metrics", "containerPort": 9090}]}]},
        "status": {"phase": phase, **({"podIP": ip} if ip else {})},
    }


def test_url_of_the_running_rank_0_pod() -> None:
    assert metrics_url([pod(1), pod(0)]) == "http://10.0.0.7:9090/metrics"
    assert metrics_url([pod(0, phase="Pending"), pod(0, phase="Failed")]) is None
    assert metrics_url([pod(0, ip=None)]) is None
    assert metrics_url([pod(None)]) == "http://10.0.0.7:9090/metrics"  # a non-indexed Job's pod
    assert metrics_url([pod(0, deletionTimestamp="2026-12-02T00:00:00Z")]) is None
    mapped = pod(0, annotations={"prometheus.io/port": "31234", "prometheus.io/path": "metrics"})
    assert metrics_url([mapped]) == "http://10.0.0.7:31234/metrics"
    assert metrics_url([pod(0, annotations={"prometheus.io/port": "nope"})]) is None
    assert metrics_url([pod(0, ip="fd00::5")]) == "http://[fd00::5]:9090/metrics"


def test_progress_from_the_workers_own_page() -> None:
    metrics = WorkerMetrics()
    metrics.on_step(12, 40, 2.5, 1234.5, 0.41)
    from prometheus_client import generate_latest

    page = generate_latest(metrics.registry).decode()
    assert parse_progress(page, NOW) == {
        "step": 12,
        "totalSteps": 40,
        "loss": 2.5,
        "tokensPerSecond": 1234.5,
        "mfu": 0.41,
        "updatedAt": "2026-12-02T21:00:00Z",
    }


def test_garbage_pages_give_nothing_and_never_raise() -> None:
    for page in ("", "<html>not metrics</html>", "accelbench_worker_step{ 12", "\x00\xff" * 50):
        assert parse_progress(page, NOW) is None
    assert parse_progress("accelbench_worker_loss 2.0\n", NOW) is None  # no step: not ours yet
    nan_loss = "accelbench_worker_step 3\naccelbench_worker_loss NaN\n"
    assert parse_progress(nan_loss, NOW) == {"step": 3, "updatedAt": "2026-12-02T21:00:00Z"}


def test_a_page_whose_numbers_no_status_can_hold_gives_nothing() -> None:
    """A step of 1e19 does not fit int64 (the apiserver would refuse the status write); a negative
    step or an MFU of 3 is not progress. The page is ignored, the last good progress stays."""
    for page in (
        "accelbench_worker_step 1e19\n",
        "accelbench_worker_step -4\n",
        "accelbench_worker_step 3\naccelbench_worker_mfu 3.0\n",
        "accelbench_worker_step 3\naccelbench_worker_tokens_per_second -1\n",
    ):
        assert parse_progress(page, NOW) is None, page
    assert parse_progress("accelbench_worker_step 3\naccelbench_worker_mfu 0.4\n", NOW) is not None


def test_same_progress_ignores_the_read_time() -> None:
    a = {"step": 3, "loss": 1.0, "updatedAt": "t1"}
    assert same_progress(a, {**a, "updatedAt": "t2"}) and not same_progress(a, {**a, "step": 4})
    assert not same_progress(a, None)


def test_scrape_a_real_metrics_server_and_a_dead_port() -> None:
    metrics = WorkerMetrics()
    metrics.on_step(5, 10, 3.25, None, None)
    server = MetricsServer(metrics, port=0, host="127.0.0.1").start()
    try:
        running = pod(0, ip="127.0.0.1", annotations={"prometheus.io/port": str(server.port)})
        url = metrics_url([running])
        assert url is not None
        progress = asyncio.run(read_progress(url, NOW))
        assert progress is not None and progress["step"] == 5 and progress["totalSteps"] == 10
        assert progress["loss"] == 3.25
    finally:
        server.stop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    assert asyncio.run(scrape(f"http://127.0.0.1:{dead}/metrics", timeout=1.0)) is None


def test_a_page_served_one_byte_a_second_is_cut_off_at_the_deadline() -> None:
    """A per-read timeout would wait forever on such a server; the whole read is bounded."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            for byte in b"HTTP/1.0 200 OK\r\n\r\naccelbench_worker_step 3\n":
                if stop.is_set():
                    return
                conn.sendall(bytes([byte]))
                time.sleep(0.2)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    started = time.monotonic()
    page = asyncio.run(scrape(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", timeout=0.5))
    elapsed = time.monotonic() - started
    stop.set()
    listener.close()
    assert page is None
    assert elapsed < 2.0  # bounded by the total timeout, not by the trickle (~9 s)


def test_only_the_reporting_role_is_scraped() -> None:
    server = pod(0, ip="10.0.0.1", labels={"accelbench.io/role": "server"})
    client = pod(None, ip="10.0.0.2", labels={"accelbench.io/role": "client"})
    assert metrics_url([server, client], "client") == "http://10.0.0.2:9090/metrics"
    assert metrics_url([server], "client") is None


def test_bench_gauges_count_cells_and_search_levels() -> None:
    from prometheus_client import generate_latest

    from accelbench.workers.metrics import BenchMetrics

    bench = BenchMetrics(planned_cells=3)
    assert parse_progress(generate_latest(bench.registry).decode(), NOW)["totalSteps"] == 3
    bench.on_cell({"phase": "sweep", "outputTokensPerSecond": 120.0})
    bench.on_cell({"phase": "search", "outputTokensPerSecond": 200.5})
    got = parse_progress(generate_latest(bench.registry).decode(), NOW)
    assert got == {"step": 2, "totalSteps": 4, "tokensPerSecond": 200.5, "updatedAt": "2026-12-02T21:00:00Z"}


def test_final_progress_comes_from_the_results() -> None:
    from accelbench.controller.progress import final_progress

    done = "2026-12-02T21:30:00Z"
    finetune = {"completionTime": done, "results": {"steps": 20, "finalLoss": 5.9, "tokensPerSecond": 397.5}}
    assert final_progress("FinetuneJob", finetune) == {
        "step": 20,
        "totalSteps": 20,
        "loss": 5.9,
        "tokensPerSecond": 397.5,
        "updatedAt": done,
    }
    cells = [{"outputTokensPerSecond": 100.0}, {"outputTokensPerSecond": 180.0}]
    bench = final_progress("InferenceBench", {"results": {"cells": cells}})
    assert bench == {"step": 2, "totalSteps": 2, "tokensPerSecond": 180.0}
    assert final_progress("FinetuneJob", {"results": {}}) is None
    assert final_progress("InferenceBench", {}) is None

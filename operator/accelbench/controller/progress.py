"""Live progress: the operator scrapes a running worker's metrics into status.progress.

The fine-tuning worker serves Prometheus gauges (workers/metrics.py; names and the status fields
they fill in api.contract.PROGRESS_GAUGES); the bench client serves step = cells measured,
totalSteps = cells planned, tokensPerSecond = the last cell's output tokens/s. While a run is
Running the operator finds the running pod of completion index 0 (of the role that reports),
reads its /metrics on its event loop (a whole read is bounded by SCRAPE_TIMEOUT_SECONDS, so a
page served one byte a second costs that pod's progress, never anyone's observation), and writes
the figures with the time it read them.
A pod that does not answer, or answers garbage, leaves status.progress as it was: progress is a
convenience, never a reason for a condition or an error.

Where to connect: the pod IP and the port of the ANNOTATION_PORT annotation (the renderer sets it
to the container's metrics port, the convention annotation-based Prometheus set-ups read), else
the container port named METRICS_PORT_NAME. A local executor that maps ports, as hack/localexec.py
does, rewrites the annotation on the pods it runs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from ..api.contract import (
    ANNOTATION_PATH,
    ANNOTATION_PORT,
    LABEL_ROLE,
    METRICS_PATH,
    METRICS_PORT_NAME,
    PROGRESS_GAUGES,
    Role,
)
from ..api.status import Progress
from .observe import completion_index

SCRAPE_TIMEOUT_SECONDS = 2.0
MAX_BYTES = 1 << 20  # a metrics page of ours is < 4 KiB; anything far larger is not ours

INTEGER_FIELDS = frozenset({"step", "totalSteps"})
# Whose metrics tell the progress: rank 0 of the training Job; the load generator of a bench.
PROGRESS_ROLE = {"FinetuneJob": Role.TRAIN.value, "InferenceBench": Role.CLIENT.value}


def metrics_url(pods: Iterable[Mapping[str, Any]], role: str | None = None) -> str | None:
    """http://<pod IP>:<port><path> of the running rank-0 pod (of `role`), or None when there is
    none yet."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if role is not None and (meta.get("labels") or {}).get(LABEL_ROLE) != role:
            continue
        if status.get("phase") != "Running" or not status.get("podIP") or meta.get("deletionTimestamp"):
            continue
        if completion_index(pod) not in (0, None):
            continue
        port = _port_of(pod)
        if port is None:
            continue
        path = (meta.get("annotations") or {}).get(ANNOTATION_PATH) or METRICS_PATH
        host = status["podIP"]
        host = f"[{host}]" if ":" in host else host  # IPv6
        return f"http://{host}:{port}{path if path.startswith('/') else '/' + path}"
    return None


def _port_of(pod: Mapping[str, Any]) -> int | None:
    annotated = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PORT)
    if annotated is not None:
        try:
            port = int(annotated)
        except ValueError:
            return None
        return port if 0 < port < 65536 else None
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == METRICS_PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def parse_progress(text: str, now: datetime) -> dict[str, Any] | None:
    """status.progress from a Prometheus text page; None when it holds none of our gauges or is
    not a metrics page at all (never raises)."""
    found: dict[str, Any] = {}
    try:
        for family in text_string_to_metric_families(text):
            field = PROGRESS_GAUGES.get(family.name)
            if field is None:
                continue
            for sample in family.samples:
                if sample.name == family.name and math.isfinite(sample.value):
                    found[field] = int(sample.value) if field in INTEGER_FIELDS else float(sample.value)
    except (ValueError, TypeError, IndexError):
        return None
    if "step" not in found:
        return None
    found["updatedAt"] = now.isoformat().replace("+00:00", "Z")
    try:  # a step of 1e19 or an MFU of 3 is a broken page, not progress: it never reaches status
        Progress.model_validate(found)
    except ValueError:
        return None
    return found


async def scrape(url: str, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> str | None:
    """The page's text, or None on any network or HTTP failure or when the whole read (connect,
    request, every byte of the answer) takes longer than `timeout`."""
    try:
        return await asyncio.wait_for(_http_get(url), timeout)
    except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError):
        return None


async def _http_get(url: str) -> str | None:
    # HTTP/1.0: the answer ends at EOF and is never chunked; prometheus_client serves it so.
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        writer.write(f"GET {target} HTTP/1.0\r\nHost: {parts.netloc}\r\nAccept: text/plain\r\n\r\n".encode())
        await writer.drain()
        data = bytearray()
        while len(data) <= MAX_BYTES:
            chunk = await reader.read(65536)
            if not chunk:
                break
            data += chunk
    finally:
        writer.close()
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or status_line[1] != b"200" or len(data) > MAX_BYTES:
        return None
    return body.decode("utf-8", errors="replace")


def same_progress(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Equal apart from the time of reading: no status write when nothing moved."""

    def strip(p: Mapping[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (p or {}).items() if k != "updatedAt"}

    return strip(a) == strip(b)


async def read_progress(url: str, now: datetime) -> dict[str, Any] | None:
    """Scrape one metrics URL (bounded by SCRAPE_TIMEOUT_SECONDS); None when nothing usable came back."""
    text = await scrape(url)
    return parse_progress(text, now) if text is not None else None


def final_progress(kind: str, status: Mapping[str, Any]) -> dict[str, Any] | None:
    """status.progress of a Succeeded run, from its results (exact, unlike the last scrape, which
    may predate the last steps); None when the results say too little."""
    results = status.get("results") or {}
    done_at = status.get("completionTime")
    if kind == "FinetuneJob" and results.get("steps"):
        progress = {
            "step": int(results["steps"]),
            "totalSteps": int(results["steps"]),
            "loss": results.get("finalLoss"),
            "tokensPerSecond": results.get("tokensPerSecond"),
            "mfu": results.get("mfu"),
        }
    elif kind == "InferenceBench" and results.get("cells"):
        cells = results["cells"]
        progress = {
            "step": len(cells),
            "totalSteps": len(cells),
            "tokensPerSecond": cells[-1].get("outputTokensPerSecond"),
        }
    else:
        return None
    progress = {k: v for k, v in progress.items() if v is not None}
    if done_at:
        progress["updatedAt"] = done_at
    return progress

"""The HTTP side: one streamed request, timed; waiting for the server; finding the model name.

The hot path does as little as possible per network read: stamp the time, split SSE events, keep
the raw payloads in the record. JSON is parsed by `settle` once the whole cell has ended, so
parsing never delays reading another stream or sending the next request (asyncio runs everything
on one thread; 64 json.loads per request would otherwise sit between a send and its schedule).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from .openai import parse_event
from .records import RequestRecord
from .sse import SseParser

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
# Long prompts are large uploads and some engines send big chunks; 1 MiB reads keep the number of
# read calls per request small (aiohttp's default buffer is 64 KiB).
READ_BUFFER_BYTES = 1 << 20
# Under the servers' own idle timeout (uvicorn's 5 s, which vLLM and transformers serve run under): a
# pooled connection idle longer is dropped here rather than reused just as the server closes it,
# which loses the request to a reset (seen between the set-up probes on a busy node).
KEEPALIVE_S = 4.0


def make_session(pool_size: int, timeout_s: float | None = None) -> aiohttp.ClientSession:
    """A session whose pool holds `pool_size` connections (0 = no limit, for open loop: a pool
    limit there would queue requests in the client, hidden from the server's latencies)."""
    connector = aiohttp.TCPConnector(
        limit=pool_size, limit_per_host=0, ttl_dns_cache=None, keepalive_timeout=KEEPALIVE_S
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        read_bufsize=READ_BUFFER_BYTES,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )


def classify_error(exc: BaseException) -> str:
    """Error type names reported per cell."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(
        exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | ConnectionResetError
    ) or (isinstance(exc, aiohttp.ClientOSError) and not isinstance(exc, aiohttp.ClientConnectorError)):
        return "disconnect"
    if isinstance(exc, aiohttp.ClientError):
        return type(exc).__name__
    return f"client_{type(exc).__name__}"


async def stream_request(
    session: aiohttp.ClientSession, url: str, body: bytes, record: RequestRecord, timeout_s: float
) -> None:
    """Send one streaming request and fill `record` (raw events: see `settle`); never raises (errors
    go in record.error)."""
    parser = SseParser()
    events: list[tuple[float, bytes]] = []
    clock = time.perf_counter
    record.sent = clock()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
                if resp.status != 200:
                    await resp.read()
                    record.error = f"http_{resp.status}"
                    record.end = clock()
                    return
                async for data in resp.content.iter_any():
                    t = clock()
                    for payload in parser.feed(data):
                        events.append((t, payload))
                t = clock()
                events.extend((t, payload) for payload in parser.close())
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            raise
        record.error = classify_error(exc)
        record.end = clock()
        return
    record.events = events


def settle(record: RequestRecord) -> RequestRecord:
    """Parse the raw events a transport left in the record (once; later calls do nothing)."""
    if record.error is None and record.end is None:  # a finished stream, not yet parsed
        events, record.events = record.events, []
        apply_events(record, events)
    return record


def apply_events(record: RequestRecord, events: list[tuple[float, bytes]]) -> None:
    """Fold the timed SSE payloads into the record."""
    for t, payload in events:
        event = parse_event(payload)
        if event.error is not None:
            record.error = event.error.split(":")[0]
            break
        if event.has_token:
            record.chunk_times.append(t)
            record.chunk_tokens.append(event.tokens)
            record.chunk_chars.append(len(event.text))
        if event.completion_tokens is not None:
            record.server_output_tokens = event.completion_tokens
        if event.prompt_tokens is not None:
            record.server_prompt_tokens = event.prompt_tokens
        if event.cached_prompt_tokens is not None:
            record.cached_prompt_tokens = event.cached_prompt_tokens
        record.end = t
        if event.done:
            break
    if record.end is None:
        record.error = record.error or "empty_stream"
    elif not record.chunk_times and record.error is None:
        record.error = "no_tokens"


@dataclass(frozen=True)
class Readiness:
    seconds: float
    ready: bool
    detail: str = ""


async def wait_ready(
    base_url: str, health_path: str | None, timeout_s: float, poll_s: float = 1.0
) -> Readiness:
    """Poll the health path (or a TCP connect when there is none) until it answers.

    The time from the client's start to the first success is the server start-up time as the
    client sees it: model download, load and compile, from the moment both pods were created.
    """
    start = time.perf_counter()
    last = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.perf_counter() - start < timeout_s:
            try:
                if health_path is None:
                    host, port = _host_port(base_url)
                    _, writer = await asyncio.open_connection(host, port)
                    writer.close()
                    return Readiness(time.perf_counter() - start, True)
                async with session.get(base_url.rstrip("/") + health_path) as resp:
                    if resp.status == 200:
                        return Readiness(time.perf_counter() - start, True)
                    last = f"HTTP {resp.status}"
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                last = type(exc).__name__
            await asyncio.sleep(poll_s)
    return Readiness(time.perf_counter() - start, False, last)


def _host_port(base_url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model the server lists (an OpenAI server serves one model per process here)."""
    async with session.get(base_url.rstrip("/") + "/v1/models") as resp:
        resp.raise_for_status()
        data = await resp.json(content_type=None)
    models = data.get("data") or []
    if not models:
        raise ValueError("the server lists no model at /v1/models")
    return str(models[0]["id"])


async def probe(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, str]:
    """One small request; (status, start of the body). Used to find which optional fields the
    server refuses before any measurement. A connection the server closed under it is retried once
    on a fresh one (the probe changes nothing on the server)."""
    try:
        return await _post_once(session, url, body)
    except (aiohttp.ClientConnectionResetError, aiohttp.ServerDisconnectedError):
        return await _post_once(session, url, body)


async def _post_once(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, str]:
    async with session.post(url, json=body) as resp:
        return resp.status, (await resp.text())[:500]

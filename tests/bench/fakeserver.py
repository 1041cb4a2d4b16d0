"""A calibrated fake OpenAI-compatible streaming server (aiohttp, loopback only).

Timeline of one streamed answer of n tokens, counted from the moment the request was received:
the first chunk at `ttft`, then one chunk every `gap` seconds; chunk sizes cycle through
`chunk_tokens` (multi-token chunks, as engines with speculative decoding or a stream interval
send). Every chunk carries `x_sent` (the server's time.perf_counter() when it wrote the chunk:
CLOCK_MONOTONIC, the same clock in every process on Linux), so tests can compare the client's
figures with what really happened as well as with the nominal values.

Sleeping is precise: asyncio.sleep to 2 ms before the target, then yielding in a loop, because
epoll rounds timeouts up to whole milliseconds.

Failure modes by prompt prefix: "FAIL500" -> HTTP 500, "DISCONNECT" -> connection dropped after
two chunks, "HANG" -> first chunk never comes (for client timeouts).

    python tests/bench/fakeserver.py --port 8011 --ttft 0.05 --gap 0.01 --chunk-tokens 1,3,2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

from aiohttp import web

MODEL = "fake-model"


@dataclass
class Behaviour:
    ttft: float = 0.05
    gap: float = 0.01
    chunk_tokens: tuple[int, ...] = (1,)
    usage: bool = True  # honour stream_options.include_usage
    send_done: bool = True


async def sleep_until(when: float) -> None:
    delay = when - time.perf_counter()
    if delay > 0.002:
        await asyncio.sleep(delay - 0.002)
    while time.perf_counter() < when:
        await asyncio.sleep(0)


def word_tokens(text: str) -> list[int]:
    """The fake's tokenizer: one token per whitespace-separated word, plus a BOS."""
    return [1] + [2 + (hash(w) % 1000) for w in text.split()]


def chunk_plan(n: int, pattern: tuple[int, ...]) -> list[int]:
    sizes: list[int] = []
    i = 0
    while sum(sizes) < n:
        sizes.append(min(pattern[i % len(pattern)], n - sum(sizes)))
        i += 1
    return sizes


def make_app(b: Behaviour) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        ids = word_tokens(body["prompt"])
        if not body.get("add_special_tokens", True):
            ids = ids[1:]
        return web.json_response({"tokens": ids, "count": len(ids)})

    async def detokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": " ".join(f"w{t}" for t in body["tokens"])})

    async def completions(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        if not isinstance(prompt, str):  # token ids (OpenAI allows them; GuideLLM sends them)
            prompt = " ".join(f"w{t}" for t in prompt)
        if prompt.startswith("FAIL500"):
            return web.json_response({"error": {"message": "boom"}}, status=500)
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        want_usage = b.usage and (body.get("stream_options") or {}).get("include_usage")
        want_logprobs = body.get("logprobs") not in (None, False)
        want_ids = bool(body.get("return_token_ids"))
        # The envelope real servers send: some clients pick their parser by `object`.
        head = {
            "id": "cmpl-fake",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": MODEL,
        }
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if prompt.startswith("HANG"):
            await asyncio.sleep(3600)
        if chat:  # the role-only first chunk real servers send; it carries no token
            await resp.write(_sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        token = 0
        for i, size in enumerate(chunk_plan(n, b.chunk_tokens)):
            await sleep_until(arrived + b.ttft + i * b.gap)
            if prompt.startswith("DISCONNECT") and i == 2:
                request.transport.close()
                return resp
            words = [f" w{token + j}" for j in range(size)]
            token += size
            text = "".join(words)
            choice: dict = {"index": 0, "finish_reason": "length" if token >= n else None}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            if want_logprobs:
                choice["logprobs"] = (
                    {"content": [{"token": w, "logprob": -1.0} for w in words]}
                    if chat
                    else {"tokens": words, "token_logprobs": [-1.0] * size}
                )
            if want_ids:
                choice["token_ids"] = list(range(token - size, token))
            await resp.write(
                _sse({**head, "choices": [choice], "x_sent": time.perf_counter(), "x_arrived": arrived})
            )
        if want_usage:
            usage = {"prompt_tokens": len(word_tokens(prompt)), "completion_tokens": n}
            usage["total_tokens"] = usage["prompt_tokens"] + n
            await resp.write(_sse({**head, "choices": [], "usage": usage}))
        if b.send_done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    return app


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--gap", type=float, default=0.01)
    p.add_argument("--chunk-tokens", default="1")
    p.add_argument("--no-usage", action="store_true")
    args = p.parse_args()
    b = Behaviour(
        ttft=args.ttft,
        gap=args.gap,
        chunk_tokens=tuple(int(x) for x in args.chunk_tokens.split(",")),
        usage=not args.no_usage,
    )
    web.run_app(make_app(b), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()

"""OpenAI-compatible request bodies and the meaning of each streamed event.

One event of `/v1/completions` carries `choices[0].text`; one of `/v1/chat/completions` carries
`choices[0].delta.content` (or `reasoning_content` for reasoning models). How many tokens an event
holds is exact only when the server says so: `logprobs` (one entry per token) or `token_ids`
(vLLM's `return_token_ids`). Otherwise the count is unknown here and `tokens` is None; the record
later spreads the server's usage total over the chunks (see records.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .sse import DONE


@dataclass(frozen=True)
class Event:
    """What one SSE event says about the generation."""

    text: str = ""
    tokens: int | None = None  # exact count when the server gave token ids or logprobs
    prompt_tokens: int | None = None  # from `usage`
    completion_tokens: int | None = None  # from `usage`
    cached_prompt_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (prefix cache)
    done: bool = False
    error: str | None = None

    @property
    def has_token(self) -> bool:
        """A chunk that delivered output: text, or token ids whose text is still held back (a
        multi-byte character split over tokens)."""
        return bool(self.text) or bool(self.tokens)


def completions_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool, **extra: Any) -> dict:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        # The final chunk then carries the server's token counts: the authority for TPOT.
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if ignore_eos:
        # vLLM/TGI honour ignore_eos; min_tokens makes servers without it still run to max_tokens.
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    body.update(extra)
    return body


def chat_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool, **extra: Any) -> dict:
    body = completions_body(model, prompt, max_tokens, ignore_eos, **extra)
    del body["prompt"]
    body["messages"] = [{"role": "user", "content": prompt}]
    # max_completion_tokens is the current name; max_tokens is still what most engines read.
    body["max_completion_tokens"] = max_tokens
    return body


def parse_event(data: bytes) -> Event:
    """One event payload -> Event. Garbage becomes an Event with `error`, never an exception."""
    if data.strip() == DONE:
        return Event(done=True)
    try:
        obj = json.loads(data)
    except ValueError:
        return Event(error="invalid_json")
    if not isinstance(obj, dict):
        return Event(error="invalid_json")
    if "error" in obj:
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else str(err)
        return Event(error=f"server_error: {str(message)[:200]}")
    text = ""
    tokens: int | None = None
    choices = obj.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
        else:
            text = choice.get("text") or ""
        tokens = _exact_tokens(choice)
    usage = obj.get("usage") or {}
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Event(
        text=text,
        tokens=tokens,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cached_prompt_tokens=cached if isinstance(cached, int) else None,
    )


def _exact_tokens(choice: dict) -> int | None:
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return len(ids)
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        if isinstance(logprobs.get("tokens"), list):  # completions
            return len(logprobs["tokens"])
        if isinstance(logprobs.get("content"), list):  # chat
            return len(logprobs["content"])
    return None

"""Autoregressive decoding for the NNX Transformer with a KV cache: greedy or temperature/top-p.

Layout: a fixed [B, T] token buffer per call, each row's prompt left-aligned at position 0 and its
length in `lengths`; generated tokens are written at `lengths` and the length grows. Positions are
the buffer indices, segment ids are 1 on a row's tokens and 0 on the rest of the buffer.

One jitted program per (B, T) and sampling setting: a prefill (`Transformer.prefill`, the normal
forward over the whole buffer once) fills each layer's k/v cache [B, T, kv_heads, head_dim], then a
`lax.while_loop` with static shapes runs `Transformer.decode_step` on one token per row: it writes
that token's k/v at its buffer index and attends to the cache up to it (and within the window on
sliding layers). The cache tail after a row's real tokens holds values of the buffer's padding; no
query ever attends to it before the decode overwrites it. Only the last position's hidden state
goes through the output projection, so the [B, T, vocab] logits never exist.

Cost: one forward over T tokens, then one single-token step per new token, each reading the weights
and the cache. The cache takes 2 × layers × B × T × kv_heads × head_dim × dtype bytes (summed over
layers where Gemma 4's global layers have their own kv_heads and head_dim), on top of the
prefill's activations; e.g. 8 rows × 2048 tokens of a model with 60 layers × 16 kv heads × 256 in
bfloat16 is 2 × 60 × 8 × 2048 × 16 × 256 × 2 B = 15 GiB.

Sampling: logits / temperature, then the top-p nucleus (the smallest set of most likely tokens
whose probability reaches top_p), then `jax.random.categorical` with the key folded in per step.
A row stops at its first stop id (written into the buffer) or when `max_new_tokens` are written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax

from .transformer import Transformer


def pick_token(logits: jax.Array, key: jax.Array, temperature: float, top_p: float) -> jax.Array:
    """Next token per row from float32 logits [B, V]: argmax when temperature is 0, else a sample."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_p < 1.0:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # probability of the more likely tokens
        kept = jnp.where(before < top_p, ordered, jnp.inf)  # the most likely token is always kept
        threshold = jnp.min(kept, axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def make_decoder(
    graphdef: nnx.GraphDef,
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    out_sharding: Any = None,
) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """decode(states, tokens [B, T] int32, lengths [B] int32, key) -> (tokens, lengths), jitted.

    `states` is the tuple of nnx states that `nnx.merge(graphdef, *states)` takes (for a LoRA split:
    (adapters, frozen base)). T must be at least max(lengths) + max_new_tokens.
    """
    stops = np.asarray(sorted(set(stop_ids)) or [-1], dtype=np.int32)

    def decode(states: tuple[Any, ...], tokens: jax.Array, lengths: jax.Array, key: jax.Array):
        if max_new_tokens < 1:
            return tokens, lengths
        model: Transformer = nnx.merge(graphdef, *states)
        b, t = tokens.shape
        index = jnp.arange(t, dtype=jnp.int32)
        rows = jnp.arange(b)

        def emit(
            i: jax.Array, hidden: jax.Array, tokens: jax.Array, lengths: jax.Array, done: jax.Array
        ) -> tuple[jax.Array, jax.Array, jax.Array]:
            """Pick step i's token from the hidden state [B, 1, D] of each row's last token; write it."""
            logits = model.logits(hidden)[:, 0].astype(jnp.float32)
            token = pick_token(logits, jax.random.fold_in(key, i), temperature, top_p)
            write = ~done & (lengths < t)
            at = jnp.minimum(lengths, t - 1)
            tokens = tokens.at[rows, at].set(jnp.where(write, token, tokens[rows, at]))
            lengths = lengths + write.astype(jnp.int32)
            done = done | (write & jnp.isin(token, stops)) | (lengths >= t)
            return tokens, lengths, done

        segment_ids = (index[None, :] < lengths[:, None]).astype(jnp.int32)
        hidden, caches = model.prefill(tokens, jnp.broadcast_to(index, (b, t)), segment_ids)
        last = jnp.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)  # [B, 1, D]
        tokens, lengths, done = emit(jnp.int32(0), last, tokens, lengths, jnp.zeros((b,), bool))

        def step(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            # Feed each row's last token and pick the next one from its output. A finished row feeds
            # its last token again and again, rewriting one cache entry with the same values.
            i, tokens, lengths, done, caches = carry
            at = jnp.maximum(lengths - 1, 0)
            hidden, caches = model.decode_step(tokens[rows, at][:, None], at[:, None], caches, at)
            tokens, lengths, done = emit(i, hidden, tokens, lengths, done)
            return i + 1, tokens, lengths, done, caches

        def more(carry: tuple[Any, ...]) -> jax.Array:
            i, _, _, done, _ = carry
            return (i < max_new_tokens) & ~jnp.all(done)

        start = (jnp.int32(1), tokens, lengths, done, caches)
        _, tokens, lengths, _, _ = jax.lax.while_loop(more, step, start)
        return tokens, lengths

    if out_sharding is not None:
        return jax.jit(decode, out_shardings=(out_sharding, out_sharding))
    return jax.jit(decode)


def buffer(
    prompts: Sequence[Sequence[int]], rows: int, length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [rows, length], lengths [rows]) with each prompt left-aligned; rows beyond the prompts
    repeat the first prompt (their output is dropped), so a batch's shape never changes."""
    if not prompts or len(prompts) > rows:
        raise ValueError(f"need 1..{rows} prompts, got {len(prompts)}")
    tokens = np.full((rows, length), pad_id, dtype=np.int32)
    lengths = np.zeros((rows,), dtype=np.int32)
    for r in range(rows):
        prompt = prompts[r] if r < len(prompts) else prompts[0]
        if len(prompt) >= length:
            raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room in a buffer of {length}")
        tokens[r, : len(prompt)] = prompt
        lengths[r] = len(prompt)
    return tokens, lengths


def completions(tokens: np.ndarray, start: np.ndarray, end: np.ndarray, count: int) -> list[list[int]]:
    """The generated ids of the first `count` rows: tokens[r, start[r]:end[r]] (stop id included)."""
    return [tokens[r, int(start[r]) : int(end[r])].tolist() for r in range(count)]


def generate(
    model: Transformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    pad_id: int = 0,
) -> list[list[int]]:
    """One-off convenience (tests, notebooks): decode `prompts` on one device, return the new ids."""
    graphdef, state = nnx.split(model)
    decode = make_decoder(
        graphdef, max_new_tokens=max_new_tokens, stop_ids=stop_ids, temperature=temperature, top_p=top_p
    )
    length = max(len(p) for p in prompts) + max_new_tokens
    tokens, lengths = buffer(prompts, len(prompts), length, pad_id)
    out, ends = decode((state,), jnp.asarray(tokens), jnp.asarray(lengths), jax.random.key(seed))
    return completions(np.asarray(out), lengths, np.asarray(ends), len(prompts))

"""Attention for the PyTorch worker on CUDA: flash for plain causal layers, FlexAttention for the rest.

Why not transformers' "sdpa" alone: a sliding-window layer (five of every six in Gemma 3) gets a
dense [B, 1, T, T] boolean mask, which rules out SDPA's flash kernel; the kernel that takes a mask
reads it and computes every block, the ones the window leaves empty included. Packed rows (several
examples per row) are the same story for every layer. FlexAttention takes the rule as a block mask
and skips the empty blocks; for a layer that is plain causal over the whole row, SDPA's flash kernel
with `is_causal` stays the fastest (see benchmarks/finetune/results/torch-attention).

The rule is data.attention_allowed, the one the JAX path uses: query q sees key k iff k <= q, both
are in the same segment, and q - k < window on sliding layers (transformers' own window rule).

How it reaches the model: registered under NAME in transformers' AttentionInterface; the worker
builds the block masks once per batch outside the model (`masks_for`) and passes them as the
attention mask: one mask, or a dict per layer type for models with local and global layers (they
take such a dict as is). A None mask means plain causal.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

NAME = "accelbench_hybrid"  # no "flash" in it: transformers takes such names for flash kernels
# Attention implementations for whole training rows (no KV cache): generation_attention swaps them
# for SDPA while the model generates. gaudi_attention adds its own.
TRAINING_ONLY: set[str] = {NAME}


# Arguments some model families pass that change the attention's result (sinks, relative position
# biases, head masks): this implementation has none of them.
UNSUPPORTED_KWARGS = ("s_aux", "sinks", "position_bias", "head_mask", "attention_bias")


def register() -> str:
    """Make NAME a valid attn_implementation for transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention_forward)
    return NAME


@functools.cache
def _compiled_flex() -> Any:
    # Uncompiled, flex_attention materializes the scores; compiled it is a fused Triton kernel.
    # Inside a model that is itself torch.compile'd this is traced through, not compiled twice.
    return torch.compile(flex_attention, dynamic=False)


def _flex(device: torch.device) -> Any:
    return _compiled_flex() if device.type == "cuda" else flex_attention


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, KV, S, D]
    value: torch.Tensor,
    attention_mask: BlockMask | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature; returns [B, T, H, D] as the other implementations do."""
    if dropout:
        raise ValueError(f"{NAME} has no attention dropout; set attention_dropout to 0 in the config")
    unsupported = sorted(k for k in UNSUPPORTED_KWARGS if kwargs.get(k) is not None)
    if unsupported:  # they change the math: refuse rather than silently compute something else
        raise ValueError(f"{NAME} does not implement {unsupported}; set ACCELBENCH_TORCH_ATTENTION=sdpa")
    if query.shape[2] != key.shape[2] or (
        attention_mask is not None and not isinstance(attention_mask, BlockMask)
    ):
        # A KV cache or a padding mask: generation, which this training kernel does not do (see
        # generation_attention); computing on would silently ignore the cache offset or the padding.
        # (Left padding at prefill cannot be seen from here: transformers builds no mask for a
        # custom implementation. generation_attention is the guard for that.)
        raise ValueError(f"{NAME} is for training on whole rows; generate under generation_attention()")
    gqa = key.shape[1] != query.shape[1]
    if attention_mask is None and sliding_window is None and softcap is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    else:
        block_mask = attention_mask
        if block_mask is None:  # a window (or soft-cap) without packed rows: one mask per shape
            block_mask = window_block_mask(query.shape[2], sliding_window, query.device)
        score_mod = None
        if softcap is not None:
            cap = float(softcap)

            def score_mod(score: torch.Tensor, b: Any, h: Any, q: Any, k: Any) -> torch.Tensor:
                return cap * torch.tanh(score / cap)

        out = _flex(query.device)(
            query, key, value, block_mask=block_mask, score_mod=score_mod, scale=scaling, enable_gqa=gqa
        )
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def generation_attention(model: torch.nn.Module) -> Iterator[None]:
    """SDPA while the trained model generates (pass@k): decoding attends from one new token to a
    KV cache through left-padding masks, which transformers builds for SDPA but not for a custom
    implementation. The model is switched back afterwards."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current not in TRAINING_ONLY:
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


# --------------------------------------------------------------------------------------------------
# Block masks (built outside the model: once per shape, or once per packed batch)


@functools.lru_cache(maxsize=16)
def window_block_mask(length: int, window: int | None, device: torch.device) -> BlockMask:
    """Causal (and windowed) over whole rows, shared by every row and head."""

    def rule(b: Any, h: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        visible = k <= q
        return visible & (q - k < window) if window is not None else visible

    return create_block_mask(rule, None, None, length, length, device=device)


def segment_block_mask(segments: torch.Tensor, window: int | None) -> BlockMask:
    """Causal, same segment, windowed when asked: packed rows ([B, T] segment ids)."""
    length = segments.shape[-1]

    def rule(b: Any, h: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        visible = (k <= q) & (segments[b, q] == segments[b, k])
        return visible & (q - k < window) if window is not None else visible

    return create_block_mask(rule, segments.shape[0], None, length, length, device=segments.device)


def masks_for(
    segment_ids: np.ndarray, window: int | None, per_layer_type: bool, device: torch.device
) -> BlockMask | dict[str, BlockMask | None] | None:
    """What the model gets as attention_mask under NAME (None parts: plain causal, flash)."""
    packed = int(segment_ids.max(initial=0)) > 1
    segments = torch.from_numpy(segment_ids).to(device) if packed else None
    full = segment_block_mask(segments, None) if segments is not None else None
    if not per_layer_type:
        return full
    local = None
    if window is not None and segments is not None:
        local = segment_block_mask(segments, window)
    elif window is not None:
        local = window_block_mask(segment_ids.shape[-1], window, device)
    return {"full_attention": full, "sliding_attention": local}

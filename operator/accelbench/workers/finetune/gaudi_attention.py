"""Flash attention on Gaudi: Habana's fused SDPA kernel behind transformers' attention interface.

`training.flashAttention` on an HPU runs habana_frameworks' FusedSDPA (the kernel optimum-habana's
Gaudi models call) for every layer: causal rows by the kernel's `is_causal`, packed rows and sliding
windows by the same boolean masks the worker gives SDPA. Where the kernel is not importable the worker
says so and runs SDPA; the report's `versions.attention` records which ran.

Training rows only (query length = key length): generation switches to SDPA (torch_attention.
generation_attention), as the kernel's causal flag would misalign a KV cache.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import torch_attention

NAME = "accelbench_gaudi_fused_sdpa"


def fused_sdpa() -> Any | None:
    """The kernel class (its `apply` takes SDPA's arguments), or None off Gaudi."""
    try:
        from habana_frameworks.torch.hpex.kernels import FusedSDPA
    except ImportError:
        return None
    return FusedSDPA


def register(kernel: Any) -> str:
    """Make NAME an attn_implementation for transformers, calling `kernel`."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, functools.partial(attention_forward, kernel=kernel))
    torch_attention.TRAINING_ONLY.add(NAME)
    return NAME


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, KV, T, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    kernel: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature; returns [B, T, H, D]."""
    if softcap is not None:
        raise ValueError(f"{NAME} has no logit soft-cap; set training.flashAttention false for this model")
    unsupported = sorted(k for k in torch_attention.UNSUPPORTED_KWARGS if kwargs.get(k) is not None)
    if unsupported:
        raise ValueError(f"{NAME} does not implement {unsupported}; set training.flashAttention false")
    if query.shape[2] != key.shape[2]:
        raise ValueError(f"{NAME} is for training on whole rows; generate under generation_attention()")
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each KV head serves a group
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    mask = attention_mask
    if mask is None and sliding_window is not None:  # a window the model left to the kernel
        mask = window_mask(query.shape[2], sliding_window, query.device)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(query.dtype)  # an additive mask, as SDPA takes it
    causal = mask is None  # a mask carries causality (and segments, windows) itself
    out = kernel.apply(query, key, value, mask, dropout, causal, scaling)
    return out.transpose(1, 2).contiguous(), None


def window_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """[1, 1, T, T] boolean: causal within the window (transformers' rule: q - k < window)."""
    q = torch.arange(length, device=device)[:, None]
    k = torch.arange(length, device=device)[None, :]
    return ((k <= q) & (q - k < window))[None, None]

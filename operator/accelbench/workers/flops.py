"""FLOPs per trained token and MFU, the one definition both frameworks report (docs/design.md).

    FLOPs/token = k·N + 6·N_lora + 6·T·Σ_layers(H·Q)

    k = 6 for full fine-tuning: forward 2N, activation gradients 2N, weight gradients 2N.
    k = 4 for LoRA: forward 2N and activation gradients 2N through the frozen base; no weight
        gradients of the base. The adapters themselves are trained: + 6·N_lora.
    N = weights that take part in a matrix product per token: every attention and MLP projection of
        every layer plus the LM head (vocab × hidden). The input embedding is a table lookup, so an
        untied input embedding is not counted; a tied one is counted once, as the LM head. Norm
        weights are left out (< 0.1 %).
    N_lora = Σ over adapted projections of r·(in + out).
    Attention: 6·L·H·Q·T (PaLM appendix B style): per token and layer, QKᵀ and AV each cost
        2·H·Q·T forward, ×3 with the backward. H = query heads, Q = head size (per layer when
        global layers use another size), T = seq_length. Like docs/anchors.md, T is the full sequence
        length on every layer: no halving for causality and no reduction for sliding-window layers,
        so figures compare with published MFU numbers that use the same convention.

Tokens are trained tokens (sum of loss_mask), so MFU counts useful work: prompt tokens masked out of
the loss still cost compute that this figure does not credit.

Check against docs/anchors.md (Gemma-3-1B shape, full, seq 2048, one H200 at 989 TFLOP/s): N = 999.75 M,
attention 6·26·4·256·2048 = 0.327 GFLOP, FLOPs/token = 6.326 G; 37,686 tok/s -> 24.1 % MFU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..api.finetune import expand_lora_targets
from ..catalog import ModelShape, projection_dims

# Owned by catalog.hf_config; re-exported for the fine-tuning worker, which imports it from here.
from ..catalog.hf_config import shape_from_hf_config as shape_from_hf_config

FULL_FORMULA = "6N + 6·L·H·Q·T (N: projection + LM-head weights, T: seq length)"
LORA_FORMULA = "4N + 6·N_lora + 6·L·H·Q·T (N: projection + LM-head weights, T: seq length)"


@dataclass(frozen=True)
class FlopsPerToken:
    total: float
    base_parameters: int  # N
    lora_parameters: int  # N_lora (0 for full fine-tuning)
    attention: float  # 6·T·Σ(H·Q)
    formula: str


def matmul_parameters(shape: ModelShape) -> int:
    """N: projections of every layer plus one vocab × hidden matrix (the LM head)."""
    layers = sum(
        fan_in * fan_out
        for i in range(shape.layers)
        for fan_in, fan_out in projection_dims(shape, shape.is_global_layer(i)).values()
    )
    return layers + shape.vocab * shape.hidden


def lora_parameters(shape: ModelShape, rank: int, targets: Iterable[str]) -> int:
    """r·(in + out) for every adapted projection, all-linear expanded as the planner and workers do.

    A layer without a named projection (v_proj of Gemma 4's shared-k/v global layers) adds nothing.
    """
    wanted = set(expand_lora_targets(targets))
    return sum(
        rank * (fan_in + fan_out)
        for i in range(shape.layers)
        for name, (fan_in, fan_out) in projection_dims(shape, shape.is_global_layer(i)).items()
        if name in wanted
    )


def attention_flops(shape: ModelShape, seq_length: int) -> float:
    heads_dims = sum(
        shape.heads * shape.layer_heads(shape.is_global_layer(i))[1] for i in range(shape.layers)
    )
    return 6.0 * heads_dims * seq_length


def flops_per_token(
    shape: ModelShape,
    seq_length: int,
    lora_rank: int | None = None,
    lora_targets: Iterable[str] = (),
) -> FlopsPerToken:
    """Full fine-tuning when `lora_rank` is None, else LoRA with that rank on `lora_targets`."""
    n = matmul_parameters(shape)
    attention = attention_flops(shape, seq_length)
    if lora_rank is None:
        return FlopsPerToken(6.0 * n + attention, n, 0, attention, FULL_FORMULA)
    n_lora = lora_parameters(shape, lora_rank, lora_targets)
    return FlopsPerToken(4.0 * n + 6.0 * n_lora + attention, n, n_lora, attention, LORA_FORMULA)


def mfu(tokens_per_second: float, flops_per_token: float, chips: int, peak_tflops_per_chip: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the chips' dense bf16 peak."""
    if chips < 1 or peak_tflops_per_chip <= 0:
        raise ValueError("mfu needs chips >= 1 and a positive peak")
    return tokens_per_second * flops_per_token / (chips * peak_tflops_per_chip * 1e12)

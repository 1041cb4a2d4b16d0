"""FLOPs per trained token and MFU, the one definition both frameworks report (DESIGN.md).

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
        global layers use another size), T = seq_length. Like ANCHORS.md, T is the full sequence
        length on every layer: no halving for causality and no reduction for sliding-window layers,
        so figures compare with published MFU numbers that use the same convention.

Tokens are trained tokens (sum of loss_mask), so MFU counts useful work: prompt tokens masked out of
the loss still cost compute that this figure does not credit.

Check against ANCHORS.md (Gemma-3-1B shape, full, seq 2048, one H200 at 989 TFLOP/s): N = 999.75 M,
attention 6·26·4·256·2048 = 0.327 GFLOP, FLOPs/token = 6.326 G; 37,686 tok/s -> 24.1 % MFU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import ModelShape, projection_dims

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
    """r·(in + out) for every adapted projection; unknown target names adapt nothing here."""
    wanted = set(targets)
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


def _global_layer_shape(cfg: Mapping[str, Any], layer_types: list[str] | None) -> tuple[Any, Any]:
    """(global_head_dim, global_kv_heads) of Gemma 4's full-attention layers, else (None, None).

    transformers (5.17 and later) writes them as per_layer_config {layer index: {head_dim,
    num_key_value_heads}}; published checkpoints carry global_head_dim (Gemma4TextConfig's default:
    512) and num_global_key_value_heads (applied only with attention_k_eq_v).
    """
    per_layer = cfg.get("per_layer_config")
    if per_layer and layer_types and "full_attention" in layer_types:
        first_global = str(layer_types.index("full_attention"))
        overrides = per_layer.get(first_global) or per_layer.get(int(first_global)) or {}
        return overrides.get("head_dim"), overrides.get("num_key_value_heads")
    if str(cfg.get("model_type", "")).startswith("gemma4"):
        kv = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None
        return cfg.get("global_head_dim", 512), kv
    return cfg.get("global_head_dim"), cfg.get("num_global_key_value_heads")


def shape_from_hf_config(config: Mapping[str, Any], family: str = "", size: str = "local") -> ModelShape:
    """The ModelShape of a Hugging Face config.json (text config; multimodal ones nest it)."""
    cfg = dict(config.get("text_config") or config)
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    layer_types = cfg.get("layer_types")
    sliding = cfg.get("sliding_window")
    local_per_global = None
    if sliding and layer_types and "full_attention" in layer_types:
        # ModelShape describes a regular pattern: local layers before each global one.
        local_per_global = layer_types.index("full_attention") or None
    global_head_dim, global_kv_heads = _global_layer_shape(cfg, layer_types)
    return ModelShape(
        family=family or str(cfg.get("model_type", "unknown")),
        size=size,
        reference="config.json",
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", family.startswith("gemma"))),
        sliding_window=int(sliding) if local_per_global else None,
        local_per_global=local_per_global,
        global_head_dim=global_head_dim,
        global_kv_heads=global_kv_heads,
        attention_k_eq_v=bool(cfg.get("attention_k_eq_v", False)),
        parameters=1,  # unknown here and unused by the FLOPs count
    )

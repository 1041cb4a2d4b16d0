"""Names and layouts: which Hugging Face tensors make which JAX parameter, and how to reshape them.

Every JAX parameter is built from one or two HF tensors by transposes, reshapes and stacking only,
so HF -> JAX -> HF is bit-exact. Norm scales are copied unchanged: both transformers and the JAX
model store Gemma 3's zero-centred scale (output = x·(1+scale)) and Llama's and Gemma 4's plain
multiplier, and the `RMSNorm.offset` of each family applies the convention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..jaxmodels.config import ModelConfig

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Rule:
    """One JAX parameter: the HF tensor names it is made of, and the two layout functions."""

    path: Path
    hf_names: tuple[str, ...]
    to_jax: Callable[[list[np.ndarray]], np.ndarray]
    to_hf: Callable[[np.ndarray], list[np.ndarray]]


def _identity(ts: list[np.ndarray]) -> np.ndarray:
    return ts[0]


def _identity_back(x: np.ndarray) -> list[np.ndarray]:
    return [x]


def _transpose(ts: list[np.ndarray]) -> np.ndarray:
    return np.ascontiguousarray(ts[0].T)


def _transpose_back(x: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(x.T)]


def _heads_in(heads: int, head_dim: int) -> Callable[[np.ndarray], np.ndarray]:
    # q/k/v_proj.weight [heads·head_dim, embed] -> [heads, embed, head_dim]
    def f(w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w.reshape(heads, head_dim, -1).transpose(0, 2, 1))

    return f


def _heads_in_back(w: np.ndarray) -> np.ndarray:
    heads, embed, head_dim = w.shape
    return np.ascontiguousarray(w.transpose(0, 2, 1).reshape(heads * head_dim, embed))


def _rules_for_layer(cfg: ModelConfig, i: int, prefix: str) -> list[Rule]:
    hf = f"{prefix}layers.{i}."
    kind = cfg.layer_types[i]
    n, h = cfg.heads, cfg.layer_head_dim(kind)
    q_in = _heads_in(n, h)
    kv_in = _heads_in(cfg.layer_kv_heads(kind), h)

    def o_to_jax(ts: list[np.ndarray]) -> np.ndarray:
        # o_proj.weight [embed, heads·head_dim] -> [heads, head_dim, embed]
        return np.ascontiguousarray(ts[0].reshape(-1, n, h).transpose(1, 2, 0))

    def o_to_hf(w: np.ndarray) -> list[np.ndarray]:
        return [np.ascontiguousarray(w.transpose(2, 0, 1).reshape(w.shape[2], n * h))]

    layer: Path = ("layers", i)
    # Gemma 4 global layers with attention_k_eq_v have no v_proj: kv_einsum holds k alone ([1, ...]).
    kv_names = (hf + "self_attn.k_proj.weight",)
    if not cfg.shares_kv(kind):
        kv_names += (hf + "self_attn.v_proj.weight",)
    rules = [
        Rule((*layer, "attn", "q_einsum", "w"), (hf + "self_attn.q_proj.weight",),
             lambda ts: q_in(ts[0]), lambda w: [_heads_in_back(w)]),
        Rule((*layer, "attn", "kv_einsum", "w"), kv_names,
             lambda ts: np.stack([kv_in(t) for t in ts]),
             lambda w: [_heads_in_back(x) for x in w]),
        Rule((*layer, "attn", "attn_vec_einsum", "w"), (hf + "self_attn.o_proj.weight",), o_to_jax, o_to_hf),
        Rule((*layer, "mlp", "gating_einsum", "w"), (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"),
             lambda ts: np.stack(ts), lambda w: [w[0], w[1]]),
        Rule((*layer, "mlp", "linear", "w"), (hf + "mlp.down_proj.weight",), _transpose, _transpose_back),
        _norm((*layer, "pre_attention_norm"), hf + "input_layernorm.weight"),
    ]  # fmt: skip
    if cfg.is_gemma:
        rules += [
            _norm((*layer, "post_attention_norm"), hf + "post_attention_layernorm.weight"),
            _norm((*layer, "pre_ffw_norm"), hf + "pre_feedforward_layernorm.weight"),
            _norm((*layer, "post_ffw_norm"), hf + "post_feedforward_layernorm.weight"),
            _norm((*layer, "attn", "query_norm"), hf + "self_attn.q_norm.weight"),
            _norm((*layer, "attn", "key_norm"), hf + "self_attn.k_norm.weight"),
        ]
    if cfg.layer_scalar:
        # Gemma 4's persistent buffer [1]; Gemma 4's v_norm has no weight, so no tensor to map.
        rules.append(Rule((*layer, "layer_scalar"), (hf + "layer_scalar",), _identity, _identity_back))
    if not cfg.is_gemma:
        # Llama's "post_attention_layernorm" is the norm in front of the MLP.
        rules.append(_norm((*layer, "pre_ffw_norm"), hf + "post_attention_layernorm.weight"))
    return rules


def _norm(path: Path, hf_name: str) -> Rule:
    return Rule((*path, "scale"), (hf_name,), _identity, _identity_back)


@dataclass(frozen=True)
class HfLayout:
    """Where the decoder sits inside a checkpoint's names (text-only or multimodal Gemma 3/4)."""

    prefix: str  # "model." for *ForCausalLM, "model.language_model." for Gemma3/4ForConditionalGeneration
    lm_head: str  # name of the untied output projection

    @classmethod
    def detect(cls, names: Iterable[str]) -> HfLayout:
        names = list(names)
        embed = [n for n in names if n.endswith("embed_tokens.weight") and "vision" not in n]
        if len(embed) != 1:
            raise ValueError(f"cannot find the decoder's embed_tokens.weight among {len(names)} tensors")
        prefix = embed[0].removesuffix("embed_tokens.weight")
        heads = [n for n in names if n.endswith("lm_head.weight")]
        return cls(prefix=prefix, lm_head=heads[0] if heads else "lm_head.weight")


def rules(cfg: ModelConfig, layout: HfLayout) -> list[Rule]:
    p = layout.prefix
    out = [
        Rule(("embedder", "input_embedding"), (p + "embed_tokens.weight",), _identity, _identity_back),
        _norm(("final_norm",), p + "norm.weight"),
    ]
    if not cfg.tied_embeddings:
        out.append(Rule(("embedder", "output_embedding"), (layout.lm_head,), _identity, _identity_back))
    for i in range(cfg.layers):
        out += _rules_for_layer(cfg, i, p)
    return out

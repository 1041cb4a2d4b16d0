"""The decoder-only transformer shared by the Gemma 3, Gemma 4 (dense text) and Llama families.

Tree layout (nnx paths):
  embedder.input_embedding [vocab, embed]; embedder.output_embedding [vocab, embed] when untied
  layers.<i>.{pre_attention_norm, post_attention_norm, pre_ffw_norm, post_ffw_norm}.scale
  layers.<i>.attn.{q_einsum, kv_einsum, attn_vec_einsum}.w, layers.<i>.attn.{query,key}_norm.scale
  layers.<i>.mlp.{gating_einsum, linear}.w
  layers.<i>.layer_scalar [1] (Gemma 4; a Buffer, not a Param)
  final_norm.scale
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from flax import nnx

import jax

from .config import ModelConfig
from .layers import Block, RMSNorm, attention_mask, softcap
from .lora import ATTENTION_TARGETS, MLP_TARGETS, validate_targets

# Per layer (k, v), each [B, T, kv_heads, head_dim] in the compute dtype.
KVCache = tuple[tuple[jax.Array, jax.Array], ...]


class Embedder(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, param_dtype: jnp.dtype) -> None:
        shape = (cfg.vocab_size, cfg.hidden)
        self.input_embedding = nnx.Param(jax.random.normal(rngs.params(), shape, param_dtype) * 0.02)
        self.output_embedding = (
            None
            if cfg.tied_embeddings
            else nnx.Param(jax.random.normal(rngs.params(), shape, param_dtype) * 0.02)
        )
        self.scale = cfg.embed_scale

    def encode(self, ids: jax.Array, dtype: jnp.dtype) -> jax.Array:
        table = self.input_embedding[...]
        # transformers multiplies in the weight dtype (the sqrt(hidden) factor rounded to it); so do we.
        return (table[ids] * jnp.asarray(self.scale, table.dtype)).astype(dtype)

    def decode(self, x: jax.Array) -> jax.Array:
        table = self.input_embedding if self.output_embedding is None else self.output_embedding
        return jnp.einsum("btd,vd->btv", x, table[...].astype(x.dtype))


class Transformer(nnx.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        param_dtype: jnp.dtype = jnp.float32,
        dtype: jnp.dtype = jnp.bfloat16,
        remat: bool = False,
        remat_policy: str = "full",
        segment_masks: bool = True,
    ) -> None:
        # Only hashable scalars as static attributes (jit caches on the graph definition).
        # segment_masks False: every row holds one sequence (plus trailing padding), so attention
        # is plain causal and runs on the fused kernels' causal/window flags instead of masks.
        self.segment_masks = segment_masks
        self.sliding_window = cfg.sliding_window
        self.final_softcap = cfg.final_softcap
        self.dtype = dtype
        self.remat = remat
        if remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy {remat_policy!r} is not one of {', '.join(REMAT_POLICIES)}")
        self.remat_policy = remat_policy
        self.embedder = Embedder(cfg, rngs=rngs, param_dtype=param_dtype)
        self.layers = nnx.List(
            [Block(cfg, kind, rngs=rngs, param_dtype=param_dtype, dtype=dtype) for kind in cfg.layer_types]
        )
        self.final_norm = RMSNorm(
            cfg.hidden, eps=cfg.norm_eps, offset=cfg.norm_offset, param_dtype=param_dtype
        )

    def add_lora(
        self,
        targets: Sequence[str],
        *,
        rank: int,
        alpha: float,
        seed: int = 0,
        param_dtype: jnp.dtype = jnp.float32,
    ) -> None:
        """Attach adapters (B = 0, so the function is unchanged) to the named projections of every layer.

        Adapters default to float32 even on a bf16 base, as PEFT does (autocast_adapter_dtype).
        """
        chosen = validate_targets(targets)
        rngs = nnx.Rngs(params=seed)
        attn = tuple(t for t in chosen if t in ATTENTION_TARGETS)
        mlp = tuple(t for t in chosen if t in MLP_TARGETS)
        for block in self.layers:
            block.attn.add_lora(attn, rank, alpha, rngs, param_dtype)
            block.mlp.add_lora(mlp, rank, alpha, rngs, param_dtype)

    def hidden_states(self, input_ids: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """Final-norm output [B, T, embed] in the compute dtype."""
        x = self.embedder.encode(input_ids, self.dtype)
        masks = self._masks(segment_ids)
        for block in self.layers:
            mask = masks[block.attn.window]
            if self.remat:
                x = _checkpointed(block, x, positions, mask, REMAT_POLICIES[self.remat_policy])
            else:
                x = block(x, positions, mask)
        return self.final_norm(x)

    def _masks(self, segment_ids: jax.Array) -> dict[int | None, jax.Array | None]:
        """Attention masks by window: two at most (global and local), built once and shared by the
        layers; none at all when rows hold one sequence each (the layers then attend causally by flag).
        """
        masks: dict[int | None, jax.Array | None] = {None: None, self.sliding_window: None}
        if self.segment_masks:
            masks[None] = attention_mask(segment_ids, None)
            if self.sliding_window is not None:
                masks[self.sliding_window] = attention_mask(segment_ids, self.sliding_window)
        return masks

    def prefill(
        self, input_ids: jax.Array, positions: jax.Array, segment_ids: jax.Array
    ) -> tuple[jax.Array, KVCache]:
        """`hidden_states` [B, T, embed] plus each layer's (k, v) [B, T, kv_heads, H]: a filled KV cache.

        The cache is as long as the input; entries after a row's real tokens hold values of whatever
        the buffer has there, which `decode_step` overwrites before any query may attend to them.
        """
        x = self.embedder.encode(input_ids, self.dtype)
        masks = self._masks(segment_ids)
        caches = []
        for block in self.layers:
            x, k, v = block.prefill(x, positions, masks[block.attn.window])
            caches.append((k, v))
        return self.final_norm(x), tuple(caches)

    def decode_step(
        self, token: jax.Array, positions: jax.Array, caches: KVCache, at: jax.Array
    ) -> tuple[jax.Array, KVCache]:
        """One token per row, token [B, 1] at positions [B, 1], against the caches from `prefill`.

        Each layer writes the token's k/v at cache index `at` [B] and attends to indices <= at.
        Returns the final-norm hidden state [B, 1, embed] and the updated caches.
        """
        x = self.embedder.encode(token, self.dtype)
        updated = []
        for block, (k, v) in zip(self.layers, caches, strict=True):
            x, k, v = block.decode(x, positions, k, v, at)
            updated.append((k, v))
        return self.final_norm(x), tuple(updated)

    def logits(self, hidden: jax.Array) -> jax.Array:
        return softcap(self.embedder.decode(hidden), self.final_softcap)

    def __call__(self, input_ids: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """Logits [B, T, vocab] in the compute dtype."""
        return self.logits(self.hidden_states(input_ids, positions, segment_ids))


# What a checkpointed block keeps for its backward pass (ENV_REMAT). "full": nothing, the whole
# forward runs again (the least memory; for LoRA, 6N of work per token where 4N is credited).
# "dots": the outputs of matmuls without batch dimensions (the projections, LoRA's included) are
# saved, so only attention and the elementwise work run again, for about 2 bytes × the projections'
# output widths per token and layer more memory.
REMAT_POLICIES: dict[str, Callable[..., Any] | None] = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _checkpointed(
    block: Block,
    x: jax.Array,
    positions: jax.Array,
    mask: jax.Array | None,
    policy: Callable[..., Any] | None = None,
) -> jax.Array:
    """Run a block under jax.checkpoint: its activations (but what `policy` saves) are recomputed
    in the backward pass.

    A pure function of the block's state (blocks mutate nothing), rather than nnx.remat, which
    tries to write state back and fails when the adapters and the frozen base come from different
    traces (LoRA under jax.grad).
    """
    graphdef, state = nnx.split(block)

    def run(state: nnx.State, h: jax.Array, p: jax.Array, m: jax.Array | None) -> jax.Array:
        return nnx.merge(graphdef, state)(h, p, m)

    return jax.checkpoint(run, policy=policy)(state, x, positions, mask)


def abstract_model(cfg: ModelConfig, **kwargs: object) -> Transformer:
    """The model with shape-only parameters: build it without allocating random weights."""
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), **kwargs))

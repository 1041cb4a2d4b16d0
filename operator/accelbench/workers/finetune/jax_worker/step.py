"""The jitted training and eval steps: the shared loss formula, accumulation, AdamW.

The model is split once into (graph, trainable, frozen): LoRA trains only `nnx.LoRAParam`
variables, so gradients and Adam moments exist for the adapters alone and the frozen base is an
ordinary (non-donated) argument of the step; full fine-tuning trains every `nnx.Param`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jax

from ....jaxmodels import Transformer
from .. import ADAM_BETAS, ADAM_EPS, MAX_GRAD_NORM, learning_rate_at

MODEL_INPUTS = ("input_ids", "positions", "segment_ids")


def masked_ce_sum(logits: jax.Array, targets: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """sum(ce·mask) and sum(mask), cross-entropy in float32 (workers.data's one loss formula)."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    mask = loss_mask.astype(jnp.float32)
    return jnp.sum((lse - picked) * mask), jnp.sum(mask)


def learning_rates(training: Any, total_steps: int) -> np.ndarray:
    """The schedule as a table from the shared `learning_rate_at`, so both frameworks step alike."""
    return np.asarray(
        [
            learning_rate_at(
                i, training.learning_rate, training.warmup_steps, total_steps, str(training.schedule)
            )
            for i in range(max(total_steps, 1))
        ],
        dtype=np.float32,
    )


def build_optimizer(training: Any, total_steps: int) -> optax.GradientTransformation:
    table = jnp.asarray(learning_rates(training, total_steps))

    def schedule(count: jax.Array) -> jax.Array:
        return table[jnp.minimum(count, table.shape[0] - 1)]

    def decay_mask(params: Any) -> Any:
        # Matrices decay; norm scales (1-D) do not: the same rule as the PyTorch worker.
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    return optax.chain(
        optax.clip_by_global_norm(MAX_GRAD_NORM),
        optax.adamw(
            schedule,
            b1=ADAM_BETAS[0],
            b2=ADAM_BETAS[1],
            eps=ADAM_EPS,
            weight_decay=training.weight_decay,
            mask=decay_mask,
        ),
    )


@dataclass
class Split:
    graphdef: nnx.GraphDef
    trainable: nnx.State
    frozen: nnx.State


def split_model(model: Transformer, lora: bool) -> Split:
    wrt = nnx.LoRAParam if lora else nnx.Param
    graphdef, trainable, frozen = nnx.split(model, wrt, ...)
    return Split(graphdef, trainable, frozen)


def _ce_of(
    graphdef: nnx.GraphDef,
    trainable: nnx.State,
    frozen: nnx.State,
    batch: dict[str, jax.Array],
    loss_chunk: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """(sum(ce·mask), sum(mask)) of one micro-batch; `loss_chunk`: TrainContext.loss_chunk_tokens.

    Chunking is opt-in: full fp32 logits over a 262k vocabulary are 8 × 2048 × 262k × 4 B ≈ 17 GB
    per micro-batch, and chunks of 512 cut the 1B full fine-tune's peak from 84.7 to 66.1 GB on an
    H200 but cost 2-5 % tokens/s (the logits are recomputed in the backward pass; benchmarks/finetune,
    results/loss-chunked): for batches or models that do not fit otherwise.
    """
    model = nnx.merge(graphdef, trainable, frozen)
    hidden = model.hidden_states(*(batch[k] for k in MODEL_INPUTS))
    return chunked_ce_sum(model, hidden, batch["targets"], batch["loss_mask"], loss_chunk)


def chunked_ce_sum(
    model: Transformer, hidden: jax.Array, targets: jax.Array, loss_mask: jax.Array, chunk: int
) -> tuple[jax.Array, jax.Array]:
    """masked_ce_sum of the model's logits, computed `chunk` tokens at a time along the sequence.

    Same sums as the unchunked form (padding of the last chunk carries mask 0); each chunk's logits
    are rematerialized under jax.checkpoint instead of being kept for the backward pass.
    """
    b, t = hidden.shape[:2]
    if chunk <= 0 or t <= chunk:
        return masked_ce_sum(model.logits(hidden), targets, loss_mask)
    n = -(-t // chunk)
    pad = n * chunk - t
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        loss_mask = jnp.pad(loss_mask, ((0, 0), (0, pad)))
    graphdef, state = nnx.split(model)

    @jax.checkpoint
    def piece(state: nnx.State, h: jax.Array, tg: jax.Array, m: jax.Array) -> tuple[jax.Array, jax.Array]:
        return masked_ce_sum(nnx.merge(graphdef, state).logits(h), tg, m)

    def body(carry: tuple[jax.Array, jax.Array], xs: tuple[jax.Array, ...]) -> tuple[Any, None]:
        ce, count = piece(state, *xs)
        return (carry[0] + ce, carry[1] + count), None

    def chunks(x: jax.Array) -> jax.Array:  # [B, n·C, ...] -> [n, B, C, ...]
        return jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)

    zero = jnp.zeros((), jnp.float32)
    (total, count), _ = jax.lax.scan(body, (zero, zero), (chunks(hidden), chunks(targets), chunks(loss_mask)))
    return total, count


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    state_shardings: tuple[Any, Any, Any],
    loss_chunk: int = 0,
) -> Callable[..., Any]:
    """step(trainable, opt_state, frozen, micro, global_tokens) -> (trainable, opt_state, loss).

    `micro` holds the step's micro-batches stacked: [A, B, T] arrays, A = accumulation steps.

    Micro-batches run in a `lax.scan`, gradients of sum(ce·mask) are summed, then divided once by the
    step's global loss-token count: every token weighs the same whatever micro-batch it is in.
    `state_shardings` (trainable, opt_state, loss) pins the outputs to the inputs' placement: left
    free, XLA may pick another one for a small tensor and the next call would not match the compile.
    """

    def ce_sum(trainable: nnx.State, frozen: nnx.State, batch: dict[str, jax.Array]) -> jax.Array:
        return _ce_of(graphdef, trainable, frozen, batch, loss_chunk)[0]

    grad_fn = jax.value_and_grad(ce_sum)

    def step(trainable, opt_state, frozen, micro, global_tokens):
        def accumulate(carry, batch):
            grads, total = carry
            value, g = grad_fn(trainable, frozen, batch)
            return (jax.tree.map(jnp.add, grads, g), total + value), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), trainable)
        (grads, total), _ = jax.lax.scan(accumulate, (zeros, jnp.zeros((), jnp.float32)), micro)
        grads = jax.tree.map(lambda g, p: (g / global_tokens).astype(p.dtype), grads, trainable)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, total / global_tokens

    return jax.jit(step, donate_argnums=(0, 1), out_shardings=state_shardings)


def make_eval_step(graphdef: nnx.GraphDef, loss_chunk: int = 0) -> Callable[..., Any]:
    def step(trainable, frozen, batch):
        return _ce_of(graphdef, trainable, frozen, batch, loss_chunk)

    return jax.jit(step)

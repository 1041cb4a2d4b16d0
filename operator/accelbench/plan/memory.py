"""Bytes per chip for fine-tuning and serving, from the model shape alone.

Every function here is arithmetic on a ModelShape; the planner decides chip counts from it.
Sizes are decimal bytes (1 GB = 1e9 B), the unit accelerator datasheets use for HBM.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..api.finetune import expand_lora_targets
from ..catalog import ModelShape, projection_dims
from .types import MemoryEstimate

GB = 1e9
BF16 = 2
FP32 = 4
PRECISION_BYTES = {"bf16": BF16, "fp16": BF16, "fp32": FP32}  # fp16 is 2 B like bf16

# Bytes per logit element in the loss: the bf16 logits, their fp32 upcast, fp32 log-softmax and
# the gradient of the logits. Eager Hugging Face training holds roughly all of these at once; it
# is what makes the logits of a 262k vocabulary the largest activation of a Gemma model. Checked
# against docs/anchors.md: Gemma-3-27B LoRA r64, grad. ckpt., seq 3072 measured 73.1 GB (batch 1) and
# 113.2 GB (batch 4) on one H200; this model gives 73.8 and 111.5.
LOGIT_BYTES = 12


def lora_adapter_parameters(
    shape: ModelShape, rank: int, target_modules: Iterable[str]
) -> tuple[int, list[str]]:
    """Trainable LoRA parameters, and the target names no projection of this shape matches.

    Each adapted projection W (in x out) gets A (in x r) and B (r x out): r x (in + out)
    parameters, in every layer that has that projection. all-linear is expanded by the API's one
    rule (expand_lora_targets), the one the FLOPs count and both workers use.
    """
    targets = set(expand_lora_targets(target_modules))
    total = 0
    matched: set[str] = set()
    for index in range(shape.layers):
        for name, (fan_in, fan_out) in projection_dims(shape, shape.is_global_layer(index)).items():
            if name in targets:
                total += rank * (fan_in + fan_out)
                matched.add(name)
    return total, sorted(targets - matched)


def layer_activation_elements(shape: ModelShape, global_layer: bool) -> int:
    """Values one layer keeps per token for its backward pass (16-bit each).

    6 x hidden: the residual stream, two norm inputs and outputs, the attention output after o_proj;
    3 x (q and k/v widths): projections before and after q/k-norm and rotary, and the attention
    output; 4 x intermediate: gate, up, the activation and its product with up.
    """
    kv_heads, head_dim = shape.layer_heads(global_layer)
    q_width = shape.heads * head_dim
    kv_width = kv_heads * head_dim
    return 6 * shape.hidden + 3 * q_width + 3 * kv_width + 4 * shape.intermediate


def activation_bytes(
    shape: ModelShape, seq: int, micro_batch: int, checkpointing: bool, flash_attention: bool
) -> float:
    """Activation memory of one micro-batch on one chip before tensor parallelism divides it.

    With T = micro_batch x seq tokens, layer widths from `layer_activation_elements` (E_l), L
    layers, hidden h, vocabulary V, query heads a:

      no checkpointing:   2 x T x sum_l E_l                      every layer keeps everything
      checkpointing:      2 x T x (L x h + max_l E_l)            layer inputs, plus one layer
                                                                 recomputed during backward
      plus, always:       LOGIT_BYTES x T x V                    logits and the loss
      plus, without flash attention, per kept layer:
                          4 x micro_batch x a x seq^2            scores and probabilities (bf16)

    Sliding-window layers are counted like global ones: the saved tensors scale with the sequence
    either way, and eager attention materialises the full score matrix regardless of the window.
    """
    tokens = micro_batch * seq
    widths = [layer_activation_elements(shape, shape.is_global_layer(i)) for i in range(shape.layers)]
    if checkpointing:
        kept_layers = 1
        per_token = shape.layers * shape.hidden + max(widths)
    else:
        kept_layers = shape.layers
        per_token = sum(widths)
    total = BF16 * tokens * per_token + LOGIT_BYTES * tokens * shape.vocab
    if not flash_attention:
        total += kept_layers * 2 * BF16 * micro_batch * shape.heads * seq * seq
    return float(total)


def finetune_memory(
    shape: ModelShape,
    *,
    lora_rank: int | None,
    target_modules: Iterable[str],
    precision: str,
    seq: int,
    micro_batch: int,
    checkpointing: bool,
    flash_attention: bool,
    fsdp: int,
    tp: int,
    overhead_gb: float,
) -> MemoryEstimate:
    """Per-chip memory of a fine-tuning step (AdamW).

    Full fine-tuning, N parameters: weights in the training precision (2 or 4 B), gradients in the
    same precision, AdamW's two fp32 moments (8 B) and, for bf16 weights, an fp32 master copy
    (4 B): 16 B/param either way (fp16 keeps fp32 weights and gradients: 4 + 4 + 8). LoRA
    (`lora_rank` set): the frozen base in the training precision,
    and A adapter parameters kept in fp32 (PEFT's default upcast) with fp32 gradients and moments:
    4 + 4 + 8 B per adapter parameter. FSDP x TP shards all of that; TP also splits activations.
    """
    # fp16 full fine-tuning is mixed precision: the trained weights stay fp32 (a gradient scaler
    # steps them) and only the math is fp16; a LoRA base is frozen, so it is held in fp16.
    weight_bytes = FP32 if precision == "fp16" and lora_rank is None else PRECISION_BYTES[precision]
    shards = fsdp * tp
    n = shape.parameters
    if lora_rank is None:
        weights = n * weight_bytes
        gradients = n * weight_bytes
        optimizer = n * (2 * FP32 + (FP32 if weight_bytes < FP32 else 0))
        adapters = 0.0
    else:
        a, _ = lora_adapter_parameters(shape, lora_rank, target_modules)
        weights = n * weight_bytes
        adapters = a * FP32
        gradients = a * FP32
        optimizer = a * 2 * FP32
    return MemoryEstimate(
        weights=weights / shards,
        gradients=gradients / shards,
        optimizer=optimizer / shards,
        adapters=adapters / shards,
        activations=activation_bytes(shape, seq, micro_batch, checkpointing, flash_attention) / tp,
        overhead=overhead_gb * GB,
    )


def kv_cache_bytes(shape: ModelShape, kv_bytes: float, context_tokens: int, concurrency: int) -> float:
    """KV cache for `concurrency` sequences of `context_tokens` tokens, whole model.

    2 (K and V) x kv_heads x head_dim x bytes x tokens, summed over layers. A sliding-window layer
    holds at most its window of tokens, as engines with a hybrid cache allocate it.
    """
    total = 0.0
    for index in range(shape.layers):
        global_layer = shape.is_global_layer(index)
        kv_heads, head_dim = shape.layer_heads(global_layer)
        tokens = (
            context_tokens
            if global_layer or shape.sliding_window is None
            else min(context_tokens, shape.sliding_window)
        )
        total += 2 * kv_heads * head_dim * kv_bytes * tokens
    return total * concurrency


def serving_memory(
    shape: ModelShape,
    *,
    weight_bytes: float,
    kv_bytes: float,
    context_tokens: int,
    concurrency: int,
    tp: int,
    overhead_gb: float,
) -> MemoryEstimate:
    """Per-chip memory of a tensor-parallel server: weights / tp plus its share of the KV cache.

    KV heads split across tp ranks only while there are enough of them; past that each rank keeps
    whole heads, so the cache divides by min(tp, kv_heads).
    """
    kv_shards = min(tp, shape.kv_heads)
    return MemoryEstimate(
        weights=shape.parameters * weight_bytes / tp,
        gradients=0.0,
        optimizer=0.0,
        adapters=0.0,
        activations=0.0,
        kv_cache=kv_cache_bytes(shape, kv_bytes, context_tokens, concurrency) / kv_shards,
        overhead=overhead_gb * GB,
    )

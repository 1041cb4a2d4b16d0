"""Bytes per chip for fine-tuning and serving, from the model shape alone.

Every function here is arithmetic on a ModelShape; the planner decides chip counts from it.
Sizes are decimal bytes (1 GB = 1e9 B), the unit accelerator datasheets use for HBM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


def _resnet_parameters(c_in: int, c_out: int, time_dim: int) -> int:
    """diffusers' ResnetBlock2D: two GroupNorms, two 3×3 convs, the time projection, a 1×1 shortcut
    when the width changes."""
    shortcut = c_in * c_out + c_out if c_in != c_out else 0
    return (
        2 * c_in
        + (9 * c_in * c_out + c_out)
        + (time_dim * c_out + c_out)
        + 2 * c_out
        + (9 * c_out * c_out + c_out)
        + shortcut
    )


def _attention_parameters(channels: int) -> int:
    return 2 * channels + 4 * (channels * channels + channels)  # GroupNorm, q, k, v, out


def unet_parameters(
    channels: Sequence[int],
    layers_per_block: int,
    attention_levels: int,
    in_channels: int = 6,
    out_channels: int = 3,
) -> int:
    """Parameters of the SR3 UNet (diffusers' UNet2DModel as workers/diffusion/sr3.build_unet makes
    it: attention in the `attention_levels` lowest-resolution levels and the middle block)."""
    levels = len(channels)
    first_attention = levels - attention_levels
    c0 = channels[0]
    time_dim = 4 * c0
    total = 9 * in_channels * c0 + c0 + (c0 * time_dim + time_dim) + (time_dim * time_dim + time_dim)
    previous = c0
    for level, width in enumerate(channels):  # down path
        for layer in range(layers_per_block):
            total += _resnet_parameters(previous if layer == 0 else width, width, time_dim)
            if level >= first_attention:
                total += _attention_parameters(width)
        if level < levels - 1:
            total += 9 * width * width + width  # strided conv
        previous = width
    deepest = channels[-1]
    total += 2 * _resnet_parameters(deepest, deepest, time_dim) + _attention_parameters(deepest)
    reversed_widths = list(reversed(channels))
    previous = deepest
    for index, width in enumerate(reversed_widths):  # up path: each resnet also takes a skip
        below = reversed_widths[min(index + 1, levels - 1)]
        for layer in range(layers_per_block + 1):
            skip = below if layer == layers_per_block else width
            c_in = previous if layer == 0 else width
            total += _resnet_parameters(c_in + skip, width, time_dim)
            if index < attention_levels:
                total += _attention_parameters(width)
        if index < levels - 1:
            total += 9 * width * width + width  # conv after nearest upsampling
        previous = width
    return total + 2 * c0 + 9 * c0 * out_channels + out_channels


def unet_activation_elements(size: int, channels: Sequence[int], layers_per_block: int) -> int:
    """Feature-map elements per image the UNet's resnets produce: at level i, (size / 2^i)^2 × width,
    for the down path's and the up path's resnets and the middle block. Bytes per element are
    SR_ACTIVATION_BYTES (measured); attention maps are small beside them at SR3's resolutions."""
    elements = 0
    for level, width in enumerate(channels):
        side = size // 2**level
        elements += side * side * width * (2 * layers_per_block + 1)
    side = size // 2 ** (len(channels) - 1)
    return elements + 2 * side * side * channels[-1]


# Bytes of saved activations per feature-map element (unet_activation_elements) in a training step:
# every resnet keeps its norms', activations' and convolutions' outputs for backward. Fitted to the
# SR3 runs on one H100 (benchmarks/diffusion_sr/results/h100: 128 px, widths 64-128-256-512, peak
# 23.86 GB at batch 64 and 45.97 GB at batch 128 in bf16, 27.24 GB at batch 64 in fp32); bf16
# autocast keeps fp32 inputs beside bf16 copies, so it saves less than half of fp32.
SR_ACTIVATION_BYTES = {"bf16": 34.3, "fp32": 39.5}
SR_WORKSPACE_GB = 0.75  # convolution workspaces and allocator slack at those runs, beside weights


def super_resolution_memory(
    *,
    size: int,
    channels: Sequence[int],
    layers_per_block: int,
    attention_levels: int,
    images_per_chip: int,
    precision: str,
    overhead_gb: float,
) -> MemoryEstimate:
    """Per-chip memory of an SR3 training step under DDP: fp32 weights, gradients and AdamW's two
    moments (16 B per parameter, on every chip), plus the activations of this chip's images."""
    n = unet_parameters(channels, layers_per_block, attention_levels)
    per_image = unet_activation_elements(size, channels, layers_per_block) * SR_ACTIVATION_BYTES[precision]
    return MemoryEstimate(
        weights=n * FP32,
        gradients=n * FP32,
        optimizer=n * 2 * FP32,
        adapters=0.0,
        activations=per_image * images_per_chip,
        overhead=(overhead_gb + SR_WORKSPACE_GB) * GB,
    )


def quantize_memory(shape: ModelShape, *, seq: int, batch: int, overhead_gb: float) -> MemoryEstimate:
    """Per-chip memory of the quantize task: the bf16 model (the exported copy is loaded only after
    it is freed) and a forward pass without gradients, whose largest tensors are the logits: bf16,
    their fp32 upcast and the loss's fp32 log-softmax over `batch` × `seq` tokens."""
    logits = batch * seq * shape.vocab * (BF16 + 2 * FP32)
    hidden = batch * seq * shape.hidden * BF16 * 8  # a layer's working set; layers run in turn
    return MemoryEstimate(
        weights=shape.parameters * BF16,
        gradients=0.0,
        optimizer=0.0,
        adapters=0.0,
        activations=logits + hidden,
        overhead=overhead_gb * GB,
    )

"""How each weight format (api.finetune.FORMATS: what a layer can be given and what it costs in
effective bits) is simulated and exported with torchao (no hand-written kernels).

The simulation (`fake_quantize`) uses torchao's affine quantization primitives with the block shape
and mapping of the format, so a sensitivity measured with it is the error the exported format makes.
The export (`export_config`) names torchao's own configs: on CUDA a linear layer's int4 is
Int4WeightOnlyConfig (tinygemm's tile-packed layout) and int8 Int8WeightOnlyConfig; elsewhere (CPU
tests), and for embedding tables everywhere, both are IntxWeightOnlyConfig with the same grouping,
which computes the same values without packed kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from ...api.finetune import FORMATS, QuantFormat, WeightFormat

# The formats and their cost in bits live in the API (the planner checks a budget before any pod
# runs); this module simulates and exports them.
BF16 = QuantFormat.BF16.value
__all__ = ["BF16", "FORMATS", "WeightFormat", "applicable", "block_size", "export_config", "fake_quantize"]


def block_size(fmt: WeightFormat, weight: torch.Tensor) -> tuple[int, int]:
    return (1, min(fmt.group_size or weight.shape[1], weight.shape[1]))


def applicable(fmt: WeightFormat, in_features: int) -> bool:
    return fmt.applicable(in_features)


def fake_quantize(weight: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """`weight` (out, in) rounded through `fmt` and back, in its own dtype."""
    if fmt.bits >= 16:
        return weight
    from torchao.quantization.quant_primitives import (
        MappingType,
        choose_qparams_affine,
        dequantize_affine,
        quantize_affine,
    )

    block = block_size(fmt, weight)
    low, high = (-(2 ** (fmt.bits - 1)), 2 ** (fmt.bits - 1) - 1)
    mapping = MappingType.SYMMETRIC if fmt.symmetric else MappingType.ASYMMETRIC
    source = weight.float()
    scale, zero = choose_qparams_affine(
        source, mapping, block, torch.int8, quant_min=low, quant_max=high, scale_dtype=torch.bfloat16
    )
    stored = quantize_affine(source, block, scale, zero, torch.int8, quant_min=low, quant_max=high)
    back = dequantize_affine(stored, block, scale, zero, torch.int8, quant_min=low, quant_max=high)
    return back.to(weight.dtype)


def export_config(fmt: WeightFormat, cuda: bool, embedding: bool = False) -> Any:
    """torchao's config that stores a layer in `fmt` (None: left in bf16). An embedding table is
    looked up, not multiplied, so it always takes IntxWeightOnlyConfig (the packed CUDA configs are
    for linear layers); the values are the same, held as int8 (unpacked)."""
    if fmt.bits >= 16:
        return None
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_primitives import MappingType

    if cuda and fmt.bits == 4 and not embedding:
        return Int4WeightOnlyConfig(group_size=fmt.group_size or 128, int4_packing_format="tile_packed_to_4d")
    if cuda and fmt.bits == 8 and fmt.group_size is None and not embedding:
        return Int8WeightOnlyConfig()
    granularity = PerGroup(fmt.group_size) if fmt.group_size else PerAxis(0)
    mapping = MappingType.SYMMETRIC if fmt.symmetric else MappingType.ASYMMETRIC
    dtype = {4: torch.int4, 8: torch.int8}[fmt.bits]
    return IntxWeightOnlyConfig(weight_dtype=dtype, granularity=granularity, mapping_type=mapping)

"""The weight formats a layer can be given, what each costs in bits, and how each is simulated and
exported with torchao (no hand-written kernels).

Effective bits of a layer = bits per weight + the bits of its scales and zero-points per weight:
int4 in groups of 128 with a bf16 scale and a bf16 zero-point per group is 4 + 32/128 = 4.25 bits;
int8 per output channel with a bf16 scale is 8 + 16/in_features; bf16 is 16.

The simulation (`fake_quantize`) uses torchao's affine quantization primitives with the block shape
and mapping of the format, so a sensitivity measured with it is the error the exported format makes.
The export (`export_config`) names torchao's own configs: on CUDA int4 is Int4WeightOnlyConfig
(tinygemm's tile-packed layout) and int8 Int8WeightOnlyConfig; elsewhere (CPU tests) both are
IntxWeightOnlyConfig with the same grouping, which computes the same values without packed kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

BF16 = "bf16"


@dataclass(frozen=True)
class WeightFormat:
    name: str  # what the spec, the plan and the report call it
    bits: int  # per stored weight; 16 = kept in bf16
    group_size: int | None  # weights per scale along the input dimension; None = one per output row
    scale_bits: int = 16  # bf16 scales
    zero_point_bits: int = 0  # asymmetric formats store one per group too

    def effective_bits(self, in_features: int) -> float:
        if self.bits >= 16:
            return float(self.bits)
        group = self.group_size or in_features
        return self.bits + (self.scale_bits + self.zero_point_bits) / group

    @property
    def symmetric(self) -> bool:
        return self.zero_point_bits == 0


FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("int4-g128", 4, 128, zero_point_bits=16),
        WeightFormat("int4-g64", 4, 64, zero_point_bits=16),
        WeightFormat("int8", 8, None),
        WeightFormat(BF16, 16, None, scale_bits=0),
    )
}


def block_size(fmt: WeightFormat, weight: torch.Tensor) -> tuple[int, int]:
    return (1, min(fmt.group_size or weight.shape[1], weight.shape[1]))


def applicable(fmt: WeightFormat, in_features: int) -> bool:
    """A grouped format needs whole groups along the input dimension."""
    return fmt.group_size is None or in_features % fmt.group_size == 0


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


def export_config(fmt: WeightFormat, cuda: bool) -> Any:
    """torchao's config that stores a layer in `fmt` (None: left in bf16)."""
    if fmt.bits >= 16:
        return None
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_primitives import MappingType

    if cuda and fmt.bits == 4:
        return Int4WeightOnlyConfig(group_size=fmt.group_size or 128, int4_packing_format="tile_packed_to_4d")
    if cuda and fmt.bits == 8 and fmt.group_size is None:
        return Int8WeightOnlyConfig()
    granularity = PerGroup(fmt.group_size) if fmt.group_size else PerAxis(0)
    mapping = MappingType.SYMMETRIC if fmt.symmetric else MappingType.ASYMMETRIC
    dtype = {4: torch.int4, 8: torch.int8}[fmt.bits]
    return IntxWeightOnlyConfig(weight_dtype=dtype, granularity=granularity, mapping_type=mapping)

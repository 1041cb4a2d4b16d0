"""Choosing a format per layer under an effective-bits budget: pure, no torch.

Every layer starts in its cheapest format; then, while the budget allows, the upgrade that removes
the most sensitivity per extra bit is taken (the greedy of a multiple-choice knapsack, taken over
each layer's convex hull of (bits, sensitivity) so a format that is never the best trade is skipped).
The budget is the average effective bits per weight over the matrices quantized (decoder linear
layers, and the embeddings and output head unless tied; what stays bf16 is reported apart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...api.finetune import WeightFormat
from .. import InvalidConfigError


@dataclass(frozen=True)
class Layer:
    name: str
    parameters: int
    in_features: int  # the dimension formats group along (an embedding's row: the hidden size)
    embedding: bool = False  # a lookup table, not a matmul: exported through another config


@dataclass(frozen=True)
class Choice:
    layer: str
    format: str
    effective_bits: float
    sensitivity: float


@dataclass(frozen=True)
class Assignment:
    choices: list[Choice]
    effective_bits: float  # average over the layers' weights
    sensitivity: float  # summed over layers (each measured alone)

    def formats(self) -> dict[str, str]:
        return {c.layer: c.format for c in self.choices}


def _hull(options: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """(bits, sensitivity, format) by rising bits, keeping only the lower convex hull where
    sensitivity falls: the trades a greedy by sensitivity-per-bit can take in order."""
    points: list[tuple[float, float, str]] = []
    for bits, sens, name in sorted(options):
        if points and sens >= points[-1][1]:
            continue  # more bits for no less error: never worth it
        while len(points) >= 2:
            (b1, s1, _), (b2, s2, _) = points[-2], points[-1]
            if (s1 - s2) / (b2 - b1) <= (s2 - sens) / (bits - b2):
                points.pop()  # the middle point is above the line: skipped by any greedy
            else:
                break
        points.append((bits, sens, name))
    return points


def choose(
    layers: Sequence[Layer],
    sensitivity: Mapping[str, Mapping[str, float]],
    formats: Sequence[WeightFormat],
    budget_bits: float,
) -> Assignment:
    """The format of every layer. `sensitivity[layer][format]`: the calibration loss increase with
    that layer alone in that format (the layer's missing formats cannot be chosen for it)."""
    if not layers:
        raise InvalidConfigError("no layers to quantize")
    total = sum(layer.parameters for layer in layers)
    hulls: dict[str, list[tuple[float, float, str]]] = {}
    for layer in layers:
        options = [
            (f.effective_bits(layer.in_features), float(sensitivity[layer.name][f.name]), f.name)
            for f in formats
            if f.name in sensitivity.get(layer.name, {})
        ]
        if not options:
            raise InvalidConfigError(f"layer {layer.name} has no measured format")
        hulls[layer.name] = _hull(options)
    at = {name: 0 for name in hulls}
    spent = sum(hulls[layer.name][0][0] * layer.parameters for layer in layers)
    floor = spent / total
    if floor > budget_bits + 1e-9:
        raise InvalidConfigError(
            f"effective-bits budget {budget_bits:g} is below the cheapest assignment ({floor:.3f} bits "
            f"per weight with every layer in its smallest format)"
        )
    by_name = {layer.name: layer for layer in layers}
    while True:
        best: tuple[float, str] | None = None
        for name, hull in hulls.items():
            i = at[name]
            if i + 1 >= len(hull):
                continue
            extra = (hull[i + 1][0] - hull[i][0]) * by_name[name].parameters
            if spent + extra > budget_bits * total + 1e-6:
                continue
            gain = (hull[i][1] - hull[i + 1][1]) / extra
            if best is None or gain > best[0]:
                best = (gain, name)
        if best is None:
            break
        name = best[1]
        spent += (hulls[name][at[name] + 1][0] - hulls[name][at[name]][0]) * by_name[name].parameters
        at[name] += 1
    choices = [
        Choice(layer.name, hulls[layer.name][at[layer.name]][2], *hulls[layer.name][at[layer.name]][:2])
        for layer in layers
    ]
    return Assignment(choices, spent / total, sum(c.sensitivity for c in choices))

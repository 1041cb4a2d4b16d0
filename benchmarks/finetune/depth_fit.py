"""Full-depth estimate of a reduced-depth model from runs at two (or more) depths.

The 27B-class model does not fit the device's disk and time at its 62 layers, so run.py measures
it at 4 and 8 layers (`--big-layers`). Step time is linear in the number of identical layers:
step = fixed + layers × per_layer, where `fixed` is the embedding, LM head, loss and optimizer of
the parts outside the blocks. A least-squares line through the measured depths gives both, and
the full-depth step time, tokens/s and MFU follow (same FLOPs/token and peak as run.py).

Gemma 3 alternates five local (sliding-window) layers with one global layer. The layers added
between two measured depths hold their own share of global layers, which may differ from the full
model's; the output says both shares. More global layers in the added span than in the full model
make the per-layer slope too high (global layers cost more), so the estimate errs low.

    python benchmarks/finetune/depth_fit.py A/results.json B/results.json [--layers 62]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per_layer) of step = fixed + layers × per_layer, least squares over ≥ 2 depths."""
    if len({x for x, _ in points}) < 2:
        raise ValueError("need runs at two different depths")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope


def global_share(first: int, last: int, every: int) -> float:
    """Share of global layers among layer indices [first, last) when every `every`-th is global."""
    layers = range(first, last)
    return sum(1 for i in layers if (i + 1) % every == 0) / max(len(layers), 1)


def estimate(cases: list[dict], layers_full: int, global_every: int) -> dict:
    points = [
        (c["derived"]["full_depth"]["layers_measured"], c["derived"]["step_seconds_mean"]) for c in cases
    ]
    points = [(int(x), float(y)) for x, y in points]
    fixed, per_layer = fit_line(points)
    ref = cases[0]["derived"]
    tokens_per_step = statistics.fmean(ref["trained_tokens_per_step"][ref["warmup_steps_excluded"] :])
    flops_per_token = ref["full_depth"]["flops_per_token"]
    peak = float(cases[0]["report"]["finetune"]["peakTflopsPerChip"]) * 1e12  # what the worker's MFU used
    step_full = fixed + layers_full * per_layer
    tokens_per_second = tokens_per_step / step_full
    depths = sorted(x for x, _ in points)
    return {
        "depths": points,
        "fixed_seconds": fixed,
        "per_layer_seconds": per_layer,
        "layers_full": layers_full,
        "step_seconds_full": step_full,
        "tokens_per_second_full": tokens_per_second,
        "mfu_full": tokens_per_second * flops_per_token / peak,
        "global_share_added_layers": global_share(depths[0], depths[-1], global_every),
        "global_share_full_model": global_share(0, layers_full, global_every),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="run.py results.json files, one case each")
    parser.add_argument("--layers", type=int, default=62, help="full depth (Gemma 3 27B: 62)")
    parser.add_argument("--global-every", type=int, default=6, help="every N-th layer is global")
    parser.add_argument("--case", help="case name when a file holds several")
    args = parser.parse_args()
    cases = []
    for path in args.results:
        for case in json.loads(Path(path).read_text())["cases"]:
            wanted = args.case is None or case["name"] == args.case
            if wanted and (case.get("derived") or {}).get("full_depth"):
                cases.append(case)
    result = estimate(cases, args.layers, args.global_every)
    print(json.dumps(result, indent=1))
    print(
        f"\nfull depth ({args.layers} layers): step {result['step_seconds_full']:.3f} s, "
        f"{result['tokens_per_second_full']:,.0f} tokens/s, MFU {result['mfu_full']:.1%} "
        f"(per layer {result['per_layer_seconds'] * 1e3:.1f} ms, "
        f"fixed {result['fixed_seconds'] * 1e3:.1f} ms; "
        f"global layers: {result['global_share_added_layers']:.0%} of the added span, "
        f"{result['global_share_full_model']:.0%} of the full model)"
    )


if __name__ == "__main__":
    main()

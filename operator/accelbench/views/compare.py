"""Side-by-side comparison of finished runs, read from their statuses (pure; the CLI does the I/O).

The question a user asks after a campaign (the same work on TPU, H100/H200 and Gaudi) is "which is
fastest, and which is cheapest per token": one row per resource, ratios against the best row of its
kind. Fine-tuning cost per 1M trained tokens comes from accelbench.cost with the status's own price
(plan chips × $/chip-hour) and measured tokens/s; serving cost per 1M output tokens is the
status's figure at the SLO capacity (priced by the operator with the same module). Resources
without results show their phase and no numbers: nothing is estimated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from ..cost import dollars_per_hour, dollars_per_million_tokens


@dataclass(frozen=True)
class Row:
    kind: str  # FinetuneJob | InferenceBench
    namespace: str
    name: str
    accelerator: str
    phase: str
    figures: dict[str, float | None] = field(default_factory=dict)
    cluster: str = ""  # where it ran: a results artifact's cluster; "" for the cluster read now
    setup: str = ""  # how a fine-tune ran: its parallelism strategy over several chips and precision


FINETUNE_COLUMNS = (
    ("tokens/s", "tokensPerSecond"),
    ("tokens/s/chip", "tokensPerSecondPerChip"),
    ("MFU", "mfu"),
    ("final loss", "finalLoss"),
    ("$/hour", "dollarsPerHour"),
    ("$/1M tokens", "dollarsPerMillionTokens"),
    ("speed ×", "speedRatio"),
    ("cost ×", "costRatio"),
)
SUPER_RESOLUTION_COLUMNS = (
    ("images/s", "imagesPerSecond"),
    ("images/s/chip", "imagesPerSecondPerChip"),
    ("PSNR dB", "psnr"),
    ("bicubic dB", "bicubicPsnr"),
    ("SSIM", "ssim"),
    ("$/hour", "dollarsPerHour"),
    ("$/1M images", "dollarsPerMillionImages"),
    ("speed ×", "speedRatio"),
    ("cost ×", "costRatio"),
)
QUANTIZE_COLUMNS = (
    ("bits (layers)", "effectiveBits"),
    ("bits (model)", "modelEffectiveBits"),
    ("compression ×", "compression"),
    ("Δ perplexity", "perplexityIncrease"),
    ("prefill × bf16", "prefillRatio"),
    ("decode × bf16", "decodeRatio"),
    ("$/hour", "dollarsPerHour"),
)
BENCH_COLUMNS = (
    ("capacity", "capacityConcurrency"),
    ("peak tok/s", "peakOutputTokensPerSecond"),
    ("$/1M at capacity", "dollarsPerMillionTokensAtCapacity"),
    ("$/1M at peak", "dollarsPerMillionTokensAtPeak"),
    ("speed ×", "speedRatio"),
    ("cost ×", "costRatio"),
)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def hourly_price(status: Mapping[str, Any]) -> float | None:
    """$/hour of the run's chips, from the price its status holds."""
    cost = status.get("cost") or {}
    chips, rate = _number(cost.get("chips")), _number(cost.get("dollarsPerChipHour"))
    return dollars_per_hour(chips, rate) if chips is not None and rate is not None else None


# The tables `compare` returns: FinetuneJobs by task (ratios only among the same work), then benches.
FINETUNE = "FinetuneJob"
SUPER_RESOLUTION = "FinetuneJob superResolution"
QUANTIZE = "FinetuneJob quantize"
BENCH = "InferenceBench"
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    FINETUNE: FINETUNE_COLUMNS,
    SUPER_RESOLUTION: SUPER_RESOLUTION_COLUMNS,
    QUANTIZE: QUANTIZE_COLUMNS,
    BENCH: BENCH_COLUMNS,
}
TITLES = {
    FINETUNE: "FinetuneJobs",
    SUPER_RESOLUTION: "FinetuneJobs: super-resolution (SR3)",
    QUANTIZE: "FinetuneJobs: quantization",
    BENCH: "InferenceBenches",
}


def finetune_group(obj: Mapping[str, Any]) -> str:
    """Which table a FinetuneJob belongs in: its spec.task, else (an artifact's run) its results."""
    task = (obj.get("spec") or {}).get("task")
    results = (obj.get("status") or {}).get("results") or {}
    if task == "superResolution" or (task is None and "superResolution" in results):
        return SUPER_RESOLUTION
    if task == "quantize" or (task is None and "quantization" in results):
        return QUANTIZE
    return FINETUNE


def _ratio(numerator: Any, denominator: Any) -> float | None:
    top, bottom = _number(numerator), _number(denominator)
    return top / bottom if top is not None and bottom else None


def super_resolution_row(obj: Mapping[str, Any]) -> Row:
    status = obj.get("status") or {}
    sr = (status.get("results") or {}).get("superResolution") or {}
    rate = _number(sr.get("imagesPerSecond"))
    hourly = hourly_price(status)
    figures = {
        "imagesPerSecond": rate,
        "imagesPerSecondPerChip": _number(sr.get("imagesPerSecondPerChip")),
        "psnr": _number(sr.get("psnr")),
        "bicubicPsnr": _number(sr.get("bicubicPsnr")),
        "ssim": _number(sr.get("ssim")),
        "dollarsPerHour": hourly,
        # the same arithmetic as $ per 1M tokens, with images as the unit of work
        "dollarsPerMillionImages": dollars_per_million_tokens(hourly, rate) if hourly else None,
    }
    return replace(_row(FINETUNE, obj, figures), setup=finetune_setup(obj))


def quantize_row(obj: Mapping[str, Any]) -> Row:
    status = obj.get("status") or {}
    q = (status.get("results") or {}).get("quantization") or {}
    figures = {
        "effectiveBits": _number(q.get("effectiveBits")),
        "modelEffectiveBits": _number(q.get("modelEffectiveBits")),
        "compression": _number(q.get("compression")),
        "perplexityIncrease": _number(q.get("perplexityIncrease")),
        "prefillRatio": _ratio(q.get("prefillTokensPerSecondQuantized"), q.get("prefillTokensPerSecondBf16")),
        "decodeRatio": _ratio(q.get("decodeTokensPerSecondQuantized"), q.get("decodeTokensPerSecondBf16")),
        "dollarsPerHour": hourly_price(status),
    }
    return _row(FINETUNE, obj, figures)


def finetune_row(obj: Mapping[str, Any]) -> Row:
    status = obj.get("status") or {}
    results = status.get("results") or {}
    tps = _number(results.get("tokensPerSecond"))
    hourly = hourly_price(status)
    per_million = dollars_per_million_tokens(hourly, tps) if hourly else None
    figures = {
        "tokensPerSecond": tps,
        "tokensPerSecondPerChip": _number(results.get("tokensPerSecondPerChip")),
        "mfu": _number(results.get("mfu")),
        "finalLoss": _number(results.get("finalLoss")),
        "dollarsPerHour": hourly,
        "dollarsPerMillionTokens": per_million,
    }
    return replace(_row("FinetuneJob", obj, figures), setup=finetune_setup(obj))


def finetune_setup(obj: Mapping[str, Any]) -> str:
    """'fsdp bf16', 'zero3 fp16', or the precision alone on one chip: what makes two runs on the
    same chips different work."""
    plan = (obj.get("status") or {}).get("plan") or {}
    training = (obj.get("spec") or {}).get("training") or {}
    strategy = plan.get("strategy") if (_number(plan.get("chips")) or 1) > 1 else None
    return " ".join(str(part) for part in (strategy, training.get("precision") or "bf16") if part)


def bench_row(obj: Mapping[str, Any]) -> Row:
    results = (obj.get("status") or {}).get("results") or {}
    keys = [
        "capacityConcurrency",
        "peakOutputTokensPerSecond",
        "dollarsPerMillionTokensAtCapacity",
        "dollarsPerMillionTokensAtPeak",
    ]
    return _row("InferenceBench", obj, {k: _number(results.get(k)) for k in keys})


def _row(kind: str, obj: Mapping[str, Any], figures: dict[str, float | None]) -> Row:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return Row(
        kind=kind,
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        accelerator=str(status.get("accelerator") or ""),
        phase=str(status.get("phase") or "Pending"),
        figures=figures,
    )


def with_ratios(rows: list[Row], speed_key: str, cost_key: str) -> list[Row]:
    """speed × = this row's speed / the best; cost × = this row's $/token / the cheapest (1 = best)."""
    speeds = [r.figures[speed_key] for r in rows if r.figures.get(speed_key)]
    costs = [r.figures[cost_key] for r in rows if r.figures.get(cost_key)]
    best_speed, cheapest = max(speeds, default=None), min(costs, default=None)
    out = []
    for r in rows:
        speed, cost = r.figures.get(speed_key), r.figures.get(cost_key)
        figures = dict(r.figures)
        figures["speedRatio"] = speed / best_speed if speed and best_speed else None
        figures["costRatio"] = cost / cheapest if cost and cheapest else None
        out.append(replace(r, figures=figures))
    return out


def artifact_cluster(document: Mapping[str, Any], uri: str) -> str:
    """The cluster a results artifact's runs ran on: its metadata.cluster, else the file's name."""
    cluster = (document.get("metadata") or {}).get("cluster")
    return str(cluster) if cluster else PurePosixPath(uri.rstrip("/")).stem


def compare(
    finetunes: Iterable[Mapping[str, Any]],
    benches: Iterable[Mapping[str, Any]],
    artifacts: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> dict[str, list[Row]]:
    """Rows per kind, fastest first (rows without results last, by name). `artifacts`: (cluster,
    BenchCampaignResults document) pairs whose runs join the rows, tagged with that cluster, so the
    same run name from two clusters stays two rows; ratios are across all of them."""

    def order(key: str) -> Any:
        return lambda r: (
            r.figures.get(key) is None,
            -(r.figures.get(key) or 0.0),
            r.cluster,
            r.namespace,
            r.name,
        )

    builders = {
        FINETUNE: finetune_row,
        SUPER_RESOLUTION: super_resolution_row,
        QUANTIZE: quantize_row,
        BENCH: bench_row,
    }
    groups: dict[str, list[Row]] = {group: [] for group in COLUMNS}
    tagged = [("", "FinetuneJob", o) for o in finetunes] + [("", "InferenceBench", o) for o in benches]
    for cluster, document in artifacts:
        tagged += [(cluster, str(run.get("kind")), run) for run in document.get("runs") or []]
    for cluster, kind, obj in tagged:
        group = finetune_group(obj) if kind == "FinetuneJob" else BENCH if kind == "InferenceBench" else None
        if group is not None:
            groups[group].append(replace(builders[group](obj), cluster=cluster))
    # speed key, cost key (None: no ratios) and the key rows are ordered by, per table
    ranking = {
        FINETUNE: ("tokensPerSecond", "dollarsPerMillionTokens", "tokensPerSecond"),
        SUPER_RESOLUTION: ("imagesPerSecond", "dollarsPerMillionImages", "imagesPerSecond"),
        QUANTIZE: (None, None, "compression"),
        BENCH: (
            "peakOutputTokensPerSecond",
            "dollarsPerMillionTokensAtCapacity",
            "peakOutputTokensPerSecond",
        ),
    }
    out = {}
    for group, rows in groups.items():
        speed, cost, by = ranking[group]
        if speed is not None and cost is not None:
            rows = with_ratios(rows, speed, cost)
        out[group] = sorted(rows, key=order(by))
    return out


def format_value(key: str, value: float | None) -> str:
    if value is None:
        return "–"
    if key == "mfu":
        return f"{value * 100:.1f} %"
    if key == "perplexityIncrease":
        return f"{value * 100:+.2f} %"
    if key in ("effectiveBits", "modelEffectiveBits"):
        return f"{value:.3f}"
    if key == "ssim":
        return f"{value:.4f}"
    if key in (
        "speedRatio",
        "costRatio",
        "prefillRatio",
        "decodeRatio",
        "compression",
        "psnr",
        "bicubicPsnr",
    ):
        return f"{value:.2f}"
    if key.startswith("dollars"):
        return f"{value:,.4g}"
    if key == "capacityConcurrency":
        return f"{value:.0f}"
    if key == "finalLoss":
        return f"{value:.4f}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def as_records(rows: dict[str, list[Row]]) -> list[dict[str, Any]]:
    """Flat records for -o json."""
    return [
        {"kind": r.kind, "cluster": r.cluster, "namespace": r.namespace, "name": r.name,
         "accelerator": r.accelerator, "setup": r.setup, "phase": r.phase, **r.figures}
        for kind_rows in rows.values()
        for r in kind_rows
    ]  # fmt: skip

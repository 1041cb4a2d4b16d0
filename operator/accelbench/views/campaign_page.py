"""A BenchCampaign's results document (campaign/artifact.py) as HTML + PNG: `accelbench report`.

The page shows what the document holds and nothing else: the campaign's phase, totals, every row of
status.cells (failed, skipped and waiting ones with their reason), the per-cell summary (median and
CV over repeats), total cost of ownership, winners, the Pareto front, baseline and regressions.

Plots (matplotlib, Agg backend, as views/bench_page.py draws them):
- speed: training tokens/s per cell (median, CV × median as an error bar from two repeats) and
  peak output tokens/s per serving cell;
- cost: $ per training cell and $ per 1M output tokens per serving cell (medians);
- TCO: one line per ownership pair, trainingDollars + servingDollarsPerHour × h, the same formula
  status.ownership uses, from 0 to the largest spec.servingHours; crossings are marked;
- capacity: per succeeded serving run and input length, the largest swept concurrency meeting the
  run's SLO (a level passes when its measured attainment reaches slo.attainment), found by the
  worker's own capacity rule (workers/bench/capacity.py).
A plot whose figures the document does not hold is left out, and the page says why.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bench_page import STYLE

DEFAULT_HORIZON_HOURS = 720.0
TCO_SAMPLES = 200


def campaign_document(
    campaign: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    written_at: str,
    cluster: str | None = None,
) -> dict[str, Any]:
    """A campaign body and its runs (as read from the cluster) as the artifact's document."""
    from ..campaign.artifact import artifact_document

    return artifact_document(campaign, runs, written_at, cluster)


# --- figures the plots draw (pure) ------------------------------------------------------------


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    error: float | None  # CV × median, from two repeats; None for one


def _label(summary: Mapping[str, Any]) -> str:
    return f"{summary.get('accelerator') or '?'}\n{summary.get('name') or summary.get('cell')}"


def spread_bars(summaries: Sequence[Mapping[str, Any]], kind: str, metric: str) -> list[Bar]:
    """One bar per summary row of `kind` whose `metric` Spread has a median."""
    bars = []
    for s in summaries:
        spread = s.get(metric)
        if s.get("kind") != kind or not isinstance(spread, Mapping):
            continue
        median, cv, n = _number(spread.get("median")), _number(spread.get("cv")), spread.get("n") or 1
        if median is None:
            continue
        error = cv * median if cv is not None and isinstance(n, int) and n > 1 else None
        bars.append(Bar(_label(s), median, error))
    return bars


@dataclass(frozen=True)
class TcoLine:
    training: str
    serving: str
    label: str
    training_dollars: float
    serving_dollars_per_hour: float
    points: tuple[tuple[float, float], ...]  # (hours, dollars) as status.ownership holds them

    def at(self, hours: float) -> float:
        """$ after `hours` of serving, by the formula status.ownership is made with."""
        from ..campaign.summary import Ownership

        return Ownership(self.training_dollars, self.serving_dollars_per_hour, hours).dollars


def tco_lines(ownership: Sequence[Mapping[str, Any]]) -> list[TcoLine]:
    """One line per (training, serving) pair of status.ownership, with its rows as points."""
    pairs: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in ownership:
        if _number(row.get("trainingDollars")) is None or _number(row.get("servingDollarsPerHour")) is None:
            continue
        pairs.setdefault((str(row.get("training")), str(row.get("serving"))), []).append(row)
    lines = []
    for (training, serving), rows in pairs.items():
        first = rows[0]
        label = (
            f"train {first.get('trainingAccelerator') or training}"
            f" + serve {first.get('servingAccelerator') or serving}"
        )
        points = sorted(
            (float(r["servingHours"]), float(r["dollars"]))
            for r in rows
            if _number(r.get("servingHours")) is not None and _number(r.get("dollars")) is not None
        )
        lines.append(
            TcoLine(
                training,
                serving,
                label,
                float(first["trainingDollars"]),
                float(first["servingDollarsPerHour"]),
                tuple(points),
            )
        )
    return lines


@dataclass(frozen=True)
class Crossing:
    first: str
    second: str
    hours: float
    dollars: float


def tco_crossings(lines: Sequence[TcoLine], horizon: float) -> list[Crossing]:
    """Where two TCO lines meet within (0, horizon]: past it the one cheaper to serve is cheaper."""
    out = []
    for i, a in enumerate(lines):
        for b in lines[i + 1 :]:
            slope = a.serving_dollars_per_hour - b.serving_dollars_per_hour
            if slope == 0:
                continue
            hours = (b.training_dollars - a.training_dollars) / slope
            if 0 < hours <= horizon:
                out.append(Crossing(a.label, b.label, hours, a.at(hours)))
    return out


def tco_horizon(spec: Mapping[str, Any]) -> float:
    hours = [h for h in (_number(v) for v in spec.get("servingHours") or []) if h is not None and h > 0]
    return max(hours) if hours else DEFAULT_HORIZON_HOURS


@dataclass(frozen=True)
class LengthCapacity:
    input_length: int
    capacity: int | None  # None: even the smallest measured level missed the SLO
    first_failing: int | None  # None: every measured level met it (the capacity is at least this)
    levels: tuple[int, ...]


def capacity_by_input_length(
    cells: Sequence[Mapping[str, Any]], slo: Mapping[str, Any]
) -> list[LengthCapacity]:
    """Per input length, the largest concurrency meeting the SLO among the closed-loop cells measured
    (status.results.cells): a level passes when its attainment reaches slo.attainment (default 0.9,
    as the API defaults it). Cells without an attainment are left out: nothing is guessed."""
    from ..workers.bench.capacity import LevelOutcome, capacity_result

    target = _number(slo.get("attainment"))
    target = 0.9 if target is None else target
    by_length: dict[int, dict[int, LevelOutcome]] = {}
    for c in cells:
        concurrency, attainment = c.get("concurrency"), _number(c.get("attainment"))
        if (
            not isinstance(concurrency, int)
            or attainment is None
            or not isinstance(c.get("inputLength"), int)
        ):
            continue
        by_length.setdefault(c["inputLength"], {})[concurrency] = LevelOutcome(
            passed=attainment >= target,
            attainment_by_bound={},
            output_tokens_per_second=_number(c.get("outputTokensPerSecond")) or 0.0,
        )
    out = []
    for length, outcomes in sorted(by_length.items()):
        result = capacity_result(outcomes)
        out.append(LengthCapacity(length, result.capacity, result.first_failing, tuple(sorted(outcomes))))
    return out


@dataclass(frozen=True)
class RunCapacity:
    name: str
    accelerator: str
    slo: dict[str, Any]
    lengths: list[LengthCapacity]


def serving_capacities(runs: Sequence[Mapping[str, Any]]) -> tuple[list[RunCapacity], list[str]]:
    """(capacity per input length of each succeeded InferenceBench with an SLO and cells, why each
    other succeeded one has none)."""
    found, missing = [], []
    for run in runs:
        status = run.get("status") or {}
        if run.get("kind") != "InferenceBench" or status.get("phase") != "Succeeded":
            continue
        name = str((run.get("metadata") or {}).get("name"))
        slo = (run.get("spec") or {}).get("slo")
        cells = (status.get("results") or {}).get("cells") or []
        if not slo:
            missing.append(f"{name}: its spec sets no SLO")
            continue
        lengths = capacity_by_input_length(cells, slo)
        if not lengths:
            missing.append(f"{name}: its results hold no closed-loop cells with an SLO attainment")
            continue
        found.append(RunCapacity(name, str(status.get("accelerator") or "?"), dict(slo), lengths))
    return found, missing


# --- plots ---------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, bars: Sequence[Bar], ylabel: str, title: str) -> None:
    xs = range(len(bars))
    errors = [b.error or 0.0 for b in bars]
    ax.bar(xs, [b.value for b in bars], yerr=errors if any(errors) else None, capsize=4, color="#4c72b0")
    ax.set_xticks(list(xs), [b.label for b in bars], fontsize=7, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)


def plot_panels(panels: Sequence[tuple[list[Bar], str, str]], path: Path) -> None:
    """Side-by-side bar charts, one per (bars, y label, title) that has bars."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, (bars, ylabel, title) in zip(axes[0], panels, strict=True):
        _bars(ax, bars, ylabel, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tco(lines: Sequence[TcoLine], horizon: float, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    xs = [horizon * i / TCO_SAMPLES for i in range(TCO_SAMPLES + 1)]
    for line in lines:
        drawn = ax.plot(xs, [line.at(x) for x in xs], label=line.label)
        if line.points:
            ax.plot(*zip(*line.points, strict=True), "o", color=drawn[0].get_color())
    for c in tco_crossings(lines, horizon):
        ax.plot([c.hours], [c.dollars], "kx", markersize=10)
        ax.annotate(f"{c.hours:,.1f} h, ${c.dollars:,.2f}", (c.hours, c.dollars), fontsize=8,
                    textcoords="offset points", xytext=(6, -12))  # fmt: skip
    ax.set_xlim(0, horizon)
    ax.set_xlabel("serving hours")
    ax.set_ylabel("total cost of ownership ($)")
    ax.set_title("Training + serving what it trained")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_capacity(capacities: Sequence[RunCapacity], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for run in capacities:
        pts = [(lc.input_length, lc.capacity or 0) for lc in run.lengths]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{run.accelerator} {run.name}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("largest concurrency meeting the SLO")
    ax.set_title("SLO capacity per input length (0: none met it)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- HTML ----------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return "–" if value is None or value == "" else html.escape(str(value))


def _num(value: Any, fmt: str) -> str:
    number = _number(value)
    return "–" if number is None else html.escape(fmt.format(number))


def _spread(value: Any, fmt: str) -> str:
    """median, with the CV and n when there are two repeats or more."""
    if not isinstance(value, Mapping) or _number(value.get("median")) is None:
        return "–"
    text = fmt.format(float(value["median"]))
    cv, n = _number(value.get("cv")), value.get("n")
    if cv is not None and isinstance(n, int) and n > 1:
        text += f" (CV {cv:.1%}, n={n})"
    return html.escape(text)


Column = tuple[str, Callable[[Mapping[str, Any]], str]]


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    head = "".join(f"<th>{html.escape(label)}</th>" for label, _ in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r)}</td>" for _, cell in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _field(key: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda r: _text(r.get(key))


def _numeric(key: str, fmt: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda r: _num(r.get(key), fmt)


def _spread_of(key: str, fmt: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda r: _spread(r.get(key), fmt)


def cell_columns(waiting: Mapping[str, str]) -> list[Column]:
    return [
        ("name", _field("name")),
        ("kind", _field("kind")),
        ("accelerator", _field("accelerator")),
        ("repeat", _field("repeat")),
        ("phase", _field("phase")),
        ("reason", _field("reason")),
        ("why waiting", lambda r: _text(waiting.get(str(r.get("name"))))),
        ("values", _field("values")),
        ("tokens/s", _numeric("tokensPerSecond", "{:,.1f}")),
        ("tokens/s/chip", _numeric("tokensPerSecondPerChip", "{:,.1f}")),
        ("MFU", _numeric("mfu", "{:.1%}")),
        ("final loss", _numeric("finalLoss", "{:.4f}")),
        ("images/s", _numeric("imagesPerSecond", "{:,.1f}")),
        ("PSNR dB", _numeric("psnr", "{:.2f}")),
        ("effective bits", _numeric("effectiveBits", "{:.3f}")),
        ("Δ perplexity", _numeric("perplexityIncrease", "{:+.2%}")),
        ("peak out tok/s", _numeric("peakOutputTokensPerSecond", "{:,.1f}")),
        ("capacity", _numeric("capacityConcurrency", "{:.0f}")),
        ("TTFT p99 ms", _numeric("ttftP99Ms", "{:,.1f}")),
        ("TPOT p99 ms", _numeric("tpotP99Ms", "{:,.2f}")),
        ("$/1M tokens", _numeric("dollarsPerMillionTokens", "{:,.4g}")),
        ("$", _numeric("costDollars", "{:,.2f}")),
        ("chip-hours", _numeric("chipHours", "{:,.2f}")),
        ("$/hour", _numeric("dollarsPerHour", "{:,.2f}")),
        ("model from", _field("modelFrom")),
        ("in matrix", lambda r: "no" if r.get("inMatrix") is False else "yes"),
    ]


SUMMARY_COLUMNS: list[Column] = [
    ("cell", _field("cell")),
    ("first run", _field("name")),
    ("kind", _field("kind")),
    ("accelerator", _field("accelerator")),
    ("values", _field("values")),
    ("runs", _field("runs")),
    ("succeeded", _field("succeeded")),
    ("tokens/s", _spread_of("tokensPerSecond", "{:,.1f}")),
    ("tokens/s/chip", _spread_of("tokensPerSecondPerChip", "{:,.1f}")),
    ("MFU", _spread_of("mfu", "{:.1%}")),
    ("final loss", _spread_of("finalLoss", "{:.4f}")),
    ("images/s", _spread_of("imagesPerSecond", "{:,.1f}")),
    ("images/s/chip", _spread_of("imagesPerSecondPerChip", "{:,.1f}")),
    ("scaling T(N)/(N·T(1))", _numeric("scalingEfficiency", "{:.2f}")),
    ("PSNR dB", _spread_of("psnr", "{:.2f}")),
    ("effective bits", _spread_of("effectiveBits", "{:.3f}")),
    ("Δ perplexity", _spread_of("perplexityIncrease", "{:+.2%}")),
    ("peak out tok/s", _spread_of("peakOutputTokensPerSecond", "{:,.1f}")),
    ("capacity", _spread_of("capacityConcurrency", "{:.0f}")),
    ("TTFT p99 ms", _spread_of("ttftP99Ms", "{:,.1f}")),
    ("TPOT p99 ms", _spread_of("tpotP99Ms", "{:,.2f}")),
    ("$/1M tokens", _spread_of("dollarsPerMillionTokens", "{:,.4g}")),
    ("$", _spread_of("costDollars", "{:,.2f}")),
    ("$/hour", _numeric("dollarsPerHour", "{:,.2f}")),
    ("model from", _field("modelFrom")),
    ("speed ×", _numeric("speedRatio", "{:.2f}")),
    ("cost ×", _numeric("costRatio", "{:.2f}")),
    ("regressed", lambda r: _text(", ".join(str(m) for m in r.get("regressed") or []))),
]

OWNERSHIP_COLUMNS: list[Column] = [
    ("training run", _field("training")),
    ("trained on", _field("trainingAccelerator")),
    ("serving run", _field("serving")),
    ("served on", _field("servingAccelerator")),
    ("training $", _numeric("trainingDollars", "{:,.2f}")),
    ("serving $/hour", _numeric("servingDollarsPerHour", "{:,.2f}")),
    ("serving hours", _numeric("servingHours", "{:,g}")),
    ("total $", _numeric("dollars", "{:,.2f}")),
    ("× cheapest", _numeric("ratio", "{:.2f}")),
]

TOTALS_KEYS = (
    ("cells", "cells", "{:.0f}"),
    ("succeeded", "succeeded", "{:.0f}"),
    ("failed", "failed", "{:.0f}"),
    ("skipped", "skipped", "{:.0f}"),
    ("running", "running", "{:.0f}"),
    ("waiting", "waiting", "{:.0f}"),
    ("dollars", "$ spent", "{:,.2f}"),
    ("chipHours", "chip-hours", "{:,.2f}"),
)


def _items(pairs: Sequence[tuple[str, str]]) -> str:
    return "<ul>" + "".join(f"<li><b>{html.escape(k)}</b>: {v}</li>" for k, v in pairs) + "</ul>"


def _capacity_table(capacities: Sequence[RunCapacity]) -> str:
    rows = []
    for run in capacities:
        for lc in run.lengths:
            if lc.capacity is None:
                capacity = "none met the SLO"
            elif lc.first_failing is None:
                capacity = f"≥ {lc.capacity} (every level measured met it)"
            else:
                capacity = f"{lc.capacity} (fails at {lc.first_failing})"
            rows.append(
                {
                    "run": run.name,
                    "accelerator": run.accelerator,
                    "slo": json.dumps(run.slo, sort_keys=True),
                    "inputLength": lc.input_length,
                    "capacity": capacity,
                    "levels": ", ".join(str(v) for v in lc.levels),
                }
            )
    columns: list[Column] = [
        ("run", _field("run")),
        ("accelerator", _field("accelerator")),
        ("SLO", _field("slo")),
        ("input length", _field("inputLength")),
        ("largest concurrency meeting the SLO", _field("capacity")),
        ("concurrency levels measured", _field("levels")),
    ]
    return _table(rows, columns)


def _plot_section(title: str, path: Path | None, why: str | None, extra: str = "") -> str:
    body = f"<img src='{html.escape(path.name)}' alt='{html.escape(title)}'>" if path else ""
    note = f"<p>{html.escape(why)}</p>" if why else ""
    return f"<h3>{html.escape(title)}</h3>{body}{note}{extra}"


def render_campaign_report(document: Mapping[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write index.html and the PNG plots that have data; return their paths by name (html, speed,
    cost, tco, capacity)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = document.get("metadata") or {}
    spec = document.get("spec") or {}
    status = document.get("status") or {}
    runs = document.get("runs") or []
    summary = status.get("summary") or []
    paths: dict[str, Path] = {}
    sections: list[str] = []

    # (a) speed and (b) cost: one panel per kind with figures.
    for key, title, panels_of in (
        (
            "speed",
            "Speed",
            (
                ("FinetuneJob", "tokensPerSecond", "training tokens/s", "Training throughput (median)"),
                (
                    "InferenceBench",
                    "peakOutputTokensPerSecond",
                    "peak output tokens/s",
                    "Serving peak throughput (median)",
                ),
            ),
        ),
        (
            "cost",
            "Cost",
            (
                ("FinetuneJob", "costDollars", "$ per training run", "Training cost (median)"),
                (
                    "InferenceBench",
                    "dollarsPerMillionTokens",
                    "$ per 1M output tokens",
                    "Serving cost at SLO capacity (median)",
                ),
            ),
        ),
    ):
        panels, missing = [], []
        for kind, metric, ylabel, panel_title in panels_of:
            bars = spread_bars(summary, kind, metric)
            if bars:
                panels.append((bars, ylabel, panel_title))
            else:
                missing.append(f"No {kind} cell in status.summary has a median {metric}: no {ylabel} plot.")
        path = None
        if panels:
            path = out / f"{key}.png"
            plot_panels(panels, path)
            paths[key] = path
        note = " ".join(missing) + (" Error bars: CV × median, from two repeats." if panels else "")
        sections.append(_plot_section(title, path, note.strip() or None))

    # (c) total cost of ownership against serving hours.
    horizon = tco_horizon(spec)
    lines = tco_lines(status.get("ownership") or [])
    if lines:
        paths["tco"] = out / "tco.png"
        plot_tco(lines, horizon, paths["tco"])
        crossings = tco_crossings(lines, horizon)
        said = [
            f"{c.first} and {c.second} cost the same, ${c.dollars:,.2f}, at {c.hours:,.1f} serving hours."
            for c in crossings
        ]
        if not crossings and len(lines) > 1:
            cheapest = min(lines, key=lambda line: line.at(horizon))
            said.append(
                f"The lines do not cross within 0–{horizon:g} h: {cheapest.label} is cheapest throughout."
            )
        note = (
            f"Lines: training $ + serving $/hour × hours (as status.ownership), 0–{horizon:g} h; "
            "dots: the status.ownership rows. " + " ".join(said)
        )
        sections.append(_plot_section("Total cost of ownership", paths["tco"], note))
    else:
        sections.append(
            _plot_section(
                "Total cost of ownership",
                None,
                "status.ownership holds no rows (no serving cell served a trained model that was priced): "
                "no TCO plot.",
            )
        )

    # (d) capacity per input length.
    capacities, without = serving_capacities(runs)
    why = " ".join(f"No capacity for {w}." for w in without)
    if capacities:
        paths["capacity"] = out / "capacity.png"
        plot_capacity(capacities, paths["capacity"])
        why = (
            "A level meets the SLO when its measured attainment reaches the SLO's attainment; only "
            "the concurrency levels measured are considered. " + why
        )
        sections.append(
            _plot_section("Capacity per input length", paths["capacity"], why, _capacity_table(capacities))
        )
    else:
        reason = "no succeeded InferenceBench run with an SLO and measured cells in the document"
        sections.append(
            _plot_section("Capacity per input length", None, f"No capacity plot: {reason}. {why}")
        )

    totals = status.get("totals") or {}
    head = [
        ("namespace", _text(meta.get("namespace"))),
        ("cluster", _text(meta.get("cluster"))),
        ("written at", _text(meta.get("writtenAt"))),
        ("phase", _text(status.get("phase"))),
        ("message", _text(status.get("message"))),
        ("repeats", _text(spec.get("repeats"))),
        ("artifact", _text(status.get("artifact"))),
    ]
    totals_list = [(label, _num(totals.get(key), fmt)) for key, label, fmt in TOTALS_KEYS]
    winners = [(str(metric), _text(cell)) for metric, cell in sorted((status.get("winners") or {}).items())]
    front = status.get("paretoFront") or []
    regressions = status.get("regressions") or []
    front_list = _items([(str(i + 1), _text(c)) for i, c in enumerate(front)]) if front else "<p>None.</p>"
    regressed = _items([(str(i + 1), _text(r)) for i, r in enumerate(regressions)]) if regressions else ""
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>accelbench campaign {_text(meta.get('name'))}</title><style>{STYLE}</style></head><body>"
        f"<h1>BenchCampaign: {_text(meta.get('name'))}</h1>{_items(head)}"
        f"<h2>Totals</h2>{_items(totals_list)}"
        f"<h2>Cells</h2>{_table(status.get('cells') or [], cell_columns(status.get('waiting') or {}))}"
        f"<h2>Summary over repeats</h2><p>Median, with the coefficient of variation (sample stdev / "
        f"mean) and n from two repeats; ratios are to the baseline.</p>{_table(summary, SUMMARY_COLUMNS)}"
        f"<h2>Total cost of ownership</h2>{_table(status.get('ownership') or [], OWNERSHIP_COLUMNS)}"
        f"<h2>Winners</h2>{_items(winners) if winners else '<p>None.</p>'}"
        f"<h2>Pareto front</h2><p>Fine-tuning cells no other beats on both cost and tokens/s.</p>"
        f"{front_list}"
        f"<h2>Baseline</h2><p>{_text(status.get('baseline'))}</p>"
        f"<h2>Regressions</h2>{regressed or '<p>None.</p>'}"
        f"<h2>Plots</h2>{''.join(sections)}</body></html>"
    )
    paths["html"] = out / "index.html"
    paths["html"].write_text(page)
    return paths

"""An InferenceBench's full results JSON (workers/bench/main.py writes it) as HTML + PNG.

$ per 1M output tokens per input length is priced here with accelbench.cost from the price the
results carry, as the operator prices the status.

Plots: TTFT p50 vs input length, one line per concurrency; output throughput vs per-user decode
speed (1000 / TPOT p50), one point per cell: the throughput–interactivity trade-off.
matplotlib (the `bench` extra) draws with the Agg backend: no display in a pod or CI.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..cost import cost_by_input_length, dollars_per_hour

TABLE_COLUMNS = (
    ("inputLength", "input", "{:d}"),
    ("concurrency", "concurrency", "{}"),
    ("requestRate", "rate/s", "{}"),
    ("completed", "ok", "{:d}"),
    ("errors", "errors", "{:d}"),
    (("ttftMs", "p50"), "TTFT p50 ms", "{:.1f}"),
    (("ttftMs", "p99"), "TTFT p99 ms", "{:.1f}"),
    (("tpotMs", "p50"), "TPOT p50 ms", "{:.2f}"),
    (("tpotMs", "p99"), "TPOT p99 ms", "{:.2f}"),
    (("itlMs", "p99"), "ITL p99 ms", "{:.2f}"),
    (("e2eMs", "p50"), "E2E p50 ms", "{:.0f}"),
    ("outputTokensPerSecond", "out tok/s", "{:.1f}"),
    ("requestsPerSecond", "req/s", "{:.2f}"),
    ("attainment", "SLO attainment", "{:.1%}"),
    (("scheduleLagMs", "p99"), "lag p99 ms", "{:.2f}"),
)


def cell_value(cell: dict, key: str | tuple[str, str]) -> Any:
    if isinstance(key, tuple):
        inner = cell.get(key[0])
        return None if not inner else inner.get(key[1])
    return cell.get(key)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "–"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return html.escape(str(value))


def ttft_series(cells: list[dict]) -> dict[int, list[tuple[int, float]]]:
    """concurrency -> [(input length, TTFT p50 ms)], sorted: the lines of the TTFT plot."""
    series: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for c in cells:
        value = cell_value(c, ("ttftMs", "p50"))
        if c.get("concurrency") is not None and value is not None:
            series[c["concurrency"]].append((c["inputLength"], value))
    return {k: sorted(v) for k, v in sorted(series.items())}


def throughput_points(cells: list[dict]) -> list[tuple[float, float, str]]:
    """(per-user tok/s = 1000/TPOT p50, output tok/s, label) per cell."""
    points = []
    for c in cells:
        tpot = cell_value(c, ("tpotMs", "p50"))
        if tpot:
            load = f"c={c['concurrency']}" if c.get("concurrency") is not None else f"{c['requestRate']}/s"
            points.append((1000.0 / tpot, c["outputTokensPerSecond"], f"in={c['inputLength']} {load}"))
    return points


def plot_ttft(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for conc, pts in ttft_series(cells).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"concurrency {conc}")
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_xscale("log", base=2)
    ax.set_title("Time to first token vs input length")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_length: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in cells:
        for x, y, _ in throughput_points([c]):
            by_length[c["inputLength"]].append((x, y))
    for length, pts in sorted(by_length.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"input {length}")
    ax.set_xlabel("per-user decode speed (tokens/s = 1000 / TPOT p50)")
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_title("Throughput vs interactivity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def html_table(cells: list[dict]) -> str:
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in TABLE_COLUMNS)
    rows = []
    for c in cells:
        tds = "".join(f"<td>{_fmt(cell_value(c, key), fmt)}</td>" for key, _, fmt in TABLE_COLUMNS)
        rows.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def summary_list(results: dict) -> str:
    items = [
        ("model", results.get("model")),
        ("endpoint", results.get("endpoint")),
        ("API", results.get("api")),
        ("server start-up (s)", _fmt(results.get("serverStartupSeconds"), "{:.1f}")),
        ("tokenizer", json.dumps(results.get("tokenizer"))),
        ("SLO", json.dumps(results.get("slo"))),
    ]
    for length, cap in (results.get("capacity") or {}).items():
        items.append((f"capacity at input {length}", json.dumps(cap)))
    price = results.get("price") or {}
    if price.get("dollarsPerChipHour") is not None:
        hourly = dollars_per_hour(price.get("chips") or 1, price["dollarsPerChipHour"])
        items.append(("price", f"{hourly:g} $/h ({price.get('priceSource')})"))
        by_length = cost_by_input_length(results.get("cells") or [], results.get("capacity") or {}, hourly)
        for length, figures in by_length.items():
            items.append((f"$ per 1M output tokens, input {length}", json.dumps(figures)))
    if results.get("tokenizer", {}).get("exact") is False:
        items.append(("warning", "input lengths are approximate (no server or local tokenizer)"))
    lis = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in items)
    return f"<ul>{lis}</ul>"


STYLE = (
    "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#eee}"
)


def render_report(results: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write index.html, ttft_vs_input.png and throughput_vs_user.png; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = results.get("cells") or []
    paths = {"ttft": out / "ttft_vs_input.png", "throughput": out / "throughput_vs_user.png"}
    plot_ttft(cells, paths["ttft"])
    plot_throughput(cells, paths["throughput"])
    definitions = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
        for k, v in (results.get("definitions") or {}).items()
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>accelbench report</title>"
        f"<style>{STYLE}</style></head><body>"
        f"<h1>InferenceBench: {html.escape(str(results.get('model')))}</h1>"
        f"{summary_list(results)}<h2>Cells</h2>{html_table(cells)}"
        f"<h2>Plots</h2><img src='{paths['ttft'].name}'><img src='{paths['throughput'].name}'>"
        f"<h2>Definitions</h2><ul>{definitions}</ul></body></html>"
    )
    paths["html"] = out / "index.html"
    paths["html"].write_text(page)
    return paths

"""Fine-tuning throughput of the accelbench workers (JAX and PyTorch) on one GPU, through `run_job`.

Every case is a FinetuneJob run by the same entry the container uses (workers.finetune.run_job), in
its own process (GPU memory released between cases; JAX and PyTorch never share a process), on
random-weight Gemma-3-shaped models and a chat JSONL dataset, with lossOn full so every token counts, as
in docs/anchors.md. By default (`--weights device`) a model dir holds only config.json and the tests'
tokenizer files (workers.testing) and the worker makes random weights on the GPU (its benchmark-only
ACCELBENCH_RANDOM_INIT mode), so the 27B-class model runs at its full 62 layers with nothing written to
disk; `--weights files` writes random safetensors with transformers instead (the workers' load path).

    python benchmarks/finetune/run.py                      # every case, results in $OUT or ./results
    python benchmarks/finetune/run.py --only '1b-full-*' --steps 8 --budget-s 500
    python benchmarks/finetune/run.py --dry-run-cpu        # tiny shapes on the CPU: tests the script
    python benchmarks/finetune/run.py --list

This file uses the standard library only; child.py (beside it) does the work in the child processes.
Results: results.json, results.md and run.log (every child's output) in --out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fnmatch
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from child import PROFILE_STEP_ENV  # this folder's child.py (stdlib only at import)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHILD = HERE / "child.py"
STARTED = time.monotonic()

LORA_RANK = 64

# accelbench.api.contract.ENV_RANDOM_INIT (this file imports nothing from the package: stdlib only).
RANDOM_INIT = "ACCELBENCH_RANDOM_INIT"


@dataclass(frozen=True)
class Case:
    name: str
    framework: str  # "pytorch" | "jax"
    model: str  # a key of MODELS (real shapes) and DRY_MODELS (dry-run shapes)
    method: str  # "full" | "lora"
    seq: int
    batch: int  # global batch (rows per optimizer step)
    gradient_checkpointing: bool = False
    compile: str = ""  # ACCELBENCH_COMPILE: "" eager, "model" or "layers" (torch.compile); JAX always jits
    about: str = ""
    micro: int | None = None  # rows per forward/backward; None: = batch (no accumulation)
    precision: str = "bf16"  # fp16: mixed precision with a gradient scaler (the V100 path)
    rank: int = LORA_RANK  # LoRA rank (alpha = 2 × rank), all projections
    env: tuple[tuple[str, str], ...] = ()  # worker tuning variables (docs/README.md), e.g. the loss chunk

    @property
    def micro_batch(self) -> int:
        return self.micro or self.batch


# Most important first: a run cut short by --budget-s keeps the cases that matter most.
CASES: list[Case] = [
    Case("1b-full-torch", "pytorch", "1b", "full", 2048, 8, about="1B full FT, eager (ANCHORS 24.1 %)"),
    Case("1b-full-jax", "jax", "1b", "full", 2048, 8, about="1B full FT, XLA (target MFU >= 45 %)"),
    Case(
        "27b-lora-b1-torch",
        "pytorch",
        "27b",
        "lora",
        3072,
        1,
        gradient_checkpointing=True,
        about="27B-class LoRA r64, grad ckpt",
    ),
    Case(
        "27b-lora-b1-jax",
        "jax",
        "27b",
        "lora",
        3072,
        1,
        gradient_checkpointing=True,
        about="27B-class LoRA r64, remat",
    ),
    Case(
        "1b-full-torch-compile",
        "pytorch",
        "1b",
        "full",
        2048,
        8,
        compile="model",
        about="1B full FT, torch.compile (ANCHORS 39.9 %)",
    ),
    Case("1b-lora-torch", "pytorch", "1b", "lora", 2048, 8, about="1B LoRA r64 all projections, eager"),
    Case("1b-lora-jax", "jax", "1b", "lora", 2048, 8, about="1B LoRA r64 all projections, XLA"),
    Case(
        "27b-lora-b4-torch",
        "pytorch",
        "27b",
        "lora",
        3072,
        4,
        gradient_checkpointing=True,
        about="27B-class LoRA r64, grad ckpt, batch 4",
    ),
    Case(
        "27b-lora-b4-jax",
        "jax",
        "27b",
        "lora",
        3072,
        4,
        gradient_checkpointing=True,
        about="27B-class LoRA r64, remat, batch 4",
    ),
    Case(
        "27b-lora-b1-torch-compile",
        "pytorch",
        "27b",
        "lora",
        3072,
        1,
        gradient_checkpointing=True,
        compile="model",
        about="27B-class LoRA r64, grad ckpt, torch.compile",
    ),
    # ACCELBENCH_COMPILE=layers: each decoder block compiled once for the whole depth (run 18).
    Case(
        "27b-lora-b1-torch-layers",
        "pytorch",
        "27b",
        "lora",
        3072,
        1,
        gradient_checkpointing=True,
        compile="layers",
        about="27B-class LoRA r64, grad ckpt, torch.compile per decoder block",
    ),
    Case(
        "1b-full-torch-layers",
        "pytorch",
        "1b",
        "full",
        2048,
        8,
        compile="layers",
        about="1B full FT, torch.compile per decoder block (vs the whole-model compile)",
    ),
    # ACCELBENCH_REMAT=dots: checkpointed blocks keep the projections' outputs (run 18).
    Case(
        "27b-lora-b1-jax-dots",
        "jax",
        "27b",
        "lora",
        3072,
        1,
        gradient_checkpointing=True,
        env=(("ACCELBENCH_REMAT", "dots"),),
        about="27B-class LoRA r64, remat saving the projections' outputs",
    ),
    Case(
        "27b-lora-b1-torch-dots",
        "pytorch",
        "27b",
        "lora",
        3072,
        1,
        gradient_checkpointing=True,
        env=(("ACCELBENCH_REMAT", "dots"),),
        about="27B-class LoRA r64, selective checkpointing saving the projections' outputs",
    ),
    Case(
        "1b-full-torch-compile-b16",
        "pytorch",
        "1b",
        "full",
        2048,
        16,
        compile="model",
        micro=8,
        about="1B full FT, torch.compile, 2 micro-batches of 8 per optimizer step",
    ),
    Case(
        "1b-full-jax-b16",
        "jax",
        "1b",
        "full",
        2048,
        16,
        micro=8,
        about="1B full FT, XLA, 2 micro-batches of 8 per optimizer step",
    ),
    Case(
        "1b-full-torch-fp16",
        "pytorch",
        "1b",
        "full",
        2048,
        8,
        precision="fp16",
        about="1B full FT, eager, fp16 autocast + GradScaler, fp32 weights",
    ),
    Case(
        "1b-lora-torch-fp16",
        "pytorch",
        "1b",
        "lora",
        2048,
        8,
        precision="fp16",
        about="1B LoRA r64 all projections, eager, fp16 base, fp16 autocast + GradScaler",
    ),
    # Shapes users compare against (issue 19): NeMo AutoModel's Llama-3-8B LoRA on one H100 (40.6 %),
    # and the public TPU-vs-GPU study's Gemma 4 31B LoRA r64, seq 3072, effective batch 8.
    Case(
        "8b-lora-r16-torch",
        "pytorch",
        "8b",
        "lora",
        4096,
        8,
        micro=2,
        rank=16,
        about="Llama-3.1-8B LoRA r16 all projections, eager, 4 micro-batches of 2",
    ),
    Case(
        "8b-lora-r16-jax",
        "jax",
        "8b",
        "lora",
        4096,
        8,
        micro=2,
        rank=16,
        about="Llama-3.1-8B LoRA r16 all projections, XLA, 4 micro-batches of 2",
    ),
    Case(
        "8b-lora-r16-torch-chunked",
        "pytorch",
        "8b",
        "lora",
        4096,
        8,
        micro=2,
        rank=16,
        env=(("ACCELBENCH_LOSS_CHUNK", "1024"),),
        about="as 8b-lora-r16-torch, LM head + loss 1,024 tokens at a time (no fp32 logits of 8,192)",
    ),
    Case(
        "8b-lora-r16-torch-m1",
        "pytorch",
        "8b",
        "lora",
        4096,
        8,
        micro=1,
        rank=16,
        about="Llama-3.1-8B LoRA r16 all projections, eager, 8 micro-batches of 1 (2 ran out of 80 GB)",
    ),
    Case(
        "8b-lora-r16-torch-m1-layers",
        "pytorch",
        "8b",
        "lora",
        4096,
        8,
        micro=1,
        rank=16,
        compile="layers",
        about="as 8b-lora-r16-torch-m1, torch.compile per decoder block",
    ),
    Case(
        "31b-lora-torch",
        "pytorch",
        "31b",
        "lora",
        3072,
        8,
        micro=1,
        gradient_checkpointing=True,
        about="Gemma-4-31B LoRA r64, grad ckpt, 8 micro-batches of 1 (the study's GPU run)",
    ),
    Case(
        "31b-lora-jax-dots",
        "jax",
        "31b",
        "lora",
        3072,
        8,
        micro=1,
        gradient_checkpointing=True,
        env=(("ACCELBENCH_REMAT", "dots"),),
        about="as 31b-lora-jax, remat saving the projections' outputs",
    ),
    Case(
        "31b-lora-jax",
        "jax",
        "31b",
        "lora",
        3072,
        8,
        micro=1,
        gradient_checkpointing=True,
        about="Gemma-4-31B LoRA r64, remat, 8 micro-batches of 1 (the study's TPU run)",
    ),
]

# docs/anchors.md (one H200, transformers 5.17 + PEFT, SDPA, fused AdamW; 27B at full depth):
# (model, method, seq, batch, compile) -> (tokens/s, MFU, peak GB)
ANCHORS: dict[tuple[str, str, int, int, bool], tuple[float, float, float]] = {
    ("1b", "full", 2048, 8, False): (37_686, 0.241, 115.7),
    ("1b", "full", 2048, 8, True): (62_414, 0.399, 59.4),
    ("1b", "lora", 2048, 8, False): (25_450, 0.111, 118.4),
    ("27b", "lora", 3072, 1, False): (1_614, 0.184, 73.1),
    ("27b", "lora", 3072, 4, False): (1_658, 0.189, 113.2),
}

# Real shapes come from the catalog (operator/accelbench/catalog/data/models.yaml): key -> family,
# size and the label the tables show.
MODELS: dict[str, dict[str, Any]] = {
    "1b": {"family": "gemma3", "size": "1b", "label": "Gemma-3-1B"},
    "27b": {"family": "gemma3", "size": "27b", "label": "Gemma-3-27B"},
    "8b": {"family": "llama", "size": "8b", "label": "Llama-3.1-8B"},
    "31b": {"family": "gemma4", "size": "31b", "label": "Gemma-4-31B"},
}
# Dry run: each family's "tiny" test shape, with a small vocabulary so the CPU keeps up.
DRY_MODELS: dict[str, dict[str, Any]] = {
    "1b": {"family": "gemma3", "size": "tiny", "overrides": {"vocab": 4096}},
    "27b": {
        "family": "gemma3",
        "size": "tiny",
        "overrides": {
            "vocab": 4096,
            "layers": 4,
            "hidden": 96,
            "heads": 4,
            "kv_heads": 2,
            "head_dim": 24,
            "intermediate": 192,
        },
        "layers": 2,
    },
    "8b": {"family": "llama", "size": "tiny", "overrides": {"vocab": 4096}},
    "31b": {"family": "gemma4", "size": "tiny", "overrides": {"vocab": 4096}},
}
DRY_SEQ = {"1b": 64, "27b": 96, "8b": 64, "31b": 96}


def elapsed() -> float:
    return time.monotonic() - STARTED


def say(message: str) -> None:
    print(message, flush=True)


# --------------------------------------------------------------------------------------------------
# Machine and environment


def command_output(argv: list[str], timeout: float = 20) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine_info(work: Path) -> dict[str, Any]:
    gpus = command_output(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    meminfo = Path("/proc/meminfo")
    mem = None
    if meminfo.is_file():
        first = meminfo.read_text().splitlines()[0].split()
        mem = f"{int(first[1]) / 2**20:.0f} GiB" if len(first) > 1 else None
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory": mem,
        "gpus": gpus.splitlines() if gpus else [],
        "work_dir": str(work),
        "work_disk_free_gb": round(free / 1e9, 1),
        "git_commit": command_output(["git", "rev-parse", "HEAD"]),
        "git_dirty_files": len((command_output(["git", "status", "--porcelain"]) or "").splitlines()),
    }


def child_env(extra: dict[str, str], dry_run: bool) -> dict[str, str]:
    env = dict(os.environ)
    operator = str(REPO / "operator")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (operator, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")  # no internet on the device machine: never try the hub
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.pop("ACCELBENCH_COMPILE", None)
    for name in ("ACCELBENCH_LOSS_CHUNK", "ACCELBENCH_REMAT"):
        env.pop(name, None)  # set per case (Case.env) or by --env, never inherited
    env.pop(RANDOM_INIT, None)  # set per case by --weights, never inherited
    if dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------------
# Child processes


def descendants(pid: int) -> list[int]:
    """Process ids below `pid` (Linux /proc), deepest last, so they can be ended one by one."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = entry.read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def end_process_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child we started and every process it started, by id (no process group tricks: a
    new session would outlive the device command)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


@dataclass
class ChildRun:
    returncode: int | None
    seconds: float
    timed_out: bool
    result: dict[str, Any] | None


def run_child(
    args: list[str], env: dict[str, str], log_path: Path, title: str, timeout: float, out_json: Path
) -> ChildRun:
    out_json.unlink(missing_ok=True)
    tick = time.monotonic()
    with log_path.open("ab") as log:
        log.write(f"\n===== {title} (at {elapsed():.0f}s, timeout {timeout:.0f}s) =====\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        timed_out = False
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            end_process_tree(proc)
        except BaseException:
            end_process_tree(proc)
            raise
    result = None
    if out_json.is_file():
        try:
            result = json.loads(out_json.read_text())
        except ValueError:
            result = None
    return ChildRun(proc.returncode, time.monotonic() - tick, timed_out, result)


def log_tail(log_path: Path, chars: int = 1500) -> str:
    try:
        with log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------------
# Cases


def manifest(
    case: Case, seq: int, model_dir: str, dataset: str, steps: int, dry_run: bool, size: str | None
) -> dict:
    method: dict[str, Any] = {"type": "full"}
    if case.method == "lora":
        method = {"type": "lora", "rank": case.rank, "alpha": 2 * case.rank, "dropout": 0.0}
    model: dict[str, Any] = {"uri": model_dir, "family": MODELS[case.model]["family"]}
    if size:
        model["size"] = size
    return {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "FinetuneJob",
        "metadata": {"name": f"bench-{case.name}"},  # a DNS label: starts with a letter
        "spec": {
            "model": model,
            "dataset": {"uri": dataset, "format": "chat", "heldOutFraction": 0},
            "method": method,
            "framework": case.framework,
            "training": {
                "seqLength": seq,
                "globalBatchSize": case.batch,
                "microBatchSize": case.micro_batch,
                "maxSteps": steps,
                "learningRate": 1e-5,
                "schedule": "constant",
                "lossOn": "full",
                "packing": True,
                "precision": case.precision,
                "gradientCheckpointing": case.gradient_checkpointing,
                "seed": 0,
            },
            "accelerator": {"type": "cpu" if dry_run else "h200", "count": 1},
        },
    }


def case_seq(case: Case, dry_run: bool) -> int:
    return DRY_SEQ[case.model] if dry_run else case.seq


def select(patterns: list[str] | None) -> list[Case]:
    if not patterns:
        return list(CASES)
    wanted = [p.strip() for group in patterns for p in group.split(",") if p.strip()]
    chosen = [c for c in CASES if any(fnmatch.fnmatchcase(c.name, p) for p in wanted)]
    unknown = [p for p in wanted if not any(fnmatch.fnmatchcase(c.name, p) for c in CASES)]
    if unknown:
        raise SystemExit(f"--only: no case matches {unknown}; cases: {', '.join(c.name for c in CASES)}")
    return chosen


def missing_modules(probe: dict[str, Any], group: str) -> list[str]:
    return [
        f"{name} (pip: {entry['pip']})"
        for name, entry in probe.get("modules", {}).items()
        if entry["group"] == group and not entry["ok"]
    ]


def unavailable(case: Case, probe: dict[str, Any], dry_run: bool) -> str | None:
    """Why this case cannot run here, from the probe; None when it can."""
    missing = missing_modules(probe, case.framework)
    if case.framework == "pytorch" and case.method == "full":
        missing = [m for m in missing if not m.startswith("peft ")]
    if missing:
        return "missing: " + ", ".join(missing)
    status = probe.get(f"accelbench_{case.framework}", "ok")
    if status != "ok":
        return f"the {case.framework} worker does not import: {status}"
    if not dry_run and case.framework == "pytorch" and not probe.get("torch_cuda"):
        return "torch sees no CUDA device"
    if not dry_run and case.framework == "jax" and probe.get("jax_backend") != "gpu":
        return f"JAX backend is {probe.get('jax_backend') or probe.get('jax_backend_error')}, not gpu"
    return None


# --------------------------------------------------------------------------------------------------
# Report


def fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def case_row(record: dict[str, Any]) -> str:
    d = record.get("derived") or {}
    report = record.get("report") or {}
    memory = (report.get("memory") or {}).get("peakBytesPerChip")
    versions = report.get("versions") or {}
    engine = {"": "eager", "model": "torch.compile"}.get(
        record["compile"], f"torch.compile ({record['compile']})"
    )
    if record["framework"] == "jax":
        engine = "XLA jit"
    if versions.get("attention"):
        engine += f", {versions['attention']}"
    if record.get("precision", "bf16") != "bf16":
        engine += f", {record['precision']}"
    anchor = record.get("anchor")
    anchor_text = f"{anchor['tokens_per_second']:,.0f} ({pct(anchor['mfu'])})" if anchor else "–"
    layers = record.get("layers")
    model = record["model_label"] + (f" ({layers}/{record['full_layers']} layers)" if layers else "")
    first = d.get("compile_seconds")
    status = record["status"]
    if status != "ok":
        status = f"**{status}**"
    cells = [
        record["name"],
        record["framework"],
        model,
        "full" if record["method"] == "full" else f"LoRA r{record.get('rank', LORA_RANK)}",
        f"{record['seq']} × {record['batch']}"
        + (f" ({record['micro']}/fwd)" if record.get("micro") and record["micro"] != record["batch"] else ""),
        "yes" if record["gradient_checkpointing"] else "no",
        engine,
        fmt(d.get("tokens_per_second")),
        pct(d.get("mfu")),
        fmt(d.get("step_seconds_mean"), ".3f"),
        fmt(memory / 1e9 if memory else None, ".1f"),
        fmt(first, ".1f"),
        fmt(d.get("setup_seconds"), ".1f"),
        anchor_text,
        status,
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    probe = results.get("probe") or {}
    modules = probe.get("modules", {})
    versions = ", ".join(
        f"{name} {entry.get('version') or '?'}" for name, entry in modules.items() if entry.get("ok")
    )
    lines = [
        f"# Fine-tuning throughput: accelbench workers ({meta['mode']})",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- machine: {meta['machine']['host']}, {meta['machine']['cpus']} CPUs, "
        f"{meta['machine']['memory']}, GPUs: {'; '.join(meta['machine']['gpus']) or 'none'}",
        f"- python {probe.get('python', '?')}: {versions}",
        f"- steps {meta['steps']} per case, the first {meta['warmup']} left out of tokens/s and MFU; "
        f"data: {meta['data']}; lossOn full, bf16 unless the engine column names another precision, "
        "micro batch = global batch unless the batch column says (rows per forward/backward)",
        "- weights: "
        + (
            "random, made on the device by the worker from a config-only dir (ACCELBENCH_RANDOM_INIT=1)"
            if meta.get("weights", "files") == "device"
            else "random safetensors written by transformers, loaded by the worker"
        ),
        "",
        "| case | framework | model | method | seq × batch | grad ckpt | engine | tokens/s | MFU | "
        "step s | peak GB | compile s | setup s | ANCHORS tok/s (MFU) | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [case_row(r) for r in results["cases"]]
    reduced = [r for r in results["cases"] if (r.get("derived") or {}).get("full_depth")]
    if reduced:
        lines += [
            "",
            "## 27B-class at reduced depth",
            "",
            "The 27B-class model keeps the real width (catalog gemma3 27b) but only "
            f"{reduced[0]['layers']} of its {reduced[0]['full_layers']} layers"
            + (
                " (dry run: the same reduction at tiny scale). "
                if meta["mode"].startswith("dry")
                else f": the full model is {reduced[0]['derived']['full_depth']['bf16_weight_gb']:.0f} GB "
                "of bf16 weights, too much to write, cache and load on the 64 GB disk within one "
                "device command. "
            )
            + "Measured tokens/s and MFU belong to the reduced model (its own FLOPs/token) and are NOT "
            "comparable with the full model or ANCHORS. The full-depth columns scale the measured step "
            "time by full/measured layers, which also scales the embedding, LM head and loss: an upper "
            "bound on time, so lower bounds on full-depth tokens/s and MFU.",
            "",
            "| case | measured tok/s | measured MFU | ms/step/layer ≤ | full-depth tok/s ≥ | "
            "full-depth MFU ≥ | ANCHORS full depth tok/s (MFU) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in reduced:
            d = r["derived"]
            full = d["full_depth"]
            anchor = r.get("anchor")
            anchor_text = f"{anchor['tokens_per_second']:,.0f} ({pct(anchor['mfu'])})" if anchor else "–"
            lines.append(
                f"| {r['name']} | {fmt(d.get('tokens_per_second'))} | {pct(d.get('mfu'))} | "
                f"{full['step_ms_per_layer_upper_bound']:.1f} | "
                f"{fmt(full['tokens_per_second_lower_bound'])} | {pct(full['mfu_lower_bound'])} | "
                f"{anchor_text} |"
            )
    failed = [r for r in results["cases"] if r["status"] != "ok"]
    if failed:
        lines += ["", "## Not measured", ""]
        for r in failed:
            lines.append(f"- {r['name']}: {r['status']}: {(r.get('error') or '').strip()[:600]}")
    ok = [r for r in results["cases"] if r["status"] == "ok"]
    if ok:
        lines += ["", "## Per case", ""]
        for r in ok:
            d = r["derived"]
            data = r.get("data") or {}
            lines.append(
                f"- {r['name']}: worker tokens/s (steps > 1) {fmt(d.get('worker_tokens_per_second'))}, "
                f"wall tokens/s (host time between steps included) "
                f"{fmt(d.get('wall_tokens_per_second'))}, "
                f"median step {fmt(d.get('step_seconds_median'), '.3f')} s, "
                f"first step done {fmt(d.get('seconds_to_first_step_done'), '.0f')} s after the child "
                f"started, segments per row max {data.get('segments_per_row_max', '?')}, "
                f"loss {d['losses'][0] if d.get('losses') else '?'} -> "
                f"{d['losses'][-1] if d.get('losses') else '?'}"
            )
    lines += [
        "",
        "## How the numbers are made",
        "",
        "- tokens/s = trained tokens (sum of loss_mask: T-1 per single-sequence row) over the "
        "worker-timed seconds (device synchronized at both ends of each step) of the steps after "
        "the warm-up ones; MFU = tokens/s × FLOPs/token (workers.flops, from the loaded config.json: "
        "6N or 4N + 6·N_lora, + 6·L·H·Q·T) / 989 TFLOP/s (catalog h200).",
        "- compile s: PyTorch = first step (torch.compile or allocator warm-up); JAX = the explicit "
        "ahead-of-time compile of the train step. setup s: model load, LoRA, optimizer.",
        "- peak GB: torch.cuda.max_memory_allocated / JAX peak_bytes_in_use, 10⁹ bytes.",
        "- ANCHORS: plain transformers + PEFT loop, random token ids (docs/anchors.md); 27B at full depth. "
        "Its LoRA MFU leaves out the adapters' 6·N_lora (4N + attention only), which workers.flops "
        "counts: at equal tokens/s our LoRA MFU reads higher (1B: 4.64 vs 4.33 GFLOP/token), so "
        "compare LoRA cases by tokens/s.",
    ]
    return "\n".join(lines) + "\n"


def write_results(out: Path, results: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "results.md").write_text(markdown(results))


def summary_line(record: dict[str, Any]) -> str:
    d = record.get("derived") or {}
    memory = ((record.get("report") or {}).get("memory") or {}).get("peakBytesPerChip")
    if record["status"] != "ok":
        return f"{record['status']}: {(record.get('error') or '')[:300]}"
    parts = [
        f"{fmt(d.get('tokens_per_second'))} tok/s",
        f"MFU {pct(d.get('mfu'))}",
        f"step {fmt(d.get('step_seconds_mean'), '.3f')} s",
        f"peak {fmt(memory / 1e9 if memory else None, '.1f')} GB",
        f"compile {fmt(d.get('compile_seconds'), '.1f')} s",
    ]
    full = d.get("full_depth")
    if full:
        parts.append(
            f"full depth >= {fmt(full['tokens_per_second_lower_bound'])} tok/s, "
            f"MFU >= {pct(full['mfu_lower_bound'])}"
        )
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    default_out = os.environ.get("OUT") or str(HERE / "results")
    parser.add_argument("--out", default=default_out, help="results dir (default: $OUT, else ./results)")
    parser.add_argument("--only", action="append", help="case names or globs, comma-separated")
    parser.add_argument("--steps", type=int, help="optimizer steps per case (default 12; dry run 4)")
    parser.add_argument("--warmup", type=int, default=2, help="leading steps left out (default 2)")
    parser.add_argument("--budget-s", type=float, default=3600, help="skip cases once this much has passed")
    parser.add_argument("--case-timeout-s", type=float, default=480, help="limit for one case's process")
    parser.add_argument(
        "--big-layers", type=int, default=0, help="layers of the 27B-class model (default 0: all 62)"
    )
    parser.add_argument(
        "--weights",
        choices=("device", "files"),
        default="device",
        help="device: config-only dirs, random weights made on the GPU by the worker (ENV_RANDOM_INIT); "
        "files: random safetensors written by transformers and loaded by the worker",
    )
    parser.add_argument("--shard-size", default="2GB", help="safetensors shard size of the model dirs")
    parser.add_argument("--data", choices=("long", "short"), default="long", help="see README.md")
    parser.add_argument(
        "--work",
        default=str(Path(tempfile.gettempdir()) / "accelbench-finetune-bench"),
        help="where model dirs and datasets go (kept and reused; NOT under --out)",
    )
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every case's process")
    parser.add_argument(
        "--profile-step",
        type=int,
        default=0,
        help="PyTorch cases: torch.profiler over this optimizer step (>= 2); <case>.profile.txt",
    )
    parser.add_argument(
        "--dry-run-cpu", action="store_true", help="tiny shapes on the CPU (tests the script)"
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 4 if args.dry_run_cpu else 12
    if args.warmup < 1 or args.steps <= args.warmup:
        parser.error("need --warmup >= 1 and --steps > --warmup")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for c in CASES:
            say(f"{c.name:24} {c.framework:8} seq {c.seq} × {c.batch}  {c.about}")
        return 0
    cases = select(args.only)
    dry = args.dry_run_cpu
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve()
    if dry:
        work = work / "dry-run"
    run_log = out / "run.log"
    run_log.unlink(missing_ok=True)
    extra_env = dict(item.split("=", 1) for item in args.env)
    env = child_env(extra_env, dry)
    command = shlex.join([Path(sys.executable).name, *sys.argv]) if argv is None else shlex.join(argv)
    results: dict[str, Any] = {
        "meta": {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": command,
            "mode": "dry run on CPU, tiny shapes" if dry else "one GPU",
            "steps": args.steps,
            "warmup": args.warmup,
            "data": args.data,
            "budget_s": args.budget_s,
            "big_layers": args.big_layers,
            "weights": args.weights,
            "env": extra_env,
            "machine": machine_info(work),
        },
        "models": {},
        "cases": [],
    }
    say(f"accelbench fine-tuning benchmark: {len(cases)} cases, {results['meta']['mode']}, out {out}")
    say(f"machine: {results['meta']['machine']['gpus'] or 'no GPU'}; work dir {work}")

    # 1. What imports, what devices the frameworks see.
    probe_out = work / "probe.json"
    probe = run_child(["probe", str(probe_out)], env, run_log, "probe", 300, probe_out).result or {}
    results["probe"] = probe
    modules = probe.get("modules", {})
    say("python " + probe.get("python", "?") + ": " + ", ".join(
        f"{n} {e.get('version') or ''}".strip() for n, e in modules.items() if e.get("ok")
    ))  # fmt: skip
    for group in ("core", "pytorch", "jax", "optional"):
        missing = missing_modules(probe, group)
        if missing:
            say(f"MISSING ({group}): {', '.join(missing)}")
    say(
        f"torch cuda: {probe.get('torch_cuda')} ({probe.get('torch_device', '-')}); "
        f"jax backend: {probe.get('jax_backend', probe.get('jax_backend_error'))}"
    )
    if not modules or missing_modules(probe, "core"):
        results["error"] = "required modules are missing (see probe): nothing was run"
        write_results(out, results)
        say(f"cannot run: {results['error']}; log: {run_log}")
        return 2

    # 2. Cases, each in its own process; models and datasets built lazily, before their first case.
    big = {**MODELS["27b"], "layers": args.big_layers or None}
    models = DRY_MODELS if dry else {**MODELS, "27b": big}
    built: dict[str, dict[str, Any] | str] = {}  # model key -> build result, or the error text
    for index, case in enumerate(cases, start=1):
        seq = case_seq(case, dry)
        record: dict[str, Any] = {
            **asdict(case),
            "seq": seq,
            "model_label": ("tiny " if dry else "") + MODELS[case.model]["label"],
            "status": "skipped",
        }
        anchor = (
            None if dry else ANCHORS.get((case.model, case.method, case.seq, case.batch, bool(case.compile)))
        )
        if anchor:
            record["anchor"] = {"tokens_per_second": anchor[0], "mfu": anchor[1], "peak_gb": anchor[2]}
        left = args.budget_s - elapsed()
        reason = unavailable(case, probe, dry)
        if reason is None and left < 20:
            reason = f"time budget: {elapsed():.0f}s of --budget-s {args.budget_s:.0f} used"
        if reason is None and case.model not in built:
            built[case.model] = build(case.model, models[case.model], cases, args, work, env, run_log, left)
            results["models"][case.model] = built[case.model]
            left = args.budget_s - elapsed()
        model = built.get(case.model)
        if reason is None and isinstance(model, str):
            reason, record["status"] = model, "failed"
        if reason is None and left < 20:
            reason = f"time budget: {elapsed():.0f}s of --budget-s {args.budget_s:.0f} used"
        if reason is not None:
            record["error"] = reason
            results["cases"].append(record)
            say(f"[{index}/{len(cases)}] {case.name}: {record['status']}: {reason}")
            write_results(out, results)
            continue
        assert isinstance(model, dict)
        shape = model["model"]["shape"]
        record["layers"] = shape["layers"] if shape["layers"] != shape["full_layers"] else None
        record["full_layers"] = shape["full_layers"]
        dataset = next(d["path"] for d in model["datasets"] if d["seq"] == seq)
        size = None if dry or record["layers"] else case.model
        spec = {
            "name": case.name,
            "manifest": manifest(case, seq, model["model"]["dir"], dataset, args.steps, dry, size),
            "model_dir": model["model"]["dir"],
            "dataset": dataset,
            "warmup": args.warmup,
            "dry_run": dry,
            "layers": shape["layers"],
            "full_layers": shape["full_layers"],
            "local_per_global": shape["local_per_global"],
        }
        spec_path = work / f"case-{case.name}.json"
        spec_path.write_text(json.dumps(spec, indent=2))
        case_env = dict(env)
        if case.framework == "jax":
            case_env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
        if case.compile:
            case_env["ACCELBENCH_COMPILE"] = case.compile
        case_env.update(case.env)
        if args.weights == "device":
            case_env[RANDOM_INIT] = "1"
        if args.profile_step:
            case_env[PROFILE_STEP_ENV] = str(args.profile_step)
        timeout = min(args.case_timeout_s, left)
        say(f"[{index}/{len(cases)}] {case.name} ({case.about}); timeout {timeout:.0f}s ...")
        result_path = work / f"result-{case.name}.json"
        child = run_child(
            ["case", str(spec_path), str(result_path)], case_env, run_log, case.name, timeout, result_path
        )
        record["seconds"] = round(child.seconds, 1)
        record["returncode"] = child.returncode
        if child.result:
            for key in ("report", "derived", "data", "notes", "profile"):
                if key in child.result:
                    record[key] = child.result[key]
        profile_table = result_path.with_suffix(".profile.txt")
        if profile_table.exists():
            shutil.copy(profile_table, out / f"{case.name}.profile.txt")
        if child.result and child.result.get("ok"):
            record["status"] = "ok"
        else:
            record["status"] = "timeout" if child.timed_out else "failed"
            error = (child.result or {}).get("error")
            if child.timed_out:
                error = f"no result after {timeout:.0f}s (killed)" + (f"; {error}" if error else "")
            elif not error:
                error = f"the case process exited with {child.returncode} and no result; log tail: "
                error += log_tail(run_log)
            record["error"] = error
        results["cases"].append(record)
        say(f"    {summary_line(record)}  [{child.seconds:.0f}s]")
        write_results(out, results)

    results["meta"]["seconds"] = round(elapsed(), 1)
    write_results(out, results)
    say("")
    say((out / "results.md").read_text())
    say(f"results: {out / 'results.json'}, {out / 'results.md'}, {run_log} ({elapsed():.0f}s in all)")
    return 0


def build(
    key: str,
    model: dict[str, Any],
    cases: list[Case],
    args: argparse.Namespace,
    work: Path,
    env: dict[str, str],
    run_log: Path,
    left: float,
) -> dict[str, Any] | str:
    """Write the model dir and the datasets its cases need; the error text when that fails."""
    dry = args.dry_run_cpu
    mine = [c for c in cases if c.model == key]
    seqs = sorted({case_seq(c, dry) for c in mine})
    datasets = []
    for seq in seqs:
        rows = args.steps * max(c.batch for c in mine if case_seq(c, dry) == seq)
        name = f"data-{args.data}-{seq}-{rows}.jsonl"
        datasets.append({"path": str(work / name), "rows": rows, "seq": seq, "mode": args.data})
    layers = model.get("layers")
    config_only = args.weights == "device"
    family = model.get("family", "gemma3")
    name = f"{family}-{key}" + (f"-{layers}l" if layers else "") + ("-config" if config_only else "")
    spec = {
        "model": {
            "dir": str(work / name),
            "family": family,
            "config_only": config_only,
            "size": model["size"],
            "overrides": model.get("overrides"),
            "layers": layers,
            "max_seq": max(seqs),
            "max_shard_size": args.shard_size,
            "cpu": dry,
        },
        "datasets": datasets,
    }
    spec_path = work / f"build-{key}.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    result_path = work / f"built-{key}.json"
    say(f"building model {key} ({model}) and {len(datasets)} dataset(s) in {work} ...")
    child = run_child(
        ["build", str(spec_path), str(result_path)], env, run_log, f"build {key}", min(600, left), result_path
    )
    if child.result is None:
        why = "timed out" if child.timed_out else f"exited with {child.returncode}"
        return f"building model {key} {why}: {log_tail(run_log)}"
    shape = child.result["model"]["shape"]
    say(
        f"    model {key}: {shape['layers']} of {shape['full_layers']} layers, hidden {shape['hidden']}, "
        f"vocab {shape['vocab']}, {'reused' if child.result['model']['reused'] else 'written'}"
        f"{' (config only: random weights on the device)' if config_only else ''} [{child.seconds:.0f}s]"
    )
    return child.result


if __name__ == "__main__":
    sys.exit(main())

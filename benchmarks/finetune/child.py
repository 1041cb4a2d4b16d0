"""The work run.py does in child processes: probe imports, build a model dir + dataset, run one case.

    python benchmarks/finetune/child.py probe OUT.json
    python benchmarks/finetune/child.py build SPEC.json OUT.json
    python benchmarks/finetune/child.py case SPEC.json OUT.json

Each call is its own process, so GPU memory is released between cases and JAX and PyTorch never
share a process. run.py sets PYTHONPATH (the repo's `operator` dir) and the environment; this file
only imports what its command needs (a PyTorch case never imports JAX and the reverse).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()

# (import name, pip name, who needs it). "core": every case; "pytorch"/"jax": that framework's cases.
MODULES: list[tuple[str, str, str]] = [
    ("numpy", "numpy", "core"),
    ("pydantic", "pydantic", "core"),
    ("yaml", "pyyaml", "core"),
    ("jinja2", "jinja2", "core"),
    ("tokenizers", "tokenizers", "core"),
    ("safetensors", "safetensors", "core"),
    ("torch", "torch", "core"),  # the model dirs are written with transformers
    ("transformers", "transformers", "core"),
    ("prometheus_client", "prometheus-client", "optional"),  # stubbed when missing (metrics unused)
    ("peft", "peft", "pytorch"),
    ("jax", "jax", "jax"),
    ("flax", "flax", "jax"),
    ("optax", "optax", "jax"),
    ("orbax.checkpoint", "orbax-checkpoint", "optional"),  # only for orbax output; not used here
    ("flash_attn", "flash-attn", "optional"),  # the torch worker uses it when present, else SDPA
]


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def write_json(path: str | Path, data: Any) -> None:
    Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")


def ensure_prometheus_client() -> str | None:
    """The worker imports prometheus_client at module level; run.py never serves metrics, so a
    missing package is replaced by a no-op stub instead of failing every case."""
    try:
        importlib.import_module("prometheus_client")
        return None
    except ImportError:
        pass

    class _Gauge:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def set(self, value: float) -> None:
            pass

    stub = types.ModuleType("prometheus_client")
    stub.CONTENT_TYPE_LATEST = "text/plain"  # type: ignore[attr-defined]
    stub.CollectorRegistry = type("CollectorRegistry", (), {})  # type: ignore[attr-defined]
    stub.Gauge = _Gauge  # type: ignore[attr-defined]
    stub.generate_latest = lambda registry=None: b""  # type: ignore[attr-defined]
    sys.modules["prometheus_client"] = stub
    return "prometheus_client is not installed: a no-op stub stands in (run.py serves no metrics)"


# --------------------------------------------------------------------------------------------------
# probe


def distribution_version(pip_name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(pip_name)
    except metadata.PackageNotFoundError:
        return ""


def probe(out: str) -> int:
    """Which modules import (with versions), and which devices torch and JAX see."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # look, do not take the GPU
    result: dict[str, Any] = {"modules": {}, "python": sys.version.split()[0], "executable": sys.executable}
    for name, pip_name, group in MODULES:
        entry: dict[str, Any] = {"pip": pip_name, "group": group}
        try:
            module = importlib.import_module(name)
            entry["ok"] = True
            entry["version"] = str(getattr(module, "__version__", "") or distribution_version(pip_name))
        except Exception as exc:  # a broken install fails in many ways; all of them mean "missing"
            entry["ok"] = False
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        result["modules"][name] = entry
    if result["modules"]["torch"]["ok"]:
        import torch

        result["torch_cuda"] = bool(torch.cuda.is_available())
        if result["torch_cuda"]:
            result["torch_device"] = torch.cuda.get_device_name(0)
            result["torch_cuda_version"] = torch.version.cuda
    if result["modules"]["jax"]["ok"]:
        try:
            import jax

            result["jax_backend"] = jax.default_backend()
            result["jax_devices"] = [d.device_kind for d in jax.devices()]
        except Exception as exc:
            result["jax_backend_error"] = f"{type(exc).__name__}: {exc}"[:300]
    # The package itself, the way a case imports it (catches a dependency missing from the list).
    ensure_prometheus_client()
    for group, module in (
        ("pytorch", "accelbench.workers.finetune.__main__"),
        ("jax", "accelbench.workers.finetune.jax_worker"),
    ):
        try:
            importlib.import_module(module)
            result[f"accelbench_{group}"] = "ok"
        except Exception as exc:
            result[f"accelbench_{group}"] = f"{type(exc).__name__}: {exc}"[:300]
    write_json(out, result)
    return 0


# --------------------------------------------------------------------------------------------------
# build: a Gemma-3-shaped random-weight model dir and a chat JSONL dataset


def layer_types(layers: int, local_per_global: int | None) -> list[str]:
    """catalog ModelShape.is_global_layer: every (local_per_global + 1)-th layer attends globally."""
    if not local_per_global:
        return ["full_attention"] * layers
    return [
        "full_attention" if (i + 1) % (local_per_global + 1) == 0 else "sliding_attention"
        for i in range(layers)
    ]


# What the catalog keys of each family hold beyond the common shape (None where a family has none).
FAMILY_KEYS: dict[str, tuple[str, ...]] = {
    "gemma3": ("sliding_window", "local_per_global"),
    "gemma4": ("sliding_window", "local_per_global", "global_head_dim", "global_kv_heads"),
    "llama": (),
}


def catalog_shape(spec: dict[str, Any]) -> dict[str, Any]:
    """The catalog's shape of spec["family"] (gemma3 when left out) at spec["size"], with
    spec["overrides"] (dry run) and spec["layers"] (reduced depth) applied; full_layers keeps the
    catalog depth."""
    from accelbench.catalog import model_shape

    family = spec.get("family", "gemma3")
    base = model_shape(family, spec["size"])
    keys = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")
    shape: dict[str, Any] = {key: getattr(base, key) for key in keys + FAMILY_KEYS[family]}
    shape.setdefault("local_per_global", None)
    shape["family"] = family
    shape.update(spec.get("overrides") or {})
    shape["full_layers"] = shape["layers"]
    if spec.get("layers"):
        shape["layers"] = min(int(spec["layers"]), shape["full_layers"])
    if family == "gemma3":
        # Gemma 3 27B scales queries by (hidden / heads)^-1/2, the smaller sizes by head_dim^-1/2.
        big = spec["size"] == "27b"
        shape["query_pre_attn_scalar"] = shape["hidden"] // shape["heads"] if big else shape["head_dim"]
    return shape


def model_config(shape: dict[str, Any], max_seq: int) -> Any:
    """A transformers config of shape["family"] at `shape` (catalog_shape), bf16, via the tests'
    tiny_config, with the catalog's layer pattern instead of the tests' 16-token alternation."""
    from accelbench.workers.testing import tiny_config

    family = shape["family"]
    config = tiny_config(
        family,
        vocab_size=shape["vocab"],
        layers=shape["layers"],
        hidden=shape["hidden"],
        heads=shape["heads"],
        kv_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        intermediate=shape["intermediate"],
        dtype="bfloat16",
    )
    if family in ("gemma3", "gemma4"):
        config.sliding_window = shape["sliding_window"]
        config.layer_types = layer_types(shape["layers"], shape["local_per_global"])
    if family == "gemma3":
        config.query_pre_attn_scalar = shape["query_pre_attn_scalar"]
    if family == "gemma4":
        # The 31B's own values where the tests' tiny shape picks small ones (catalog gemma4 31b).
        config.global_head_dim = shape["global_head_dim"]
        config.num_global_key_value_heads = shape["global_kv_heads"]
        config.final_logit_softcapping = 30.0
    if family == "llama":
        config.rope_theta = 500_000.0  # Llama 3.1; no effect on speed
    config.max_position_embeddings = max(int(config.max_position_embeddings), max_seq)
    return config


def count_parameters(config: Any) -> int:
    """Parameters of the model `config` describes, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return sum(p.numel() for p in model.parameters())


def build_model(spec: dict[str, Any]) -> dict[str, Any]:
    """The tests' generator (workers.testing: BPE tokenizer, tiny_config, tokenizer files) at a real
    Gemma 3 shape. config_only: config.json and tokenizer files alone (the worker makes random weights
    on the device, ACCELBENCH_RANDOM_INIT); else weights initialized by transformers on the GPU when
    there is one, saved sharded."""
    import torch
    from transformers import AutoModelForCausalLM

    from accelbench.workers.testing import build_tokenizer, write_tokenizer_files

    shape = catalog_shape(spec)
    directory = Path(spec["dir"])
    marker = directory / "bench-shape.json"
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        log(f"reusing {directory}")
        files = sorted(p.name for p in directory.iterdir())
        return {"dir": str(directory), "reused": True, "shape": shape, "files": files}
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors*"):
        old.unlink()
    family = shape["family"]
    tokenizer = build_tokenizer(family)
    config = model_config(shape, int(spec["max_seq"]))
    if spec.get("config_only"):
        config.save_pretrained(directory)
        write_tokenizer_files(directory, family, tokenizer)
        marker.write_text(json.dumps(spec))
        parameters = count_parameters(config)
        log(f"wrote config.json and tokenizer files of {parameters / 1e9:.3f} B parameters to {directory}")
        return {
            "dir": str(directory),
            "reused": False,
            "shape": shape,
            "parameters": parameters,
            "weight_bytes": 0,
            "files": sorted(p.name for p in directory.iterdir()),
        }
    device = "cuda" if torch.cuda.is_available() and not spec.get("cpu") else "cpu"
    torch.manual_seed(0)
    tick = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    parameters = sum(p.numel() for p in model.parameters())
    log(f"initialized {parameters / 1e9:.3f} B parameters on {device} in {time.perf_counter() - tick:.1f}s")
    tick = time.perf_counter()
    model.save_pretrained(directory, safe_serialization=True, max_shard_size=spec["max_shard_size"])
    write_tokenizer_files(directory, family, tokenizer)
    log(f"saved to {directory} in {time.perf_counter() - tick:.1f}s")
    del model
    marker.write_text(json.dumps(spec))
    size = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    return {
        "dir": str(directory),
        "reused": False,
        "shape": shape,
        "parameters": parameters,
        "weight_bytes": size,
        "files": sorted(p.name for p in directory.iterdir()),
    }


def build_dataset(spec: dict[str, Any]) -> dict[str, Any]:
    """Chat JSONL from the tests' generator (workers.testing.make_chat_dataset).

    long: each row joins enough generated samples into one user and one assistant message to hold
          more than seq_length words (every word is at least one token), so after truncation every
          packed row is a single sequence: plain causal attention, like docs/anchors.md's measurement.
    short: the generator's own short rows; packing puts many in a row (block-diagonal masks)."""
    from accelbench.workers.testing import make_chat_dataset

    path = Path(spec["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    rows, seq = int(spec["rows"]), int(spec["seq"])
    if spec["mode"] == "short":
        # ~40 tokens per templated sample: 1.5× the tokens the steps need.
        make_chat_dataset(path, n=max(64, rows * seq * 3 // 80), seed=0)
        return {"path": str(path), "seq": seq, "rows": rows * seq * 3 // 80}
    words_per_row = seq + 32
    parts = path.with_suffix(".parts.jsonl")
    make_chat_dataset(parts, n=rows * (words_per_row // 8 + 4), seed=0)  # a sample has >= 8 words
    samples = [json.loads(line)["messages"] for line in parts.read_text().splitlines() if line]
    parts.unlink()
    lines, k = [], 0
    for _ in range(rows):
        users: list[str] = []
        answers: list[str] = []
        words = 0
        while words < words_per_row:
            _, user, assistant = samples[k]
            k += 1
            users.append(user["content"])
            answers.append(assistant["content"])
            words += len(user["content"].split()) + len(assistant["content"].split())
        messages = [
            {"role": "system", "content": "Answer every question."},
            {"role": "user", "content": " ".join(users)},
            {"role": "assistant", "content": " ".join(answers)},
        ]
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n")
    return {"path": str(path), "seq": seq, "rows": rows}


def build(spec_path: str, out: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    result: dict[str, Any] = {"model": build_model(spec["model"]), "datasets": []}
    for data in spec["datasets"]:
        result["datasets"].append(build_dataset(data))
    result["seconds"] = time.perf_counter() - STARTED
    write_json(out, result)
    return 0


# --------------------------------------------------------------------------------------------------
# case: one run_job, then the figures derived from its report and per-step progress


@dataclass
class StepLog:
    """A MetricsSink that keeps what the worker reports after each step, with a wall-clock stamp.
    `after_step` runs at the end of every step (the profiler's step boundary)."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    after_step: Callable[[], None] | None = None

    def on_step(
        self, step: int, total_steps: int, loss: float, tokens_per_second: float | None, mfu: float | None
    ) -> None:
        now = time.perf_counter()
        self.steps.append({"step": step, "t": now - STARTED, "loss": loss, "tps": tokens_per_second})
        tps = f"{tokens_per_second:,.0f}" if tokens_per_second else "-"
        util = f"{mfu:.1%}" if mfu is not None else "-"
        log(f"step {step}/{total_steps} loss {loss:.4f} tokens/s {tps} mfu {util}")
        if self.after_step is not None:
            self.after_step()

    def on_eval(self, step: int, eval_loss: float) -> None:
        log(f"eval at step {step}: {eval_loss:.4f}")


# --------------------------------------------------------------------------------------------------
# profile: where one optimizer step of a PyTorch case goes (run.py --profile-step)

# Set by run.py --profile-step. derive() leaves that step out of tokens/s: the profiler slows it.
PROFILE_STEP_ENV = "BENCH_PROFILE_STEP"

# Kernel name fragments -> category, first match wins (cuBLAS/CUTLASS GEMMs on Hopper are named
# sm90_xmma_*, nvjet_*, cutlass*; cuDNN and FlashAttention kernels carry fmha/flash in their names;
# Inductor's are triton_*).
KERNEL_CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("fused by torch.compile", ("triton",)),  # Inductor's kernels fuse casts, norms and activations
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("matmul", ("gemm", "xmma", "nvjet", "cutlass", "matmul", "splitk", "aten::mm", "addmm", "bmm")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("loss", ("softmax", "cross_entropy", "nll_loss", "log_softmax")),
    ("copy / cast", ("copy", "memcpy", "memset", "to_copy", "cast")),
]


# Ranges on the GPU's timeline that are not kernels: the profiler's own step marker
# (ProfilerStep#N, keyed "ProfilerStep*") and record_function annotations. They span kernels
# counted on their own, so adding them counts that time twice (the first H100 profiles of
# 2026-12-07 did: busy time past the step's wall time, idle read 0).
ANNOTATION_PREFIXES = ("ProfilerStep",)


def is_kernel(name: str, user_annotation: bool = False) -> bool:
    return not user_annotation and not name.startswith(ANNOTATION_PREFIXES)


def kernel_category(name: str) -> str:
    """The category of a GPU kernel by its name; "other elementwise / norm" for the rest."""
    lowered = name.lower()
    for category, fragments in KERNEL_CATEGORIES:
        if any(f in lowered for f in fragments):
            return category
    return "other elementwise / norm"


def profile_breakdown(kernels: list[tuple[str, float, int]], wall_seconds: float) -> dict[str, Any]:
    """kernels: (name, device seconds, calls) of one profiled step -> seconds per category, the
    GPU's busy time, and idle time (the step's span the GPU ran no kernel: launch overhead, host
    work, synchronisation). The step's span is the profiler's step range on the GPU timeline when
    `kernels` holds it (ProfilerStep*), else `wall_seconds`, the host's time for the window (which
    also holds the profiler's own trace collection, so idle reads high)."""
    by_category: dict[str, dict[str, float]] = {}
    marked: float | None = None
    for name, seconds, calls in kernels:
        if name.startswith(ANNOTATION_PREFIXES):
            marked = seconds
        if not is_kernel(name):
            continue
        entry = by_category.setdefault(kernel_category(name), {"seconds": 0.0, "kernels": 0})
        entry["seconds"] += seconds
        entry["kernels"] += calls
    step_seconds = marked if marked else wall_seconds
    busy = sum(e["seconds"] for e in by_category.values())
    idle = max(step_seconds - busy, 0.0)
    ranked = sorted(by_category.items(), key=lambda kv: -kv[1]["seconds"])
    share = {k: round(v["seconds"] / step_seconds, 4) for k, v in ranked} if step_seconds > 0 else {}
    return {
        "step_seconds": round(step_seconds, 5),
        "step_span": "profiler step range on the GPU" if marked else "host wall time of the window",
        "gpu_busy_seconds": round(busy, 5),
        "gpu_idle_seconds": round(idle, 5),
        "categories": {
            k: {"seconds": round(v["seconds"], 5), "kernels": int(v["kernels"])} for k, v in ranked
        },
        "share_of_step": share | ({"idle": round(idle / step_seconds, 4)} if step_seconds > 0 else {}),
    }


class StepProfiler:
    """torch.profiler over optimizer step `step` (1-based): started before run_job, advanced at each
    step's end by StepLog.after_step, so its one active window is exactly that step."""

    def __init__(self, step: int, table_path: Path) -> None:
        import torch

        if step < 2:
            raise ValueError(f"{PROFILE_STEP_ENV} must be 2 or more (step 1 compiles), got {step}")
        self.step, self.table_path, self.summary = step, table_path, None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = torch.profiler.schedule(wait=step - 2, warmup=1, active=1, repeat=1)
        self.profiler = torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self.done
        )
        self.window_started = 0.0
        self.steps_seen = 0

    def __enter__(self) -> StepProfiler:
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.profiler.__exit__(*exc)

    def after_step(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.steps_seen += 1
        if self.steps_seen == self.step - 1:
            self.window_started = time.perf_counter()  # the active window opens at this boundary
        self.profiler.step()

    def done(self, prof: Any) -> None:
        from torch.autograd import DeviceType

        wall = time.perf_counter() - self.window_started
        averages = prof.key_averages()
        gpu = [e for e in averages if e.device_type != DeviceType.CPU]
        # Kernels, and the step marker (profile_breakdown takes the step's span from it); other
        # user annotations are ranges, not work.
        kernels = [
            (e.key, e.self_device_time_total / 1e6, e.count)
            for e in gpu
            if not getattr(e, "is_user_annotation", False) or e.key.startswith(ANNOTATION_PREFIXES)
        ]
        if not kernels:  # CPU run (dry run): the ops' own CPU time stands in for kernels
            kernels = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in averages if is_kernel(e.key)]
        self.summary = {"step": self.step, **profile_breakdown(kernels, wall)}
        sort_by = "self_device_time_total" if gpu else "self_cpu_time_total"
        self.table_path.write_text(
            json.dumps(self.summary, indent=2) + "\n\n" + averages.table(sort_by=sort_by, row_limit=40)
        )
        log(f"profile of step {self.step}: {json.dumps(self.summary['share_of_step'])}")


def require_device(framework: str) -> str:
    """On the real run a framework that silently fell back to the CPU would 'measure' for hours."""
    if framework == "pytorch":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device (torch.cuda.is_available() is False)")
        return torch.cuda.get_device_name(0)
    import jax

    if jax.default_backend() != "gpu":
        raise RuntimeError(f"JAX runs on {jax.default_backend()!r}, not on the GPU (jax CUDA plugin?)")
    return jax.devices()[0].device_kind


def full_depth_flops(spec: dict[str, Any], config: dict[str, Any]) -> tuple[float, int]:
    """(FLOPs per trained token, parameters) of the model at its full depth (same formula)."""
    from accelbench.workers.flops import flops_per_token, shape_from_hf_config

    full = dict(config)
    layers = int(spec["full_layers"])
    full["num_hidden_layers"] = layers
    family = spec["manifest"]["spec"]["model"]["family"]
    if "layer_types" in full:
        full["layer_types"] = layer_types(layers, spec["local_per_global"])
    shape = shape_from_hf_config(full, family)
    method = spec["manifest"]["spec"]["method"]
    rank = method.get("rank") if method["type"] == "lora" else None
    targets = method.get("targetModules") or [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    result = flops_per_token(shape, int(spec["manifest"]["spec"]["training"]["seqLength"]), rank, targets)
    d, h = shape.hidden, shape.head_dim
    per_layer = d * h * 2 * (shape.heads + shape.kv_heads) + 3 * d * shape.intermediate
    return result.total, layers * per_layer + shape.vocab * d


def derive(spec: dict[str, Any], report: Any, sink: StepLog, tokens: list[float]) -> dict[str, Any]:
    """Throughput over the steps after the first `warmup` (the worker itself leaves out only step 1).

    Worker-timed seconds per step are recovered from the worker's cumulative tokens/s after each step
    (its clock: device synchronized at both ends of a step); the wall figure divides by the time
    between progress callbacks instead, so it also counts host work between steps (batch feeding).
    """
    warmup = int(spec["warmup"])
    finetune, timings = report.finetune, report.timings
    peak, flops, chips = finetune.peak_tflops_per_chip, finetune.flops_per_token, max(report.chips, 1)
    excluded_by_worker = 1 if len(tokens) > 1 else 0
    seconds: dict[int, float] = {}
    cumulative_tokens = cumulative_seconds = 0.0
    for entry in sink.steps:
        step = entry["step"]
        if step <= excluded_by_worker:
            continue
        cumulative_tokens += tokens[step - 1]
        if entry["tps"]:
            now = cumulative_tokens / entry["tps"]
            seconds[step] = now - cumulative_seconds
            cumulative_seconds = now
    profiled = int(os.environ.get(PROFILE_STEP_ENV) or 0)  # the profiler slows the step it records
    steady = [s for s in sorted(seconds) if s > warmup and s != profiled]
    out: dict[str, Any] = {
        "warmup_steps_excluded": warmup,
        "steps": len(tokens),
        "trained_tokens_per_step": tokens,
        "step_seconds": {str(k): round(v, 5) for k, v in sorted(seconds.items())},
        "losses": [round(e["loss"], 5) for e in sink.steps],
    }

    def utilization(tps: float) -> float | None:
        return tps * flops / (chips * peak * 1e12) if flops and peak else None

    if steady:
        steady_tokens = sum(tokens[s - 1] for s in steady)
        steady_seconds = sum(seconds[s] for s in steady)
        out["tokens_per_second"] = steady_tokens / steady_seconds
        out["tokens_per_second_per_chip"] = out["tokens_per_second"] / chips
        out["mfu"] = utilization(out["tokens_per_second"])
        out["step_seconds_mean"] = steady_seconds / len(steady)
        ordered = sorted(seconds[s] for s in steady)
        out["step_seconds_median"] = ordered[len(ordered) // 2]
        stamps = {e["step"]: e["t"] for e in sink.steps}
        last = max(stamps)
        if warmup in stamps and last > warmup:
            wall = stamps[last] - stamps[warmup]
            out["wall_tokens_per_second"] = sum(tokens[warmup:last]) / wall
    else:
        out["note"] = f"only {len(tokens)} steps: nothing left after {warmup} warm-up steps"
    out["worker_tokens_per_second"] = finetune.tokens_per_second
    out["worker_mfu"] = finetune.mfu
    stamps = [e["t"] for e in sink.steps]
    if stamps:
        out["seconds_to_first_step_done"] = stamps[0]
    if spec.get("full_layers") and spec["full_layers"] != spec["layers"] and "step_seconds_mean" in out:
        config = json.loads((Path(spec["model_dir"]) / "config.json").read_text())
        full_flops, full_parameters = full_depth_flops(spec, config)
        factor = spec["full_layers"] / spec["layers"]
        step = out["step_seconds_mean"] * factor
        per_step = sum(tokens[s - 1] for s in steady) / len(steady)
        tps = per_step / step
        out["full_depth"] = {
            "layers_measured": spec["layers"],
            "layers_full": spec["full_layers"],
            "method": "step time × full/measured layers: embedding, LM head, loss and optimizer "
            "counted as if they scaled with depth, so time is an upper bound and tokens/s and MFU "
            "lower bounds for the full model (same per-layer cost assumed)",
            "step_seconds_upper_bound": step,
            "tokens_per_second_lower_bound": tps,
            "flops_per_token": full_flops,
            "mfu_lower_bound": tps * full_flops / (chips * peak * 1e12) if peak else None,
            "step_ms_per_layer_upper_bound": 1000 * out["step_seconds_mean"] / spec["layers"],
            "parameters": full_parameters,
            "bf16_weight_gb": 2 * full_parameters / 1e9,
        }
    if timings is not None:
        out["compile_seconds"] = timings.compile_seconds
        out["setup_seconds"] = timings.setup_seconds
        out["total_seconds"] = timings.total_seconds
    return out


def tokens_per_step(spec: dict[str, Any], job_input: Any) -> tuple[list[float], dict[str, Any]]:
    """The step plan run_job follows (same deterministic data path), read without training."""
    import numpy as np

    from accelbench.workers.data import data_config_from_spec, prepare_data

    job = job_input.job
    config = data_config_from_spec(job.spec, job_input.plan, None)
    data = prepare_data(spec["model_dir"], spec["dataset"], config, job.spec.model.family.value)
    tokens = [float(data.train.loss_mask[data.step_rows(s)].sum()) for s in range(1, data.total_steps + 1)]
    segments = data.train.segment_ids.max(axis=1)
    rows = {
        "train_rows": len(data.train),
        "segments_per_row_max": int(segments.max(initial=0)),
        "segments_per_row_mean": float(np.mean(segments)) if len(segments) else 0.0,
        "truncated_examples": data.train_stats.truncated,
    }
    return tokens, rows


def case(spec_path: str, out: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    result: dict[str, Any] = {"name": spec["name"], "ok": False}
    try:
        notes = [n for n in [ensure_prometheus_client()] if n]
        from accelbench.workers.finetune.__main__ import RunOptions, run_job
        from accelbench.workers.jobenv import parse_job_payload

        framework = spec["manifest"]["spec"]["framework"]
        if not spec["dry_run"]:
            log(f"device: {require_device(framework)}")
        job_input = parse_job_payload(spec["manifest"])
        sink = StepLog()
        options = RunOptions(
            max_steps=None, env=dict(os.environ), extra_sink=sink, serve_metrics=False, log=log
        )
        log(f"run_job {spec['name']} ({framework}, compile={os.environ.get('ACCELBENCH_COMPILE', '0')})")
        profile_step = int(os.environ.get(PROFILE_STEP_ENV) or 0)
        if profile_step and framework == "pytorch":
            with StepProfiler(profile_step, Path(out).with_suffix(".profile.txt")) as profiler:
                sink.after_step = profiler.after_step
                report, code = run_job(job_input, options)
            result["profile"] = profiler.summary
        else:
            report, code = run_job(job_input, options)
        result["exit_code"] = code
        result["report"] = report.to_wire()
        if report.ok:
            tokens, rows = tokens_per_step(spec, job_input)
            result["data"] = rows
            result["derived"] = derive(spec, report, sink, tokens)
            result["ok"] = True
        else:
            error = report.error
            result["error"] = f"{error.type}: {error.message}" if error else "the report says not ok"
        result["notes"] = notes
    except BaseException as exc:  # anything: the parent records it as this case's failure
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        result["traceback"] = traceback.format_exc()[-4000:]
        log(result["traceback"])
    result["child_seconds"] = time.perf_counter() - STARTED
    write_json(out, result)
    return 0 if result["ok"] else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "probe":
        return probe(argv[1])
    if len(argv) >= 3 and argv[0] == "build":
        return build(argv[1], argv[2])
    if len(argv) >= 3 and argv[0] == "case":
        return case(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The fine-tuning worker: one interface, two frameworks.

`python -m accelbench.workers.finetune` parses the job, prepares the data once (numpy, shared), builds
a `TrainContext` and hands it to the framework's `train(ctx) -> FinetuneOutcome`:

    PyTorch: accelbench.workers.finetune.torch_worker.train
    JAX:     accelbench.workers.finetune.jax_worker.train

The entrypoint then turns the outcome into a WorkerReport (throughput, MFU, loss, eval, memory), so
both frameworks are measured by the same code. A framework's `train` must:

- iterate `ctx.data.train_steps(dp_rank, dp_size)`: one `StepBatch` per optimizer step, holding this
  data-parallel rank's micro-batches and the step's global loss-token count; compute the loss exactly
  as `accelbench.workers.data` documents (sum(ce·mask) / global sum(mask), attention rule included);
- call `ctx.metrics.on_step(...)` after each step (serves Prometheus, drives the CLI progress bar);
- record one `StepRecord` per optimizer step with wall time measured after a device synchronize;
- after the held-out eval, when `ctx.pass_at_k` is set, generate and score it with
  `finetune.passk.evaluate` (generate_torch / jax_worker.passk supply the generation) and put the
  result in `FinetuneOutcome.pass_at_k`;
- fill `FinetuneOutcome` and raise `InvalidConfigError` for inputs that cannot work (ExitCode.INVALID_CONFIG);
  anything else propagates and becomes exit code 1;
- when `ctx.random_init` is set, build the model from config.json alone with random weights made on
  the device (no safetensors read) and add `RANDOM_INIT_NOTE` to the outcome's notes.

Random-init mode (ENV_RANDOM_INIT=1, benchmarks only). Throughput does not depend on the weights'
values, and a 27B model's 54 GB of random safetensors cost minutes to write and load and most of a
benchmark machine's disk; so a benchmark may hand the worker a directory holding only config.json and
the tokenizer files, and ask for random weights explicitly. The loss of such a run means nothing and
it writes no weights (spec.output is refused). Without the variable a directory without weights fails
as before, with InvalidConfigError: the mode is never taken silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ...api import FinetuneJob, Framework
from ...api.contract import ENV_COMPILE, ENV_LOSS_CHUNK, ENV_RANDOM_INIT, ENV_REMAT
from ...api.payload import WorkerPlan
from ...api.status import PassAtKResults
from .. import InvalidConfigError
from ..data import PreparedData
from ..jobenv import DistEnv

if TYPE_CHECKING:
    from .passk import PassAtKTask


class CompileMode(StrEnum):
    """How the PyTorch worker uses torch.compile (ENV_COMPILE; JAX always jits).

    MODEL compiles the forward and the loss as one function (1B full fine-tune on one H200:
    72,330 tokens/s, benchmarks/finetune run 13). With gradient checkpointing its graph breaks at
    transformers' checkpoint wrapper and the blocks run eager (tiny Llama on CPU: 8 graph breaks;
    on the 27B model its first step outlasted the benchmark's budget, run 13). LAYERS compiles each
    decoder block instead ("regional compilation"): the blocks share their code, so one compile
    (two for models with local and global layers) serves the whole depth, checkpointed or not, and
    the head and loss stay eager.
    """

    OFF = "off"
    MODEL = "model"
    LAYERS = "layers"


def compile_mode(value: str | None) -> CompileMode:
    """ENV_COMPILE's value: unset, "" or "0" is off, "1" is the whole model (its original meaning)."""
    text = (value or "").strip().lower()
    if text in ("", "0", CompileMode.OFF.value):
        return CompileMode.OFF
    if text == "1":
        return CompileMode.MODEL
    try:
        return CompileMode(text)
    except ValueError:
        choices = ", ".join(m.value for m in CompileMode)
        raise InvalidConfigError(f"{ENV_COMPILE}={value!r}: expected 0, 1 or one of {choices}") from None


def remat_policy(value: str | None) -> str:
    """ENV_REMAT's value: what a checkpointed block keeps for its backward pass when
    gradientCheckpointing is on. "full" (unset): nothing, the block's forward runs again. "dots":
    the outputs of the projections' matmuls (JAX: jaxmodels.transformer.REMAT_POLICIES; PyTorch:
    torch_worker.checkpointing_kwargs), so only attention and elementwise work are recomputed."""
    text = (value or "").strip().lower() or "full"
    if text not in ("full", "dots"):
        raise InvalidConfigError(f"{ENV_REMAT}={value!r}: expected full or dots")
    return text


def loss_chunk_tokens(value: str | None) -> int:
    """ENV_LOSS_CHUNK's value: tokens per chunk of the LM head + loss; unset or 0 = all at once."""
    text = (value or "").strip()
    if not text:
        return 0
    try:
        tokens = int(text)
    except ValueError:
        tokens = -1
    if tokens < 0:
        raise InvalidConfigError(f"{ENV_LOSS_CHUNK}={value!r}: expected a whole number of tokens, 0 or more")
    return tokens


class MetricsSink(Protocol):
    """Where a framework reports progress. Rank 0's values are the ones that matter."""

    def on_step(
        self, step: int, total_steps: int, loss: float, tokens_per_second: float | None, mfu: float | None
    ) -> None: ...

    def on_eval(self, step: int, eval_loss: float) -> None: ...


@dataclass(frozen=True)
class TrainContext:
    """Everything a framework's `train` needs; built once by the entrypoint.

    `plan` is the operator's plan from the payload (framework, chips, fsdp, tp, micro-batch, peak).
    """

    job: FinetuneJob
    plan: WorkerPlan
    model_dir: Path  # local Hugging Face-format directory (config.json, *.safetensors, tokenizer)
    data: PreparedData  # tokenized, masked, packed; yields byte-identical batches to both frameworks
    dist: DistEnv  # rank/world/local rank (torch) or process id/count (JAX)
    metrics: MetricsSink
    flops_per_token: float  # per trained token, workers.flops (the report recomputes nothing)
    peak_tflops_per_chip: float | None  # the plan's (catalog, dense bf16); what MFU divides by
    chips: int  # chips the run uses in total (MFU divides by it)
    output_dir: Path | None = None  # local path to write weights to; None = do not save
    warmup_steps_excluded: int = 1  # steps left out of tokens/s (compilation, allocator warm-up)
    compile: CompileMode = CompileMode.OFF  # ENV_COMPILE: torch.compile (JAX always jits)
    remat_policy: str = "full"  # ENV_REMAT: what a checkpointed block saves (full | dots)
    loss_chunk_tokens: int = 0  # ENV_LOSS_CHUNK: the LM head + loss this many tokens at a time (0: all)
    lora_autocast: bool = True  # ENV_LORA_AUTOCAST=0: bf16 LoRA without autocast (benchmark A/B)
    random_init: bool = False  # ENV_RANDOM_INIT=1: random weights on the device (benchmarks only)
    log: Callable[[str], None] = print
    pass_at_k: PassAtKTask | None = None  # spec.passAtK with its problems loaded; None = not asked for


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as the framework saw it (global values, identical on every rank)."""

    step: int  # 1-based
    loss: float  # sum(ce·mask)/sum(mask) over the whole global batch
    trained_tokens: int  # sum(loss_mask) over the whole global batch
    seconds: float  # wall time of the step, device synchronized at both ends


@dataclass
class FinetuneOutcome:
    """What `train` returns; the entrypoint builds the WorkerReport from it."""

    framework: str  # "pytorch" | "jax"
    device: str  # e.g. "NVIDIA H200", "TPU v5p", "cpu"
    chips: int
    steps: list[StepRecord]
    warmup_steps_excluded: int  # leading steps left out of tokens/s
    setup_seconds: float  # model load, sharding, optimizer creation
    compile_seconds: float | None = None  # time of the excluded leading steps (or explicit compile)
    eval_loss: float | None = None  # held-out sum(ce·mask)/sum(mask); None when there is no held-out set
    eval_history: list[tuple[int, float]] = field(default_factory=list)  # (step, eval loss)
    peak_memory_bytes: int | None = None  # per chip, the largest seen
    memory_capacity_bytes: int | None = None  # per chip
    versions: dict[str, str] = field(default_factory=dict)  # framework library versions
    output_path: str | None = None  # where weights were written
    notes: list[str] = field(default_factory=list)  # fallbacks taken (e.g. sdpa instead of flash)
    pass_at_k: PassAtKResults | None = None  # after training, when spec.passAtK asked for it


RANDOM_INIT_NOTE = (
    f"weights: random, initialized on the device from config.json ({ENV_RANDOM_INIT}=1, benchmarks "
    "only): throughput is real, the loss is not"
)


def weights_marker(random_init: bool) -> dict[str, str]:
    """An entry for the report's versions map: a random-weight run says so in its WorkerReport."""
    return {"weights": f"random ({ENV_RANDOM_INIT}=1)"} if random_init else {}


def tuning_marker(ctx: TrainContext) -> dict[str, str]:
    """Entries for the report's versions map naming the tuning a run took (ENV_COMPILE for PyTorch,
    ENV_REMAT, ENV_LOSS_CHUNK), so a figure in status says how it was made; empty when none was set."""
    marker: dict[str, str] = {}
    if ctx.compile != CompileMode.OFF and ctx.plan.framework == Framework.PYTORCH:
        marker["compile"] = f"torch.compile {ctx.compile.value} ({ENV_COMPILE})"
    if ctx.remat_policy != "full" and ctx.job.spec.training.gradient_checkpointing:
        how = "jax.checkpoint" if ctx.plan.framework == Framework.JAX else "selective checkpointing"
        marker["remat"] = f"{how} saves {ctx.remat_policy} ({ENV_REMAT})"
    if ctx.loss_chunk_tokens:
        marker["loss"] = (
            f"LM head + cross-entropy in chunks of {ctx.loss_chunk_tokens} tokens ({ENV_LOSS_CHUNK})"
        )
    return marker


def missing_weights(model_dir: Path, detail: str) -> InvalidConfigError:
    """The error for a model dir that does not load (no weights, say); names the benchmark-only way
    out, since a config-only dir is what a benchmark without that variable most likely handed over."""
    return InvalidConfigError(
        f"cannot load the model from {model_dir}: {detail} "
        f"(throughput benchmarks on a config-only dir set {ENV_RANDOM_INIT}=1 for random weights)"
    )


# The optimizer recipe both frameworks implement (torch.optim.AdamW / optax.adamw defaults agree):
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
MAX_GRAD_NORM = 1.0  # clip the global gradient norm (optax.clip_by_global_norm) before the update
# Weight decay applies to trainable parameters with two or more dimensions (projection matrices,
# embeddings, LoRA A/B), never to norm scales or biases.


def learning_rate_at(step: int, base: float, warmup: int, total: int, schedule: str) -> float:
    """Learning rate of optimizer step `step` (0-based: the first update uses step 0).

    Warm-up: base·(step+1)/warmup for step < warmup. Then, with p = (step-warmup)/max(1, total-warmup):
    cosine base·½(1+cos πp), linear base·(1-p), constant base.
    """
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return base * (1.0 - progress)
    return base


__all__ = [
    "ADAM_BETAS",
    "ADAM_EPS",
    "MAX_GRAD_NORM",
    "RANDOM_INIT_NOTE",
    "FinetuneOutcome",
    "InvalidConfigError",
    "MetricsSink",
    "StepRecord",
    "TrainContext",
    "learning_rate_at",
    "missing_weights",
    "weights_marker",
]

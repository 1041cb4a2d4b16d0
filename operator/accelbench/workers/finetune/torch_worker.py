"""The PyTorch path: transformers + peft on cuda, hpu (Gaudi) or cpu; DDP or FSDP2 under torchrun.

Loss and masks come from workers.data (not from transformers' label shifting), so this path and the
JAX path compute the same number on the same batch. Packed rows get an explicit block-diagonal causal
mask (sliding-window variant for Gemma's local layers) when a micro-batch holds more than one segment
per row; rows with a single segment need only plain causal attention (padding trails, see data.py),
which keeps SDPA on its fast is_causal kernels. With flash_attention_2 no mask is passed: transformers
reads segment starts from the restarting position ids and runs varlen flash attention. On CUDA
without flash_attn, torch_attention.py (flash for causal layers, FlexAttention block masks for
windows and packed rows) is the flashAttention default; see choose_attention.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...api.contract import ENV_COMPILE, ENV_HPU_GRAPHS, ENV_LOSS_CHUNK, ENV_TORCH_ATTENTION
from ...api.finetune import CheckpointFormat, MethodType, ParallelismStrategy, Precision, expand_lora_targets
from ...api.payload import WorkerPlan
from ..data import Batch, attention_allowed
from . import (
    ADAM_BETAS,
    ADAM_EPS,
    MAX_GRAD_NORM,
    RANDOM_INIT_NOTE,
    CompileMode,
    FinetuneOutcome,
    InvalidConfigError,
    StepRecord,
    TrainContext,
    gaudi_attention,
    learning_rate_at,
    missing_weights,
    torch_attention,
    tuning_marker,
    weights_marker,
)
from .torch_loss import ChunkedLossModel, forward_chunked
from .zero3 import Zero3, deepspeed_config

# --------------------------------------------------------------------------------------------------
# Device and process group


@dataclass(frozen=True)
class DeviceInfo:
    device: torch.device
    name: str
    capacity_bytes: int | None


def habana_available() -> bool:
    return importlib.util.find_spec("habana_frameworks") is not None


def pick_device(local_rank: int) -> DeviceInfo:
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        props = torch.cuda.get_device_properties(index)
        return DeviceInfo(torch.device("cuda", index), props.name, int(props.total_memory))
    if habana_available():
        import habana_frameworks.torch.core  # noqa: F401  (registers the hpu device)
        import habana_frameworks.torch.hpu as hthpu

        name = hthpu.get_device_name() if hasattr(hthpu, "get_device_name") else "Gaudi"
        return DeviceInfo(torch.device("hpu"), str(name), None)
    return DeviceInfo(torch.device("cpu"), f"cpu ({platform.machine() or 'unknown'})", None)


def init_process_group(ctx: TrainContext, device: torch.device) -> bool:
    """torch.distributed when torchrun started more than one process; env:// rendezvous."""
    if not ctx.dist.distributed or not torch.distributed.is_available():
        return False
    if not torch.distributed.is_initialized():
        backend = {"cuda": "nccl", "hpu": "hccl"}.get(device.type, "gloo")
        if device.type == "hpu":
            import habana_frameworks.torch.distributed.hccl  # noqa: F401
        torch.distributed.init_process_group(backend=backend)
    return True


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a wall clock read afterwards covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "hpu":
        import habana_frameworks.torch.hpu as hthpu

        hthpu.synchronize()


def mark_step(device: torch.device) -> None:
    """Gaudi lazy mode executes the accumulated graph here; a no-op elsewhere."""
    if device.type == "hpu":
        import habana_frameworks.torch.core as htcore

        htcore.mark_step()


def peak_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "hpu":
        import habana_frameworks.torch.hpu as hthpu

        stats = hthpu.memory_stats() if hasattr(hthpu, "memory_stats") else {}
        value = stats.get("MaxInUse")
        return int(value) if value is not None else None
    # cpu: the process's peak resident set (Linux reports KiB)
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# --------------------------------------------------------------------------------------------------
# Model


# ENV_TORCH_ATTENTION names transformers' attn_implementation outright (e.g. flex_attention,
# or torch_attention.NAME on a machine without flash_attn) for benchmarking; packed rows' masks are
# built for sdpa/eager and torch_attention.NAME only, so leave it unset for packed data otherwise.
ATTENTION_OVERRIDE = ENV_TORCH_ATTENTION


def choose_attention(
    flash_requested: bool, device: torch.device, capability: tuple[int, int] | None = None
) -> tuple[str, str | None]:
    """(attn_implementation, note).

    flashAttention on CUDA: the flash_attn package's kernels when it is installed, else flash
    through SDPA for causal layers and FlexAttention for windowed layers and packed rows
    (torch_attention.py). On Gaudi: Habana's FusedSDPA (gaudi_attention.py). Off, or elsewhere: SDPA."""
    forced = os.environ.get(ATTENTION_OVERRIDE)
    if forced:
        if forced == torch_attention.NAME:
            torch_attention.register()
        return forced, f"attention forced to {forced} by {ATTENTION_OVERRIDE}"
    if not flash_requested:
        return "sdpa", None
    if device.type == "hpu":
        kernel = gaudi_attention.fused_sdpa()
        if kernel is None:
            return "sdpa", "flash attention requested but Habana's FusedSDPA is not importable; using sdpa"
        return gaudi_attention.register(kernel), None
    if device.type != "cuda":
        return "sdpa", f"flash attention requested but unavailable on {device.type}; using sdpa"
    major, minor = capability or torch.cuda.get_device_capability(device)
    if major < 8:  # V100 (sm_70): FlashAttention and the flash SDPA kernel need sm_80+
        return "sdpa", f"flash attention needs sm_80+, this GPU is sm_{major}{minor}; using sdpa"
    if importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2", None
    return torch_attention.register(), None


def capture_hpu_graphs(model: torch.nn.Module) -> str:
    """spec.gaudi.hpuGraphs: Habana's ModuleCacher records the model's forward and backward as HPU
    graphs and replays them (less host work per step). Returns the note saying what happened."""
    import habana_frameworks.torch as ht

    cacher = getattr(ht.hpu, "ModuleCacher", None)
    if cacher is None:
        return "HPU graphs requested, but this habana_frameworks has no ModuleCacher: ran without"
    cacher(max_graphs=8)(model=model, inplace=True)
    return "HPU graphs: the model's forward and backward captured by ModuleCacher"


def load_model(ctx: TrainContext, dtype: torch.dtype, attn: str, device: torch.device) -> torch.nn.Module:
    """The checkpoint's weights (on the CPU; train() moves them), or with ctx.random_init random
    weights made directly on `device` by transformers' own initializers: no 54 GB host copy."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (ctx.model_dir / "config.json").is_file():
        raise InvalidConfigError(f"{ctx.model_dir} is not a Hugging Face model dir (no config.json)")
    if ctx.random_init:
        try:
            config = AutoConfig.from_pretrained(ctx.model_dir)
        except (OSError, ValueError) as exc:
            raise InvalidConfigError(f"cannot read {ctx.model_dir / 'config.json'}: {exc}") from None
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    try:
        return AutoModelForCausalLM.from_pretrained(ctx.model_dir, dtype=dtype, attn_implementation=attn)
    except (OSError, ValueError) as exc:
        raise missing_weights(ctx.model_dir, str(exc)) from None


def apply_lora(model: torch.nn.Module, ctx: TrainContext) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    method = ctx.job.spec.method
    # all-linear expanded here, not by PEFT: the same projections the JAX worker and FLOPs count use.
    targets = expand_lora_targets(method.target_modules)
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t not in present]
    if missing:
        raise InvalidConfigError(f"LoRA target modules {missing} are not in the model")
    config = LoraConfig(
        r=int(method.rank or 0),
        lora_alpha=method.lora_alpha,
        lora_dropout=method.dropout,
        target_modules=list(targets),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


# Matmuls whose outputs a "dots" checkpoint keeps: the projections (nn.Linear on [tokens, features]
# lowers to mm/addmm). Batched matmuls (attention's, when not in a fused kernel) are recomputed.
SAVED_UNDER_DOTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def checkpointing_kwargs(policy: str) -> dict[str, Any]:
    """torch.utils.checkpoint arguments for the remat policy (finetune.remat_policy).

    Non-reentrant always: it works with frozen inputs (LoRA) and with FSDP2. "dots" adds selective
    activation checkpointing: the projections' outputs are saved in the forward pass and only the
    rest of the block runs again in the backward pass (the JAX worker's "dots" policy).
    """
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if policy == "dots":
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def keep_projections(ctx: Any, op: Any, *args: Any, **kw: Any) -> CheckpointPolicy:
            return CheckpointPolicy.MUST_SAVE if op in SAVED_UNDER_DOTS else CheckpointPolicy.PREFER_RECOMPUTE

        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, keep_projections)
    return kwargs


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks, wherever peft put them; FSDP2 shards each one separately."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def worker_strategy(plan: WorkerPlan) -> ParallelismStrategy:
    """The plan's resolved strategy; a payload from before strategies: fsdp when sharded, else ddp."""
    if plan.strategy:
        return ParallelismStrategy(plan.strategy)
    return ParallelismStrategy.FSDP if plan.fsdp > 1 else ParallelismStrategy.DDP


def wrap_distributed(model: torch.nn.Module, ctx: TrainContext, device: torch.device) -> torch.nn.Module:
    """FSDP2 (fully_shard per decoder layer, then the root) when the plan shards; DDP otherwise.
    ZeRO-3 is not a wrapper here: train() hands the model to DeepSpeed (zero3.py)."""
    plan = ctx.plan
    if plan.tp > 1:
        raise InvalidConfigError("tensor parallelism (tp > 1) is not implemented in the PyTorch worker")
    if plan.fsdp > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


# --------------------------------------------------------------------------------------------------
# Batches and loss


def sliding_window_of(config: Any) -> int | None:
    layer_types = getattr(config, "layer_types", None) or []
    return getattr(config, "sliding_window", None) if "sliding_attention" in layer_types else None


def attention_mask_for(
    segment_ids: np.ndarray, config: Any, attn: str, device: torch.device
) -> torch.Tensor | dict[str, torch.Tensor] | None:
    """The data.py attention rule in the form transformers takes; None when plain causal suffices."""
    if attn == torch_attention.NAME:
        per_layer_type = bool(getattr(config, "layer_types", None))
        return torch_attention.masks_for(segment_ids, sliding_window_of(config), per_layer_type, device)
    if attn == "flash_attention_2" or int(segment_ids.max(initial=0)) <= 1:
        return None
    full = torch.from_numpy(attention_allowed(segment_ids)).unsqueeze(1).to(device)
    window = sliding_window_of(config)
    if window is None:
        return full
    local = torch.from_numpy(attention_allowed(segment_ids, window)).unsqueeze(1).to(device)
    # Models with local layers take a mask per layer type and pass 4D masks through unchanged.
    return {"full_attention": full, "sliding_attention": local}


def to_device(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
    tensors["input_ids"] = tensors["input_ids"].long()
    tensors["positions"] = tensors["positions"].long()
    tensors["targets"] = tensors["targets"].long()
    return {k: v.to(device, non_blocking=True) for k, v in tensors.items()}


def forward_ce(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | dict[str, torch.Tensor] | None,
    targets: torch.Tensor,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum(ce·mask), sum(mask)): forward and the data.py loss formula, ce in float32.

    One function so torch.compile sees the forward and the loss together: compiled alone, the
    model would hand eager code float32 logits of [tokens, vocab] (17 GB for 16k tokens of a
    262k vocabulary) to upcast, write and read back.
    """
    out = model(input_ids=input_ids, position_ids=positions, attention_mask=mask, use_cache=False)
    logits = out.logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    weights = loss_mask.reshape(-1)
    return (ce * weights).sum(), weights.sum()


LossFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def eager_loss_fn(chunked: bool) -> LossFn:
    """forward_ce, or forward_chunked when the model is a torch_loss.ChunkedLossModel."""
    return forward_chunked if chunked else forward_ce


def compiled_loss_fn(model: torch.nn.Module, mode: CompileMode, chunked: bool = False) -> LossFn:
    """The training loss function under `mode` (see CompileMode), compiling what it names; `chunked`:
    the model is a torch_loss.ChunkedLossModel, called as such.

    LAYERS compiles each decoder block in place (`Module.compile`), inside the checkpoint wrapper
    transformers puts around a block, so a recomputation reruns the compiled code; parameters are
    the graph's inputs, so blocks with the same code share one compile (and eval, in no_grad mode,
    one more). MODEL compiles only the training function: eval calls eager_loss_fn, since it runs a
    few times and in no_grad mode it would be a second whole-model compile.
    """
    plain = eager_loss_fn(chunked)
    if mode == CompileMode.MODEL:
        return torch.compile(plain)
    if mode == CompileMode.LAYERS:
        layers = decoder_layers(model)
        if not layers:
            found = type(model).__name__
            raise InvalidConfigError(f"{ENV_COMPILE}=layers: no decoder layers found in {found}")
        for layer in layers:
            layer.compile()
    return plain


def masked_ce_sum(
    model: torch.nn.Module,
    batch: Batch,
    config: Any,
    attn: str,
    device: torch.device,
    loss_fn: LossFn = forward_ce,
    autocast: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum(ce·mask), sum(mask)) of one micro-batch (`loss_fn` is forward_ce, maybe compiled).
    autocast: the forward runs under autocast to that dtype (the loss itself autocasts to fp32)."""
    t = to_device(batch, device)
    mask = attention_mask_for(batch["segment_ids"], config, attn, device)
    amp = torch.autocast(device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()
    with amp:
        return loss_fn(model, t["input_ids"], t["positions"], mask, t["targets"], t["loss_mask"])


def weights_dtype(precision: Precision, lora: bool) -> torch.dtype:
    """bf16: bf16 weights. fp16: mixed precision, so trained weights stay fp32 and only a frozen LoRA
    base is held in fp16. fp32: fp32."""
    if precision == Precision.BF16:
        return torch.bfloat16
    if precision == Precision.FP16 and lora:
        return torch.float16
    return torch.float32


def autocast_dtype(precision: Precision, lora: bool, lora_autocast: bool = True) -> torch.dtype | None:
    """The dtype the forward autocasts to, or None.

    fp16: always (mixed precision over fp32 trained weights). bf16 LoRA: PEFT keeps the adapters in
    fp32 and casts each projection's input to fp32 for them, so every adapter matmul runs in fp32
    beside a bf16 base; under bf16 autocast they run in bf16 while their weights, gradients and
    optimizer state stay fp32 (fp16 LoRA, which autocasts, ran 1.35x bf16 LoRA's tokens/s on one
    H200: benchmarks/finetune run 14). bf16 full: the weights are bf16 already. `lora_autocast`
    False (ENV_LORA_AUTOCAST=0) turns the bf16 LoRA case off: an A/B switch for the benchmarks."""
    if precision == Precision.FP16:
        return torch.float16
    if precision == Precision.BF16 and lora and lora_autocast:
        return torch.bfloat16
    return None


def gradient_scaler(precision: Precision, device: torch.device, sharded: bool) -> Any:
    """fp16's loss scaler (None otherwise). Sharded (FSDP): every rank sees only its shard of the
    gradients, so the overflow check is all-reduced to make every rank skip the same steps."""
    if precision != Precision.FP16:
        return None
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)


def all_reduce_sum(value: torch.Tensor, distributed: bool) -> torch.Tensor:
    if distributed:
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.SUM)
    return value


# --------------------------------------------------------------------------------------------------
# Training


def build_optimizer(model: torch.nn.Module, ctx: TrainContext, device: torch.device) -> torch.optim.AdamW:
    training = ctx.job.spec.training
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": training.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(
        groups,
        lr=training.learning_rate,
        betas=ADAM_BETAS,
        eps=ADAM_EPS,
        fused=device.type == "cuda",  # one kernel for all parameters instead of a loop per tensor
    )


def no_sync(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip the gradient all-reduce on all but the last micro-batch of a step."""
    if last:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2

        @contextlib.contextmanager
        def _fsdp() -> Iterator[None]:
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return _fsdp()
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    ctx: TrainContext,
    config: Any,
    attn: str,
    device: torch.device,
    dist: bool,
    autocast: torch.dtype | None = None,
    chunked: bool = False,
) -> float | None:
    """Mean held-out loss through eager_loss_fn (blocks compiled in place by ENV_COMPILE=layers stay
    compiled); `chunked`: the model is a ChunkedLossModel."""
    data = ctx.data
    loss_fn = eager_loss_fn(chunked)
    if len(data.held_out) == 0:
        return None
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    batch_size = data.micro_batch_size(ctx.dist.world_size)
    for batch in data.eval_batches(ctx.dist.rank, ctx.dist.world_size, batch_size):
        ce_sum, count = masked_ce_sum(model, batch, config, attn, device, loss_fn, autocast=autocast)
        total += torch.stack([ce_sum.double(), count.double()])
    model.train()
    all_reduce_sum(total, dist)
    ce_sum, count = total.tolist()
    return ce_sum / count if count > 0 else None


def train(ctx: TrainContext) -> FinetuneOutcome:
    started = time.perf_counter()
    spec = ctx.job.spec
    training = spec.training
    info = pick_device(ctx.dist.local_rank)
    device = info.device
    dist = init_process_group(ctx, device)
    notes: list[str] = []
    if spec.output is not None and spec.output.format == CheckpointFormat.ORBAX:
        raise InvalidConfigError("output format orbax is for the JAX worker; use safetensors with pytorch")

    lora = spec.method.type == MethodType.LORA
    dtype = weights_dtype(training.precision, lora)
    attn, note = choose_attention(training.flash_attention, device)
    if note:
        notes.append(note)
        ctx.log(f"note: {note}")
    torch.manual_seed(training.seed)  # LoRA initialization and dropout
    model = load_model(ctx, dtype, attn, device)
    if ctx.random_init:
        notes.append(RANDOM_INIT_NOTE)
        ctx.log(f"note: {RANDOM_INIT_NOTE}")
    config = model.config
    if ctx.data.vocab_size > config.vocab_size:
        raise InvalidConfigError(
            f"the tokenizer has {ctx.data.vocab_size} tokens, the model's embedding only {config.vocab_size}"
        )
    if training.gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=checkpointing_kwargs(ctx.remat_policy)
        )
    if lora:
        model = apply_lora(model, ctx)
    model.to(device)
    model.train()
    if device.type == "hpu" and os.environ.get(ENV_HPU_GRAPHS) == "1":
        notes.append(capture_hpu_graphs(model))
    base = model
    strategy = worker_strategy(ctx.plan) if dist else None
    chunked = ctx.loss_chunk_tokens > 0
    if chunked:
        if strategy == ParallelismStrategy.ZERO3:
            raise InvalidConfigError(
                f"{ENV_LOSS_CHUNK} is not supported with the zero3 strategy (ZeRO-3 gathers the LM head's "
                "weight only inside the head's own forward); use ddp or fsdp, or unset it"
            )
        model = ChunkedLossModel(model, ctx.loss_chunk_tokens)  # the loss inside the wrapped forward
    # Before any wrapper: FSDP2's and DeepSpeed's hooks then sit outside the compiled blocks.
    loss_fn = compiled_loss_fn(model, ctx.compile, chunked)
    zero3: Zero3 | None = None
    if strategy == ParallelismStrategy.ZERO3:
        world_size = ctx.dist.world_size
        config = deepspeed_config(
            training.precision,
            ctx.data.micro_batch_size(world_size),
            ctx.data.grad_accumulation(world_size),
            MAX_GRAD_NORM,
        )
        # DeepSpeed takes the optimizer over the model's own parameters and partitions both.
        optimizer = build_optimizer(base, ctx, device)
        zero3 = Zero3.start(base, optimizer, config)
        model = zero3.module
    else:
        if dist:
            model = wrap_distributed(model, ctx, device)
        # After the wrap: FSDP2 swaps each parameter for its sharded DTensor.
        optimizer = build_optimizer(base, ctx, device)
    param_groups = zero3.param_groups if zero3 is not None else optimizer.param_groups
    # fp16 and bf16 under zero3 are DeepSpeed's own modes (a half or bf16 model): no autocast there.
    autocast = autocast_dtype(training.precision, lora, ctx.lora_autocast) if zero3 is None else None
    sharded = dist and ctx.plan.fsdp > 1
    scaler = None if zero3 is not None else gradient_scaler(training.precision, device, sharded)
    skipped_steps = 0  # fp16: steps the scaler skipped for an overflow (the scale halves instead)
    trainable = [p for p in base.parameters() if p.requires_grad]
    setup_seconds = time.perf_counter() - started

    world = ctx.dist.world_size
    total_steps = ctx.data.total_steps
    records: list[StepRecord] = []
    evals: list[tuple[int, float]] = []
    steady_tokens, steady_seconds = 0, 0.0
    for step_batch in ctx.data.train_steps(ctx.dist.rank, world):
        index = step_batch.step - 1
        lr = learning_rate_at(
            index, training.learning_rate, training.warmup_steps, total_steps, training.schedule
        )
        for group in param_groups:
            group["lr"] = lr
        synchronize(device)
        tick = time.perf_counter()
        local = torch.zeros((), dtype=torch.float32, device=device)
        micro = step_batch.micro_batches
        for k, batch in enumerate(micro):
            last = k == len(micro) - 1
            with no_sync(model, last or zero3 is not None):  # ZeRO-3 reduces at its own boundary
                ce_sum, _ = masked_ce_sum(model, batch, config, attn, device, loss_fn, autocast=autocast)
                # DDP, FSDP and ZeRO average gradients over ranks; × world makes it the global-token mean.
                scaled = ce_sum * (world / step_batch.global_loss_tokens)
                if zero3 is not None:
                    zero3.backward(scaled, last)
                else:
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                mark_step(device)
            local += ce_sum.detach()
        if zero3 is not None:
            skipped_steps += zero3.step()  # clip (the engine's), step, zero the gradients
        elif scaler is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        if zero3 is None:
            torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
            if scaler is not None:
                scale = scaler.get_scale()
                scaler.step(optimizer)  # skipped when a gradient overflowed
                scaler.update()
                skipped_steps += scaler.get_scale() < scale
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        mark_step(device)
        loss = float(all_reduce_sum(local, dist).item()) / step_batch.global_loss_tokens
        synchronize(device)
        seconds = time.perf_counter() - tick
        tokens = int(step_batch.global_loss_tokens)
        records.append(StepRecord(step_batch.step, loss, tokens, seconds))
        if step_batch.step > ctx.warmup_steps_excluded:
            steady_tokens += tokens
            steady_seconds += seconds
        tps = steady_tokens / steady_seconds if steady_seconds > 0 else None
        mfu = None
        if tps is not None and ctx.peak_tflops_per_chip:
            mfu = tps * ctx.flops_per_token / (ctx.chips * ctx.peak_tflops_per_chip * 1e12)
        ctx.metrics.on_step(step_batch.step, total_steps, loss, tps, mfu)
        every = training.eval_every_steps
        if every and step_batch.step % every == 0 and step_batch.step < total_steps:
            value = evaluate(model, ctx, config, attn, device, dist, autocast, chunked)
            if value is not None:
                evals.append((step_batch.step, value))
                ctx.metrics.on_eval(step_batch.step, value)

    if skipped_steps:
        notes.append(f"fp16 loss scaling skipped {skipped_steps} of {len(records)} steps on overflow")
        ctx.log(f"note: {notes[-1]}")
    eval_loss = evaluate(model, ctx, config, attn, device, dist, autocast, chunked)
    if eval_loss is not None:
        evals.append((total_steps, eval_loss))
        ctx.metrics.on_eval(total_steps, eval_loss)
    pass_at_k = None
    if ctx.pass_at_k is not None:  # before saving: a merged LoRA export unloads the adapters
        from .generate_torch import run_pass_at_k

        pass_at_k = run_pass_at_k(base, ctx, device, dist)
    output_path = None
    if ctx.output_dir is not None:
        output_path = save_weights(base, ctx, lora, dist, zero3)
    warm = records[: ctx.warmup_steps_excluded]
    return FinetuneOutcome(
        framework="pytorch",
        device=info.name,
        chips=ctx.chips,
        steps=records,
        warmup_steps_excluded=ctx.warmup_steps_excluded,
        setup_seconds=setup_seconds,
        compile_seconds=sum(r.seconds for r in warm) if warm else None,
        eval_loss=eval_loss,
        eval_history=evals,
        peak_memory_bytes=peak_memory(device),
        memory_capacity_bytes=info.capacity_bytes,
        # How the figures were made first: those entries are kept when the report is trimmed.
        versions=weights_marker(ctx.random_init) | tuning_marker(ctx) | library_versions(attn, device),
        output_path=output_path,
        notes=notes,
        pass_at_k=pass_at_k,
    )


# --------------------------------------------------------------------------------------------------
# Output


def save_weights(
    model: torch.nn.Module, ctx: TrainContext, lora: bool, dist: bool, zero3: Zero3 | None = None
) -> str | None:
    """Safetensors in Hugging Face layout (loads with from_pretrained / a serving engine).

    LoRA: merged W + alpha/r·BA when output.mergeLora (the default), else the adapter alone.
    Under FSDP the full state dict is gathered to rank 0's CPU first; under ZeRO-3 every rank
    gathers the whole model for the save (a collective), and rank 0 writes it."""
    if zero3 is not None:
        with zero3.gathered(model):
            return save_weights(model, ctx, lora, dist=False)
    out = ctx.output_dir
    assert out is not None
    merge = ctx.job.spec.output.merge_lora if ctx.job.spec.output else True
    state = None
    if dist and ctx.plan.fsdp > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ctx.dist.rank != 0:
        return None
    out.mkdir(parents=True, exist_ok=True)
    if lora and merge:
        if state is not None:
            model.load_state_dict(state)
        merged = model.merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
    else:
        model.save_pretrained(out, state_dict=state, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        source = ctx.model_dir / name
        if source.is_file():
            (out / name).write_bytes(source.read_bytes())
    return str(out)


def library_versions(attn: str, device: torch.device) -> dict[str, str]:
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "attention": attn}
    for name in ("peft", "flash_attn", "habana_frameworks"):
        if importlib.util.find_spec(name) is not None:
            module = __import__(name)
            versions[name] = str(getattr(module, "__version__", "present"))
    if device.type == "cuda" and torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
    return versions

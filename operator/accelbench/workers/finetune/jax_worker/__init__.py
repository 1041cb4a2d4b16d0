"""The JAX fine-tuning worker: Flax NNX model, optax AdamW, a ('data','fsdp','tp') mesh, Orbax.

`train(ctx) -> FinetuneOutcome` follows the convention of `workers.finetune`. One process per host
(`jax.distributed.initialize` when JAX_NUM_PROCESSES > 1) drives every chip of its host; the batch
of a step is the concatenation of the data-parallel ranks' rows (`PreparedData.train_steps` with one
rank per (data, fsdp) mesh position), so the JAX and PyTorch workers see the same rows per step.

Timing: the train step is compiled ahead of time (`jit(...).lower(...).compile()`) and that time is
reported as compile_seconds; each step's clock starts and stops after `block_until_ready`.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jax

from ....api.finetune import CheckpointFormat, MethodType, Precision, expand_lora_targets
from ....bridge import export_hf, export_peft_adapter, load_hf, save_orbax, sharded_placer
from ....bridge.convert import LoadedModel
from ....bridge.mapping import HfLayout
from ....jaxmodels.config import load_config
from ....jaxmodels.transformer import Transformer
from ...data import Batch, StepBatch
from .. import (
    RANDOM_INIT_NOTE,
    FinetuneOutcome,
    InvalidConfigError,
    StepRecord,
    TrainContext,
    missing_weights,
    tuning_marker,
    weights_marker,
)
from .mesh import (
    batch_sharding,
    build_mesh,
    data_parallel_size,
    initialize_distributed,
    local_data_ranks,
    param_sharding,
)
from .step import Split, build_optimizer, make_eval_step, make_train_step, split_model

__all__ = ["train"]

BATCH_KEYS = ("input_ids", "targets", "loss_mask", "positions", "segment_ids")


def dtypes(precision: Precision) -> tuple[jnp.dtype, jnp.dtype]:
    """(param dtype, compute dtype). bf16 keeps bf16 weights like the PyTorch worker; adapters are fp32.
    fp16 needs a loss scaler, which this worker has not: refused (the planner refuses it first)."""
    if precision == Precision.FP16:
        raise InvalidConfigError("precision fp16 is not supported by the JAX worker (no loss scaling)")
    return (jnp.float32, jnp.float32) if precision == Precision.FP32 else (jnp.bfloat16, jnp.bfloat16)


def random_model(ctx: TrainContext, mesh: Mesh) -> LoadedModel:
    """ENV_RANDOM_INIT: the model of config.json with the model's own random initializers, run eagerly
    on this process's first device, then placed with the parameter shardings.

    Eager, not one jitted init: a jitted init of the 62-layer 27B model spent minutes in XLA's compiler
    on the H200 (every parameter's random numbers as one program), while eager calls compile once per
    distinct parameter shape and reuse it for every layer. The cost: the whole model is made on one
    device first (each process its own copy, same seed, so the copies agree), which a benchmark on
    chips that each hold the model can afford.
    """
    spec = ctx.job.spec
    param_dtype, dtype = dtypes(spec.training.precision)
    try:
        cfg = load_config(ctx.model_dir)
    except (OSError, ValueError) as exc:
        raise InvalidConfigError(f"cannot read {ctx.model_dir / 'config.json'}: {exc}") from None
    with jax.default_device(jax.local_devices()[0]):
        model = Transformer(
            cfg,
            rngs=nnx.Rngs(params=spec.training.seed),
            param_dtype=param_dtype,
            dtype=dtype,
            remat=spec.training.gradient_checkpointing,
            remat_policy=ctx.remat_policy,
        )
    if mesh.devices.size > 1:
        place = sharded_placer(param_sharding(mesh))
        graphdef, state = nnx.split(model)
        flat = nnx.to_flat_state(state)
        for path, var in flat:
            var.set_value(place(path, var.get_value()))
        model = nnx.merge(graphdef, nnx.from_flat_state(flat))
    # No checkpoint names to mirror: the text-only causal-LM layout, used only by exports (refused).
    return LoadedModel(model, cfg, HfLayout(prefix="model.", lm_head="lm_head.weight"), ())


def load_model(ctx: TrainContext, mesh: Mesh) -> LoadedModel:
    spec = ctx.job.spec
    param_dtype, dtype = dtypes(spec.training.precision)
    if ctx.random_init:
        loaded = random_model(ctx, mesh)
    else:
        try:
            loaded = load_hf(
                ctx.model_dir,
                param_dtype=param_dtype,
                dtype=dtype,
                remat=spec.training.gradient_checkpointing,
                remat_policy=ctx.remat_policy,
                place=sharded_placer(param_sharding(mesh)),
            )
        except FileNotFoundError as exc:  # no safetensors (a config-only dir): the input, not a crash
            raise missing_weights(ctx.model_dir, str(exc)) from None
    if ctx.data.vocab_size > loaded.cfg.vocab_size:
        raise InvalidConfigError(
            f"the tokenizer has {ctx.data.vocab_size} tokens, "
            f"the model's embedding only {loaded.cfg.vocab_size}"
        )
    # Static: one compile, and the fused kernels' causal/window flags when no row packs two examples.
    loaded.model.segment_masks = not ctx.data.one_sequence_per_row
    if spec.method.type == MethodType.LORA:
        if spec.method.dropout > 0:
            raise InvalidConfigError(
                "LoRA dropout is not implemented in the JAX worker; set method.dropout 0"
            )
        try:
            loaded.model.add_lora(
                expand_lora_targets(spec.method.target_modules),  # all-linear: every projection
                rank=spec.method.rank or 0,
                alpha=spec.method.lora_alpha,
                seed=spec.training.seed,
            )
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None
    return loaded


def attention_note(segment_masks: bool) -> str:
    from ....jaxmodels.layers import ATTENTION_IMPL

    how = "einsum (XLA)" if ATTENTION_IMPL == "einsum" else f"jax.nn.dot_product_attention ({ATTENTION_IMPL})"
    if segment_masks:
        return f"attention: {how} with block-diagonal masks (rows pack several examples)"
    return f"attention: {how}, causal and sliding window as kernel flags (one example per row)"


def place_state(state: Any, mesh: Mesh) -> Any:
    """Put a (trainable) state on the mesh with the parameter rules (adapters come out replicated)."""
    from flax import nnx

    rule = param_sharding(mesh)
    flat = nnx.to_flat_state(state)
    for path, var in flat:
        value = var.get_value()
        var.set_value(jax.device_put(value, rule(path, value.shape)))
    return nnx.from_flat_state(flat)


def _on_mesh(tree: Any, mesh: Mesh, fallback: NamedSharding) -> Any:
    """Moments follow their parameter's sharding; scalars (the step count) land on one device: replicate."""

    def fix(x: jax.Array) -> jax.Array:
        sharding = x.sharding
        return (
            x
            if isinstance(sharding, NamedSharding) and sharding.mesh == mesh
            else jax.device_put(x, fallback)
        )

    return jax.tree.map(fix, tree)


def _shardings(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.sharding, tree)


class BatchFeeder:
    """Turns this process's rows into global, sharded device arrays."""

    def __init__(self, ctx: TrainContext, mesh: Mesh) -> None:
        self.ctx = ctx
        self.mesh = mesh
        self.dp = data_parallel_size(mesh)
        self.ranks = local_data_ranks(mesh)
        self.micro = ctx.data.micro_batch_size(self.dp)

    def steps(self) -> Iterator[tuple[StepBatch, dict[str, jax.Array]]]:
        """(rank-0 view of the step, micro-batches [A, B_global, T] as sharded arrays)."""
        streams = [self.ctx.data.train_steps(r, self.dp) for r in self.ranks]
        for parts in zip(*streams, strict=True):
            yield parts[0], self._globalize(_stack_micro_batches(parts), batch_dim=1)

    def eval_batches(self) -> Iterator[dict[str, jax.Array]]:
        streams = [self.ctx.data.eval_batches(r, self.dp, self.micro) for r in self.ranks]
        # Ranks can hold different numbers of held-out batches: pad the short ones with empty rows.
        lists = [list(s) for s in streams]
        count = _agree_max(max((len(x) for x in lists), default=0))
        for i in range(count):
            rows = [x[i] if i < len(x) else _empty_like(self._template(), self.micro) for x in lists]
            yield self._globalize({k: _concat(r[k] for r in rows) for k in BATCH_KEYS}, batch_dim=0)

    def _template(self) -> Batch:
        t = self.ctx.data.config.seq_length
        return {k: np.zeros((1, t), np.float32 if k == "loss_mask" else np.int32) for k in BATCH_KEYS}

    def _globalize(self, local: dict[str, np.ndarray], batch_dim: int) -> dict[str, jax.Array]:
        out = {}
        for k, v in local.items():
            sharding = batch_sharding(self.mesh, v.ndim, batch_dim)
            shape = list(v.shape)
            shape[batch_dim] = shape[batch_dim] // len(self.ranks) * self.dp
            out[k] = jax.make_array_from_process_local_data(sharding, v, tuple(shape))
        return out


def _stack_micro_batches(parts: tuple[StepBatch, ...]) -> dict[str, np.ndarray]:
    """[A, B_local, T] per key: micro-batch a of every local rank side by side, in rank order."""
    accumulation = len(parts[0].micro_batches)
    return {
        k: np.stack([_concat(p.micro_batches[a][k] for p in parts) for a in range(accumulation)])
        for k in BATCH_KEYS
    }


def _concat(parts: Iterator[np.ndarray]) -> np.ndarray:
    return np.concatenate(list(parts), axis=0)


def _empty_like(template: Batch, rows: int) -> Batch:
    return {k: np.zeros((rows, v.shape[1]), v.dtype) for k, v in template.items()}


def _agree_max(value: int) -> int:
    """The largest value over processes (every process must run the same number of eval steps)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray([value]))))


def evaluate(split: Split, eval_step: Any, feeder: BatchFeeder) -> float | None:
    total = count = 0.0
    for batch in feeder.eval_batches():
        ce, n = eval_step(split.trainable, split.frozen, batch)
        total += float(ce)
        count += float(n)
    return total / count if count > 0 else None


def device_memory() -> tuple[int | None, int | None]:
    """(peak bytes in use, capacity) of the first local device; None where the backend has no stats."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use"), stats.get("bytes_limit")


def versions() -> dict[str, str]:
    import flax
    import optax

    out = {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__}
    out["python"] = platform.python_version()
    return out


def train(ctx: TrainContext) -> FinetuneOutcome:
    started = time.perf_counter()
    initialize_distributed(ctx.dist)
    spec = ctx.job.spec
    training = spec.training
    mesh = build_mesh(ctx.plan.fsdp, ctx.plan.tp)
    ctx.log(f"jax mesh {dict(mesh.shape)} on {jax.device_count()} devices, {jax.process_count()} processes")
    loaded = load_model(ctx, mesh)
    notes = [attention_note(loaded.model.segment_masks)]
    if ctx.random_init:
        notes.append(RANDOM_INIT_NOTE)
        ctx.log(f"note: {RANDOM_INIT_NOTE}")
    lora = spec.method.type == MethodType.LORA
    split = split_model(loaded.model, lora)
    split.trainable = place_state(split.trainable, mesh)
    tx = build_optimizer(training, ctx.data.total_steps)
    replicated = NamedSharding(mesh, PartitionSpec())
    # Eager init: the moments inherit each parameter's sharding (a jitted init puts them on one device).
    opt_state = _on_mesh(tx.init(split.trainable), mesh, replicated)
    shardings = (_shardings(split.trainable), _shardings(opt_state), replicated)
    train_step = make_train_step(split.graphdef, tx, shardings, ctx.loss_chunk_tokens)
    eval_step = make_eval_step(split.graphdef, ctx.loss_chunk_tokens)
    feeder = BatchFeeder(ctx, mesh)
    setup_seconds = time.perf_counter() - started

    records: list[StepRecord] = []
    evals: list[tuple[int, float]] = []
    compiled = None
    compile_seconds = 0.0
    steady_tokens, steady_seconds = 0, 0.0
    for step_batch, micro in feeder.steps():
        tokens = jnp.float32(step_batch.global_loss_tokens)
        if compiled is None:
            tick = time.perf_counter()
            compiled = train_step.lower(split.trainable, opt_state, split.frozen, micro, tokens).compile()
            compile_seconds = time.perf_counter() - tick
        jax.block_until_ready((split.trainable, micro))
        tick = time.perf_counter()
        split.trainable, opt_state, loss = compiled(split.trainable, opt_state, split.frozen, micro, tokens)
        jax.block_until_ready((split.trainable, opt_state, loss))
        seconds = time.perf_counter() - tick
        record = StepRecord(step_batch.step, float(loss), int(step_batch.global_loss_tokens), seconds)
        records.append(record)
        if step_batch.step > ctx.warmup_steps_excluded:
            steady_tokens += record.trained_tokens
            steady_seconds += seconds
        tps = steady_tokens / steady_seconds if steady_seconds > 0 else None
        mfu = None
        if tps is not None and ctx.peak_tflops_per_chip:
            mfu = tps * ctx.flops_per_token / (ctx.chips * ctx.peak_tflops_per_chip * 1e12)
        ctx.metrics.on_step(step_batch.step, ctx.data.total_steps, record.loss, tps, mfu)
        every = training.eval_every_steps
        if every and step_batch.step % every == 0 and step_batch.step < ctx.data.total_steps:
            value = evaluate(split, eval_step, feeder)
            if value is not None:
                evals.append((step_batch.step, value))
                ctx.metrics.on_eval(step_batch.step, value)

    eval_loss = evaluate(split, eval_step, feeder)
    if eval_loss is not None:
        evals.append((ctx.data.total_steps, eval_loss))
        ctx.metrics.on_eval(ctx.data.total_steps, eval_loss)
    pass_at_k = None
    if ctx.pass_at_k is not None:
        from .passk import run_pass_at_k

        pass_at_k = run_pass_at_k(ctx, split, mesh)
    output_path = save_output(ctx, loaded, split) if ctx.output_dir is not None else None
    peak, capacity = device_memory()
    return FinetuneOutcome(
        framework="jax",
        device=jax.devices()[0].device_kind,
        chips=ctx.chips,
        steps=records,
        warmup_steps_excluded=ctx.warmup_steps_excluded,
        setup_seconds=setup_seconds,
        compile_seconds=compile_seconds,
        eval_loss=eval_loss,
        eval_history=evals,
        peak_memory_bytes=peak,
        memory_capacity_bytes=capacity,
        # How the figures were made first: those entries are kept when the report is trimmed.
        versions=weights_marker(ctx.random_init) | tuning_marker(ctx) | versions(),
        output_path=output_path,
        notes=notes,
        pass_at_k=pass_at_k,
    )


def save_output(ctx: TrainContext, loaded: LoadedModel, split: Split) -> str:
    """Orbax (adapters unmerged) or Hugging Face safetensors (merged LoRA, or a PEFT adapter)."""
    from flax import nnx

    assert ctx.output_dir is not None
    model = nnx.merge(split.graphdef, split.trainable, split.frozen)
    spec = ctx.job.spec
    output = spec.output
    lora = spec.method.type == MethodType.LORA
    if output is not None and output.format == CheckpointFormat.ORBAX:
        return str(save_orbax(model, ctx.output_dir, ctx.model_dir))
    if lora and output is not None and not output.merge_lora:
        path = export_peft_adapter(
            model,
            loaded.layout,
            ctx.output_dir,
            rank=spec.method.rank or 0,
            alpha=spec.method.lora_alpha,
            base=spec.base_model.uri,
        )
        return str(path)
    return str(export_hf(model, loaded.cfg, ctx.model_dir, ctx.output_dir, layout=loaded.layout))

"""Where the time of one JAX training step goes: the worker's own model, loss and optimizer, timed in parts.

    PYTHONPATH=operator:benchmarks/finetune python3 benchmarks/finetune/breakdown.py \
        [--size 1b] [--batch 8] [--seq 2048] [--method full] [--out results/breakdown.json]

Random weights at the catalog's Gemma 3 shape (no disk), random tokens, every token trained (as the
run.py cases). Each part is its own jitted function over the worker's pieces (jaxmodels.Transformer,
jax_worker.step): the whole train step (as the worker compiles it), forward only, forward+backward
without the optimizer, the decoder blocks alone (forward+backward of the final-norm output), the LM
head + cross-entropy alone (on fixed hidden states), and the AdamW update alone. Variants: the
attention with block-diagonal masks instead of kernel flags, and the einsum attention. XLA's own
FLOP count of the compiled step is printed next to the docs/design.md formula.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def timed(fn: Any, *args: Any, repeats: int = 10) -> tuple[float, float]:
    """(compile seconds, median seconds per call) with the device synchronized around each call."""
    import numpy as np

    import jax

    tick = time.perf_counter()
    # A fresh wrapper each time: jax.jit caches traces per function object, and the variants
    # change what the same function traces to (module flags read at trace time).
    compiled = jax.jit(lambda *a: fn(*a)).lower(*args).compile()
    compile_s = time.perf_counter() - tick
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - tick)
    return compile_s, float(np.median(times))


def build(size: str, method: str, seq: int, layers: int | None) -> tuple[Any, Any, dict[str, Any]]:
    import jax.numpy as jnp
    from child import catalog_shape, model_config
    from flax import nnx

    from accelbench.jaxmodels import Transformer
    from accelbench.jaxmodels.config import config_from_hf

    shape = catalog_shape({"size": size, "layers": layers})
    hf = model_config(shape, seq)
    cfg_dict = hf.to_dict()
    cfg = config_from_hf(cfg_dict)
    model = Transformer(
        cfg,
        rngs=nnx.Rngs(0),
        param_dtype=jnp.bfloat16,
        dtype=jnp.bfloat16,
        remat=method == "lora" and size != "1b",
        segment_masks=False,
    )
    if method == "lora":
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model.add_lora(targets, rank=64, alpha=128)
    return model, cfg_dict, shape


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1b")
    parser.add_argument("--method", default="full", choices=["full", "lora"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--loss-chunk", type=int, default=0)
    parser.add_argument("--variants", default="masks,einsum", help="comma list: masks, einsum, none")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import jax
    from accelbench.jaxmodels import layers as jax_layers
    from accelbench.workers import flops as flops_mod
    from accelbench.workers.finetune.jax_worker import step as step_mod

    model, cfg_dict, shape = build(args.size, args.method, args.seq, args.layers)
    lora = args.method == "lora"
    split = step_mod.split_model(model, lora)
    rng = np.random.default_rng(0)
    b, t = args.batch, args.seq
    ids = rng.integers(0, shape["vocab"], size=(b, t + 1)).astype(np.int32)
    batch = {
        "input_ids": jnp.asarray(ids[:, :-1]),
        "targets": jnp.asarray(ids[:, 1:]),
        "loss_mask": jnp.ones((b, t), jnp.float32),
        "positions": jnp.asarray(np.arange(t, dtype=np.int32)[None].repeat(b, 0)),
        "segment_ids": jnp.ones((b, t), jnp.int32),
    }
    tokens = b * t
    training = SimpleNamespace(learning_rate=1e-5, warmup_steps=0, schedule="constant", weight_decay=0.0)
    tx = step_mod.build_optimizer(training, 100)
    opt_state = tx.init(split.trainable)
    graphdef, trainable, frozen = split.graphdef, split.trainable, split.frozen

    model_shape = flops_mod.shape_from_hf_config(cfg_dict, "gemma3", args.size)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    formula = flops_mod.flops_per_token(
        model_shape, t, lora_rank=64 if lora else None, lora_targets=targets
    ).total
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "shape": shape,
        "batch": b,
        "seq": t,
        "method": args.method,
        "loss_chunk": args.loss_chunk,
        "formula_flops_per_token": formula,
        "parts": {},
    }
    print(json.dumps({k: v for k, v in report.items() if k != "parts"}), flush=True)

    def record(name: str, compile_s: float, seconds: float, extra: dict[str, Any] | None = None) -> None:
        entry = {"compile_s": round(compile_s, 2), "ms": round(seconds * 1e3, 3)}
        entry["tokens_per_s"] = round(tokens / seconds)
        entry["mfu_989"] = round(tokens / seconds * formula / 989e12, 4)
        entry.update(extra or {})
        report["parts"][name] = entry
        rate = f"{tokens / seconds:10,.0f} tok/s"
        print(f"{name:34s} {seconds * 1e3:9.2f} ms  ({rate}, compile {compile_s:5.1f} s)", flush=True)

    def ce(tr: Any, fr: Any, bt: dict[str, Any]) -> Any:
        return step_mod._ce_of(graphdef, tr, fr, bt, args.loss_chunk)[0]

    # 1. The worker's train step (one micro-batch, value_and_grad + clip + AdamW).
    def train_step(tr: Any, opt: Any, fr: Any, micro: Any, n: Any) -> Any:
        grads_fn = jax.value_and_grad(ce)
        value, g = grads_fn(tr, fr, jax.tree.map(lambda x: x[0], micro))
        g = jax.tree.map(lambda gg, p: (gg / n).astype(p.dtype), g, tr)
        updates, opt = tx.update(g, opt, tr)
        import optax

        return optax.apply_updates(tr, updates), opt, value / n

    micro = jax.tree.map(lambda x: x[None], batch)
    n = jnp.float32(tokens)
    lowered = jax.jit(train_step).lower(trainable, opt_state, frozen, micro, n)
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla_flops = float((cost or {}).get("flops", 0.0))
    c, s = timed(train_step, trainable, opt_state, frozen, micro, n)
    record("train step (worker)", c, s, {"xla_flops_per_token": xla_flops / tokens})

    # 2. Forward only; 3. forward + backward, no optimizer.
    c, s = timed(ce, trainable, frozen, batch)
    record("forward (loss)", c, s)
    c, s = timed(jax.grad(ce), trainable, frozen, batch)
    record("forward+backward", c, s)

    # 4. Decoder blocks alone (embedding + blocks + final norm), fwd+bwd.
    def body(tr: Any, fr: Any, bt: dict[str, Any]) -> Any:
        m = nnx.merge(graphdef, tr, fr)
        h = m.hidden_states(bt["input_ids"], bt["positions"], bt["segment_ids"])
        return jnp.sum(h.astype(jnp.float32))

    c, s = timed(jax.grad(body), trainable, frozen, batch)
    record("blocks fwd+bwd (no LM head)", c, s)

    # 5. LM head + cross-entropy alone, on fixed hidden states (grads to hidden and embedding).
    hidden = jnp.asarray(rng.normal(size=(b, t, shape["hidden"])), jnp.bfloat16)

    def head(tr: Any, fr: Any, h: Any, bt: dict[str, Any]) -> Any:
        m = nnx.merge(graphdef, tr, fr)
        out = step_mod.chunked_ce_sum(m, h, bt["targets"], bt["loss_mask"], args.loss_chunk)
        return out[0]

    c, s = timed(jax.grad(head, argnums=(0, 2)), trainable, frozen, hidden, batch)
    record("LM head + CE fwd+bwd", c, s)

    # 6. The optimizer alone (clip + AdamW + apply) on stand-in gradients.
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e-3, p.dtype), trainable)

    def update(tr: Any, opt: Any, g: Any) -> Any:
        import optax

        updates, opt = tx.update(g, opt, tr)
        return optax.apply_updates(tr, updates), opt

    c, s = timed(update, trainable, opt_state, grads)
    record("optimizer (clip + AdamW)", c, s)

    # Variants of the whole step.
    for variant in [v for v in args.variants.split(",") if v and v != "none"]:
        if variant == "masks":
            model.segment_masks = True
        elif variant == "einsum":
            jax_layers.ATTENTION_IMPL = "einsum"
        graphdef = nnx.split(model, nnx.LoRAParam if lora else nnx.Param, ...)[0]
        c, s = timed(train_step, trainable, opt_state, frozen, micro, n)
        record(f"train step, {variant} attention", c, s)
        model.segment_masks = False
        jax_layers.ATTENTION_IMPL = os.environ.get("ACCELBENCH_JAX_ATTENTION", "auto")
    graphdef = split.graphdef

    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

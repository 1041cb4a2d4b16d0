"""The KV-cache decode (Transformer.prefill + decode_step) computes what the full forward computes."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax_helpers import FAMILIES, TINY_SHAPE

import jax
from accelbench.bridge import load_hf
from accelbench.jaxmodels import Transformer
from accelbench.jaxmodels.config import config_from_hf
from accelbench.jaxmodels.generate import generate
from accelbench.workers.testing import tiny_config

LENGTHS = (3, 14, 21)  # rows of different lengths; decoding runs them past the tiny 16-token window
STEPS = 8


def _full_logits(model: Transformer, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The plain forward over the whole buffer, each row's tokens as its one segment."""
    b, t = tokens.shape
    positions = np.tile(np.arange(t, dtype=np.int32), (b, 1))
    segments = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    return np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segments)))


def _assert_decode_equals_forward(model: Transformer, vocab: int, seed: int = 0) -> None:
    """Prefill the prompts, then feed STEPS random tokens one at a time: every step's logits equal the
    full forward's logits at that position (the sequence so far, run without a cache)."""
    rng = np.random.default_rng(seed)
    b, t = len(LENGTHS), max(LENGTHS) + STEPS + 3
    tokens = rng.integers(1, vocab, size=(b, t)).astype(np.int32)  # the tail is garbage on purpose
    lengths = np.asarray(LENGTHS, np.int32)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    segments = jnp.asarray((np.arange(t)[None] < lengths[:, None]).astype(np.int32))
    hidden, caches = model.prefill(jnp.asarray(tokens), positions, segments)
    expected = model.hidden_states(jnp.asarray(tokens), positions, segments)
    np.testing.assert_allclose(np.asarray(hidden), np.asarray(expected), atol=1e-5, rtol=1e-5)
    k0, v0 = caches[0]
    kv_heads, head_dim = model.layers[0].attn.kv_einsum.w.shape[1], model.layers[0].attn.q_einsum.w.shape[2]
    assert k0.shape == v0.shape == (b, t, kv_heads, head_dim)

    step = nnx.jit(lambda m, tok, at, caches: m.decode_step(tok[:, None], at[:, None], caches, at))
    for _ in range(STEPS):
        at = lengths.copy()  # the new token's index
        tokens[np.arange(b), at] = rng.integers(1, vocab, size=b)
        lengths = lengths + 1
        hidden, caches = step(model, jnp.asarray(tokens[np.arange(b), at]), jnp.asarray(at), caches)
        cached = np.asarray(model.logits(hidden))[:, 0]
        full = _full_logits(model, tokens, lengths)[np.arange(b), at]
        np.testing.assert_allclose(cached, full, atol=1e-4, rtol=1e-4)
    # Against the tiny Gemmas' 16-token window: row 1 crosses it while decoding, row 2 starts past it.
    assert LENGTHS[1] < 16 < LENGTHS[1] + STEPS and LENGTHS[2] > 16


@pytest.mark.parametrize("segment_masks", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_step_logits_equal_the_full_forward(
    tiny_models: dict[str, Path], family: str, segment_masks: bool
) -> None:
    loaded = load_hf(tiny_models[family], param_dtype=jnp.float32, dtype=jnp.float32)
    loaded.model.segment_masks = segment_masks  # the prefill's attention: masks or causal flags
    _assert_decode_equals_forward(loaded.model, loaded.cfg.vocab_size)


def _random_adapters(model: Transformer, seed: int) -> None:
    """All seven projections adapted, B non-zero, so every adapter changes the function."""
    model.add_lora(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], rank=4, alpha=8
    )
    key = jax.random.key(seed)
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.LoRAParam) and path[-1] == "b":
            key, sub = jax.random.split(key)
            var[...] = jax.random.normal(sub, var.shape, var.dtype) * 0.05


@pytest.mark.parametrize("family", ["llama", "gemma4"])
def test_decode_step_with_lora_adapters(tiny_models: dict[str, Path], family: str) -> None:
    loaded = load_hf(tiny_models[family], param_dtype=jnp.float32, dtype=jnp.float32)
    base = _full_logits(loaded.model, np.ones((1, 4), np.int32), np.asarray([4]))
    _random_adapters(loaded.model, seed=3)
    assert not np.allclose(_full_logits(loaded.model, np.ones((1, 4), np.int32), np.asarray([4])), base)
    _assert_decode_equals_forward(loaded.model, loaded.cfg.vocab_size, seed=1)


def test_decode_step_with_attention_softcap() -> None:
    """Gemma 2 style soft-capped attention logits (no fused kernel: the einsum path in both)."""
    raw = tiny_config("gemma3", **TINY_SHAPE)
    raw.attn_logit_softcapping = 0.5  # small enough to bite on random logits
    raw.sliding_window = 16
    cfg = config_from_hf(raw.to_dict())
    assert cfg.attn_softcap == 0.5
    model = Transformer(cfg, rngs=nnx.Rngs(4), dtype=jnp.float32)
    _assert_decode_equals_forward(model, cfg.vocab_size, seed=2)


def test_generate_with_a_stop_id_keeps_the_other_rows_going() -> None:
    """A row that stops early leaves the batch; the others decode as they would alone."""
    raw = tiny_config("llama", **TINY_SHAPE)
    model = Transformer(config_from_hf(raw.to_dict()), rngs=nnx.Rngs(5), dtype=jnp.float32)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
    alone = [generate(model, [p], max_new_tokens=10) for p in prompts]
    stop = alone[0][0][2]  # row 0's third token: it stops there
    together = generate(model, prompts, max_new_tokens=10, stop_ids=[stop])
    assert together[0] == alone[0][0][: alone[0][0].index(stop) + 1]
    cut = alone[1][0]
    expected = cut[: cut.index(stop) + 1] if stop in cut else cut
    assert together[1] == expected


SHARDED = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from accelbench.bridge import load_hf
from accelbench.bridge.convert import sharded_placer
from accelbench.jaxmodels.generate import buffer, make_decoder
from accelbench.workers.finetune.jax_worker.mesh import batch_sharding, build_mesh, param_sharding
from accelbench.workers.finetune.jax_worker.step import split_model

model_dir, plan = sys.argv[1], json.loads(sys.argv[2])
mesh = build_mesh(plan.get("fsdp", 1), plan.get("tp", 1))
place = sharded_placer(param_sharding(mesh))
loaded = load_hf(model_dir, param_dtype=jnp.float32, dtype=jnp.float32, place=place)
loaded.model.add_lora(["q_proj", "v_proj", "o_proj"], rank=4, alpha=8)
split = split_model(loaded.model, lora=True)
prompts = [[5 + i for i in range(n)] for n in (3, 14, 21, 9)]
tokens, lengths = buffer(prompts, 4, 48, 0)
replicated = NamedSharding(mesh, PartitionSpec())
rows = batch_sharding(mesh, 2, 0) if plan.get("rows_sharded") else replicated
lengths_sharding = batch_sharding(mesh, 1, 0) if plan.get("rows_sharded") else replicated
decode = make_decoder(split.graphdef, max_new_tokens=20, stop_ids=[], out_sharding=replicated)
out, ends = decode(
    (split.trainable, split.frozen),
    jax.device_put(tokens, rows),
    jax.device_put(lengths, lengths_sharding),
    jax.random.key(0),
)
print("RESULT " + json.dumps({"tokens": np.asarray(out).tolist(), "ends": np.asarray(ends).tolist(),
      "devices": len(jax.devices())}))
"""


def test_sharded_decode_equals_one_device(tiny_models: dict[str, Path]) -> None:
    """The decoder on a 4-device CPU mesh (fsdp × tp sharded weights; rows replicated as pass@k has them,
    or split over the data axis) writes the tokens a one-device run writes."""
    import json
    import os
    import subprocess
    import sys

    def run(plan: dict[str, object], devices: int) -> dict[str, object]:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        args = [sys.executable, "-c", SHARDED, str(tiny_models["gemma4"]), json.dumps(plan)]
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=180, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, done.stdout + done.stderr
        return json.loads(lines[-1].removeprefix("RESULT "))

    single = run({}, 1)
    for plan in ({"fsdp": 2, "tp": 2}, {"tp": 2, "rows_sharded": True}):
        sharded = run(plan, 4)
        assert sharded["devices"] == 4
        assert (sharded["tokens"], sharded["ends"]) == (single["tokens"], single["ends"]), plan

"""Bridge: HF -> JAX -> HF is bit-exact; sharded checkpoints load; LoRA merges into servable weights."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from jax_helpers import FAMILIES, hf_logits, packed_inputs
from safetensors.numpy import load_file

import jax
from accelbench.bridge import export_hf, export_peft_adapter, load_hf, load_orbax, save_orbax
from accelbench.bridge.hf_files import INDEX, TensorReader, copy_side_files, write_tensors
from accelbench.jaxmodels import Transformer


def _all_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    with TensorReader(model_dir) as reader:
        return {n: reader.get(n) for n in reader.names()}


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_bit_exact(tiny_models: dict[str, Path], family: str, tmp_path: Path) -> None:
    src = tiny_models[family]
    loaded = load_hf(src)
    out = export_hf(loaded.model, loaded.cfg, src, tmp_path / "out", layout=loaded.layout)
    before, after = _all_tensors(src), _all_tensors(out)
    # A tied checkpoint may carry lm_head as a duplicate of the embedding; it is not rewritten.
    if loaded.cfg.tied_embeddings:
        before.pop(loaded.layout.lm_head, None)
    assert sorted(before) == sorted(after)
    for name, arr in before.items():
        assert arr.dtype == after[name].dtype, name
        assert np.array_equal(arr, after[name]), name
    assert json.loads((out / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()


def test_sharded_checkpoint_loads_like_a_single_file(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    src = tiny_models["llama"]
    shards = write_tensors(_all_tensors(src), tmp_path, shard_bytes=200_000)
    copy_side_files(src, tmp_path)
    assert len(shards) > 2 and (tmp_path / INDEX).exists()
    one, many = load_hf(src).model, load_hf(tmp_path).model
    for a, b in zip(jax.tree.leaves(nnx.state(one)), jax.tree.leaves(nnx.state(many)), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def _with_random_adapters(model: Transformer, seed: int) -> None:
    """Adapters start with B = 0; give B values so the merge has something to merge."""
    model.add_lora(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], rank=4, alpha=8
    )
    state = nnx.state(model, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(seed), 1000))
    state = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape, x.dtype) * 0.05, state)
    nnx.update(model, state)


def _jax_logits(model: Transformer, batch: dict[str, np.ndarray]) -> np.ndarray:
    args = (jnp.asarray(batch[k]) for k in ("input_ids", "positions", "segment_ids"))
    return np.asarray(model(*args))


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_lora_export_loads_in_transformers(
    tiny_models: dict[str, Path], family: str, tmp_path: Path
) -> None:
    src = tiny_models[family]
    loaded = load_hf(src)
    _with_random_adapters(loaded.model, seed=1)
    batch = packed_inputs(seed=2)
    row = batch["input_ids"][1][batch["segment_ids"][1] == 1][None]
    expected = _jax_logits(loaded.model, {"input_ids": row, "positions": np.arange(row.shape[1])[None],
                                          "segment_ids": np.ones_like(row)})  # fmt: skip
    out = export_hf(loaded.model, loaded.cfg, src, tmp_path / "merged", layout=loaded.layout)
    np.testing.assert_allclose(hf_logits(out, row), expected, atol=1e-4, rtol=1e-4)
    # The same adapters unmerged, as a PEFT adapter on top of the untouched base model.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = export_peft_adapter(
        loaded.model, loaded.layout, tmp_path / "adapter", rank=4, alpha=8, base=str(src)
    )
    base = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager")
    peft_model = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        got = peft_model(torch.from_numpy(row.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_orbax_round_trip_keeps_adapters(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    src = tiny_models["gemma3"]
    loaded = load_hf(src)
    _with_random_adapters(loaded.model, seed=3)
    save_orbax(loaded.model, tmp_path / "ckpt", src)
    restored = load_orbax(tmp_path / "ckpt")
    batch = packed_inputs(seed=4)
    np.testing.assert_array_equal(_jax_logits(restored, batch), _jax_logits(loaded.model, batch))
    assert load_file(str(src / "model.safetensors"))  # the source stays untouched


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])  # gemma4: its layer_scalar buffers travel too
def test_convert_cli_round_trip_through_orbax_and_jax(
    tiny_models: dict[str, Path], tmp_path: Path, family: str
) -> None:
    from accelbench.cli import main

    src = tiny_models[family]
    steps = [("hf", "orbax", src, tmp_path / "o"), ("orbax", "jax", tmp_path / "o", tmp_path / "j"),
             ("jax", "hf", tmp_path / "j", tmp_path / "h")]  # fmt: skip
    for source, target, model_dir, out in steps:
        argv = ["convert", "--from", source, "--to", target, "--model-dir", str(model_dir), "--out", str(out)]
        assert main(argv) == 0
    before, after = _all_tensors(src), _all_tensors(tmp_path / "h")
    before.pop("lm_head.weight", None)
    assert sorted(before) == sorted(after)
    assert all(np.array_equal(before[n], after[n]) for n in before)

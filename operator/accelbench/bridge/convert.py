"""Hugging Face checkpoint <-> NNX model, Orbax checkpoints, and merged-LoRA export.

Loading streams one parameter at a time: read its HF tensors, change the layout, cast, and place it
on the devices with the caller's sharding (`jax.make_array_from_callback`, so every process of a
multi-host job creates only its own shards). Export gathers one parameter at a time to the host.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax

from ..jaxmodels.config import ModelConfig, config_from_hf, load_config
from ..jaxmodels.layers import Buffer
from ..jaxmodels.lora import LoRA
from ..jaxmodels.transformer import Transformer, abstract_model
from .hf_files import TensorReader, copy_side_files, write_tensors
from .mapping import HfLayout, rules
from .mapping import Path as TreePath

Placer = Callable[[TreePath, np.ndarray], jax.Array]
LORA_META = "accelbench_lora.json"
# Everything a checkpoint stores: weights, adapters and buffers (Gemma 4's layer_scalar).
STORED = nnx.Any(nnx.Param, Buffer)


@dataclass
class LoadedModel:
    model: Transformer
    cfg: ModelConfig
    layout: HfLayout
    extra_names: tuple[str, ...]  # tensors the decoder does not use (a vision tower): passed through


def default_placer(path: TreePath, arr: np.ndarray) -> jax.Array:
    return jnp.asarray(arr)


def sharded_placer(sharding_for: Callable[[TreePath, tuple[int, ...]], jax.sharding.Sharding]) -> Placer:
    """Place each parameter with the sharding a rule gives for its path; works across processes."""

    def place(path: TreePath, arr: np.ndarray) -> jax.Array:
        sharding = sharding_for(path, arr.shape)
        return jax.make_array_from_callback(arr.shape, sharding, lambda index: arr[index])

    return place


def load_hf(
    model_dir: str | Path,
    *,
    param_dtype: jnp.dtype = jnp.float32,
    dtype: jnp.dtype = jnp.float32,
    remat: bool = False,
    remat_policy: str = "full",
    place: Placer = default_placer,
) -> LoadedModel:
    """Build the NNX model for a Hugging Face directory without ever allocating random weights."""
    cfg = load_config(model_dir)
    abstract = abstract_model(
        cfg, param_dtype=param_dtype, dtype=dtype, remat=remat, remat_policy=remat_policy
    )
    graphdef, state = nnx.split(abstract)
    flat = nnx.to_flat_state(state)
    with TensorReader(model_dir) as reader:
        layout = HfLayout.detect(reader.names())
        by_path = {r.path: r for r in rules(cfg, layout)}
        used: set[str] = set()
        for path, var in flat:
            rule = by_path[path]
            arr = rule.to_jax([reader.get(n) for n in rule.hf_names]).astype(param_dtype)
            var.set_value(place(path, arr))
            used.update(rule.hf_names)
        # A tied checkpoint may still carry a copy of lm_head: it is the embedding, not an extra.
        extras = tuple(n for n in reader.names() if n not in used and n != layout.lm_head)
    model = nnx.merge(graphdef, nnx.from_flat_state(flat))
    return LoadedModel(model, cfg, layout, extras)


def to_host(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def base_params(model: Transformer) -> dict[TreePath, jax.Array]:
    state = nnx.state(model, nnx.All(STORED, nnx.Not(nnx.LoRAParam)))
    return {path: var.get_value() for path, var in nnx.to_flat_state(state)}


# Where each adapter's dense update [*in, *out] lands in the einsum layout.
def _merge_target(name: str) -> tuple[str, str, int | None, tuple[int, ...] | None]:
    """(submodule, weight module, index into a fused weight, transpose of the delta)."""
    return {
        "q_lora": ("attn", "q_einsum", None, (1, 0, 2)),  # [D,N,H] -> [N,D,H]
        "k_lora": ("attn", "kv_einsum", 0, (1, 0, 2)),
        "v_lora": ("attn", "kv_einsum", 1, (1, 0, 2)),
        "o_lora": ("attn", "attn_vec_einsum", None, None),  # [N,H,D] already
        "gate_lora": ("mlp", "gating_einsum", 0, (1, 0)),  # [D,F] -> [F,D]
        "up_lora": ("mlp", "gating_einsum", 1, (1, 0)),
        "down_lora": ("mlp", "linear", None, None),  # [F,D] already
    }[name]


def adapters(model: Transformer) -> Iterator[tuple[int, str, LoRA]]:
    for i, block in enumerate(model.layers):
        for sub in (block.attn, block.mlp):
            for name in ("q_lora", "k_lora", "v_lora", "o_lora", "gate_lora", "up_lora", "down_lora"):
                lora = getattr(sub, name, None)
                if isinstance(lora, LoRA):
                    yield i, name, lora


def merged_params(model: Transformer) -> dict[TreePath, np.ndarray]:
    """Host copies of the base weights with every adapter folded in: W + alpha/r·(A·B), in float32."""
    params = {path: to_host(x) for path, x in base_params(model).items()}
    for i, name, lora in adapters(model):
        sub, weight, index, perm = _merge_target(name)
        path = ("layers", i, sub, weight, "w")
        delta = to_host(lora.delta())
        delta = delta if perm is None else delta.transpose(perm)
        merged = params[path].astype(np.float32)
        if index is None:
            merged = merged + delta
        else:
            merged[index] = merged[index] + delta
        params[path] = merged.astype(params[path].dtype)
    return params


def hf_tensors(
    params: dict[TreePath, np.ndarray], cfg: ModelConfig, layout: HfLayout, dtype: np.dtype | None
) -> Iterator[tuple[str, np.ndarray]]:
    for rule in rules(cfg, layout):
        for name, arr in zip(rule.hf_names, rule.to_hf(params[rule.path]), strict=True):
            yield name, arr if dtype is None else arr.astype(dtype)


def _config_dtype(raw: dict[str, Any]) -> np.dtype | None:
    name = raw.get("dtype") or raw.get("torch_dtype") or (raw.get("text_config") or {}).get("dtype")
    table = {"float32": np.float32, "float16": np.float16, "bfloat16": jnp.bfloat16}
    return np.dtype(table[name]) if name in table else None


def _text_only(raw: dict[str, Any]) -> dict[str, Any]:
    """A multimodal Gemma 3/4 config reduced to its decoder, for exports without the vision tower."""
    text = dict(raw["text_config"])
    if raw.get("model_type") == "gemma4":
        text.update(model_type="gemma4_text", architectures=["Gemma4ForCausalLM"])
    else:
        text.update(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"])
    return text


def export_hf(
    model: Transformer,
    cfg: ModelConfig,
    src_dir: str | Path,
    out_dir: str | Path,
    *,
    layout: HfLayout | None = None,
    merge_lora: bool = True,
    dtype: np.dtype | None = None,
) -> Path:
    """Write a Hugging Face directory a serving engine loads: weights, config.json, tokenizer files.

    dtype None: the dtype config.json names (what the source checkpoint was published in).
    Tensors the decoder does not use (a vision tower) are copied from src_dir when it has them;
    otherwise a multimodal config is reduced to the text-only decoder.
    """
    src, out = Path(src_dir), Path(out_dir)
    raw = json.loads((src / "config.json").read_text())
    if not merge_lora and any(True for _ in adapters(model)):
        raise ValueError("export_hf writes full weights; use export_peft_adapter for unmerged LoRA")
    params = merged_params(model)
    extras = _source_extras(src, layout)
    if layout is None or (extras is None and "text_config" in raw):
        layout = HfLayout(prefix="model.", lm_head="lm_head.weight")
        raw = _text_only(raw) if "text_config" in raw else raw
    target = dtype if dtype is not None else _config_dtype(raw)
    tensors = hf_tensors(params, cfg, layout, target)
    if jax.process_index() == 0:
        write_tensors(_chain(tensors, extras), out)
        copy_side_files(src, out, skip=("config.json",))
        (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out


def _source_extras(src: Path, layout: HfLayout | None) -> Iterator[tuple[str, np.ndarray]] | None:
    if layout is None or not any(src.glob("*.safetensors")):
        return None
    reader = TensorReader(src)
    names = [n for n in reader.names() if not n.startswith(layout.prefix) and n != layout.lm_head]
    return ((n, reader.get(n)) for n in names)


def _chain(
    first: Iterator[tuple[str, np.ndarray]], second: Iterator[tuple[str, np.ndarray]] | None
) -> Iterator[tuple[str, np.ndarray]]:
    yield from first
    if second is not None:
        yield from second


def peft_tensors(model: Transformer, layout: HfLayout) -> dict[str, np.ndarray]:
    """Adapters in PEFT's names and layout: lora_A [r, in], lora_B [out, r]."""
    out: dict[str, np.ndarray] = {}
    for i, name, lora in adapters(model):
        sub = "self_attn" if name in ("q_lora", "k_lora", "v_lora", "o_lora") else "mlp"
        proj = name.removesuffix("_lora") + "_proj"
        base = f"base_model.model.{layout.prefix}layers.{i}.{sub}.{proj}"
        a, b = to_host(lora.a.get_value()), to_host(lora.b.get_value())
        rank = a.shape[-1]
        out[f"{base}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, rank).T)
        out[f"{base}.lora_B.weight"] = np.ascontiguousarray(b.reshape(rank, -1).T)
    return out


def export_peft_adapter(
    model: Transformer, layout: HfLayout, out_dir: str | Path, *, rank: int, alpha: float, base: str
) -> Path:
    """An unmerged adapter directory that `peft.PeftModel.from_pretrained(base_model, dir)` loads."""
    out = Path(out_dir)
    tensors = peft_tensors(model, layout)
    targets = sorted({n.split(".")[-3] for n in tensors})
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        from safetensors.numpy import save_file

        save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": rank,
            "lora_alpha": alpha,
            "lora_dropout": 0.0,
            "target_modules": targets,
            "bias": "none",
            "base_model_name_or_path": base,
        }
        (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


# --- JAX-side formats -------------------------------------------------------------------------


def _path_name(path: TreePath) -> str:
    return ".".join(str(p) for p in path)


def lora_meta(model: Transformer) -> dict[str, Any] | None:
    """targets/rank/alpha of the adapters a model carries (what a restore needs to rebuild them)."""
    found = list(adapters(model))
    if not found:
        return None
    names = sorted({name for _, name, _ in found})
    first = found[0][2]
    rank = int(first.a.get_value().shape[-1])
    targets = [n.removesuffix("_lora") + "_proj" for n in names]
    return {"targets": targets, "rank": rank, "alpha": first.scale * rank}


def save_jax_safetensors(model: Transformer, out_dir: str | Path, src_dir: str | Path) -> Path:
    """The JAX tree as-is (einsum layout, dotted nnx paths) in jax/model.safetensors, plus side files."""
    state = nnx.state(model, STORED)
    tensors = {_path_name(p): to_host(v.get_value()) for p, v in nnx.to_flat_state(state)}
    out = Path(out_dir)
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_tensors(tensors, out / "jax")
        copy_side_files(src_dir, out)
        meta = lora_meta(model)
        if meta is not None:
            (out / LORA_META).write_text(json.dumps(meta))
    return out


def _abstract_for(src: Path, param_dtype: jnp.dtype, dtype: jnp.dtype) -> tuple[Transformer, ModelConfig]:
    cfg = config_from_hf(json.loads((src / "config.json").read_text()))
    lora = json.loads((src / LORA_META).read_text()) if (src / LORA_META).exists() else None

    def build() -> Transformer:
        m = Transformer(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype, dtype=dtype)
        if lora is not None:
            m.add_lora(lora["targets"], rank=lora["rank"], alpha=lora["alpha"])
        return m

    return nnx.eval_shape(build), cfg


def load_jax_safetensors(
    src_dir: str | Path, *, param_dtype: jnp.dtype = jnp.float32, dtype: jnp.dtype = jnp.float32
) -> tuple[Transformer, ModelConfig]:
    """Restore a `save_jax_safetensors` directory."""
    src = Path(src_dir)
    abstract, cfg = _abstract_for(src, param_dtype, dtype)
    graphdef, state = nnx.split(abstract)
    flat = nnx.to_flat_state(state)
    with TensorReader(src / "jax") as reader:
        for path, var in flat:
            arr = reader.get(_path_name(path))
            var.set_value(jnp.asarray(arr if isinstance(var, nnx.LoRAParam) else arr.astype(param_dtype)))
    return nnx.merge(graphdef, nnx.from_flat_state(flat)), cfg


def save_orbax(model: Transformer, out_dir: str | Path, src_dir: str | Path) -> Path:
    """An Orbax checkpoint of every parameter (adapters unmerged) next to config.json and tokenizer."""
    import orbax.checkpoint as ocp

    out = Path(out_dir).absolute()
    state = nnx.state(model, STORED)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(out / "params", state, force=True)
    if jax.process_index() == 0:
        copy_side_files(src_dir, out)
        meta = lora_meta(model)
        if meta is not None:
            (out / LORA_META).write_text(json.dumps(meta))
    return out


def load_orbax(
    ckpt_dir: str | Path, *, param_dtype: jnp.dtype = jnp.float32, dtype: jnp.dtype = jnp.float32
) -> Transformer:
    """Restore a `save_orbax` directory (adapters re-attached when it has them)."""
    import orbax.checkpoint as ocp

    src = Path(ckpt_dir).absolute()
    abstract, _ = _abstract_for(src, param_dtype, dtype)
    graphdef, state = nnx.split(abstract)
    with ocp.StandardCheckpointer() as ckpt:
        restored = ckpt.restore(src / "params", state)
    return nnx.merge(graphdef, restored)

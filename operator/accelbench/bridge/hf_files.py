"""Hugging Face model directories on disk: (sharded) safetensors in, safetensors out, side files copied.

Tensors are read one at a time through `safe_open`, so converting a 27B checkpoint never holds more
than the tensors of one parameter in host memory beyond what the caller keeps.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Everything a serving engine or tokenizer needs next to the weights, except the weights themselves.
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
)
DEFAULT_SHARD_BYTES = 4 * 1024**3


class TensorReader:
    """Lazy access to every tensor of a model directory, by name, across shards."""

    def __init__(self, model_dir: str | Path) -> None:
        self.dir = Path(model_dir)
        self._files = _weight_files(self.dir)
        self._stack = ExitStack()
        self._handles = {
            f: self._stack.enter_context(safe_open(str(f), framework="numpy")) for f in self._files
        }
        self._where: dict[str, Path] = {}
        for f, h in self._handles.items():
            for name in h.keys():  # noqa: SIM118 - safe_open handles are not mappings
                self._where[name] = f

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        return self._handles[self._where[name]].get_tensor(name)


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    if (model_dir / SINGLE).exists():
        return [model_dir / SINGLE]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    return found


def write_tensors(
    tensors: Mapping[str, np.ndarray] | Iterator[tuple[str, np.ndarray]],
    out_dir: str | Path,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[Path]:
    """Write tensors as model.safetensors, or as numbered shards plus the index when they are large.

    A shard is written as soon as it is full, so host memory holds one shard, not the model.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    written: list[tuple[Path, list[str], int]] = []
    shard: dict[str, np.ndarray] = {}

    def flush() -> None:
        path = out / f".shard-{len(written) + 1}.tmp"
        save_file(shard, str(path), metadata={"format": "pt"})
        written.append((path, list(shard), sum(a.nbytes for a in shard.values())))
        shard.clear()

    for name, arr in items:
        if shard and sum(a.nbytes for a in shard.values()) + arr.nbytes > shard_bytes:
            flush()
        shard[name] = np.ascontiguousarray(arr)
    if shard or not written:
        flush()
    return _name_shards(out, written)


def _name_shards(out: Path, written: list[tuple[Path, list[str], int]]) -> list[Path]:
    if len(written) == 1:
        final = out / SINGLE
        written[0][0].replace(final)
        return [final]
    paths, weight_map = [], {}
    for i, (tmp, names, _) in enumerate(written, start=1):
        final = out / f"model-{i:05d}-of-{len(written):05d}.safetensors"
        tmp.replace(final)
        paths.append(final)
        weight_map.update(dict.fromkeys(names, final.name))
    index = {"metadata": {"total_size": sum(n for _, _, n in written)}, "weight_map": weight_map}
    (out / INDEX).write_text(json.dumps(index, indent=2))
    return paths


def copy_side_files(src_dir: str | Path, out_dir: str | Path, *, skip: tuple[str, ...] = ()) -> None:
    src, out = Path(src_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in SIDE_FILES:
        if name not in skip and (src / name).exists():
            shutil.copy2(src / name, out / name)

"""`accelbench convert`: move a checkpoint between Hugging Face, JAX-layout safetensors and Orbax.

The arguments are declared in accelbench.cli, which stays free of JAX imports.

    accelbench convert --from hf --to orbax --model-dir D --out O
    accelbench convert --from orbax --to hf --model-dir O --out D2       (LoRA merged by default)
    accelbench convert --from orbax --to hf --no-merge-lora ...           (a PEFT adapter instead)

--model-dir and --out may be gs:// or s3:// prefixes: the input is copied into the local object cache
first (workers.storage, the workers' own copy code), the output written to a temporary directory and
uploaded with its manifest.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def convert(
    source: str, target: str, model_dir: str | Path, out: str | Path, *, merge_lora: bool = True
) -> Path:
    from . import convert as c

    if source == target:
        raise ValueError("--from and --to name the same format")
    src = Path(model_dir)
    if source == "hf":
        loaded = c.load_hf(src)
        model, cfg, layout, meta_dir = loaded.model, loaded.cfg, loaded.layout, src
    elif source == "orbax":
        model, cfg, layout, meta_dir = c.load_orbax(src), None, None, src
    else:
        (model, cfg), layout, meta_dir = c.load_jax_safetensors(src), None, src
    if target == "orbax":
        return c.save_orbax(model, out, meta_dir)
    if target == "jax":
        return c.save_jax_safetensors(model, out, meta_dir)
    if cfg is None:
        cfg = c.load_config(src)
    if not merge_lora and c.lora_meta(model) is not None:
        meta = c.lora_meta(model) or {}
        layout = layout or c.HfLayout(prefix="model.", lm_head="lm_head.weight")
        return c.export_peft_adapter(
            model, layout, out, rank=meta["rank"], alpha=meta["alpha"], base=str(src)
        )
    return c.export_hf(model, cfg, meta_dir, out, layout=layout)


def run(args: argparse.Namespace) -> int:
    import sys
    import tempfile

    from ..workers import storage

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    model_dir = args.model_dir
    if storage.is_object_store(model_dir):
        model_dir = storage.fetch(model_dir, storage.default_cache_dir(), log=log).path
    if not storage.is_object_store(args.out):
        path = convert(args.source, args.target, model_dir, args.out, merge_lora=args.merge_lora)
        print(f"wrote {path}")
        return 0
    storage.parse_uri(args.out)  # a malformed URI fails before the conversion
    with tempfile.TemporaryDirectory(prefix="accelbench-convert-") as tmp:
        convert(args.source, args.target, model_dir, tmp, merge_lora=args.merge_lora)
        storage.upload_dir(Path(tmp), args.out, log=log)
    print(f"wrote {args.out}")
    return 0

"""Write a random-weight Llama model dir in Hugging Face format at a catalog shape (run.py's child).

    python make_model.py SPEC.json OUT.json

SPEC: {"dir", "family": "llama", "size": "1b" | "tiny", "dtype": "bfloat16", "device": "cuda" | "cpu",
"max_positions"}. OUT: what was written, the parameter count, seconds, and the versions of what the
benchmark runs (torch, transformers, ..., the GPU torch sees).

The tests' generator (accelbench.workers.testing: tiny_config, write_tokenizer_files with the
family's special tokens and chat template) at the catalog's shape (catalog/data/models.yaml), with
two changes for serving:
- the tokenizer covers the model's whole vocabulary (128,256 ids for Llama 3): the tests' 512-token
  BPE would leave most ids a random-weight model emits without text. Here every id decodes: the
  6 special tokens, the 256 byte-level tokens, then ASCII pairs and triples (merges of those);
  prompts in English come out at about 2.5 characters per token.
- no end-of-sequence token in the generation config (nor config.json), so every answer runs to
  max_tokens: `transformers serve` refuses `ignore_eos`/`min_tokens`, and both load generators
  must see the output lengths they ask for.
"""

from __future__ import annotations

import itertools
import json
import string
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
VERSIONED = ("torch", "transformers", "tokenizers", "fastapi", "uvicorn", "starlette", "openai", "pydantic")
VERSIONED += ("aiperf", "aiohttp", "numpy", "accelerate", "huggingface-hub", "httptools", "uvloop")


def log(message: str) -> None:
    print(f"[make_model {time.perf_counter() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def byte_alphabet() -> dict[int, str]:
    """The byte-level BPE alphabet: printable Latin-1 bytes stand for themselves, the other bytes
    for the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def full_vocab_tokenizer(vocab_size: int, specials: list[str]) -> Any:
    """A byte-level BPE of exactly `vocab_size` tokens (ids 0..n-1 are `specials`)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    table = byte_alphabet()
    if set(table.values()) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("byte alphabet differs from the tokenizers library's ByteLevel alphabet")
    vocab: dict[str, int] = {}
    for token in [*specials, *(table[b] for b in range(256))]:
        vocab[token] = len(vocab)
    # Frequent characters first, so the pairs and triples that fill the vocabulary are text-like.
    order = " etaoinshrdlcumwfgypbvkjxqz" + string.ascii_uppercase + string.digits + string.punctuation
    chars = [table[ord(c)] for c in order]
    merges: list[tuple[str, str]] = []

    def add(left: str, right: str) -> None:
        if len(vocab) < vocab_size and left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append((left, right))

    for a, b in itertools.product(chars, chars):
        add(a, b)
    for top in range(len(chars)):  # triples over a growing alphabet: the most frequent first
        if len(vocab) >= vocab_size:
            break
        for i, j, k in itertools.product(range(top + 1), repeat=3):
            if max(i, j, k) == top:
                add(chars[i] + chars[j], chars[k])
    if len(vocab) != vocab_size:
        raise RuntimeError(f"built {len(vocab)} tokens, wanted {vocab_size}")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return tokenizer


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def build(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from accelbench.catalog import model_shape
    from accelbench.workers.testing import SPECIAL_TOKENS, tiny_config, write_tokenizer_files

    family = spec["family"]
    shape = model_shape(family, spec["size"])
    directory = Path(spec["dir"])
    result: dict[str, Any] = {
        "dir": str(directory),
        "shape": {
            k: getattr(shape, k)
            for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")
        },
        "tied_embeddings": shape.tied_embeddings,
        "reference": shape.reference,
    }
    marker = directory / "bench-spec.json"
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        log(f"reusing {directory}")
        result["reused"] = True
        result["parameters"] = json.loads((directory / "bench-built.json").read_text())["parameters"]
        return result
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    tick = time.perf_counter()
    tokenizer = full_vocab_tokenizer(shape.vocab, SPECIAL_TOKENS[family])
    log(f"tokenizer of {tokenizer.get_vocab_size()} tokens in {time.perf_counter() - tick:.1f}s")
    config = tiny_config(
        family,
        vocab_size=shape.vocab,
        layers=shape.layers,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        intermediate=shape.intermediate,
        dtype=spec["dtype"],
    )
    config.tie_word_embeddings = bool(shape.tied_embeddings)
    config.max_position_embeddings = max(int(config.max_position_embeddings), int(spec["max_positions"]))
    config.eos_token_id = None  # answers run to max_tokens (see the module docstring)
    device = spec["device"]
    torch.manual_seed(0)
    tick = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, spec["dtype"]))
    model.generation_config.eos_token_id = None
    parameters = sum(p.numel() for p in model.parameters())
    log(f"initialized {parameters / 1e9:.3f} B parameters on {device} in {time.perf_counter() - tick:.1f}s")
    tick = time.perf_counter()
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="10GB")
    write_tokenizer_files(directory, family, tokenizer)
    log(f"saved to {directory} in {time.perf_counter() - tick:.1f}s")
    del model
    saved = json.loads((directory / "generation_config.json").read_text())
    if saved.get("eos_token_id") is not None:
        raise RuntimeError(f"generation_config.json still has eos_token_id {saved['eos_token_id']}")
    (directory / "bench-built.json").write_text(json.dumps({"parameters": parameters}))
    marker.write_text(json.dumps(spec))
    result.update(
        reused=False,
        parameters=parameters,
        weight_bytes=sum(p.stat().st_size for p in directory.glob("*.safetensors")),
    )
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    out: dict[str, Any] = {"versions": versions(), "python": sys.version.split()[0]}
    import torch

    out["torch_cuda"] = bool(torch.cuda.is_available())
    if out["torch_cuda"]:
        out["torch_device"] = torch.cuda.get_device_name(0)
        out["torch_cuda_version"] = torch.version.cuda
    elif spec["device"] != "cpu":
        raise SystemExit(f"device {spec['device']!r} asked for, but torch sees no CUDA device")
    out["model"] = build(spec)
    out["seconds"] = time.perf_counter() - STARTED
    Path(argv[1]).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

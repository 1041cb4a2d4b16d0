"""Tiny random-weight models and chat datasets, made offline, for tests and `make demo`.

`make_tiny_model` writes a real Hugging Face model dir: config.json as transformers saves it,
model.safetensors (random init by transformers), and a byte-level BPE tokenizer trained on a built-in
corpus with the family's chat special tokens and a chat template in tokenizer_config.json.
Everything is deterministic in its arguments.

    python -m accelbench.workers.testing --model-dir D --family llama --dataset F.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .data import GEMMA_TEMPLATE, LLAMA_TEMPLATE

FAMILIES = ("llama", "gemma3", "gemma4")
VOCAB_SIZE = 512

# Special tokens per family, in id order (ids 0..n-1); the names are the real families' names so the
# built-in chat templates of workers.data apply unchanged.
SPECIAL_TOKENS: dict[str, list[str]] = {
    "gemma3": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
    # The tiny Gemma 4 reuses Gemma 3's turn tokens, so the built-in Gemma chat template applies.
    "gemma4": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
    "llama": [
        "<|finetune_right_pad_id|>",
        "<|end_of_text|>",
        "<|begin_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ],
}
# (pad, eos, bos) token of each family, by name
ROLE_TOKENS = {
    "gemma3": ("<pad>", "<eos>", "<bos>"),
    "gemma4": ("<pad>", "<eos>", "<bos>"),
    "llama": ("<|finetune_right_pad_id|>", "<|eot_id|>", "<|begin_of_text|>"),
}

_WORD_TEXT = (
    "zero one two three four five six seven eight nine ten eleven twelve plus minus times is the "
    "what how many a an of and or not sum answer question model user assistant please compute add "
    "subtract number result equals value red green blue cat dog tree river stone light dark"
)
_WORDS = _WORD_TEXT.split()


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(400)]
    lines += [f"{a} plus {b} is {a + b}. {a} times {b} is {a * b}." for a in range(13) for b in range(13)]
    return [*lines, "user", "model", "assistant", "system"]


def build_tokenizer(family: str, vocab_size: int = VOCAB_SIZE, seed: int = 0) -> Any:
    """A byte-level BPE (no unknown tokens) trained on the built-in corpus; specials get ids 0..5."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS[family],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    return tokenizer


def tiny_config(
    family: str,
    *,
    vocab_size: int,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    dtype: str,
) -> Any:
    specials = SPECIAL_TOKENS[family]
    pad, eos, bos = (specials.index(t) for t in ROLE_TOKENS[family])
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
    )
    if family == "llama":
        from transformers import LlamaConfig

        config = LlamaConfig(**common, tie_word_embeddings=False)
    elif family == "gemma3":
        from transformers import Gemma3TextConfig

        # Alternate local and global layers so both mask kinds are exercised even at two layers.
        layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        config = Gemma3TextConfig(
            **common, sliding_window=16, layer_types=layer_types, query_pre_attn_scalar=head_dim
        )
    elif family == "gemma4":
        from transformers import Gemma4TextConfig

        # The 31B's features at test size: local/global layers, global layers with twice the head
        # size, one KV head and values = keys, proportional (partial) rope on global layers, final
        # soft-cap (small enough to matter for tiny logits), no per-layer input embeddings
        # (hidden_size_per_layer_input defaults to 256).
        layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        config = Gemma4TextConfig(
            **common,
            sliding_window=16,
            layer_types=layer_types,
            global_head_dim=2 * head_dim,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=0,
            final_logit_softcapping=2.0,  # the 31B has 30; tiny logits stay below 1
        )
    else:
        raise ValueError(f"family {family!r} is not one of {FAMILIES}")
    config.dtype = dtype
    return config


def make_tiny_model(
    directory: str | Path,
    family: str = "llama",
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    seed: int = 0,
    dtype: str = "float32",
) -> Path:
    """Write a random-weight Hugging Face model dir and return its path."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(family, seed=seed)
    config = tiny_config(
        family,
        vocab_size=tokenizer.get_vocab_size(),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        dtype=dtype,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if family == "gemma4":
        _perturb_gemma4_scales(model, seed)
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer_files(directory, family, tokenizer)
    return directory


def _perturb_gemma4_scales(model: Any, seed: int) -> None:
    """Gemma 4 initializes every norm scale and layer_scalar to exactly 1, which would hide a wrong
    norm convention or a dropped scalar; spread them around 1 (deterministically) instead."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("norm.weight", "layer_scalar")):
                noise = torch.rand(tensor.shape, generator=generator, dtype=torch.float32)
                tensor.copy_((0.75 + 0.5 * noise).to(tensor.dtype))


def write_tokenizer_files(directory: Path, family: str, tokenizer: Any) -> None:
    tokenizer.save(str(directory / "tokenizer.json"))
    pad, eos, bos = ROLE_TOKENS[family]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": 4096,
        "add_bos_token": False,  # the chat template writes the BOS token itself
        "chat_template": GEMMA_TEMPLATE if family.startswith("gemma") else LLAMA_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": bos, "eos_token": eos, "pad_token": pad}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


_NUMBER_TEXT = "zero one two three four five six seven eight nine ten eleven twelve"
_NUMBERS = _NUMBER_TEXT.split()


def _sample(rng: random.Random) -> tuple[str, str, str]:
    """(system, prompt, completion): small arithmetic a tiny model can start to learn in a few steps."""
    a, b = rng.randrange(13), rng.randrange(13)
    kind = rng.choice(["plus", "times", "words"])
    if kind == "plus":
        return "Answer with the sum.", f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == "times":
        return "Answer with the product.", f"What is {a} times {b}?", f"{a} times {b} is {a * b}."
    return "Spell the number.", f"How is {a} written?", f"{a} is written {_NUMBERS[a]}."


def make_chat_dataset(path: str | Path, n: int = 64, seed: int = 0, format: str = "chat") -> Path:
    """A JSONL dataset of `n` rows: chat `messages` (system, user, assistant) or prompt/completion."""
    if format not in ("chat", "promptCompletion"):
        raise ValueError("format is chat or promptCompletion")
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for _ in range(n):
        system, prompt, completion = _sample(rng)
        if format == "chat":
            row: dict[str, Any] = {
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": completion},
                ]
            }
        else:
            row = {"prompt": prompt, "completion": completion}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelbench.workers.testing", description=__doc__)
    parser.add_argument("--model-dir", help="write a tiny model here")
    parser.add_argument("--family", choices=FAMILIES, default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dataset", help="write a chat JSONL dataset here")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--format", choices=("chat", "promptCompletion"), default="chat")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.model_dir and not args.dataset:
        parser.error("give --model-dir and/or --dataset")
    if args.model_dir:
        print(f"wrote {make_tiny_model(args.model_dir, args.family, layers=args.layers, seed=args.seed)}")
    if args.dataset:
        print(f"wrote {make_chat_dataset(args.dataset, args.rows, args.seed, args.format)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

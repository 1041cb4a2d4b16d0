"""Quantization from per-layer sensitivity on one GPU (issue 18 part 3), on a TinyLlama-1.1B-shaped
model that has learned something first.

Nothing can be downloaded on the device, and a random-weight model's perplexity is the vocabulary
size whatever is done to it, so the model is first trained by the PyTorch worker itself
(`python -m accelbench.workers.finetune`, full fine-tuning from random weights) on the tests'
synthetic chat corpus, then quantized by `python -m accelbench.workers.quantize` at each budget,
calibrated and evaluated on text generated with another seed (never seen in training).

    source benchmarks/device_setup.sh       # carry benchmarks/.devicewheels
    python3 benchmarks/quantize/run.py --out $OUT/quantize

Results: one report JSON per budget (the per-layer sensitivity table inside), results.md, run.log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# TinyLlama-1.1B (catalog-free: its config.json values): 22 layers, hidden 2048, 32 heads, 4 KV heads.
TINYLLAMA = {"layers": 22, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 64, "intermediate": 5632}


def run(argv: list[str], log: Path, env: dict[str, str]) -> float:
    tick = time.perf_counter()
    with log.open("a") as sink:
        sink.write(f"\n$ {' '.join(argv)}\n")
        sink.flush()
        done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if done.returncode:
        sys.exit(f"{argv[2]} exited {done.returncode}; see {log}")
    return time.perf_counter() - tick


def long_chats(path: Path, n: int, seed: int, turns: int) -> Path:
    """`n` conversations of `turns` question-answer turns each (the tests' synthetic arithmetic,
    `workers.testing._sample`), so one conversation fills about one training row. The fine-tuning
    data path restarts positions and attention at every conversation, while the quantize worker
    measures windows of `seq` tokens with positions 0..seq-1 and no document mask: a model trained
    only on 52-token conversations sees positions it never learned there (perplexity 216 in the
    first full run). Long conversations make the measured windows the text the model was trained on.
    """
    import random

    from accelbench.workers.testing import _sample

    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        messages = [{"role": "system", "content": "Answer each question."}]
        for _ in range(turns):
            _, prompt, completion = _sample(rng)
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n")
    return path


def summarize(out: Path, budgets: list[str], results: dict) -> list[str]:
    """results.md (the table of the budgets done so far) and results.json."""
    import torch

    header = (
        "| budget | effective bits (layers) | whole model | compression | formats | ppl bf16 → quantized "
    )
    header += "| Δ ppl | prefill tok/s bf16 → quantized | decode tok/s bf16 → quantized "
    header += "| weight GB bf16 → quantized |"
    rows = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for budget in budgets:
        r = json.loads((out / f"report-{budget}.json").read_text())
        rows.append(
            f"| {budget} | {r['effective_bits']:.3f} | {r['model_effective_bits']:.3f} "
            f"| {r['compression']:.2f}× "
            f"| {r['formats_used']} | {r['perplexity_bf16']:.3f} → {r['perplexity_quantized']:.3f} "
            f"| {100 * r['perplexity_increase']:+.2f} % | {r['prefill_tokens_per_second_bf16']:,.0f} → "
            f"{r['prefill_tokens_per_second_quantized']:,.0f} | {r['decode_tokens_per_second_bf16']:,.1f} → "
            f"{r['decode_tokens_per_second_quantized']:,.1f} | {r['weight_bytes_bf16'] / 1e9:.3f} → "
            f"{r['weight_bytes_quantized'] / 1e9:.3f} |"
        )
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    (out / "results.md").write_text(f"device: {device}\n\n" + "\n".join(rows) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results")) / "quantize")
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantize-work"))
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--budgets", default="4.25,4.5,5.0")
    parser.add_argument("--accelerator", default="h200", help="catalog type of this GPU (MFU peak)")
    parser.add_argument(
        "--dry-run-cpu", action="store_true", help="a tiny shape on the CPU: tests the script"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "operator"))
    import torch
    from transformers import AutoModelForCausalLM

    from accelbench.workers.testing import (
        build_tokenizer,
        tiny_config,
        write_tokenizer_files,
    )

    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.out / "run.log"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{os.environ.get('PYTHONPATH', '')}"}
    model_dir, trained = args.work / "tinyllama-random", args.work / "tinyllama-trained"
    shape, vocab, seq = dict(TINYLLAMA), 32000, 1024
    if args.dry_run_cpu:
        shape = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 256}
        vocab, seq, args.train_steps, args.accelerator = 1024, 64, 4, "cpu"
    tokenizer = build_tokenizer("llama")
    config = tiny_config("llama", vocab_size=vocab, dtype="bfloat16", **shape)
    config.max_position_embeddings = 2048
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir, safe_serialization=True)
    write_tokenizer_files(model_dir, "llama", tokenizer)
    del model
    # About 28 tokens a turn: conversations of about `seq` tokens (a few are cut at `seq` in training,
    # so every position up to seq-1 is trained). 16 rows a step, none repeated.
    turns = max(1, seq // 28)
    train_data = long_chats(args.work / "train.jsonl", n=16 * args.train_steps + 64, seed=0, turns=turns)
    eval_data = long_chats(args.work / "eval.jsonl", n=64, seed=1, turns=turns)
    manifest = {
        "apiVersion": "accelbench.io/v1alpha1",
        "kind": "FinetuneJob",
        "metadata": {"name": "quantize-base"},
        "spec": {
            "model": {"uri": str(model_dir), "family": "llama", "parameters": parameters},
            "dataset": {"uri": str(train_data), "format": "chat", "heldOutFraction": 0.02},
            "method": {"type": "full"},
            "framework": "pytorch",
            "training": {"seqLength": seq, "globalBatchSize": 16, "maxSteps": args.train_steps,
                         "learningRate": 3e-4, "warmupSteps": 10, "schedule": "cosine", "lossOn": "full"},
            "accelerator": {"type": args.accelerator, "count": 1},
            "output": {"uri": str(trained)},
        },
    }  # fmt: skip
    job = args.work / "train.json"
    job.write_text(json.dumps(manifest))
    results: dict = {"model": {"shape": shape, "vocab": vocab, "parameters": parameters}, "runs": {}}
    results["train_seconds"] = run(
        [sys.executable, "-m", "accelbench.workers.finetune", "--job", str(job)], log, env
    )
    for budget in args.budgets.split(","):
        report = args.out / f"report-{budget}.json"
        argv = [
            sys.executable,
            "-m",
            "accelbench.workers.quantize",
            "--model",
            str(trained),
            "--data",
            str(eval_data),
        ]
        argv += ["--out", str(args.work / f"q-{budget}"), "--report", str(report), "--budget-bits", budget]
        argv += [
            "--formats",
            "int4-g128,int8,bf16",
            "--seq",
            "1024",
            "--calibration",
            "16",
            "--held-out",
            "16",
        ]
        argv += ["--batch", "8"]
        results["runs"][budget] = {"seconds": run(argv, log, env), "report": report.name}
        # After every budget, so a run stopped by a time limit keeps the table of those done.
        rows = summarize(args.out, list(results["runs"]), results)
        print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

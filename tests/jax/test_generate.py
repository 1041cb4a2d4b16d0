"""Decoding: JAX greedy = transformers' greedy generate, token for token; sampling; a JAX worker run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax_helpers import FAMILIES, manifest, run
from transformers import AutoModelForCausalLM

import jax
from accelbench.api.finetune import Checker, PassAtK
from accelbench.bridge import load_hf
from accelbench.jaxmodels.generate import generate, pick_token
from accelbench.workers.data import ChatTokenizer
from accelbench.workers.finetune.generate_torch import make_generate
from accelbench.workers.finetune.passk import PassAtKTask, load_problems, stop_token_ids

NEW_TOKENS = 20


def _task(model_dir: Path, family: str, dataset: Path, tmp_path: Path) -> PassAtKTask:
    """Three chat problems of different prompt lengths (the batch needs padding), greedy."""
    tok = ChatTokenizer.from_model_dir(model_dir, family)
    rows = [json.loads(line) for line in dataset.read_text().splitlines()[:3]]
    rows[1]["messages"][1]["content"] += " Please answer with words, then digits."
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = PassAtK(dataset=str(path), max_new_tokens=NEW_TOKENS, checker=Checker(command=["true"]))
    return PassAtKTask(spec, load_problems(path, tok), tok, stop_token_ids(model_dir, tok))


@pytest.mark.parametrize("family", FAMILIES)
def test_jax_greedy_equals_transformers_generate(
    tiny_models: dict[str, Path], chat_dataset: Path, tmp_path: Path, family: str
) -> None:
    model_dir = tiny_models[family]
    task = _task(model_dir, family, chat_dataset, tmp_path)
    prompts = [p.prompt_ids for p in task.problems]
    assert len({len(p) for p in prompts}) > 1
    if family.startswith("gemma"):  # prompt + completion run past the 16-token sliding window
        assert min(len(p) for p in prompts) + NEW_TOKENS > 2 * 16

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    one_by_one = []
    for prompt in prompts:
        out = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=list(task.stop_ids),
            pad_token_id=task.tokenizer.pad_id,
        )
        one_by_one.append(out[0, len(prompt) :].tolist())
    batched = make_generate(hf, task, torch.device("cpu"))(prompts, 0)  # the worker's path: left padding

    loaded = load_hf(model_dir, param_dtype=jnp.float32, dtype=jnp.float32)
    ours = generate(
        loaded.model, prompts, max_new_tokens=NEW_TOKENS, stop_ids=task.stop_ids, pad_id=task.tokenizer.pad_id
    )
    assert all(len(o) == NEW_TOKENS for o in ours)  # random weights: no stop token, full length
    assert ours == one_by_one
    assert batched == one_by_one


def test_pick_token_greedy_nucleus_and_seeded_sampling() -> None:
    logits = jnp.log(jnp.asarray([[0.05, 0.6, 0.3, 0.05], [0.4, 0.1, 0.1, 0.4001]], jnp.float32))
    key = jax.random.key(0)
    np.testing.assert_array_equal(pick_token(logits, key, 0.0, 1.0), [1, 3])
    # top_p below the top token's probability leaves only that token
    for seed in range(5):
        np.testing.assert_array_equal(pick_token(logits, jax.random.key(seed), 1.0, 0.5)[:1], [1])
    draws = np.stack([np.asarray(pick_token(logits, jax.random.key(s), 1.0, 0.8)) for s in range(200)])
    assert set(draws[:, 0]) == {1, 2}  # the 0.9 nucleus of row 0: tokens 1 and 2, never 0 or 3
    assert set(draws[:, 1]) == {0, 3}  # row 1: 0.4 + 0.4 reaches 0.8
    again = np.stack([np.asarray(pick_token(logits, jax.random.key(s), 1.0, 0.8)) for s in range(200)])
    np.testing.assert_array_equal(draws, again)


def test_jax_worker_reports_pass_at_k(
    tiny_models: dict[str, Path], chat_dataset: Path, tmp_path: Path
) -> None:
    rows = [json.loads(line) for line in chat_dataset.read_text().splitlines()[:3]]
    for row, expect in zip(rows, ["pass", "fail", "pass"], strict=True):
        row["expect"] = expect
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    check = (
        "import json, os, sys; p = json.load(open(os.environ['ACCELBENCH_PROBLEM'])); "
        "sys.exit(0 if p['expect'] == 'pass' and os.path.isfile(sys.argv[1]) else 1)"
    )
    spec = manifest(
        tiny_models["llama"], chat_dataset, "llama", "jax",
        method={"type": "lora", "rank": 4}, training={"maxSteps": 2},
    )  # fmt: skip
    spec["spec"]["passAtK"] = {
        "dataset": str(problems),
        "k": [1, 2],
        "samplesPerProblem": 2,
        "temperature": 0.8,
        "maxNewTokens": 8,
        "batchSize": 4,
        "checker": {"command": [sys.executable, "-c", check, "{sample}"]},
    }
    section = run(spec).finetune.pass_at_k
    assert section is not None
    assert (section.problems, section.samples, section.passed, section.failed) == (3, 6, 4, 2)
    assert section.scores == {"pass@1": pytest.approx(2 / 3), "pass@2": pytest.approx(2 / 3)}
    assert section.generate_seconds > 0 and section.checker_errors == 0

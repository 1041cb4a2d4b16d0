"""Mixed-precision quantization from per-layer sensitivity (issue 18 part 3) on CPU: the bit
accounting, torchao's rounding, the budgeted choice, and a whole run on a tiny Llama whose export
loads back with transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelbench.api.contract import ExitCode
from accelbench.workers import InvalidConfigError
from accelbench.workers.quantize.formats import FORMATS, applicable, fake_quantize
from accelbench.workers.quantize.plan import Layer, choose
from accelbench.workers.quantize.run import QuantizeSettings, quantizable_layers, quantize_model, tensor_bytes
from accelbench.workers.testing import make_chat_dataset, make_tiny_model

INT4, INT8, BF16 = FORMATS["int4-g128"], FORMATS["int8"], FORMATS["bf16"]


def test_effective_bits_count_scales_and_zero_points() -> None:
    assert INT4.effective_bits(2048) == 4 + 32 / 128  # bf16 scale and zero-point per 128 weights
    assert FORMATS["int4-g64"].effective_bits(2048) == 4.5
    assert INT8.effective_bits(2048) == 8 + 16 / 2048  # one bf16 scale per output row
    assert BF16.effective_bits(2048) == 16
    assert not applicable(INT4, 64) and applicable(INT4, 256) and applicable(INT8, 64)


def test_torchao_rounding_follows_the_format() -> None:
    torch.manual_seed(0)
    weight = torch.randn(32, 256)
    error = {f.name: float((fake_quantize(weight, f) - weight).pow(2).mean()) for f in (INT4, INT8, BF16)}
    assert error["bf16"] == 0 < error["int8"] < error["int4-g128"]
    rounded = fake_quantize(weight, INT4)
    for row in rounded[:4]:
        for group in row.view(2, 128):  # at most 16 levels per group of 128
            assert len(torch.unique(group)) <= 16


def layers_of(*sizes: int) -> list[Layer]:
    return [Layer(f"l{i}", n, 1024) for i, n in enumerate(sizes)]


SENS = {
    "l0": {"int4-g128": 0.50, "int8": 0.01, "bf16": 0.0},  # very sensitive
    "l1": {"int4-g128": 0.02, "int8": 0.001, "bf16": 0.0},
    "l2": {"int4-g128": 0.05, "int8": 0.002, "bf16": 0.0},
}


def test_the_budget_goes_to_the_layer_that_loses_most_per_bit() -> None:
    formats = [INT4, INT8, BF16]
    floor = INT4.effective_bits(1024)
    assert choose(layers_of(100, 100, 100), SENS, formats, floor).formats() == dict.fromkeys(
        SENS, "int4-g128"
    )
    one_upgrade = floor + (INT8.effective_bits(1024) - floor) / 3
    chosen = choose(layers_of(100, 100, 100), SENS, formats, one_upgrade + 1e-6)
    assert chosen.formats() == {"l0": "int8", "l1": "int4-g128", "l2": "int4-g128"}
    assert chosen.effective_bits <= one_upgrade + 1e-6
    everything = choose(layers_of(100, 100, 100), SENS, formats, 16)
    assert set(everything.formats().values()) == {"bf16"} and everything.sensitivity == 0


def test_a_budget_below_the_cheapest_assignment_is_refused_with_the_floor() -> None:
    with pytest.raises(InvalidConfigError, match=r"below the cheapest assignment \(4.250 bits"):
        choose(layers_of(10), {"l0": SENS["l0"]}, [INT4, INT8], 4.0)


def test_a_format_that_costs_more_and_loses_more_is_never_chosen() -> None:
    sens = {"l0": {"int4-g128": 0.3, "int4-g64": 0.4, "int8": 0.01}}  # g64: more bits, more loss
    chosen = choose(layers_of(10), sens, [INT4, FORMATS["int4-g64"], INT8], 4.6)
    assert chosen.formats() == {"l0": "int4-g128"}  # 4.6 buys g64 but not int8: g64 is no better


def test_a_tiny_model_is_quantized_under_the_budget_and_its_export_loads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = make_tiny_model(tmp_path / "model", "llama", dtype="bfloat16")
    data = make_chat_dataset(tmp_path / "text.jsonl", n=48)
    settings = QuantizeSettings(
        budget_bits=6.0, formats=("int4-g64", "int8", "bf16"), seq=32, calibration=4, held_out=4, batch=2
    )
    report = quantize_model(model, data, tmp_path / "out", settings, log=lambda _: None)
    # two decoder blocks of seven projections, the embeddings and the output head (not tied here)
    assert report.layers == 2 * 7 + 2
    assert report.effective_bits <= 6.0 + 1e-6
    assert set(report.formats_used) <= {"int4-g64", "int8", "bf16"} and "int4-g64" in report.formats_used
    assert report.model_effective_bits > report.effective_bits  # the bf16 norms count there
    assert report.compression == pytest.approx(16 / report.model_effective_bits, rel=1e-3)
    assert report.weight_bytes_quantized < report.weight_bytes_bf16
    assert report.perplexity_bf16 > 1 and report.perplexity_quantized > 1
    assert len(report.sensitivity) == 16 and all("lossIncrease" in row for row in report.sensitivity)
    assert {"model.embed_tokens", "lm_head"} <= {row["layer"] for row in report.sensitivity}
    saved = json.loads((tmp_path / "out" / "quantization-report.json").read_text())
    assert saved["effective_bits"] == report.effective_bits

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
    chosen = {row["layer"]: row["chosen"] for row in report.sensitivity}
    for name, module in loaded.named_modules():
        if name in chosen:
            plain = type(module.weight) in (torch.Tensor, torch.nn.Parameter)
            assert plain == (chosen[name] == "bf16"), (name, type(module.weight))
    assert tensor_bytes(torch.zeros(3, dtype=torch.bfloat16)) == 6
    assert loaded(torch.tensor([[1, 2, 3]])).logits.shape[-1] == loaded.config.vocab_size


def test_tied_embeddings_stay_out_of_the_budget() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    shape |= {"num_attention_heads": 2, "num_key_value_heads": 1}
    untied = quantizable_layers(LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False)))
    tied = quantizable_layers(LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True)))
    assert isinstance(untied["model.embed_tokens"], torch.nn.Embedding) and "lm_head" in untied
    assert set(untied) - set(tied) == {"model.embed_tokens", "lm_head"} and len(tied) == 7


def test_the_cli_refuses_an_impossible_budget_with_the_invalid_config_code(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "model", "llama", dtype="bfloat16")
    data = make_chat_dataset(tmp_path / "text.jsonl", n=16)
    args = ["--model", str(model), "--data", str(data), "--out", str(tmp_path / "out"), "--budget-bits", "3"]
    args += ["--formats", "int4-g64,int8", "--seq", "16", "--calibration", "2", "--held-out", "2"]
    result = subprocess.run(
        [sys.executable, "-m", "accelbench.workers.quantize", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=300,
    )
    assert result.returncode == ExitCode.INVALID_CONFIG, result.stderr[-2000:]
    assert "below the cheapest assignment" in result.stderr

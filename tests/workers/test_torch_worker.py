"""The PyTorch path on CPU with tiny random-weight models: it learns, reports, serves metrics."""

from __future__ import annotations

import importlib.util
import math
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from accelbench.api import parse_termination_message
from accelbench.api.finetune import Precision
from accelbench.workers import InvalidConfigError
from accelbench.workers.data import ChatTokenizer, build_rows, read_jsonl, tokenize_examples
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.finetune.torch_worker import masked_ce_sum
from accelbench.workers.jobenv import parse_job_payload
from accelbench.workers.report import write_report

QUIET = RunOptions(serve_metrics=False, log=lambda _: None, env={})


def _run(manifest: dict[str, Any], options: RunOptions = QUIET):
    return run_job(parse_job_payload(manifest), options)


@pytest.mark.parametrize(
    ("family", "method", "lr"),
    [
        ("llama", {"type": "lora", "rank": 8}, 1e-2),
        ("llama", {"type": "full"}, 3e-3),
        ("gemma3", {"type": "lora", "rank": 8}, 1e-2),
        ("gemma3", {"type": "full"}, 3e-3),
    ],
)
def test_loss_goes_down(manifest_for, family: str, method: dict, lr: float) -> None:
    manifest = manifest_for(family, method=method, training={"maxSteps": 6, "learningRate": lr})
    report, code = _run(manifest)
    assert code == 0, report.error
    ft = report.finetune
    assert ft.steps == 6 and len(ft.loss_history) == 6
    assert ft.final_loss < ft.first_loss - 0.05, ft.loss_history
    assert ft.eval_loss is not None and ft.perplexity == pytest.approx(math.exp(ft.eval_loss))


@pytest.mark.parametrize("method", [{"type": "lora", "rank": 8}, {"type": "full"}])
def test_fp16_mixed_precision_learns_and_starts_where_fp32_does(manifest_for, method: dict) -> None:
    """fp16 (the V100 path): fp16 math under autocast with a gradient scaler; its first-step loss is
    the fp32 run's to fp16 rounding, and it learns."""
    training = {"maxSteps": 6, "learningRate": 1e-2 if method["type"] == "lora" else 3e-3}
    fp32, code32 = _run(manifest_for("llama", method=method, training={**training, "precision": "fp32"}))
    fp16, code16 = _run(manifest_for("llama", method=method, training={**training, "precision": "fp16"}))
    assert code32 == 0 and code16 == 0, (fp32.error, fp16.error)
    assert fp16.finetune.first_loss == pytest.approx(fp32.finetune.first_loss, rel=1e-2)
    assert fp16.finetune.first_loss != fp32.finetune.first_loss  # the math did run in fp16
    assert fp16.finetune.final_loss < fp16.finetune.first_loss - 0.05, fp16.finetune.loss_history


def test_bf16_lora_runs_its_adapters_under_autocast_and_learns(manifest_for) -> None:
    """bf16 LoRA autocasts (the fp32 adapters' matmuls in bf16); ACCELBENCH_LORA_AUTOCAST=0 is the
    fp32-adapter path. Both learn and start at the same loss to bf16 rounding."""
    from accelbench.workers.finetune.torch_worker import autocast_dtype

    assert autocast_dtype(Precision.BF16, True) == torch.bfloat16
    assert autocast_dtype(Precision.BF16, True, lora_autocast=False) is None
    assert autocast_dtype(Precision.BF16, False) is None  # bf16 weights: nothing to cast
    assert autocast_dtype(Precision.FP16, False) == torch.float16
    assert autocast_dtype(Precision.FP32, True) is None
    training = {"maxSteps": 6, "learningRate": 1e-2, "precision": "bf16"}
    manifest = manifest_for("llama", method={"type": "lora", "rank": 8}, training=training)
    auto, code = _run(manifest)
    plain, plain_code = _run(manifest, RunOptions(serve_metrics=False, log=lambda _: None,
                                                 env={"ACCELBENCH_LORA_AUTOCAST": "0"}))  # fmt: skip
    assert code == 0 and plain_code == 0, (auto.error, plain.error)
    assert auto.finetune.first_loss == pytest.approx(plain.finetune.first_loss, rel=2e-2)
    assert auto.finetune.final_loss < auto.finetune.first_loss - 0.05, auto.finetune.loss_history


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_packed_rows_give_the_same_loss_as_unpacked(tiny_models, chat_dataset: Path, family: str) -> None:
    """The block-diagonal mask keeps packed examples apart (sliding-window layers included)."""
    tok = ChatTokenizer.from_model_dir(tiny_models[family], family)
    examples = tokenize_examples(tok, read_jsonl(chat_dataset)[:6], "full")
    packed, _ = build_rows(examples, 128, True, tok.pad_id)
    single, _ = build_rows(examples, 128, False, tok.pad_id)
    assert len(packed) < len(single)
    model = AutoModelForCausalLM.from_pretrained(tiny_models[family], attn_implementation="sdpa").eval()
    cpu = torch.device("cpu")
    with torch.no_grad():
        a, na = masked_ce_sum(model, packed.take(range(len(packed))), model.config, "sdpa", cpu)
        b, nb = masked_ce_sum(model, single.take(range(len(single))), model.config, "sdpa", cpu)
    assert na.item() == nb.item()
    assert a.item() == pytest.approx(b.item(), rel=1e-5)


def test_report_is_complete_and_fits_the_termination_message(manifest_for, tmp_path: Path, capsys) -> None:
    report, code = _run(manifest_for("llama", training={"maxSteps": 3}))
    assert code == 0
    log = tmp_path / "termination-log"
    write_report(report, env={"ACCELBENCH_TERMINATION_LOG": str(log)})
    parsed = parse_termination_message(log.read_text())
    assert parsed.ok and parsed.kind == "finetune" and parsed.framework == "pytorch"
    ft = parsed.finetune
    assert ft.steps == 3 and ft.trained_tokens > 0 and ft.tokens_per_second > 0
    assert ft.tokens_per_second_per_chip == ft.tokens_per_second  # one chip
    assert ft.mfu is not None and ft.mfu > 0 and ft.flops_per_token > 0 and "4N" in ft.mfu_formula
    assert ft.peak_tflops_per_chip == 1.0  # catalog cpu figure
    assert ft.first_loss and ft.final_loss and ft.eval_loss and ft.perplexity
    assert parsed.timings.total_seconds > 0 and parsed.timings.step_seconds_mean > 0
    assert parsed.memory.peak_bytes_per_chip > 0
    assert {"torch", "transformers", "peft"} <= set(parsed.versions)
    assert parsed.device.startswith("cpu")
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("ACCELBENCH_REPORT {")


class _ScrapeDuringRun:
    """A sink that, at step 1, lets a scraper thread read /metrics and /healthz and waits for it."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.step_seen = threading.Event()
        self.scraped = threading.Event()
        self.bodies: dict[str, str] = {}

    def log(self, message: str) -> None:
        if message.startswith("metrics: serving on port"):
            self.port = int(message.rsplit(" ", 1)[1])

    def scrape(self) -> None:
        self.step_seen.wait(60)
        for path in ("/metrics", "/healthz"):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
                self.bodies[path] = response.read().decode()
        self.scraped.set()

    def on_step(self, step, total_steps, loss, tokens_per_second, mfu) -> None:
        if step == 2:
            self.step_seen.set()
            self.scraped.wait(30)

    def on_eval(self, step, eval_loss) -> None:
        return None


def test_metrics_endpoint_answers_during_a_run(manifest_for) -> None:
    probe = _ScrapeDuringRun()
    scraper = threading.Thread(target=probe.scrape)
    scraper.start()
    options = RunOptions(env={"ACCELBENCH_METRICS_PORT": "0"}, extra_sink=probe, log=probe.log)
    _, code = _run(manifest_for("llama", training={"maxSteps": 3}), options)
    scraper.join(60)
    assert code == 0
    metrics = probe.bodies["/metrics"]
    assert "accelbench_worker_step 2.0" in metrics
    for name in ("loss", "tokens_per_second", "mfu", "total_steps"):
        assert f"accelbench_worker_{name} " in metrics
    assert probe.bodies["/healthz"].strip() == "ok"


def test_saves_merged_lora_weights_that_transformers_loads(manifest_for, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report, code = _run(manifest_for("gemma3", training={"maxSteps": 2}, output=str(out)))
    assert code == 0, report.error
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in name for name, _ in model.named_parameters())


def test_unknown_lora_target_is_invalid_config(manifest_for) -> None:
    manifest = manifest_for("llama", method={"type": "lora", "rank": 4, "targetModules": ["nope_proj"]})
    with pytest.raises(InvalidConfigError) as err:
        parse_job_payload(manifest)  # the API's LoraTarget vocabulary refuses it before any run
    assert "targetModules" in str(err.value) and "'all-linear'" in str(err.value)


def test_all_linear_trains_the_same_adapters_as_every_projection_named(manifest_for) -> None:
    every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    runs = [
        _run(manifest_for("gemma3", method={"type": "lora", "rank": 4, "targetModules": targets},
                          training={"maxSteps": 2}))
        for targets in (["all-linear"], every)
    ]  # fmt: skip
    (all_linear, code_a), (named, code_b) = runs
    assert code_a == 0 and code_b == 0, (all_linear.error, named.error)
    assert all_linear.finetune.loss_history == pytest.approx(named.finetune.loss_history, abs=1e-6)
    assert all_linear.finetune.flops_per_token == named.finetune.flops_per_token


def test_attention_choice_and_its_override(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelbench.workers.finetune.torch_worker import ATTENTION_OVERRIDE, choose_attention

    cpu = torch.device("cpu")
    monkeypatch.delenv(ATTENTION_OVERRIDE, raising=False)
    assert choose_attention(False, cpu) == ("sdpa", None)
    attn, note = choose_attention(True, cpu)  # flash needs CUDA + flash_attn: falls back, says so
    assert attn == "sdpa" and note is not None and "unavailable" in note
    from accelbench.workers.finetune import torch_attention

    cuda = torch.device("cuda")  # the choice only (nothing runs on it)
    expected = "flash_attention_2" if importlib.util.find_spec("flash_attn") else torch_attention.NAME
    assert choose_attention(True, cuda, capability=(9, 0)) == (expected, None)
    assert choose_attention(False, cuda, capability=(9, 0)) == ("sdpa", None)
    attn, note = choose_attention(True, cuda, capability=(7, 0))  # V100: no flash kernels before sm_80
    assert attn == "sdpa" and note is not None and "sm_70" in note
    attn, note = choose_attention(True, torch.device("hpu"))  # no habana_frameworks here
    assert attn == "sdpa" and note is not None and "FusedSDPA" in note
    monkeypatch.setenv(ATTENTION_OVERRIDE, "flex_attention")
    attn, note = choose_attention(False, cpu)
    assert attn == "flex_attention" and note is not None and ATTENTION_OVERRIDE in note


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("pack", [False, True])
def test_hybrid_attention_gives_the_sdpa_logits(
    tiny_models, chat_dataset: Path, family: str, pack: bool
) -> None:
    """torch_attention (the CUDA default) keeps the data.py rule: same loss as sdpa's dense masks,
    packed rows and a sliding window shorter than the rows included (forward only: FlexAttention
    has no backward on CPU)."""
    from accelbench.workers.finetune import torch_attention

    sdpa, hybrid = losses_by_attention(tiny_models, chat_dataset, family, pack, torch_attention.register())
    assert hybrid == pytest.approx(sdpa, rel=1e-5)


def losses_by_attention(
    tiny_models, chat_dataset: Path, family: str, pack: bool, name: str
) -> tuple[float, float]:
    """(sdpa's loss, `name`'s loss) of one forward over the same rows, packed or not; Gemma 3 with a
    16-token window, so windows bite within the 128-token rows."""
    tok = ChatTokenizer.from_model_dir(tiny_models[family], family)
    examples = tokenize_examples(tok, read_jsonl(chat_dataset)[:6], "full")
    rows, _ = build_rows(examples, 128, pack, tok.pad_id)
    batch = rows.take(range(len(rows)))
    assert (int(batch["segment_ids"].max()) > 1) == pack
    extra = {"sliding_window": 16} if family == "gemma3" else {}
    cpu = torch.device("cpu")
    losses = []
    for attn in ("sdpa", name):
        model = AutoModelForCausalLM.from_pretrained(tiny_models[family], attn_implementation=attn, **extra)
        with torch.no_grad():
            ce, n = masked_ce_sum(model.eval(), batch, model.config, attn, cpu)
        losses.append(ce.item() / n.item())
    return losses[0], losses[1]


class _SdpaAsFusedKernel:
    """Stands in for Habana's FusedSDPA off Gaudi: the same positional arguments, computed by SDPA.
    It checks the wiring (GQA, masks, windows, layout); the kernel itself only runs on an HPU."""

    calls = 0

    @classmethod
    def apply(cls, q, k, v, mask, dropout_p, is_causal, scale):
        cls.calls += 1
        assert q.shape == k.shape == v.shape  # GQA expanded before the kernel
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("pack", [False, True])
def test_gaudi_fused_attention_wiring_gives_the_sdpa_logits(
    tiny_models, chat_dataset: Path, family: str, pack: bool
) -> None:
    """The Gaudi flash path hands the kernel what SDPA would compute with: same loss as sdpa, packed
    rows and sliding windows included."""
    from accelbench.workers.finetune import gaudi_attention

    name = gaudi_attention.register(_SdpaAsFusedKernel)
    sdpa, fused = losses_by_attention(tiny_models, chat_dataset, family, pack, name)
    assert _SdpaAsFusedKernel.calls > 0
    assert fused == pytest.approx(sdpa, rel=1e-5)


def test_hybrid_attention_refuses_what_it_does_not_implement() -> None:
    from accelbench.workers.finetune import torch_attention

    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="s_aux"):
        torch_attention.attention_forward(torch.nn.Module(), q, q, q, None, s_aux=torch.zeros(2))
    with pytest.raises(ValueError, match="dropout"):
        torch_attention.attention_forward(torch.nn.Module(), q, q, q, None, dropout=0.1)
    out, weights = torch_attention.attention_forward(torch.nn.Module(), q, q, q, None, s_aux=None)
    assert out.shape == (1, 4, 2, 8) and weights is None  # [B, T, H, D], as transformers expects


def test_generation_switches_the_hybrid_attention_to_sdpa(tiny_models) -> None:
    """pass@k decodes through a KV cache and left padding: SDPA's job. Under generation_attention
    the model trained with the hybrid attention generates what an SDPA model generates, and gets its
    attention back afterwards; without it the hybrid refuses the cache instead of computing wrong."""
    from accelbench.workers.finetune import torch_attention

    name = torch_attention.register()
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    kwargs = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    reference = AutoModelForCausalLM.from_pretrained(tiny_models["gemma3"], attn_implementation="sdpa").eval()
    model = AutoModelForCausalLM.from_pretrained(tiny_models["gemma3"], attn_implementation=name).eval()
    with torch.no_grad():
        expected = reference.generate(input_ids=ids, attention_mask=mask, **kwargs)
        with torch_attention.generation_attention(model):
            assert model.config._attn_implementation == "sdpa"
            got = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        assert model.config._attn_implementation == name
        assert torch.equal(got, expected)
        with pytest.raises(ValueError, match="generation_attention"):
            model.generate(input_ids=ids[1:], attention_mask=mask[1:], **kwargs)


def test_compile_mode_reads_the_variable_and_names_what_it_knows() -> None:
    from accelbench.workers.finetune import CompileMode, compile_mode

    assert [compile_mode(v) for v in (None, "", "0", "off")] == [CompileMode.OFF] * 4
    assert compile_mode("1") == compile_mode("model") == CompileMode.MODEL  # "1" keeps its meaning
    assert compile_mode(" Layers ") == CompileMode.LAYERS
    with pytest.raises(
        InvalidConfigError, match=r"ACCELBENCH_COMPILE='fast'.*0, 1 or one of off, model, layers"
    ):
        compile_mode("fast")


@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointed", "plain"])
def test_compiling_each_decoder_layer_trains_as_eager_does_and_compiles_once_for_any_depth(
    manifest_for, tmp_path: Path, checkpointing: bool
) -> None:
    """ACCELBENCH_COMPILE=layers (regional compilation): the same losses as eager to float rounding,
    and a model twice as deep traces no more (the blocks share their graphs). Without checkpointing,
    the whole-model mode traces 223 operations at 2 layers and 415 at 4, so this tells them apart;
    with it, transformers' checkpoint wrapper breaks the whole-model graph and leaves every block
    eager (8 graph breaks, 30 operations traced: why the per-block mode exists)."""
    from torch._dynamo.utils import counters

    from accelbench.workers.testing import make_tiny_model

    training = {
        "maxSteps": 3,
        "learningRate": 1e-2,
        "precision": "fp32",
        "gradientCheckpointing": checkpointing,
    }
    lora = {"type": "lora", "rank": 8}
    layers = RunOptions(serve_metrics=False, log=lambda _: None, env={"ACCELBENCH_COMPILE": "layers"})

    def compiled_run(manifest: dict[str, Any]) -> tuple[Any, tuple[int, int, int]]:
        """(report, (graphs compiled, operations traced into them, graph breaks))."""
        torch._dynamo.reset()
        counters.clear()
        report, code = _run(manifest, layers)
        assert code == 0, report.error
        stats = counters["stats"]
        return report, (
            stats["unique_graphs"],
            stats["calls_captured"],
            sum(counters["graph_break"].values()),
        )

    manifest = manifest_for("llama", method=lora, training=training)
    eager, eager_code = _run(manifest)
    compiled, shallow = compiled_run(manifest)
    deeper = manifest_for("llama", method=lora, training=training)
    deeper["spec"]["model"]["uri"] = str(make_tiny_model(tmp_path / "deep", "llama", layers=4))
    _, deep = compiled_run(deeper)
    assert eager_code == 0, eager.error
    assert shallow[1] >= 100, shallow  # a block's operations were traced, not only the head's
    assert deep == shallow, (deep, shallow)
    assert compiled.versions["compile"].startswith("torch.compile layers") and "compile" not in eager.versions
    assert compiled.finetune.loss_history == pytest.approx(eager.finetune.loss_history, rel=1e-4)
    assert compiled.finetune.eval_loss == pytest.approx(eager.finetune.eval_loss, rel=1e-4)

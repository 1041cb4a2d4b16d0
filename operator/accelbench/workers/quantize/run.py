"""One quantization run: measure each layer's sensitivity, choose formats under the budget, export
with torchao through transformers, and measure the export against bf16.

1. Text: the JSONL's rows (chat `messages` or `prompt`/`completion`) are encoded as the fine-tuning
   data path encodes them (chat template, special tokens), joined and cut into `seq`-token windows; the first
   `calibration` windows calibrate, the next `held_out` ones evaluate (never both).
2. Sensitivity of a weight matrix in a format = the calibration loss with that matrix alone rounded
   through the format (formats.fake_quantize) minus the bf16 loss. The matrices are every decoder
   linear layer and, when they are not one tied matrix, the input embeddings and the output head
   (together 12 % of a TinyLlama-1.1B: left in bf16 they hold the whole model above 5.6 bits).
3. plan.choose under `budget_bits`; the assignment is exported as transformers' TorchAoConfig over
   torchao's ModuleFqnToConfig (one config per layer), saved as safetensors: the directory loads
   with `from_pretrained` (and so in `transformers serve`; vLLM reads the same torchao config).
4. The saved model is loaded back and measured against the bf16 one on the held-out windows:
   perplexity, weight bytes, and tokens/s of a prefill (a batch of windows in one forward pass,
   compute-bound) and of greedy decoding of one sequence (memory-bound, where weight-only formats
   are meant to pay; their kernels dequantize, so prefill can be slower than bf16).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import InvalidConfigError
from ..data import ChatTokenizer, read_jsonl
from . import REPORT_FILE
from .formats import BF16, FORMATS, WeightFormat, applicable, export_config, fake_quantize
from .plan import Assignment, Layer, choose

DEFAULT_FORMATS = ("int4-g128", "int8", BF16)


@dataclass(frozen=True)
class QuantizeSettings:
    budget_bits: float = 4.5
    formats: tuple[str, ...] = DEFAULT_FORMATS
    seq: int = 512
    calibration: int = 8  # windows of `seq` tokens
    held_out: int = 8
    batch: int = 4  # windows per forward pass
    family: str = "llama"  # the chat template used when the model dir has none (workers.data)

    def weight_formats(self) -> list[WeightFormat]:
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown:
            raise InvalidConfigError(f"formats {unknown} are not among {sorted(FORMATS)}")
        return [FORMATS[f] for f in self.formats]


@dataclass
class QuantizeReport:
    device: str
    layers: int  # weight matrices the budget covers (quantizable_layers)
    quantized_parameters: int  # their weights
    other_parameters: int  # norms, biases and tied embeddings: kept in bf16
    budget_bits: float
    effective_bits: float  # over the quantized layers, scales and zero-points counted
    model_effective_bits: float  # over every parameter (the bf16 rest included)
    compression: float  # bf16 bytes / exported bytes, whole model (16 / model_effective_bits)
    formats_used: dict[str, int]  # format -> layers
    perplexity_bf16: float
    perplexity_quantized: float
    perplexity_increase: float  # relative: 0.02 = +2 %
    prefill_tokens_per_second_bf16: float
    prefill_tokens_per_second_quantized: float
    decode_tokens_per_second_bf16: float
    decode_tokens_per_second_quantized: float
    weight_bytes_bf16: int
    weight_bytes_quantized: int
    calibration_tokens: int
    held_out_tokens: int
    seconds: dict[str, float] = field(default_factory=dict)
    sensitivity: list[dict[str, Any]] = field(default_factory=list)  # the per-layer table (artifact)


def windows(model_dir: Path, data: Path, family: str, seq: int, count: int) -> torch.Tensor:
    """`count` windows of `seq` tokens: the dataset's conversations encoded exactly as the fine-tuning
    data path encodes them (the model's chat template and special tokens: the text a fine-tuned
    model knows), joined, wrapping round when short."""
    tokenizer = ChatTokenizer.from_model_dir(model_dir, family)
    stream: list[int] = []
    for messages in read_jsonl(data):
        ids, _ = tokenizer.encode_chat(messages)
        stream.extend(int(i) for i in ids)
    need = seq * count
    while len(stream) < need:
        stream = stream + stream
    return torch.tensor(stream[:need], dtype=torch.long).view(count, seq)


@torch.no_grad()
def mean_loss(model: torch.nn.Module, tokens: torch.Tensor, batch: int) -> float:
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(tokens), batch):
        chunk = tokens[start : start + batch].to(device)
        logits = model(chunk).logits[:, :-1].float()
        target = chunk[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"
        )
        total += float(loss)
        count += target.numel()
    return total / count


def quantizable_layers(model: Any) -> dict[str, torch.nn.Linear | torch.nn.Embedding]:
    """The weight matrices a budget covers: every linear layer inside the decoder blocks, then the
    input embeddings and the output head unless they share one matrix (a tied matrix serves a
    lookup and a matmul, and transformers would have to untie it, storing it twice, to quantize it)."""
    layers: dict[str, torch.nn.Linear | torch.nn.Embedding] = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}"
    }
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is embeddings.weight:
        return layers
    for name, module in model.named_modules():
        if module is embeddings or module is head:
            layers[name] = module
    return layers


@torch.no_grad()
def measure_sensitivity(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    formats: Sequence[WeightFormat],
    batch: int,
    log: Callable[[str], None],
) -> tuple[float, dict[str, dict[str, float]], list[Layer]]:
    base = mean_loss(model, tokens, batch)
    table: dict[str, dict[str, float]] = {}
    layers: list[Layer] = []
    matrices = quantizable_layers(model)
    for index, (name, module) in enumerate(matrices.items(), start=1):
        weight = module.weight.data
        layers.append(Layer(name, weight.numel(), weight.shape[1], isinstance(module, torch.nn.Embedding)))
        table[name] = {}
        for fmt in formats:
            if not applicable(fmt, weight.shape[1]):
                continue
            if fmt.bits >= 16:
                table[name][fmt.name] = 0.0
                continue
            original = weight.clone()
            module.weight.data = fake_quantize(weight, fmt)
            table[name][fmt.name] = mean_loss(model, tokens, batch) - base
            module.weight.data = original
        if index % 16 == 0 or index == len(matrices):
            log(f"sensitivity: {index}/{len(matrices)} layers")
    return base, table, layers


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor's storage holds; a torchao tensor subclass counts its inner tensors (packed
    data, scales, zero-points), which is what the quantized layer keeps in memory."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(tensor_bytes(t) for t in [*model.parameters(), *model.buffers()])


def _timed(device: torch.device, work: Callable[[], Any], repeats: int) -> float:
    """The best wall time of `repeats` calls after one warm-up, device synchronized around each."""
    work()
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tick = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - tick)
    return best


@torch.no_grad()
def prefill_rate(model: torch.nn.Module, tokens: torch.Tensor, batch: int, repeats: int = 3) -> float:
    """Tokens/s of one forward pass over `batch` held-out windows (compute-bound: a prompt's prefill)."""
    device = next(model.parameters()).device
    chunk = tokens[:batch].to(device)
    return chunk.numel() / _timed(device, lambda: model(chunk), repeats)


@torch.no_grad()
def decode_rate(
    model: torch.nn.Module, tokens: torch.Tensor, new_tokens: int = 64, repeats: int = 2
) -> float:
    """Tokens/s generating `new_tokens` greedily after a 64-token prompt, one sequence (memory-bound:
    where weight-only formats are meant to pay)."""
    device = next(model.parameters()).device
    prompt = tokens[:1, :64].to(device)

    def generate() -> Any:
        return model.generate(
            prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
        )

    return new_tokens / _timed(device, generate, repeats)


def quantize_model(
    model_dir: Path,
    data: Path,
    out_dir: Path,
    settings: QuantizeSettings,
    log: Callable[[str], None] = print,
) -> QuantizeReport:
    from torchao.quantization import ModuleFqnToConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

    formats = settings.weight_formats()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    seconds: dict[str, float] = {}
    tick = time.perf_counter()
    tokens = windows(model_dir, data, settings.family, settings.seq, settings.calibration + settings.held_out)
    calibration, held_out = tokens[: settings.calibration], tokens[settings.calibration :]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval()
    seconds["load"] = time.perf_counter() - tick

    tick = time.perf_counter()
    base, table, layers = measure_sensitivity(model, calibration, formats, settings.batch, log)
    seconds["sensitivity"] = time.perf_counter() - tick
    assignment: Assignment = choose(layers, table, formats, settings.budget_bits)
    chosen = assignment.formats()

    held_bf16 = mean_loss(model, held_out, settings.batch)
    prefill_bf16 = prefill_rate(model, held_out, settings.batch)
    decode_bf16 = decode_rate(model, held_out)
    bytes_bf16 = weight_bytes(model)
    all_parameters = sum(p.numel() for p in model.parameters())
    del model
    if cuda:
        torch.cuda.empty_cache()

    tick = time.perf_counter()
    lookups = {layer.name for layer in layers if layer.embedding}
    per_layer = {
        name: export_config(FORMATS[fmt], cuda, embedding=name in lookups) for name, fmt in chosen.items()
    }
    config = ModuleFqnToConfig({name: c for name, c in per_layer.items() if c is not None})
    quantized = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.bfloat16,
        device_map=str(device),
        # Without the flag transformers leaves the embeddings and the output head alone whatever
        # the per-module config names.
        quantization_config=TorchAoConfig(quant_type=config, include_input_output_embeddings=True),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    quantized.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out_dir)
    del quantized
    seconds["export"] = time.perf_counter() - tick

    reloaded = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.bfloat16, device_map=str(device)
    ).eval()
    held_quantized = mean_loss(reloaded, held_out, settings.batch)
    prefill_quantized = prefill_rate(reloaded, held_out, settings.batch)
    decode_quantized = decode_rate(reloaded, held_out)
    bytes_quantized = weight_bytes(reloaded)

    quantized_parameters = sum(layer.parameters for layer in layers)
    other = all_parameters - quantized_parameters
    model_bits = (assignment.effective_bits * quantized_parameters + 16 * other) / all_parameters
    used: dict[str, int] = {}
    for fmt in chosen.values():
        used[fmt] = used.get(fmt, 0) + 1
    by_layer = {c.layer: c for c in assignment.choices}
    report = QuantizeReport(
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        layers=len(layers),
        quantized_parameters=quantized_parameters,
        other_parameters=other,
        budget_bits=settings.budget_bits,
        effective_bits=round(assignment.effective_bits, 4),
        model_effective_bits=round(model_bits, 4),
        compression=round(16 / model_bits, 3),
        formats_used=used,
        perplexity_bf16=math.exp(held_bf16),
        perplexity_quantized=math.exp(held_quantized),
        perplexity_increase=math.exp(held_quantized - held_bf16) - 1,
        prefill_tokens_per_second_bf16=prefill_bf16,
        prefill_tokens_per_second_quantized=prefill_quantized,
        decode_tokens_per_second_bf16=decode_bf16,
        decode_tokens_per_second_quantized=decode_quantized,
        weight_bytes_bf16=bytes_bf16,
        weight_bytes_quantized=bytes_quantized,
        calibration_tokens=calibration.numel(),
        held_out_tokens=held_out.numel(),
        seconds={k: round(v, 2) for k, v in seconds.items()},
        sensitivity=[
            {
                "layer": layer.name,
                "parameters": layer.parameters,
                "chosen": chosen[layer.name],
                "effectiveBits": round(by_layer[layer.name].effective_bits, 4),
                "lossIncrease": table[layer.name],
            }
            for layer in layers
        ],
    )
    log(
        f"base calibration loss {base:.4f}; {report.effective_bits:.3f} effective bits over "
        f"{len(layers)} layers "
        f"({used}); perplexity {report.perplexity_bf16:.3f} -> {report.perplexity_quantized:.3f} "
        f"({100 * report.perplexity_increase:+.2f} %)"
    )
    (out_dir / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    return report

"""The FinetuneJob tasks other than causalLM, run by the same entrypoint (`__main__.run_job`):

- superResolution: the SR3 worker (workers/diffusion) on the folder of images `spec.dataset.uri`
  names, its last `evalImages` images held out; data parallel over torchrun's processes.
- quantize: the per-layer quantizer (workers/quantize) of `spec.model` on the dataset's
  conversations, the export written to `spec.output` with the sensitivity table beside it.

Each returns a WorkerReport in the shape the operator ingests: `finetune` keeps the steps and losses
(none for quantize), the task's own section its figures. The entrypoint adds the total and
object-storage timings, uploads the outputs and writes the report, as for causalLM.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from ...api import FinetuneJob
from ...api.report import FinetuneMetrics, Memory, ReportKind, Timings, WorkerReport
from ...api.status import QuantizationResults, SuperResolutionResults
from .. import InvalidConfigError
from ..jobenv import DistEnv
from ..quantize import REPORT_FILE
from ..report import LOSS_HISTORY_LIMIT, thin
from . import MetricsSink


def _versions(*packages: str) -> dict[str, str]:
    found = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def run_super_resolution(
    job: FinetuneJob,
    dist: DistEnv,
    sink: MetricsSink,
    images_dir: Path,
    output_dir: Path | None,
    log: Callable[[str], None],
) -> WorkerReport:
    from ..diffusion.images import load_images
    from ..diffusion.sr3 import SRSettings, train

    sr = job.spec.sr
    settings = SRSettings(
        size=sr.image_size,
        scale=sr.scale,
        channels=tuple(sr.channels),
        layers_per_block=sr.layers_per_block,
        attention_levels=sr.attention_levels,
        batch=sr.global_batch_size,
        steps=sr.steps,
        learning_rate=sr.learning_rate,
        precision=sr.precision.value,
        sample_steps=sr.sample_steps,
        warmup_steps=sr.warmup_steps,
        seed=sr.seed,
    )
    if not images_dir.is_dir():
        raise InvalidConfigError(
            f"dataset {images_dir} (from {job.spec.dataset.uri}) is not a folder of images"
        )
    images = load_images(images_dir, sr.image_size)
    if len(images) <= sr.eval_images:
        raise InvalidConfigError(
            f"{len(images)} images in {job.spec.dataset.uri} leave none to train on after "
            f"superResolution.evalImages={sr.eval_images} held out"
        )
    split = len(images) - sr.eval_images
    report = train(
        settings,
        images[:split],
        images[split:],
        dist,
        log=log,
        on_step=lambda step, steps, loss: sink.on_step(step, steps, loss, None, None),
        save_to=output_dir,
    )
    losses = report.losses
    return WorkerReport(
        kind=ReportKind.FINETUNE,
        ok=True,
        framework="pytorch",
        device=report.device[:200],
        chips=max(report.processes, 1),
        rank=dist.rank,
        finetune=FinetuneMetrics(
            steps=report.steps,
            first_loss=losses[0] if losses else None,
            final_loss=losses[-1] if losses else None,
            loss_history=thin(losses, LOSS_HISTORY_LIMIT),
        ),
        super_resolution=SuperResolutionResults(
            images_per_second=report.images_per_second,
            images_per_second_per_chip=report.images_per_second_per_chip,
            parameters=report.parameters,
            eval_images=report.eval_images,
            psnr=report.psnr,
            ssim=report.ssim,
            bicubic_psnr=report.bicubic_psnr,
            bicubic_ssim=report.bicubic_ssim,
            eval_seconds=report.eval_seconds,
        ),
        timings=Timings(
            total_seconds=0.0,
            setup_seconds=report.setup_seconds,
            compile_seconds=report.first_step_seconds,
            train_seconds=report.train_seconds,
            step_seconds_mean=report.step_seconds_median,
        ),
        memory=Memory(peak_bytes_per_chip=report.peak_memory_bytes),
        versions=_versions("torch", "diffusers"),
    )


def run_quantize(
    job: FinetuneJob,
    model_dir: Path,
    dataset: Path,
    output_dir: Path,
    log: Callable[[str], None],
) -> WorkerReport:
    from ..quantize.run import QuantizeSettings, quantize_model

    spec = job.spec
    q = spec.quantization
    settings = QuantizeSettings(
        budget_bits=q.budget_bits,
        formats=tuple(f.value for f in q.formats),
        seq=q.seq_length,
        calibration=q.calibration_windows,
        held_out=q.held_out_windows,
        batch=q.batch_size,
        family=spec.base_model.family.value,
    )
    result = quantize_model(model_dir, dataset, output_dir, settings, log=log)
    output = spec.output
    table = f"{output.uri.rstrip('/')}/{REPORT_FILE}" if output is not None else None
    return WorkerReport(
        kind=ReportKind.FINETUNE,
        ok=True,
        framework="pytorch",
        device=result.device[:200],
        chips=1,
        finetune=FinetuneMetrics(steps=0, perplexity=result.perplexity_quantized),
        quantization=QuantizationResults(
            budget_bits=result.budget_bits,
            effective_bits=result.effective_bits,
            model_effective_bits=result.model_effective_bits,
            compression=result.compression,
            layers=result.layers,
            formats_used=result.formats_used,
            perplexity_bf16=result.perplexity_bf16,
            perplexity_quantized=result.perplexity_quantized,
            perplexity_increase=result.perplexity_increase,
            weight_bytes_bf16=result.weight_bytes_bf16,
            weight_bytes_quantized=result.weight_bytes_quantized,
            prefill_tokens_per_second_bf16=result.prefill_tokens_per_second_bf16,
            prefill_tokens_per_second_quantized=result.prefill_tokens_per_second_quantized,
            decode_tokens_per_second_bf16=result.decode_tokens_per_second_bf16,
            decode_tokens_per_second_quantized=result.decode_tokens_per_second_quantized,
            sensitivity_table=table,
        ),
        timings=Timings(
            total_seconds=0.0,
            setup_seconds=result.seconds.get("load"),
            train_seconds=result.seconds.get("sensitivity"),
        ),
        versions=_versions("torch", "torchao", "transformers"),
    )

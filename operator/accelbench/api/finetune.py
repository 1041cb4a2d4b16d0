"""FinetuneJob: fine-tune a model with LoRA or full training on one accelerator pool."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from .base import ApiModel, cel, to_camel
from .common import (
    Accelerator,
    EnvFromSource,
    EnvVar,
    ModelSource,
    Pricing,
    Resources,
    RunControl,
    StorageUri,
    storage_uri_field,
)


class DatasetFormat(StrEnum):
    AUTO = "auto"
    CHAT = "chat"
    PROMPT_COMPLETION = "promptCompletion"
    IMAGE_FOLDER = "imageFolder"  # PNG/JPEG files of one folder: task superResolution


class DatasetSource(ApiModel):
    uri: StorageUri = storage_uri_field(
        "JSONL file: chat `messages` or `prompt`/`completion` rows; for task superResolution a folder of "
        "PNG/JPEG images."
    )
    format: DatasetFormat = DatasetFormat.AUTO
    held_out_fraction: float = Field(default=0.05, ge=0, lt=1, description="Share kept out for eval loss.")
    max_samples: int | None = Field(default=None, ge=1)


class MethodType(StrEnum):
    LORA = "lora"
    FULL = "full"


class LoraTarget(StrEnum):
    """A Hugging Face projection name, or all-linear for every attention and MLP projection."""

    # One vocabulary for the planner, the FLOPs count and both workers: a name one of them accepts,
    # the others count and adapt the same way (expand_lora_targets).

    Q_PROJ = "q_proj"
    K_PROJ = "k_proj"
    V_PROJ = "v_proj"
    O_PROJ = "o_proj"
    GATE_PROJ = "gate_proj"
    UP_PROJ = "up_proj"
    DOWN_PROJ = "down_proj"
    ALL_LINEAR = "all-linear"


# Every projection, in Hugging Face order (attention, then MLP): what all-linear stands for.
LORA_PROJECTIONS: tuple[str, ...] = tuple(t.value for t in LoraTarget if t is not LoraTarget.ALL_LINEAR)


def expand_lora_targets(targets: Iterable[str]) -> tuple[str, ...]:
    """The projection names `targets` adapt, in Hugging Face order, all-linear standing for all of them.

    Raises ValueError naming the allowed values for anything else, so no caller can count or adapt a
    name silently differently from another.
    """
    wanted = set(targets)
    unknown = sorted(wanted - {t.value for t in LoraTarget})
    if unknown:
        allowed = [t.value for t in LoraTarget]
        raise ValueError(f"LoRA target modules {unknown} are not projection names; use {allowed}")
    if LoraTarget.ALL_LINEAR in wanted:
        return LORA_PROJECTIONS
    return tuple(p for p in LORA_PROJECTIONS if p in wanted)


class Method(ApiModel):
    """LoRA (rank required) or full fine-tuning."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("self.type != 'lora' || has(self.rank)", "method lora needs a rank"),
                cel(
                    "self.type != 'full' || (!has(self.rank) && !has(self.alpha))",
                    "rank and alpha apply only to method lora",
                ),
            ]
        }
    }

    type: MethodType = MethodType.LORA
    rank: int | None = Field(default=None, ge=1, le=4096)
    alpha: float | None = Field(default=None, gt=0, description="LoRA scale numerator; defaults to 2×rank.")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[LoraTarget] = Field(
        default_factory=lambda: [LoraTarget(p) for p in LORA_PROJECTIONS],
        min_length=1,  # an empty list once passed admission and failed inside the worker
        max_length=32,
        description="Projections that get adapters (all-linear: every one); the default is every "
        "attention and MLP projection.",
    )

    @model_validator(mode="after")
    def _lora_needs_rank(self) -> Method:
        if self.type == MethodType.LORA and self.rank is None:
            raise ValueError("method lora needs a rank")
        if self.type == MethodType.FULL and (self.rank is not None or self.alpha is not None):
            raise ValueError("rank and alpha apply only to method lora")
        return self

    @property
    def lora_alpha(self) -> float:
        return self.alpha if self.alpha is not None else 2.0 * (self.rank or 0)


class Schedule(StrEnum):
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


class LossOn(StrEnum):
    """Which tokens carry loss. Both frameworks read the same mask, so the comparison stays fair."""

    COMPLETION = "completion"
    FULL = "full"


class Precision(StrEnum):
    """bf16: weights and math in bf16. fp16: mixed precision with a gradient scaler (the V100 path:
    fp16 math, fp32 trainable weights, a LoRA base frozen in fp16). fp32: no 16-bit math."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class Training(ApiModel):
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("!(has(self.epochs) && has(self.maxSteps))", "set epochs or maxSteps, not both"),
                cel(
                    "!has(self.microBatchSize) || self.globalBatchSize % self.microBatchSize == 0",
                    "globalBatchSize must be a multiple of microBatchSize",
                ),
            ]
        }
    }

    seq_length: int = Field(default=2048, ge=8, le=1_048_576)
    global_batch_size: int = Field(default=8, ge=1, description="Sequences per optimizer step, all chips.")
    micro_batch_size: int | None = Field(
        default=None, ge=1, description="Sequences per chip per forward pass; the rest is accumulation."
    )
    learning_rate: float = Field(default=1e-4, gt=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Schedule = Schedule.COSINE
    epochs: float | None = Field(default=None, gt=0)
    max_steps: int | None = Field(default=None, ge=1)
    loss_on: LossOn = LossOn.COMPLETION
    packing: bool = True
    precision: Precision = Precision.BF16
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    flash_attention: bool = Field(
        default=True,
        description=(
            "PyTorch on CUDA: flash_attn's kernels when installed, else flash (SDPA is_causal) for causal "
            "layers and FlexAttention for sliding-window layers and packed rows. Off, or on other devices: "
            "SDPA with dense masks. The JAX worker ignores it (cuDNN on GPU, XLA elsewhere)."
        ),
    )
    gradient_checkpointing: bool = False
    eval_every_steps: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Training:
        if self.epochs is not None and self.max_steps is not None:
            raise ValueError("set epochs or maxSteps, not both")
        if self.micro_batch_size is not None and self.global_batch_size % self.micro_batch_size:
            raise ValueError("globalBatchSize must be a multiple of microBatchSize")
        return self


class Framework(StrEnum):
    JAX = "jax"
    PYTORCH = "pytorch"


class ParallelismStrategy(StrEnum):
    """How the chips share the work (the planner's memory estimate follows the choice).

    auto: the fewest chips that fit, with a whole replica per chip (data parallel) whenever the model
    fits one chip, sharded (fsdp) only when it does not. ddp: a whole replica per chip (PyTorch DDP,
    JAX's data axis); refused when one chip cannot hold it. fsdp: weights, gradients and optimizer
    state sharded over every chip (PyTorch FSDP2, JAX's fsdp axis). zero3: the same sharding through
    DeepSpeed ZeRO stage 3 (PyTorch only). explicit: the fsdp × tp mesh given."""

    AUTO = "auto"
    DDP = "ddp"
    FSDP = "fsdp"
    ZERO3 = "zero3"
    EXPLICIT = "explicit"


class Parallelism(ApiModel):
    """auto lets the planner shard only when the model does not fit one chip; explicit fixes the mesh."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "self.strategy != 'explicit' || has(self.fsdp) || has(self.tp)",
                    "explicit parallelism needs fsdp and/or tp",
                )
            ]
        }
    }

    strategy: ParallelismStrategy = ParallelismStrategy.AUTO
    fsdp: int | None = Field(default=None, ge=1)
    tp: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _explicit_needs_axes(self) -> Parallelism:
        if self.strategy == ParallelismStrategy.EXPLICIT and self.fsdp is None and self.tp is None:
            raise ValueError("explicit parallelism needs fsdp and/or tp")
        return self


class CheckpointFormat(StrEnum):
    SAFETENSORS = "safetensors"
    ORBAX = "orbax"


class Output(ApiModel):
    uri: StorageUri = storage_uri_field(
        "Where the trained weights, report.json and manifest.json go: pvc://, gs://, s3:// or a path."
    )
    format: CheckpointFormat = CheckpointFormat.SAFETENSORS
    merge_lora: bool = Field(default=True, description="Export W + alpha/r·BA so engines load it directly.")


class ExtractMode(StrEnum):
    """What of a completion the checker gets: all of it, or the first ``` fenced block in it."""

    RAW = "raw"
    FENCED = "fenced"


class Checker(ApiModel):
    """A command run once per sample in a fresh directory; exit status 0 = pass, timeout = fail."""

    # The directory holds the sample (`sample_file`) and the problem row (problem.json); the env has
    # ACCELBENCH_SAMPLE, ACCELBENCH_PROBLEM and ACCELBENCH_WORKDIR, and `{sample}`, `{problem}`,
    # `{workdir}` in an argument become the same paths. No shell: ["sh", "-c", "..."] for pipelines.

    command: list[str] = Field(min_length=1, description="argv, e.g. [sh, -c, 'iverilog ... && vvp ...'].")
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    extract: ExtractMode = Field(
        default=ExtractMode.RAW, description="raw: the whole completion; fenced: its first ``` block."
    )
    sample_file: str = Field(
        default="sample.txt",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=100,
        description="File name the sample is written to (an extension some tools want, e.g. design.v).",
    )


class PassAtK(ApiModel):
    """After training: sample completions for held-out problems and score them with a checker."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!has(self.samplesPerProblem) || !has(self.k) "
                    "|| self.k.all(x, x <= self.samplesPerProblem)",
                    "samplesPerProblem must be at least the largest k",
                )
            ]
        }
    }

    dataset: StorageUri = storage_uri_field(
        "JSONL of problems: chat `messages` (a trailing assistant turn, the reference, is "
        "dropped) or `prompt`, plus any fields the checker reads (tests, id, ...).",
    )
    k: list[Annotated[int, Field(ge=1, le=1000)]] = Field(
        default_factory=lambda: [1], min_length=1, max_length=8, description="The k of each pass@k."
    )
    samples_per_problem: int | None = Field(
        default=None, ge=1, le=1000, description="n samples per problem (>= every k); default: the largest k."
    )
    max_problems: int | None = Field(default=None, ge=1, description="Use the first N problems only.")
    max_new_tokens: int = Field(default=512, ge=1, le=32768)
    temperature: float = Field(
        default=0.0, ge=0, le=10, description="0 = greedy (one sample per problem stands for all n)."
    )
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    batch_size: int = Field(default=16, ge=1, le=4096, description="Sequences generated together.")
    checker: Checker

    @model_validator(mode="after")
    def _n_covers_k(self) -> PassAtK:
        if self.samples_per_problem is not None and max(self.k) > self.samples_per_problem:
            raise ValueError("samplesPerProblem must be at least the largest k")
        return self

    @property
    def n(self) -> int:
        """Samples per problem."""
        return self.samples_per_problem if self.samples_per_problem is not None else max(self.k)


HPU_GRAPHS_NEED_LAZY = "gaudi.hpuGraphs needs gaudi.lazyMode (HPU graphs are captured from lazy mode)"


class GaudiOptions(ApiModel):
    """Intel Gaudi execution knobs (gaudi2, gaudi3; the planner refuses them elsewhere)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [cel("!self.hpuGraphs || self.lazyMode", HPU_GRAPHS_NEED_LAZY)]
        }
    }

    lazy_mode: bool = Field(
        default=True,
        description="PT_HPU_LAZY_MODE: lazy mode accumulates ops into graphs run at each mark_step (the "
        "worker marks after every backward and optimizer step); false runs eager mode.",
    )
    hpu_graphs: bool = Field(
        default=False,
        description="Capture the training step's forward and backward as HPU graphs (habana_frameworks' "
        "ModuleCacher) to cut host overhead; lazy mode only.",
    )

    @model_validator(mode="after")
    def _graphs_need_lazy_mode(self) -> GaudiOptions:
        if self.hpu_graphs and not self.lazy_mode:
            raise ValueError(HPU_GRAPHS_NEED_LAZY)
        return self


class Task(StrEnum):
    """What the job runs on its chips (docs/design.md: modes of one kind, not new kinds).

    causalLM: fine-tune a language model (LoRA or full). superResolution: train an SR3-style
    diffusion super-resolution UNet from scratch on a folder of images. quantize: choose a weight
    format per layer of `model` from each layer's measured sensitivity under an effective-bits budget,
    export it and measure it against bf16."""

    CAUSAL_LM = "causalLM"
    SUPER_RESOLUTION = "superResolution"
    QUANTIZE = "quantize"


class SrPrecision(StrEnum):
    BF16 = "bf16"
    FP32 = "fp32"


MAX_UNET_LEVELS = 6
DEFAULT_UNET_CHANNELS = (64, 128, 256, 256)
# CEL has no pow(): 2^(levels - 1), indexed by the number of levels minus one. A list left out has
# no schema default (pydantic's default_factory), so the rules fall back to the default's levels.
_LEVELS = f"(has(self.channels) ? size(self.channels) : {len(DEFAULT_UNET_CHANNELS)})"
_HALVINGS = f"[1, 2, 4, 8, 16, 32][{_LEVELS} - 1]"


class SuperResolution(ApiModel):
    """SR3: a diffusers UNet2DModel denoises the high-resolution image given its bicubic-upsampled
    low-resolution view (DDPM training, DDIM sampling); held-out images are scored by PSNR and SSIM
    beside plain bicubic. Data parallel (DDP) over the chips: `globalBatchSize` images per step."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    f"self.imageSize % (self.scale * {_HALVINGS}) == 0",
                    "imageSize must be divisible by scale × 2^(levels − 1) (the UNet halves it at each "
                    "level below the first)",
                ),
                cel(f"self.attentionLevels <= {_LEVELS}", "attentionLevels exceeds the levels"),
                cel("self.warmupSteps < self.steps", "steps must exceed warmupSteps"),
            ]
        }
    }

    image_size: int = Field(default=64, ge=8, le=1024, description="High-resolution side in pixels.")
    scale: int = Field(default=4, ge=2, le=16, description="Upscaling factor: input is imageSize / scale.")
    channels: list[Annotated[int, Field(ge=8, le=2048)]] = Field(
        default_factory=lambda: list(DEFAULT_UNET_CHANNELS),
        min_length=1,
        max_length=MAX_UNET_LEVELS,
        description="UNet width per resolution level.",
    )
    layers_per_block: int = Field(default=2, ge=1, le=8)
    attention_levels: int = Field(
        default=1, ge=0, le=MAX_UNET_LEVELS, description="How many of the lowest-resolution levels attend."
    )
    global_batch_size: int = Field(default=16, ge=1, le=65536, description="Images per step, all chips.")
    steps: int = Field(default=100, ge=2, le=10_000_000)
    learning_rate: float = Field(default=1e-4, gt=0, le=1)
    warmup_steps: int = Field(
        default=2, ge=0, description="Leading steps left out of images/s (allocator, autotuning)."
    )
    precision: SrPrecision = Field(default=SrPrecision.BF16, description="bf16 autocast, or fp32.")
    eval_images: int = Field(
        default=16, ge=0, le=4096, description="The last N images of the folder are held out and scored."
    )
    sample_steps: int = Field(default=50, ge=1, le=1000, description="DDIM steps per held-out image.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _check(self) -> SuperResolution:
        halvings = 2 ** (len(self.channels) - 1)
        if self.image_size % (self.scale * halvings):
            raise ValueError(
                "imageSize must be divisible by scale × 2^(levels − 1) (the UNet halves it at each level "
                "below the first)"
            )
        if self.attention_levels > len(self.channels):
            raise ValueError("attentionLevels exceeds the levels")
        if self.warmup_steps >= self.steps:
            raise ValueError("steps must exceed warmupSteps")
        return self


class QuantFormat(StrEnum):
    INT4_G128 = "int4-g128"
    INT4_G64 = "int4-g64"
    INT8 = "int8"
    BF16 = "bf16"


@dataclass(frozen=True)
class WeightFormat:
    """What one stored weight format costs. Effective bits of a layer = bits per weight + the bits of
    its scales and zero-points per weight: int4 in groups of 128 with a bf16 scale and a bf16
    zero-point per group is 4 + 32/128 = 4.25; int8 per output row with a bf16 scale is
    8 + 16/in_features; bf16 is 16. The planner and the worker both count with this."""

    name: str  # what the spec, the plan and the report call it
    bits: int  # per stored weight; 16 = kept in bf16
    group_size: int | None  # weights per scale along the input dimension; None = one per output row
    scale_bits: int = 16  # bf16 scales
    zero_point_bits: int = 0  # asymmetric formats store one per group too

    def effective_bits(self, in_features: int) -> float:
        if self.bits >= 16:
            return float(self.bits)
        group = self.group_size or in_features
        return self.bits + (self.scale_bits + self.zero_point_bits) / group

    @property
    def symmetric(self) -> bool:
        return self.zero_point_bits == 0

    def applicable(self, in_features: int) -> bool:
        """A grouped format needs whole groups along the input dimension."""
        return self.group_size is None or in_features % self.group_size == 0


FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat(QuantFormat.INT4_G128.value, 4, 128, zero_point_bits=16),
        WeightFormat(QuantFormat.INT4_G64.value, 4, 64, zero_point_bits=16),
        WeightFormat(QuantFormat.INT8.value, 8, None),
        WeightFormat(QuantFormat.BF16.value, 16, None, scale_bits=0),
    )
}


def budget_floor(formats: Iterable[str], layer_in_features: Sequence[tuple[int, int]]) -> float | None:
    """The fewest effective bits per weight any assignment reaches: every layer in its cheapest
    applicable format. `layer_in_features`: (parameters, in_features) per layer. None when some
    layer has no applicable format."""
    chosen = [FORMATS[f] for f in formats]
    spent = total = 0.0
    for parameters, in_features in layer_in_features:
        costs = [f.effective_bits(in_features) for f in chosen if f.applicable(in_features)]
        if not costs:
            return None
        spent += min(costs) * parameters
        total += parameters
    return spent / total if total else None


FORMATS_REPEAT = "quantize.formats names a format twice"


class Quantize(ApiModel):
    """Per-layer sensitivity on calibration text (the dataset's conversations), one format per weight
    matrix (each decoder linear layer, and the embeddings and output head unless tied) under an
    effective-bits budget, a torchao export to spec.output, and perplexity, memory and tokens/s of
    the export against bf16 on held-out windows."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!has(self.formats) || self.formats.all(f, self.formats.filter(g, g == f).size() == 1)",
                    FORMATS_REPEAT,
                ),
            ]
        }
    }

    budget_bits: float = Field(
        default=4.5,
        ge=2,
        le=16,
        description=(
            "Effective bits per weight over the quantized matrices (decoder linear layers, and the "
            "embeddings and output head unless tied), scales and zero-points counted."
        ),
    )
    formats: list[QuantFormat] = Field(
        default_factory=lambda: [QuantFormat.INT4_G128, QuantFormat.INT8, QuantFormat.BF16],
        min_length=1,
        max_length=len(QuantFormat),
        description="Formats a layer may be given (torchao's weight-only int4/int8, or kept in bf16).",
    )
    seq_length: int = Field(default=512, ge=16, le=32768, description="Tokens per calibration window.")
    calibration_windows: int = Field(default=8, ge=1, le=4096)
    held_out_windows: int = Field(default=8, ge=1, le=4096, description="Windows perplexity is measured on.")
    batch_size: int = Field(default=4, ge=1, le=1024, description="Windows per forward pass.")

    @model_validator(mode="after")
    def _distinct(self) -> Quantize:
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(FORMATS_REPEAT)
        return self


# Which block belongs to which task (the others are refused), and the fields only causalLM reads.
TASK_BLOCKS: dict[Task, str] = {Task.SUPER_RESOLUTION: "superResolution", Task.QUANTIZE: "quantize"}
CAUSAL_LM_ONLY = ("method", "training", "passAtK", "parallelism")
IMAGE_FOLDER_ONLY_FOR_SR = (
    "dataset.format imageFolder is for task superResolution (which reads a folder of images, format "
    "auto or imageFolder); the other tasks read JSONL"
)


def _spec_rules() -> list[dict[str, str]]:
    rules = [
        cel(
            f"!has(self.{block}) || self.task == '{task.value}'",
            f"spec.{block} applies only to task {task.value}",
        )
        for task, block in TASK_BLOCKS.items()
    ]
    rules += [
        cel(
            f"self.task == 'causalLM' || !has(self.{field})",
            f"spec.{field} applies only to task causalLM",
        )
        for field in CAUSAL_LM_ONLY
    ]
    rules += [
        cel(
            "self.task == 'causalLM' || !has(self.framework) || self.framework == 'pytorch'",
            "tasks superResolution and quantize run on the PyTorch worker only",
        ),
        cel(
            "self.task != 'superResolution' || !has(self.model)",
            "task superResolution trains its UNet from scratch: leave spec.model out",
        ),
        cel(
            "self.task == 'superResolution' || has(self.model)",
            "spec.model is required for tasks causalLM and quantize",
        ),
        cel(
            "!has(self.dataset.format) || (self.task == 'superResolution' ? "
            "self.dataset.format in ['auto', 'imageFolder'] : self.dataset.format != 'imageFolder')",
            IMAGE_FOLDER_ONLY_FOR_SR,
        ),
        cel("self.task != 'quantize' || has(self.output)", "task quantize needs spec.output for the export"),
    ]
    return rules


class FinetuneJobSpec(RunControl):
    """Fine-tune a model (LoRA or full) with a JAX or PyTorch worker and report throughput, MFU and cost;
    or, by `task`, train an SR3 super-resolution model or quantize a model per layer."""

    model_config = RunControl.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": _spec_rules()}
    }

    task: Task = Field(default=Task.CAUSAL_LM, description="causalLM, superResolution or quantize.")
    model: ModelSource | None = Field(default=None, description="Required except for task superResolution.")
    dataset: DatasetSource
    method: Method = Field(default_factory=lambda: Method(rank=16))
    training: Training = Field(default_factory=Training)
    super_resolution: SuperResolution | None = Field(
        default=None, description="Task superResolution's settings (defaults when left out)."
    )
    quantize: Quantize | None = Field(
        default=None, description="Task quantize's settings (defaults when left out)."
    )
    framework: Framework | None = Field(
        default=None, description="Left out: jax on TPU, pytorch on GPU, Gaudi and CPU."
    )
    accelerator: Accelerator
    parallelism: Parallelism = Field(default_factory=Parallelism)
    gaudi: GaudiOptions | None = Field(default=None, description="Gaudi execution knobs (gaudi2, gaudi3).")
    image: str | None = Field(default=None, description="Worker image; defaults to the catalog's image.")
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    env_from: list[EnvFromSource] = Field(
        default_factory=list, max_length=16, description="Whole Secrets or ConfigMaps as variables."
    )
    resources: Resources | None = None
    output: Output | None = None
    pass_at_k: PassAtK | None = Field(
        default=None, description="Optional pass@k eval after training, scored by a checker command."
    )
    pricing: Pricing = Field(default_factory=Pricing)

    @model_validator(mode="after")
    def _task_fields(self) -> FinetuneJobSpec:
        """The spec rules (_spec_rules) for specs that never pass an apiserver (accelbench run, tests)."""
        # A field counts as set when it differs from its default: a payload or a status round trip
        # writes every default out, and must read back as the spec the apiserver admitted.
        task = self.task
        fields = type(self).model_fields
        present = {
            to_camel(name)
            for name, info in fields.items()
            if getattr(self, name) != info.get_default(call_default_factory=True)
        }
        for block_task, block in TASK_BLOCKS.items():
            if block in present and task != block_task:
                raise ValueError(f"spec.{block} applies only to task {block_task.value}")
        if task != Task.CAUSAL_LM:
            for name in CAUSAL_LM_ONLY:
                if name in present:
                    raise ValueError(f"spec.{name} applies only to task causalLM")
            if self.framework not in (None, Framework.PYTORCH):
                raise ValueError("tasks superResolution and quantize run on the PyTorch worker only")
        if task == Task.SUPER_RESOLUTION and self.model is not None:
            raise ValueError("task superResolution trains its UNet from scratch: leave spec.model out")
        if task != Task.SUPER_RESOLUTION and self.model is None:
            raise ValueError("spec.model is required for tasks causalLM and quantize")
        fmt = self.dataset.format
        if task == Task.SUPER_RESOLUTION:
            fits = fmt in (DatasetFormat.AUTO, DatasetFormat.IMAGE_FOLDER)
        else:
            fits = fmt != DatasetFormat.IMAGE_FOLDER
        if not fits:
            raise ValueError(IMAGE_FOLDER_ONLY_FOR_SR)
        if task == Task.QUANTIZE and self.output is None:
            raise ValueError("task quantize needs spec.output for the export")
        return self

    @property
    def base_model(self) -> ModelSource:
        """spec.model where the task has one (every task but superResolution)."""
        if self.model is None:
            raise ValueError(f"task {self.task.value} has no spec.model")
        return self.model

    @property
    def sr(self) -> SuperResolution:
        return self.super_resolution or SuperResolution()

    @property
    def quantization(self) -> Quantize:
        return self.quantize or Quantize()

"""Status of both kinds: phase, conditions with reasons a user can act on, plan, results, cost."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from .base import ApiModel


class Phase(StrEnum):
    PENDING = "Pending"
    SCHEDULING = "Scheduling"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class ConditionType(StrEnum):
    # kstatus (what Flux, Argo CD and `kubectl wait` read): Ready once the run succeeded, Reconciling
    # while work goes on, Stalled when it cannot go on without someone (it failed, a bad spec, a
    # foreign object holding a child's name). Derived from the phase on every pass.
    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    APPLIED = "Applied"  # the spec is valid and the children exist (False: why they do not)
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    RESULT_VALID = "ResultValid"
    ARTIFACT_WRITTEN = "ArtifactWritten"  # BenchCampaign with artifactUri: its results document is stored
    REGRESSED = "Regressed"  # BenchCampaign with a baseline: a cell worse than it by more than the threshold


class Reason(StrEnum):
    """Why a condition is what it is; each one tells the user what to look at."""

    INVALID_SPEC = "InvalidSpec"
    CHILDREN_CREATED = "ChildrenCreated"
    QUEUED = "Queued"
    SUSPENDED = "Suspended"
    UNSCHEDULABLE = "Unschedulable"
    SCHEDULED = "Scheduled"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    OOM_KILLED = "OOMKilled"
    PREEMPTED = "Preempted"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    CONTAINER_FAILED = "ContainerFailed"
    WORKER_ERROR = "WorkerError"
    RUNNING = "Running"
    COMPLETED = "Completed"
    RESULT_VALID = "ResultValid"
    ARTIFACT_STORED = "Written"  # BenchCampaign: its results document is at status.artifact
    ARTIFACT_WRITE_FAILED = "WriteFailed"  # the store refused or failed; tried again every minute
    REGRESSED = "Regressed"  # BenchCampaign with a baseline: a cell worse than it by more than the threshold
    RESULT_INVALID = "ResultInvalid"
    RESULT_MISSING = "ResultMissing"
    JOB_DELETED = "JobDeleted"  # the child Job vanished before its completion was observed
    POD_CREATE_FAILED = "FailedCreate"  # the apiserver refused the Job's pods (quota, Pod Security, ...)
    NAME_CONFLICT = "NameConflict"  # a child's name is taken by an object this resource does not own
    QUOTA_EXCEEDED = "QuotaExceeded"  # a ResourceQuota refused a child (retried while quota frees up)
    WAITING_FOR_MODEL = "WaitingForModel"  # an InferenceBench's FinetuneJob has not succeeded yet
    MODEL_UNAVAILABLE = "ModelUnavailable"  # ... and never will (failed, no servable output)
    # A worker's own failure, as its report's error.type: the run's Failed condition carries it.
    INVALID_CONFIG = "InvalidConfig"
    OBJECT_NOT_FOUND = "ObjectNotFound"
    OBJECT_ACCESS_DENIED = "ObjectAccessDenied"
    OBJECT_CORRUPT = "ObjectCorrupt"
    INSUFFICIENT_DISK = "InsufficientDisk"
    OUTPUT_NOT_WRITTEN = "OutputNotWritten"


# Worker failures a retry cannot fix (the worker exits ExitCode.INVALID_CONFIG) and that name their
# cause: status shows them as the Failed reason instead of the generic WorkerError.
WORKER_FAILURE_REASONS = frozenset(
    {
        Reason.INVALID_CONFIG,
        Reason.OBJECT_NOT_FOUND,
        Reason.OBJECT_ACCESS_DENIED,
        Reason.OBJECT_CORRUPT,
        Reason.INSUFFICIENT_DISK,
        Reason.OUTPUT_NOT_WRITTEN,
    }
)


def named_failure(message: str) -> tuple[str, str] | None:
    """(reason, rest) of a `Reason: rest` message whose reason is one of WORKER_FAILURE_REASONS (how a
    worker's error and the fetch container's termination message read); None for anything else."""
    reason, sep, rest = message.partition(": ")
    if sep and reason in WORKER_FAILURE_REASONS:
        return reason, rest.strip()
    return None


class Condition(ApiModel):
    type: str
    status: str = Field(pattern="^(True|False|Unknown)$")
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class PlanStatus(ApiModel):
    """What the planner chose, so the user sees chips and memory before the pods run."""

    chips: int
    hosts: int
    chips_per_host: int
    topology: str | None = None
    fsdp: int = 1
    tp: int = 1
    strategy: str | None = Field(default=None, description="ddp, fsdp, zero3 or explicit (resolved).")
    memory_per_chip_gb: float
    hbm_per_chip_gb: float
    framework: str | None = None


class Children(ApiModel):
    job: str | None = None
    service: str | None = None
    server: str | None = None
    client: str | None = None
    results_config_map: str | None = None


class Progress(ApiModel):
    """Rank 0's live figures, scraped by the operator from the worker's metrics while it runs."""

    step: int | None = Field(default=None, ge=0)
    total_steps: int | None = Field(default=None, ge=0)
    loss: float | None = None
    tokens_per_second: float | None = Field(default=None, ge=0)
    mfu: float | None = Field(default=None, ge=0, le=1)
    updated_at: str | None = Field(default=None, description="When the operator read them (UTC).")


class Cost(ApiModel):
    dollars: float | None = Field(
        default=None, description="Absent when no price is known (see priceSource): never a $0 guess."
    )
    chips: int
    hours: float = Field(description="Chip-holding hours over every segment of the run.")
    earlier_hours: float = Field(
        default=0.0, description="Hours of segments that ended before the current one (suspend, preemption)."
    )
    dollars_per_chip_hour: float | None = Field(
        default=None, description="Absent when no price is known for the accelerator."
    )
    price_source: str = Field(description="Where the price came from: catalog entry and date, or custom.")


class PassAtKResults(ApiModel):
    """pass@k after training: the unbiased estimator 1 - C(n-c,k)/C(n,k), averaged over problems."""

    # `samples` counts checked completions (greedy decoding checks one per problem and counts it n
    # times); passed + failed = samples, and timeouts and checker errors are failures too.

    scores: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=dict, description='By k: {"pass@1": 0.42, "pass@10": 0.71}.'
    )
    problems: int = Field(ge=0)
    samples_per_problem: int = Field(ge=1)
    samples: int = Field(ge=0, description="Completions checked.")
    passed: int = Field(ge=0)
    failed: int = Field(ge=0)
    timeouts: int = Field(default=0, ge=0)
    checker_errors: int = Field(default=0, ge=0, description="The checker could not run (e.g. not found).")
    seconds: float | None = Field(default=None, ge=0)
    generate_seconds: float | None = Field(default=None, ge=0)
    check_seconds: float | None = Field(default=None, ge=0)
    note: str | None = Field(default=None, max_length=300)
    intervals: dict[
        str, Annotated[list[Annotated[float, Field(ge=0, le=1)]], Field(min_length=2, max_length=2)]
    ] = Field(
        default_factory=dict,
        description='By k: the 95 % bootstrap interval over problems, {"pass@1": [0.38, 0.47]}.',
    )
    by_difficulty: dict[str, dict[str, Annotated[float, Field(ge=0, le=1)]]] = Field(
        default_factory=dict,
        description='With `difficulty` in the problems: scores per difficulty, {"hard": {"pass@1": 0.2}}.',
    )

    @model_validator(mode="after")
    def _counts_add_up(self) -> PassAtKResults:
        if self.passed + self.failed != self.samples:
            raise ValueError("passed + failed must equal samples")
        if self.timeouts + self.checker_errors > self.failed:
            raise ValueError("timeouts and checker errors are failures: their sum cannot exceed failed")
        return self


class SuperResolutionResults(ApiModel):
    """Task superResolution: training speed and the held-out images' quality beside bicubic."""

    images_per_second: float | None = Field(default=None, ge=0, description="Global, steady-state steps.")
    images_per_second_per_chip: float | None = Field(default=None, ge=0)
    parameters: int | None = Field(default=None, ge=0, description="The UNet's parameter count.")
    eval_images: int = Field(default=0, ge=0)
    psnr: float | None = Field(default=None, description="Mean PSNR of the held-out images, dB.")
    ssim: float | None = Field(default=None, ge=-1, le=1)
    bicubic_psnr: float | None = Field(default=None, description="The same images upsampled bicubically.")
    bicubic_ssim: float | None = Field(default=None, ge=-1, le=1)
    eval_seconds: float | None = Field(default=None, ge=0)


class QuantizationResults(ApiModel):
    """Task quantize: the chosen formats' cost and what they do to quality, memory and speed."""

    budget_bits: float = Field(ge=0)
    effective_bits: float = Field(
        ge=0,
        description=(
            "Per weight of the quantized matrices (decoder linear layers, and the embeddings and "
            "output head unless tied), scales and zero-points counted."
        ),
    )
    model_effective_bits: float = Field(
        ge=0, description="Per weight of the whole model (norms and tied embeddings in bf16 counted)."
    )
    compression: float = Field(ge=0, description="bf16 bytes / exported bytes, whole model.")
    layers: int = Field(ge=0)
    formats_used: dict[str, int] = Field(default_factory=dict, description="Format -> layers given it.")
    perplexity_bf16: float = Field(ge=0)
    perplexity_quantized: float = Field(ge=0)
    perplexity_increase: float = Field(description="Relative: 0.02 is +2 %.")
    weight_bytes_bf16: int = Field(ge=0)
    weight_bytes_quantized: int = Field(ge=0)
    prefill_tokens_per_second_bf16: float | None = Field(default=None, ge=0)
    prefill_tokens_per_second_quantized: float | None = Field(default=None, ge=0)
    decode_tokens_per_second_bf16: float | None = Field(default=None, ge=0)
    decode_tokens_per_second_quantized: float | None = Field(default=None, ge=0)
    sensitivity_table: str | None = Field(
        default=None, max_length=2048, description="Where the per-layer sensitivity table was written."
    )


class FinetuneResults(ApiModel):
    tokens_per_second: float | None = Field(default=None, ge=0, description="Task causalLM.")
    tokens_per_second_per_chip: float | None = Field(default=None, ge=0)
    mfu: float | None = Field(default=None, ge=0, le=1)
    mfu_formula: str | None = None
    trained_tokens: int | None = Field(default=None, ge=0)
    steps: int = Field(default=0, ge=0)
    first_loss: float | None = None
    final_loss: float | None = None
    eval_loss: float | None = None
    perplexity: float | None = Field(default=None, ge=0)
    train_seconds: float | None = Field(default=None, ge=0)
    device: str | None = None
    pass_at_k: PassAtKResults | None = None
    super_resolution: SuperResolutionResults | None = None
    quantization: QuantizationResults | None = None


class BenchCell(ApiModel):
    """One point of the sweep: an input length at a concurrency (closed loop) or a rate (open loop)."""

    input_length: int = Field(ge=0)
    concurrency: int | None = Field(default=None, ge=1)
    request_rate: float | None = Field(default=None, ge=0)
    ttft_p50_ms: float | None = Field(default=None, ge=0)
    ttft_p99_ms: float | None = Field(default=None, ge=0)
    tpot_p50_ms: float | None = Field(default=None, ge=0)
    tpot_p99_ms: float | None = Field(default=None, ge=0)
    itl_p50_ms: float | None = Field(default=None, ge=0)
    itl_p99_ms: float | None = Field(default=None, ge=0)
    e2e_p50_ms: float | None = Field(default=None, ge=0)
    e2e_p99_ms: float | None = Field(default=None, ge=0)
    output_tokens_per_second: float | None = Field(default=None, ge=0)
    requests_per_second: float | None = Field(default=None, ge=0)
    goodput_output_tokens_per_second: float | None = Field(
        default=None, ge=0, description="Output tokens/s of the requests that met the SLO."
    )
    attainment: float | None = Field(default=None, ge=0, le=1)
    errors: int = Field(default=0, ge=0)
    client_limited: bool | None = Field(
        default=None,
        description="Open loop: the client could not deliver this rate against a null server, so these "
        "latencies are partly the client's, not the server's alone.",
    )


class ClientCalibrationPoint(ApiModel):
    """One planned open-loop rate, driven against a zero-latency server before the run."""

    request_rate: float = Field(gt=0)
    requests: int = Field(ge=0)
    delivered_fraction: float | None = Field(
        default=None, ge=0, description="The planned send span over the actual one: 1 = on schedule."
    )
    send_lag_p99_ms: float | None = Field(default=None, ge=0, description="Actual send - scheduled send.")


class ClientOverhead(ApiModel):
    """The load generator measured against itself: what it can deliver on this pod at the rates the
    run plans, before any server figure is trusted."""

    against: str = Field(description="What it was measured against (a loopback null server).")
    points: list[ClientCalibrationPoint] = Field(default_factory=list)
    delivers_planned_rates: bool = Field(
        description="Every planned rate delivered at >= 99.5 %; otherwise those cells are clientLimited."
    )


class InputLengthCapacity(ApiModel):
    """The SLO capacity at one input length: how many concurrent users of that prompt length the
    server carries, and what a million output tokens cost there."""

    input_length: int = Field(ge=0)
    capacity_concurrency: int | None = Field(
        default=None, ge=1, description="Largest level meeting the SLO; empty when even the smallest failed."
    )
    first_failing_concurrency: int | None = Field(default=None, ge=1)
    binding_constraint: str | None = None
    output_tokens_per_second: float | None = Field(default=None, ge=0, description="At capacity.")
    dollars_per_million_tokens: float | None = Field(default=None, ge=0, description="At capacity.")


class BenchResults(ApiModel):
    cells: list[BenchCell] = Field(default_factory=list)
    capacity_concurrency: int | None = Field(default=None, ge=1, description="Largest level meeting the SLO.")
    capacity_input_length: int | None = Field(
        default=None, description="The input length the capacity is for (the longest swept)."
    )
    capacity_by_input_length: list[InputLengthCapacity] = Field(
        default_factory=list, description="The SLO capacity at each input length swept, shortest first."
    )
    client_overhead: ClientOverhead | None = Field(
        default=None, description="With open-loop rates: the client's own calibration at those rates."
    )
    binding_constraint: str | None = None
    first_failing_concurrency: int | None = None
    peak_output_tokens_per_second: float | None = Field(default=None, ge=0)
    dollars_per_million_tokens_at_capacity: float | None = Field(default=None, ge=0)
    dollars_per_million_tokens_at_peak: float | None = Field(default=None, ge=0)
    server_startup_seconds: float | None = Field(default=None, ge=0)
    price_source: str | None = None


class ResourceStatus(ApiModel):
    phase: Phase | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = None
    accelerator: str | None = Field(default=None, description="Type and shape, for the printer column.")
    plan: PlanStatus | None = None
    children: Children | None = None
    start_time: str | None = None
    completion_time: str | None = None
    progress: Progress | None = None
    cost: Cost | None = None
    message: str | None = None


class FinetuneJobStatus(ResourceStatus):
    results: FinetuneResults | None = None


class ServedAdapter(ApiModel):
    uri: str
    name: str
    rank: int


class ServedModelStatus(ApiModel):
    """What an InferenceBench that names a FinetuneJob serves, fixed when its children were applied."""

    finetune_job: str
    finetune_job_uid: str | None = None
    uri: str | None = None
    family: str | None = None
    size: str | None = None
    parameters: int | None = None
    adapter: ServedAdapter | None = None


class InferenceBenchStatus(ResourceStatus):
    results: BenchResults | None = None
    served_model: ServedModelStatus | None = None

"""InferenceBench: a serving engine plus a load generator sweeping input length and load."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from .base import ApiModel, cel
from .common import (
    Accelerator,
    EnvFromSource,
    EnvVar,
    ModelFamily,
    ModelSource,
    Pricing,
    Resources,
    RunControl,
    StorageUri,
    storage_uri_field,
)


class Engine(StrEnum):
    VLLM = "vllm"
    TGI = "tgi"
    JETSTREAM = "jetstream"
    # Hugging Face `transformers serve`: any transformers model, CPU or GPU, no extra engine.
    # For small models and local runs; its numbers are not those of a production engine.
    TRANSFORMERS = "transformers"
    EXTERNAL = "external"


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    FP8 = "fp8"
    BF16 = "bf16"


class Server(ApiModel):
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("self.engine != 'external' || has(self.endpoint)", "engine external needs an endpoint"),
                cel("self.engine == 'external' || !has(self.endpoint)", "endpoint applies only to external"),
            ]
        }
    }

    engine: Engine = Engine.VLLM
    image: str | None = None
    endpoint: str | None = Field(default=None, pattern=r"^https?://", description="For engine external.")
    tensor_parallel: int | None = Field(default=None, ge=1, description="Left out: the planner's chips.")
    max_model_length: int | None = Field(default=None, ge=16)
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO
    quantization: str | None = Field(default=None, description="Engine quantization name, e.g. fp8, awq.")
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)
    port: int = Field(default=8000, ge=1, le=65535)
    readiness_timeout_seconds: int = Field(default=1800, ge=10)
    deadline_seconds: int = Field(
        default=6 * 3600,
        ge=60,
        description="The server Job's own activeDeadlineSeconds: the longest it may hold its chips, "
        "even with the operator gone (the operator stops it as soon as the client is done). A shorter "
        "spec.activeDeadlineSeconds wins.",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    resources: Resources | None = None
    run_as_root: bool = Field(
        default=False,
        description="Run the engine as root, for an image that cannot run as another user. Left false, "
        "it runs as uid 1000 with a writable HOME (the restricted Pod Security profile); Gaudi runs as "
        "root regardless (its runtime needs it).",
    )

    @model_validator(mode="after")
    def _endpoint(self) -> Server:
        if self.engine == Engine.EXTERNAL and not self.endpoint:
            raise ValueError("engine external needs an endpoint")
        if self.engine != Engine.EXTERNAL and self.endpoint:
            raise ValueError("endpoint applies only to external")
        return self


class RequestApi(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


class PromptDatasetType(StrEnum):
    RANDOM = "random"
    JSONL = "jsonl"


class PromptDataset(ApiModel):
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("self.type != 'jsonl' || has(self.uri)", "dataset jsonl needs a uri"),
            ]
        }
    }

    type: PromptDatasetType = PromptDatasetType.RANDOM
    uri: str | None = None

    @model_validator(mode="after")
    def _uri(self) -> PromptDataset:
        if self.type == PromptDatasetType.JSONL and not self.uri:
            raise ValueError("dataset jsonl needs a uri")
        return self


class Workload(ApiModel):
    """The sweep: every input length × every concurrency (closed loop) and request rate (open loop)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                # Lists left out are absent in CEL (the pydantic defaults apply later), so every
                # rule guards with has(); the real apiserver refuses the rule otherwise.
                cel(
                    "!has(self.concurrency) || size(self.concurrency) > 0"
                    " || (has(self.requestRates) && size(self.requestRates) > 0)",
                    "workload needs concurrency levels or request rates",
                ),
                cel(
                    "!has(self.concurrency) || self.concurrency.all(c, c >= 1)",
                    "every concurrency must be at least 1",
                ),
                cel(
                    "!has(self.requestRates) || self.requestRates.all(r, r > 0.0)",
                    "every request rate must be above 0",
                ),
                cel(
                    "!has(self.inputLengths) || self.inputLengths.all(n, n >= 1)",
                    "every input length must be at least 1",
                ),
            ]
        }
    }

    input_lengths: list[int] = Field(default_factory=lambda: [512], min_length=1, max_length=64)
    output_length: int = Field(default=128, ge=1)
    concurrency: list[Annotated[int, Field(le=100_000)]] = Field(
        default_factory=lambda: [1, 4, 16], max_length=64
    )
    request_rates: list[float] = Field(default_factory=list, max_length=64)
    requests_per_point: int | None = Field(default=None, ge=1, le=1_000_000)
    seconds_per_point: float | None = Field(default=None, gt=0)
    warmup_requests: int = Field(default=4, ge=0, le=100_000)
    dataset: PromptDataset = Field(default_factory=PromptDataset)
    ignore_eos: bool = True
    api: RequestApi = RequestApi.COMPLETIONS

    @model_validator(mode="after")
    def _levels(self) -> Workload:
        if not self.concurrency and not self.request_rates:
            raise ValueError("workload needs concurrency levels or request rates")
        if any(c < 1 for c in self.concurrency):
            raise ValueError("every concurrency must be at least 1")
        if any(r <= 0 for r in self.request_rates):
            raise ValueError("every request rate must be above 0")
        if any(n < 1 for n in self.input_lengths):
            raise ValueError("every input length must be at least 1")
        return self


class Slo(ApiModel):
    """A request meets the SLO when each set bound holds; a level passes at the attainment share."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "has(self.ttftMs) || has(self.tpotMs) || has(self.e2eMs)",
                    "slo needs at least one of ttftMs, tpotMs, e2eMs",
                )
            ]
        }
    }

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)
    attainment: float = Field(default=0.9, gt=0, le=1)

    @model_validator(mode="after")
    def _some_bound(self) -> Slo:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("slo needs at least one of ttftMs, tpotMs, e2eMs")
        return self


class BenchOutput(ApiModel):
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "self.uri.startsWith('gs://') || self.uri.startsWith('s3://')",
                    "a bench output uri must be gs://BUCKET/PATH or s3://BUCKET/PATH",
                )
            ]
        }
    }

    uri: StorageUri = storage_uri_field(
        "Where the load generator writes results.json, the HTML report with its plots, report.json "
        "and manifest.json when the run ends: gs:// or s3://."
    )

    @model_validator(mode="after")
    def _object_store(self) -> BenchOutput:
        if not self.uri.startswith(("gs://", "s3://")):
            raise ValueError("a bench output uri must be gs://BUCKET/PATH or s3://BUCKET/PATH")
        return self


class LoraAdapter(ApiModel):
    """A PEFT LoRA adapter served on top of model.uri (vLLM's multi-LoRA serving)."""

    uri: StorageUri = storage_uri_field("The adapter directory (adapter_config.json, adapter weights).")
    name: str = Field(
        default="finetuned",
        pattern=r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$",
        description="The model name requests ask for; the load generator sends it.",
    )
    rank: int = Field(default=16, ge=1, le=4096, description="Its LoRA rank (the engine's --max-lora-rank).")


class ServedModel(ModelSource):
    """What the engine serves: a model directory (uri), optionally with a LoRA adapter on top, or what
    a FinetuneJob of the same namespace trained (finetuneJob): the bench then waits until that run
    succeeded and serves its output (a merged model, or its adapter on the base model it trained),
    with family and size taken from it."""

    model_config = ModelSource.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("has(self.uri) != has(self.finetuneJob)", "set exactly one of uri and finetuneJob"),
                cel(
                    "has(self.finetuneJob) || has(self.family)",
                    "family is needed unless finetuneJob gives it",
                ),
                cel("!has(self.finetuneJob) || !has(self.adapter)", "finetuneJob brings its own adapter"),
            ]
        }
    }

    uri: StorageUri | None = storage_uri_field(  # type: ignore[assignment]
        "Hugging Face-format model directory: pvc://CLAIM/PATH, gs://, s3://, or a local path.", default=None
    )
    family: ModelFamily | None = Field(  # type: ignore[assignment]
        default=None, description="Architecture family; with finetuneJob, the trained model's."
    )
    finetune_job: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="Serve what this FinetuneJob (same namespace) trained, once it succeeded.",
    )
    adapter: LoraAdapter | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ServedModel:
        if (self.uri is None) == (self.finetune_job is None):
            raise ValueError("set exactly one of uri and finetuneJob")
        if self.finetune_job is None and self.family is None:
            raise ValueError("family is needed unless finetuneJob gives it")
        if self.finetune_job is not None and self.adapter is not None:
            raise ValueError("finetuneJob brings its own adapter")
        return self


class InferenceBenchSpec(RunControl):
    """Serve a model and sweep load against it: latency percentiles, SLO capacity and $ per 1M tokens."""

    model: ServedModel
    server: Server = Field(default_factory=Server)
    accelerator: Accelerator
    workload: Workload = Field(default_factory=Workload)
    slo: Slo | None = None
    capacity_search: bool = Field(
        default=True, description="Search the largest concurrency that meets the SLO (needs slo)."
    )
    client_image: str | None = None
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="For every pod of the bench (engine, model fetch, load generator): e.g. an object "
        "store's endpoint, credentials through secretKeyRef. server.env adds the engine's own.",
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=16,
        description="Whole Secrets or ConfigMaps as variables, for every pod of the bench like env.",
    )
    output: BenchOutput | None = None
    pricing: Pricing = Field(default_factory=Pricing)

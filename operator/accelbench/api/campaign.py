"""BenchCampaign: a matrix of FinetuneJobs and InferenceBenches on identical work, with a budget.

Each arm is a template (the spec of one run) and a matrix of spec paths to vary (accelerators
first, but any field). The operator makes one child run per cell and repeat, named by a hash of the
cell's values (campaign/matrix.py), admits cells under `budget` and the concurrency caps
(campaign/budget.py), and gathers every child's results into one table in status.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from .base import API_VERSION, ApiModel, cel
from .common import StorageUri, storage_uri_field
from .finetune import FinetuneJobSpec
from .inference import InferenceBenchSpec
from .resources import MAX_NAME_LENGTH, ObjectMeta
from .status import Condition

MAX_CAMPAIGN_USD = 10_000_000.0
MAX_CELLS = 500  # a campaign's children live in one namespace and one status
CELL_KEY_LENGTH = 8  # hex digits of sha256 naming a cell: 4e9 keys, far beyond any campaign's cells
MAX_REPEATS = 99
# A child is a run like any other, so its name has a run's bound: "<campaign>-t<key>-<repeat>".
MAX_CAMPAIGN_NAME_LENGTH = MAX_NAME_LENGTH - len("-t") - CELL_KEY_LENGTH - len(f"-{MAX_REPEATS}")

# A matrix value is any JSON (an accelerator object, a number, a string): kept as given.
_ANY_VALUE = {"x-kubernetes-preserve-unknown-fields": True}


class Matrix(ApiModel):
    """`axes` maps a dotted spec path (as in the manifest: `accelerator`, `training.seqLength`) to the
    values to try; the cells are their product, minus each `exclude` entry (a partial assignment),
    plus each `include` entry (a whole assignment)."""

    axes: dict[str, list[Any]] = Field(
        default_factory=dict,
        max_length=8,
        json_schema_extra={"additionalProperties": {"type": "array", "maxItems": 64, "items": _ANY_VALUE}},
    )
    include: list[dict[str, Any]] = Field(
        default_factory=list, max_length=64, json_schema_extra={"items": {"type": "object", **_ANY_VALUE}}
    )
    exclude: list[dict[str, Any]] = Field(
        default_factory=list, max_length=64, json_schema_extra={"items": {"type": "object", **_ANY_VALUE}}
    )


class FinetuneArm(ApiModel):
    template: FinetuneJobSpec
    matrix: Matrix = Field(default_factory=Matrix)


# The one matrix path that is not a spec path: the training cell whose output a serving cell serves.
FROM_FINETUNE = "fromFinetune"


class InferenceArm(ApiModel):
    template: InferenceBenchSpec
    matrix: Matrix = Field(default_factory=Matrix)
    from_finetune: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"type": "object", **_ANY_VALUE},
        description=(
            "Serve what the campaign trained: matrix values that select one training cell (e.g. "
            "{accelerator: {type: h100, count: 2}}); its first repeat's output becomes model.uri, and "
            "the serving cell waits until that run succeeded. A matrix axis or include entry "
            f"`{FROM_FINETUNE}` sets it per cell."
        ),
    )


class Budget(ApiModel):
    max_usd: float | None = Field(
        default=None, alias="maxUSD", gt=0, le=MAX_CAMPAIGN_USD, description="Never spent past."
    )
    max_chip_hours: float | None = Field(default=None, gt=0, le=MAX_CAMPAIGN_USD)


class Baseline(ApiModel):
    """What the cells are compared with: a cell of this campaign (matrix values selecting one cell of
    each kind) or the same cells of an earlier campaign in the namespace (matched by cell key)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("has(self.cell) != has(self.campaign)", "a baseline is a cell or a campaign, one of them")
            ]
        }
    }

    cell: dict[str, Any] | None = Field(default=None, json_schema_extra={"type": "object", **_ANY_VALUE})
    campaign: str | None = Field(default=None, max_length=MAX_CAMPAIGN_NAME_LENGTH)
    threshold: float = Field(
        default=0.05,
        gt=0,
        le=10,
        description="A cell worse than its baseline by more than this fraction regressed.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Baseline:
        if (self.cell is None) == (self.campaign is None):
            raise ValueError("baseline: set cell or campaign, one of them")
        return self


class BenchCampaignSpec(ApiModel):
    """A matrix of fine-tuning and serving runs across accelerators, with a budget and one report."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("has(self.finetune) || has(self.inference)", "a campaign needs finetune or inference")
            ]
        }
    }

    finetune: FinetuneArm | None = None
    inference: InferenceArm | None = None
    repeats: int = Field(default=1, ge=1, le=MAX_REPEATS, description="Runs per cell: median and spread.")
    budget: Budget = Field(default_factory=Budget)
    max_concurrent: int | None = Field(default=None, ge=1, le=1000, description="Cells running at once.")
    max_concurrent_per_accelerator: int | None = Field(default=None, ge=1, le=1000)
    baseline: Baseline | None = None
    artifact_uri: StorageUri | None = storage_uri_field(
        "Where the finished campaign's results JSON goes (<uri>/<campaign>.json): gs://, s3:// or a path "
        "the operator can write. `accelbench compare` merges such files from several clusters.",
        default=None,
    )
    serving_hours: list[float] = Field(
        default_factory=lambda: [1.0],
        min_length=1,
        max_length=8,
        json_schema_extra={"items": {"type": "number", "exclusiveMinimum": 0}},
        description="Total cost of ownership rows: training + this many hours of serving what it trained.",
    )

    @model_validator(mode="after")
    def _some_arm(self) -> BenchCampaignSpec:
        if self.finetune is None and self.inference is None:
            raise ValueError("a campaign needs finetune or inference")
        if self.artifact_uri is not None and self.artifact_uri.startswith("pvc://"):
            raise ValueError(
                "artifactUri: the operator writes it itself, so gs://, s3:// or a path, not pvc://"
            )
        return self


class CellRow(ApiModel):
    """One child run: where it ran and what it measured, as its own status says."""

    name: str
    kind: str
    cell: str = Field(description="The cell's key: a hash of its values, shared by its repeats.")
    values: str = Field(description="The cell's matrix values, as JSON.")
    repeat: int = Field(ge=0)
    accelerator: str | None = None
    phase: str | None = None
    reason: str | None = None
    tokens_per_second: float | None = Field(default=None, ge=0)
    tokens_per_second_per_chip: float | None = Field(default=None, ge=0)
    mfu: float | None = Field(default=None, ge=0, le=1)
    final_loss: float | None = None
    peak_output_tokens_per_second: float | None = Field(default=None, ge=0)
    capacity_concurrency: int | None = Field(default=None, ge=0)
    dollars_per_million_tokens: float | None = Field(default=None, ge=0)
    cost_dollars: float | None = Field(default=None, ge=0)
    chip_hours: float | None = Field(default=None, ge=0)
    dollars_per_hour: float | None = Field(default=None, ge=0, description="chips x $/chip-hour.")
    ttft_p99_ms: float | None = Field(default=None, ge=0, description="At the SLO capacity.")
    tpot_p99_ms: float | None = Field(default=None, ge=0, description="At the SLO capacity.")
    images_per_second: float | None = Field(default=None, ge=0, description="Task superResolution.")
    images_per_second_per_chip: float | None = Field(default=None, ge=0)
    psnr: float | None = Field(default=None, description="Held-out PSNR, dB (task superResolution).")
    effective_bits: float | None = Field(default=None, ge=0, description="Task quantize.")
    perplexity_increase: float | None = Field(default=None, description="Task quantize: relative, vs bf16.")
    model_from: str | None = Field(default=None, description="The training run whose output it serves.")
    in_matrix: bool = Field(default=True, description="False: a Git edit removed the cell; its run is kept.")


class Spread(ApiModel):
    """A cell's repeats: the median, and the coefficient of variation (sample stdev / mean) from two."""

    median: float
    cv: float | None = Field(default=None, ge=0)
    n: int = Field(ge=1)


class CellSummary(ApiModel):
    """One cell over its succeeded repeats; ratios are to the baseline (>1: faster, or costlier)."""

    cell: str
    name: str = Field(description="The first repeat's run.")
    kind: str
    values: str
    accelerator: str | None = None
    runs: int = Field(ge=0)
    succeeded: int = Field(ge=0)
    tokens_per_second: Spread | None = None
    tokens_per_second_per_chip: Spread | None = None
    mfu: Spread | None = None
    final_loss: Spread | None = None
    peak_output_tokens_per_second: Spread | None = None
    capacity_concurrency: Spread | None = None
    ttft_p99_ms: Spread | None = None
    tpot_p99_ms: Spread | None = None
    dollars_per_million_tokens: Spread | None = None
    cost_dollars: Spread | None = None
    images_per_second: Spread | None = None
    images_per_second_per_chip: Spread | None = None
    psnr: Spread | None = None
    effective_bits: Spread | None = None
    perplexity_increase: Spread | None = None
    scaling_efficiency: float | None = Field(
        default=None,
        ge=0,
        description="T(N) / (N·T(1)): this cell's throughput over N chips against N times the cell that "
        "differs only in running on one chip (task superResolution, and causalLM by tokens/s).",
    )
    dollars_per_hour: float | None = Field(default=None, ge=0)
    model_from: str | None = None
    speed_ratio: float | None = Field(default=None, ge=0, description="Throughput / the baseline's.")
    cost_ratio: float | None = Field(
        default=None, ge=0, description="Cost (or $/1M tokens) / the baseline's."
    )
    regressed: list[str] = Field(default_factory=list, description="Metrics worse than the baseline allows.")


class Ownership(ApiModel):
    """Total cost of ownership: one training run's cost plus serving its output for some hours."""

    training: str
    serving: str
    training_accelerator: str | None = None
    serving_accelerator: str | None = None
    training_dollars: float = Field(ge=0)
    serving_dollars_per_hour: float = Field(ge=0)
    serving_hours: float = Field(gt=0)
    dollars: float = Field(ge=0)
    ratio: float | None = Field(default=None, ge=0, description="To the cheapest at the same hours.")


class Totals(ApiModel):
    cells: int = Field(default=0, ge=0)
    succeeded: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)
    skipped: int = Field(default=0, ge=0, description="Serving cells whose model's training failed.")
    running: int = Field(default=0, ge=0)
    waiting: int = Field(default=0, ge=0)
    dollars: float = Field(default=0.0, ge=0, description="Priced cells only: see unpricedCells.")
    chip_hours: float = Field(default=0.0, ge=0)
    unpriced_cells: int = Field(
        default=0,
        ge=0,
        description="Cells that held chips with no price known: their chip-hours count, their $ are "
        "unavailable and left out of dollars (never counted as $0 spent).",
    )


class BenchCampaignStatus(ApiModel):
    phase: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    cells: list[CellRow] = Field(default_factory=list, max_length=MAX_CELLS)
    waiting: dict[str, str] = Field(default_factory=dict, description="Cell name -> why it has not started.")
    totals: Totals = Field(default_factory=Totals)
    pareto_front: list[str] = Field(
        default_factory=list, description="Fine-tuning cells no other beats on both cost and tokens/s."
    )
    winners: dict[str, str] = Field(default_factory=dict, description="Metric -> the cell best at it.")
    summary: list[CellSummary] = Field(default_factory=list, max_length=MAX_CELLS)
    ownership: list[Ownership] = Field(default_factory=list, max_length=MAX_CELLS)
    baseline: str | None = Field(default=None, description="What the ratios compare with.")
    regressions: list[str] = Field(default_factory=list, max_length=MAX_CELLS)
    artifact: str | None = Field(default=None, description="Where the results JSON was written.")


class BenchCampaign(ApiModel):
    KIND: ClassVar[str] = "BenchCampaign"
    PLURAL: ClassVar[str] = "benchcampaigns"
    SHORT_NAMES: ClassVar[list[str]] = ["bc", "campaign"]

    api_version: Literal["accelbench.io/v1alpha1"] = API_VERSION
    kind: Literal["BenchCampaign"] = "BenchCampaign"
    metadata: ObjectMeta
    spec: BenchCampaignSpec
    status: BenchCampaignStatus | None = None

    @model_validator(mode="after")
    def _name_leaves_room_for_cells(self) -> BenchCampaign:
        if len(self.metadata.name) > MAX_CAMPAIGN_NAME_LENGTH:
            raise ValueError(
                f"metadata.name: at most {MAX_CAMPAIGN_NAME_LENGTH} characters (each cell's run is named "
                "<campaign>-<t|s><8-hex key>[-<repeat>])"
            )
        return self

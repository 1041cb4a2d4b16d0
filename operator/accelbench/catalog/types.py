"""Typed shape of the catalog data files (catalog/data/*.yaml)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The 16-bit precisions a chip may have matrix units for (catalog peak_tflops keys).
MATRIX_PRECISIONS = ("bf16", "fp16")


class CatalogModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CatalogError(ValueError):
    """The catalog cannot answer: unknown model shape, bad price override, broken data file."""


class Price(CatalogModel):
    on_demand: float | None = Field(
        ge=0,
        description="$ per chip-hour; null when no public figure could be cited (cost is then shown "
        "as unavailable, never as $0, until the prices ConfigMap sets one).",
    )
    spot: float | None = Field(default=None, ge=0)
    source: str = Field(description="Where the figure comes from (page and region).")
    date: str = Field(description="When it was read, YYYY-MM-DD.")


class TpuTopology(CatalogModel):
    """One slice shape: how many hosts and chips per host GKE gives for it."""

    topology: str
    chips: int
    hosts: int
    chips_per_host: int


class WorkerImages(CatalogModel):
    jax: str | None = None
    pytorch: str | None = None
    bench: str | None = None
    vllm: str | None = None
    tgi: str | None = None
    jetstream: str | None = None
    transformers: str | None = None


class Toleration(CatalogModel):
    key: str
    operator: str = "Exists"
    effect: str = "NoSchedule"


class AcceleratorSpec(CatalogModel):
    name: str  # matches api.AcceleratorType values
    vendor: str  # google, nvidia, habana, cpu
    display_name: str
    resource_name: str | None  # e.g. google.com/tpu, nvidia.com/gpu, habana.ai/gaudi; None for cpu
    node_labels: dict[str, str]  # fixed nodeSelector entries (topology label added by the renderer for TPU)
    tolerations: list[Toleration] = Field(default_factory=list)
    chips_per_host_options: list[int]  # single-host GPU/Gaudi counts, or TPU chips per host
    max_chips_per_host: int
    topologies: list[TpuTopology] = Field(default_factory=list)  # TPU only
    hbm_gb: float
    hbm_tb_per_s: float
    # Dense matrix peak per chip for each 16-bit precision the chip has matrix units for (bf16,
    # fp16): a precision missing here is refused by the planner (V100 has no bf16).
    peak_tflops: dict[str, float] = Field(min_length=1)
    host_cpu: int  # CPUs per host usable by the worker
    host_memory_gb: float
    default_framework: str  # jax or pytorch
    images: WorkerImages
    price: Price
    # Memory the runtime holds on every chip before the model gets any (CUDA/HPU context, NCCL or
    # collective buffers, allocator slack); the planner adds it to each chip's estimate.
    runtime_overhead_gb: float = Field(default=2.0, ge=0)
    machine_type: str | None = None  # the node shape these figures describe, e.g. a3-highgpu-8g
    notes: list[str] = Field(default_factory=list)  # caveats a user should read with the figures

    @field_validator("peak_tflops")
    @classmethod
    def _known_precisions(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = set(value) - set(MATRIX_PRECISIONS)
        if unknown or any(v <= 0 for v in value.values()):
            raise ValueError(f"peak_tflops takes positive figures for {MATRIX_PRECISIONS}, got {value}")
        return value

    def supports(self, precision: str) -> bool:
        """fp32 runs everywhere; a 16-bit precision needs matrix units for it."""
        return precision == "fp32" or precision in self.peak_tflops

    def peak_for(self, precision: str) -> float:
        """What MFU divides by: the precision's matrix peak; fp32 runs are measured against the
        chip's 16-bit peak (bf16 where it has one), the figure a user compares chips by."""
        if precision in self.peak_tflops:
            return self.peak_tflops[precision]
        return self.peak_tflops.get("bf16") or self.peak_tflops["fp16"]

    @property
    def serving_peak_tflops(self) -> float:
        """Engines serve in bf16 where the chip has it and in fp16 otherwise (vLLM casts on V100)."""
        return self.peak_for("bf16") if "bf16" in self.peak_tflops else self.peak_for("fp16")

    @property
    def is_tpu(self) -> bool:
        return self.vendor == "google"

    def topology(self, name: str) -> TpuTopology | None:
        return next((t for t in self.topologies if t.topology == name), None)


class Catalog(CatalogModel):
    accelerators: dict[str, AcceleratorSpec]

    def get(self, name: str) -> AcceleratorSpec:
        try:
            return self.accelerators[name]
        except KeyError:
            raise KeyError(
                f"accelerator {name!r} is not in the catalog ({', '.join(self.accelerators)})"
            ) from None


class ModelShape(CatalogModel):
    """What the planner needs to know about a decoder-only transformer before any pod runs.

    Layers come in two kinds when `sliding_window` is set: local (sliding-window) layers and global
    (full-attention) layers, `local_per_global` local layers before each global one. Global layers
    may use their own head size and KV-head count (`global_head_dim`, `global_kv_heads`), and with
    `attention_k_eq_v` they have no separate V projection.
    """

    family: str
    size: str
    reference: str  # where the shape comes from (model repository or config)
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate: int = Field(ge=1)
    vocab: int = Field(ge=1)
    tied_embeddings: bool
    sliding_window: int | None = Field(default=None, ge=1)
    local_per_global: int | None = Field(default=None, ge=1)
    global_head_dim: int | None = Field(default=None, ge=1)
    global_kv_heads: int | None = Field(default=None, ge=1)
    attention_k_eq_v: bool = False
    parameters: int = Field(ge=1, description="Total parameters of the checkpoint (what gets loaded).")
    extra_parameters: int = Field(default=0, ge=0, description="Parameters outside the decoder (vision).")
    approximate: bool = False
    note: str | None = None

    @property
    def name(self) -> str:
        return f"{self.family}-{self.size}"

    def is_global_layer(self, index: int) -> bool:
        """Layer `index` (0-based) attends to the whole context."""
        if self.sliding_window is None or self.local_per_global is None:
            return True
        return (index + 1) % (self.local_per_global + 1) == 0

    @property
    def global_layers(self) -> int:
        return sum(1 for i in range(self.layers) if self.is_global_layer(i))

    @property
    def local_layers(self) -> int:
        return self.layers - self.global_layers

    def layer_heads(self, global_layer: bool) -> tuple[int, int]:
        """(kv_heads, head_dim) of a global or a local layer."""
        if global_layer:
            return (self.global_kv_heads or self.kv_heads, self.global_head_dim or self.head_dim)
        return (self.kv_heads, self.head_dim)


class ModelCatalog(CatalogModel):
    """Model shapes by family, then size (lower case, e.g. 31b, 270m, tiny)."""

    families: dict[str, dict[str, ModelShape]]

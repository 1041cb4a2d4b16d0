"""Typed shape of the catalog data files (catalog/data/*.yaml)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CatalogModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(CatalogModel):
    on_demand: float = Field(ge=0, description="$ per chip-hour")
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
    peak_bf16_tflops: float  # dense, per chip
    host_cpu: int  # CPUs per host usable by the worker
    host_memory_gb: float
    default_framework: str  # jax or pytorch
    images: WorkerImages
    price: Price

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
            raise KeyError(f"accelerator {name!r} is not in the catalog ({', '.join(self.accelerators)})") from None

"""Processes, devices and where every array lives: the ('data', 'fsdp', 'tp') mesh and its rules.

FSDP shards every large weight's embed dimension over 'fsdp'; tensor parallelism shards heads and
the MLP's hidden dimension over 'tp'; the batch is split over 'data' and 'fsdp' together (FSDP is
data parallelism with sharded weights). A dimension that an axis does not divide stays replicated on
that axis (Gemma 3 1B has one kv head: its kv weights cannot be split over tp).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jax

from ...jobenv import DistEnv
from .. import InvalidConfigError

AXES = ("data", "fsdp", "tp")
BATCH_AXES = ("data", "fsdp")

# Logical axes of each weight, by the last two path names (module, variable) of the nnx tree.
_WEIGHT_AXES: dict[tuple[str, str], tuple[str | None, ...]] = {
    ("embedder", "input_embedding"): ("tp", "fsdp"),  # [vocab, embed]
    ("embedder", "output_embedding"): ("tp", "fsdp"),
    ("q_einsum", "w"): ("tp", "fsdp", None),  # [heads, embed, head_dim]
    ("kv_einsum", "w"): (None, "tp", "fsdp", None),  # [2, kv_heads, embed, head_dim]
    ("attn_vec_einsum", "w"): ("tp", None, "fsdp"),  # [heads, head_dim, embed]
    ("gating_einsum", "w"): (None, "tp", "fsdp"),  # [2, ffw, embed]
    ("linear", "w"): ("tp", "fsdp"),  # [ffw, embed]
}


def initialize_distributed(dist: DistEnv) -> None:
    """Join the other processes of a multi-host job (before any JAX computation)."""
    if dist.world_size <= 1:
        return
    if not dist.jax_coordinator:
        raise InvalidConfigError(
            "JAX_NUM_PROCESSES > 1 needs JAX_COORDINATOR_ADDRESS (host:port of process 0)"
        )
    jax.distributed.initialize(
        coordinator_address=dist.jax_coordinator, num_processes=dist.world_size, process_id=dist.rank
    )


def mesh_shape(fsdp: int, tp: int, device_count: int) -> tuple[int, int, int]:
    """(data, fsdp, tp) from the plan's fsdp and tp; data takes the devices left over."""
    if device_count % (fsdp * tp):
        raise InvalidConfigError(
            f"fsdp {fsdp} × tp {tp} does not divide the {device_count} devices of the job"
        )
    return device_count // (fsdp * tp), fsdp, tp


def build_mesh(fsdp: int, tp: int, devices: list[jax.Device] | None = None) -> Mesh:
    """The (data, fsdp, tp) mesh of the plan's axes over `devices` (default: every device)."""
    devices = devices if devices is not None else jax.devices()
    shape = mesh_shape(fsdp, tp, len(devices))
    # tp innermost: its all-reduces are the most frequent, so it spans the closest devices.
    return Mesh(np.asarray(devices).reshape(shape), AXES)


def _fits(axis: str | None, size: int, mesh: Mesh) -> str | None:
    if axis is None or mesh.shape[axis] == 1 or size % mesh.shape[axis]:
        return None
    return axis


def param_spec(path: tuple[Any, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec of a parameter; norms and LoRA adapters (small) are replicated."""
    key = tuple(str(p) for p in path[-2:])
    axes = _WEIGHT_AXES.get(key)  # type: ignore[arg-type]
    if axes is None or len(axes) != len(shape):
        return PartitionSpec()
    return PartitionSpec(*(_fits(a, n, mesh) for a, n in zip(axes, shape, strict=True)))


def param_sharding(mesh: Mesh):
    def sharding_for(path: tuple[Any, ...], shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(mesh, param_spec(path, shape, mesh))

    return sharding_for


def batch_sharding(mesh: Mesh, ndim: int, batch_dim: int) -> NamedSharding:
    spec = [None] * ndim
    spec[batch_dim] = BATCH_AXES
    return NamedSharding(mesh, PartitionSpec(*spec))


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def local_data_ranks(mesh: Mesh) -> list[int]:
    """The data-parallel ranks (batch slices) whose rows this process must supply, in mesh order.

    Rank r = position along the flattened (data, fsdp) axes; a process supplies the ranks of the
    devices it owns (several on a multi-chip host, each once even when tp replicates them).
    """
    ranks: list[int] = []
    grid = mesh.devices
    for d in range(grid.shape[0]):
        for f in range(grid.shape[1]):
            owners = {dev.process_index for dev in grid[d, f].ravel()}
            rank = d * grid.shape[1] + f
            if jax.process_index() in owners and rank not in ranks:
                ranks.append(rank)
    return ranks

"""The worker's inputs: the JobPayload (api/payload.py; ENV_JOB, or a file) and the distributed env.

See render/finetune.py for the env contract. Everything here is a pure function of a mapping
(`env`, defaulting to os.environ) so tests can drive it without touching the process environment.

A payload carries the operator's plan; a bare manifest (a local `--job FILE`, tests) is planned
here with the built-in catalog (plan.local_worker_plan), the one case a worker reads the catalog.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..api import FinetuneJob, parse_resource
from ..api.contract import (
    ENV_COMPLETION_INDEX,
    ENV_JAX_COORDINATOR,
    ENV_JAX_PROCESS_ID,
    ENV_JAX_PROCESSES,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_NPROC_PER_NODE,
    ENV_PVC_ROOT,
    ENV_RANK,
    ENV_WORLD_SIZE,
)
from ..api.errors import describe
from ..api.payload import JobPayload, WorkerPlan
from . import InvalidConfigError

DEFAULT_PVC_ROOT = "/mnt/pvc"


@dataclass(frozen=True)
class JobInput:
    job: FinetuneJob
    plan: WorkerPlan


@dataclass(frozen=True)
class DistEnv:
    """Who this process is. torch: one process per chip (torchrun); JAX: one process per host."""

    rank: int = 0  # global process rank (torch RANK, JAX process id)
    world_size: int = 1  # processes in total
    local_rank: int = 0  # process index on this host (selects the GPU/HPU)
    local_world_size: int = 1
    node_rank: int = 0  # host index = JOB_COMPLETION_INDEX
    nnodes: int = 1
    master_addr: str | None = None  # torch rendezvous
    master_port: int | None = None
    nproc_per_node: int = 1  # what the renderer asked for (launcher input before torchrun runs)
    jax_coordinator: str | None = None  # host:port, multi-host JAX only

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidConfigError(f"env {name}={value!r} is not an integer") from None


def dist_env(framework: str, env: Mapping[str, str] | None = None) -> DistEnv:
    """The process's place in the run. For torch, RANK/WORLD_SIZE/LOCAL_RANK come from torchrun;
    before torchrun runs they are absent and NNODES/NPROC_PER_NODE say what to launch."""
    env = os.environ if env is None else env
    node_rank = _int(env, ENV_NODE_RANK, _int(env, ENV_COMPLETION_INDEX, 0))
    if framework == "jax":
        world = _int(env, ENV_JAX_PROCESSES, 1)
        rank = _int(env, ENV_JAX_PROCESS_ID, node_rank)
        return DistEnv(
            rank=rank,
            world_size=world,
            node_rank=node_rank,
            nnodes=world,
            jax_coordinator=env.get(ENV_JAX_COORDINATOR) or None,
        )
    return DistEnv(
        rank=_int(env, ENV_RANK, 0),
        world_size=_int(env, ENV_WORLD_SIZE, 1),
        local_rank=_int(env, ENV_LOCAL_RANK, 0),
        local_world_size=_int(env, ENV_LOCAL_WORLD_SIZE, 1),
        node_rank=node_rank,
        nnodes=_int(env, ENV_NNODES, 1),
        master_addr=env.get(ENV_MASTER_ADDR) or None,
        master_port=_int(env, ENV_MASTER_PORT, 29500) if env.get(ENV_MASTER_PORT) else None,
        nproc_per_node=_int(env, ENV_NPROC_PER_NODE, 1),
    )


def parse_job_payload(obj: Any) -> JobInput:
    """A JobPayload dict (the operator's, with its plan) or a bare manifest (planned here)."""
    if not isinstance(obj, dict):
        raise InvalidConfigError("the job must be a JSON/YAML object with apiVersion, kind, metadata, spec")
    if "plan" in obj:
        try:
            payload = JobPayload.model_validate(obj)
        except ValidationError as exc:
            raise InvalidConfigError(f"invalid job payload: {describe(exc)}") from None
        resource, plan = payload.resource(), payload.plan
    else:
        try:
            resource = parse_resource(obj)
        except ValidationError as exc:
            raise InvalidConfigError(f"invalid FinetuneJob: {describe(exc)}") from None
        except ValueError as exc:
            raise InvalidConfigError(f"invalid FinetuneJob: {exc}") from None
        plan = _local_plan(resource)
    if not isinstance(resource, FinetuneJob):
        raise InvalidConfigError(f"the fine-tuning worker runs a FinetuneJob, not a {resource.kind}")
    return JobInput(job=resource, plan=plan)


def _local_plan(resource: Any) -> WorkerPlan:
    from ..catalog import load_catalog
    from ..plan import local_worker_plan

    try:
        plan, _ = local_worker_plan(resource, load_catalog())
    except KeyError as exc:  # an accelerator the catalog does not know
        raise InvalidConfigError(str(exc.args[0])) from None
    return plan


def load_job(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> JobInput:
    """From `path` (JSON or YAML, one document) when given, else from the ENV_JOB variable."""
    env = os.environ if env is None else env
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidConfigError(f"cannot read job file {path}: {exc}") from None
        try:
            obj = yaml.safe_load(text)  # YAML is a superset of JSON
        except yaml.YAMLError as exc:
            raise InvalidConfigError(f"job file {path} is not JSON/YAML: {exc}") from None
        return parse_job_payload(obj)
    text = env.get(ENV_JOB)
    if not text:
        raise InvalidConfigError(f"no job: set {ENV_JOB} or pass --job FILE")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise InvalidConfigError(f"{ENV_JOB} is not JSON: {exc}") from None
    return parse_job_payload(obj)


def resolve_uri(uri: str, env: Mapping[str, str] | None = None, base: Path | None = None) -> Path:
    """A spec URI -> a local path. pvc://CLAIM/PATH lives under ENV_PVC_ROOT; relative paths
    are taken from `base` (the manifest's directory for `accelbench run`). gs:// is copied by
    workers.storage before this is asked; other object stores are refused."""
    env = os.environ if env is None else env
    if uri.startswith("pvc://"):
        root = Path(env.get(ENV_PVC_ROOT) or DEFAULT_PVC_ROOT)
        return root / uri.removeprefix("pvc://")
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise InvalidConfigError(
            f"{scheme}:// is not readable by the worker yet (gs://, pvc:// and paths are); copy {uri} to one"
        )
    path = Path(uri).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path

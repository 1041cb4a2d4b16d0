"""Which model an InferenceBench serves: its own model.uri, or what a FinetuneJob trained.

A bench naming `spec.model.finetuneJob` waits (Pending, Applied=False/WaitingForModel) until that
FinetuneJob of its namespace has succeeded, then serves its output:
- a merged model (method full, or LoRA with output.mergeLora, the default) or a quantized export
  (task quantize; transformers' torchao format, which vLLM loads): output.uri;
- a LoRA adapter (output.mergeLora: false): the FinetuneJob's base model.uri with the adapter on top,
  named after the FinetuneJob, at its rank (vLLM's multi-LoRA serving; render refuses other engines).
Family, size and parameters come from the FinetuneJob, so the planner sizes what was trained.
A FinetuneJob that failed, writes no output, writes Orbax checkpoints (no engine loads them) or
trains a super-resolution UNet ends
the bench as Failed/ModelUnavailable: it never starts, so it never costs anything.

The outcome is kept in status.servedModel when the children are applied, and later renders of the
same run (a queued bench's client resumed, a re-created child) use that record: what the run serves
never changes under it, and the FinetuneJob may be deleted once the bench has started.
Everything here is pure: the bench's manifest, its stored status and the FinetuneJob's body in.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api.finetune import Task
from ..api.status import Phase

FINETUNE_JOB_FIELD = "finetuneJob"
SERVED_MODEL_STATUS = "servedModel"
TERMINAL_PHASES = frozenset({Phase.SUCCEEDED.value, Phase.FAILED.value})
# The model fields the planner reads, taken over from the FinetuneJob.
SHAPE_FIELDS = ("family", "size", "parameters")


@dataclass(frozen=True)
class Resolution:
    manifest: Mapping[str, Any] | None = None  # the bench as rendered: model.uri (and adapter) set
    served: dict[str, Any] | None = None  # status.servedModel, for a bench that names a FinetuneJob
    wait: str | None = None  # why it cannot start yet
    fail: str | None = None  # why it never will


def source_name(bench: Mapping[str, Any]) -> str | None:
    """The FinetuneJob a bench serves from, if it names one."""
    model = (bench.get("spec") or {}).get("model") or {}
    name = model.get(FINETUNE_JOB_FIELD) if isinstance(model, Mapping) else None
    return str(name) if name else None


def _with_model(bench: Mapping[str, Any], model: Mapping[str, Any]) -> dict[str, Any]:
    resolved = copy.deepcopy(dict(bench))
    resolved["spec"] = {**(resolved.get("spec") or {}), "model": dict(model)}
    return resolved


def served_from_finetune(name: str, finetune: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(status.servedModel, None) for a FinetuneJob that succeeded, else (None, why it cannot serve)."""
    spec = finetune.get("spec") or {}
    output = spec.get("output") or {}
    if spec.get("task") == Task.SUPER_RESOLUTION.value:
        return None, (
            f"FinetuneJob {name} trains a super-resolution UNet (task superResolution): there is no "
            "language model to serve"
        )
    if not output.get("uri"):
        return None, f"FinetuneJob {name} writes no output.uri: there is nothing to serve"
    if output.get("format") == "orbax":
        return None, (
            f"FinetuneJob {name} writes Orbax checkpoints, which no serving engine loads: "
            "set its output.format to safetensors (or convert with `accelbench convert`)"
        )
    base = spec.get("model") or {}
    method = spec.get("method") or {}
    shape = {k: base[k] for k in SHAPE_FIELDS if base.get(k) is not None}
    uid = (finetune.get("metadata") or {}).get("uid")
    served: dict[str, Any] = {FINETUNE_JOB_FIELD: name, "finetuneJobUid": uid, **shape}
    if method.get("type", "lora") == "lora" and output.get("mergeLora") is False:
        served["uri"] = base.get("uri")
        served["adapter"] = {"uri": output["uri"], "name": name, "rank": int(method.get("rank") or 16)}
    else:
        served["uri"] = output["uri"]
    return served, None


def resolve_served_model(
    bench: Mapping[str, Any], status: Mapping[str, Any], finetune: Mapping[str, Any] | None
) -> Resolution:
    """`bench`: its manifest; `status`: its stored status; `finetune`: the named FinetuneJob's body
    (None when there is none)."""
    name = source_name(bench)
    if name is None:
        return Resolution(manifest=bench)
    served = status.get(SERVED_MODEL_STATUS)
    if not (isinstance(served, Mapping) and served.get(FINETUNE_JOB_FIELD) == name):
        if finetune is None:
            return Resolution(wait=f"FinetuneJob {name} does not exist yet; serving starts when it succeeded")
        phase = (finetune.get("status") or {}).get("phase")
        if phase not in TERMINAL_PHASES:
            return Resolution(
                wait=f"FinetuneJob {name} is {phase or 'not started'}; serving starts when it succeeded"
            )
        if phase != Phase.SUCCEEDED.value:
            return Resolution(fail=f"FinetuneJob {name} {str(phase).lower()}: no trained model to serve")
        served, why = served_from_finetune(name, finetune)
        if served is None:
            return Resolution(fail=why)
    model = {k: v for k, v in served.items() if k in (*SHAPE_FIELDS, "uri", "adapter")}
    return Resolution(manifest=_with_model(bench, model), served=dict(served))

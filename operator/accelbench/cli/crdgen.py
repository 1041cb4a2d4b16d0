"""CustomResourceDefinitions generated from the pydantic models (the single schema source).

Kubernetes wants a *structural* OpenAPI v3.0 schema, which differs from what pydantic emits:
no `$ref` (definitions are inlined), `nullable: true` instead of `anyOf: [X, null]`, boolean
`exclusiveMinimum`, no `additionalProperties: false` beside `properties`, no `const`/`title`.
Rules that need the catalog (valid TPU topologies) are added here, since `api` must not import it.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from ..api import GROUP, VERSION, FinetuneJob, InferenceBench
from ..api.campaign import MAX_CAMPAIGN_NAME_LENGTH, BenchCampaign, BenchCampaignSpec, BenchCampaignStatus
from ..api.finetune import FinetuneJobSpec
from ..api.inference import InferenceBenchSpec
from ..api.resources import MAX_NAME_LENGTH, NAME_PATTERN
from ..api.status import FinetuneJobStatus, InferenceBenchStatus
from ..catalog.types import Catalog

CATEGORY = "accelbench"

_DROP_KEYS = {"title"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema made structural: refs inlined, nulls as `nullable`."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs)


PRESERVE = "x-kubernetes-preserve-unknown-fields"


def _convert(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_convert(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _convert({**target, **extra}, defs)
    if "anyOf" in node:
        return _convert_any_of(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _convert(prop, defs) for name, prop in value.items()}
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "additionalProperties" and value is False:
            continue  # structural schemas reject it beside properties; unknown fields are pruned anyway
        elif key == "additionalProperties" and value is True and node.get(PRESERVE):
            # The apiserver reads `true` as an empty schema for every value, under which a nested
            # object's fields are unknown (dropped, or refused by strict field validation): the
            # preserve-unknown-fields beside it already keeps any value whole.
            continue
        elif key == "default" and value is None:
            continue
        else:
            out[key] = _convert(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"])
    return out


def _convert_any_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    options = [o for o in node["anyOf"] if o.get("type") != "null"]
    nullable = len(options) < len(node["anyOf"])
    if len(options) != 1:
        raise ValueError(f"cannot make a structural schema of anyOf with {len(options)} non-null options")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    merged = _convert({**options[0], **rest}, defs)
    if nullable:
        merged["nullable"] = True
    return merged


def _enum_type(values: list[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "boolean"
    if all(isinstance(v, int) for v in values):
        return "integer"
    return "string"


def topology_rule(catalog: Catalog) -> dict[str, str]:
    """One CEL rule: a TPU topology must be one the catalog lists for that TPU type."""
    clauses = []
    for name, acc in sorted(catalog.accelerators.items()):
        if acc.is_tpu:
            valid = ", ".join(f"'{t.topology}'" for t in acc.topologies)
            clauses.append(f"(self.type == '{name}' && self.topology in [{valid}])")
    rule = "!has(self.topology) || " + " || ".join(clauses)
    message = "topology is not valid for this TPU type; " + "; ".join(
        f"{name}: {', '.join(t.topology for t in acc.topologies)}"
        for name, acc in sorted(catalog.accelerators.items())
        if acc.is_tpu
    )
    return {"rule": rule, "message": message}


def _add_catalog_rules(spec_schema: dict[str, Any], catalog: Catalog) -> None:
    """The accelerator types and TPU topologies of the catalog, on a run's spec (or, in a campaign,
    on each arm's template)."""
    props = spec_schema["properties"]
    if "accelerator" not in props:  # a campaign: its arms carry run specs
        for arm in ("finetune", "inference"):
            _add_catalog_rules(props[arm]["properties"]["template"], catalog)
        return
    accelerator = props["accelerator"]
    accelerator.setdefault("x-kubernetes-validations", []).append(topology_rule(catalog))
    accelerator["properties"]["type"]["enum"] = sorted(catalog.accelerators)


_FINETUNE_COLUMNS = [
    {"name": "Accelerator", "type": "string", "jsonPath": ".status.accelerator"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    # Live, from status.progress (the operator scrapes rank 0 while it runs).
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.results.tokensPerSecond"},
    {"name": "MFU", "type": "number", "jsonPath": ".status.results.mfu"},
    {"name": "Cost $", "type": "number", "jsonPath": ".status.cost.dollars"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "priority": 1,
    },
]

_CAMPAIGN_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Cells", "type": "integer", "jsonPath": ".status.totals.cells"},
    {"name": "Succeeded", "type": "integer", "jsonPath": ".status.totals.succeeded"},
    {"name": "Failed", "type": "integer", "jsonPath": ".status.totals.failed"},
    {"name": "Running", "type": "integer", "jsonPath": ".status.totals.running"},
    {"name": "Cost $", "type": "number", "jsonPath": ".status.totals.dollars"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]

_BENCH_COLUMNS = [
    {"name": "Accelerator", "type": "string", "jsonPath": ".status.accelerator"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Cells", "type": "integer", "jsonPath": ".status.progress.step"},  # measured so far
    {"name": "Capacity", "type": "integer", "jsonPath": ".status.results.capacityConcurrency"},
    {"name": "Peak tok/s", "type": "number", "jsonPath": ".status.results.peakOutputTokensPerSecond"},
    {"name": "$/1M tok", "type": "number", "jsonPath": ".status.results.dollarsPerMillionTokensAtCapacity"},
    {"name": "Cost $", "type": "number", "jsonPath": ".status.cost.dollars"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


# Spec fields a user may change after a run started: they act on the running Job (hold or resume
# it, stop it later or sooner, clean it up later); every other field is what the run measured.
MUTABLE_AFTER_START = ("suspend", "activeDeadlineSeconds", "ttlSecondsAfterFinished")


# A name that cannot make its children is refused at admission (api/resources.py says why).
NAME_RULE = {
    "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
    "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
    f"with a letter) of at most {MAX_NAME_LENGTH} characters: the run's children and their pods are "
    "named after it, which Kubernetes caps at 63",
}


CAMPAIGN_NAME_RULE = {
    "rule": f"self.metadata.name.size() <= {MAX_CAMPAIGN_NAME_LENGTH} "
    f"&& self.metadata.name.matches('{NAME_PATTERN}')",
    "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
    f"with a letter) of at most {MAX_CAMPAIGN_NAME_LENGTH} characters: each cell's run is named "
    "<campaign>-<t|s><8-hex key>[-<repeat>], within a run's own bound",
}


def immutability_rules(spec_schema: dict[str, Any]) -> list[dict[str, str]]:
    """CEL transition rules on the root: once status.startTime is set (the run started and is being
    paid for), each spec field outside MUTABLE_AFTER_START keeps its value. One rule per field, so
    the refusal names it; a spec refused before it started may still be fixed."""
    started = "has(oldSelf.status) && has(oldSelf.status.startTime)"
    rules = []
    for field in sorted(spec_schema.get("properties", {})):
        if field in MUTABLE_AFTER_START:
            continue
        same = (
            f"has(self.spec.{field}) == has(oldSelf.spec.{field}) && "
            f"(!has(self.spec.{field}) || self.spec.{field} == oldSelf.spec.{field})"
        )
        rules.append(
            {
                "rule": f"!({started}) || ({same})",
                "message": f"spec.{field} cannot change once the run has started (status.startTime is set); "
                f"only {', '.join('spec.' + m for m in MUTABLE_AFTER_START)} can. Create a new resource "
                "to run it differently",
            }
        )
    return rules


def _crd(
    kind: str,
    plural: str,
    short_names: list[str],
    spec_model: type[BaseModel],
    status_model: type[BaseModel],
    columns: list[dict[str, Any]],
    catalog: Catalog,
    name_rule: dict[str, str] = NAME_RULE,
    locked_after_start: bool = True,
) -> dict[str, Any]:
    spec_schema = structural_schema(spec_model)
    _add_catalog_rules(spec_schema, catalog)
    rules = [name_rule, *(immutability_rules(spec_schema) if locked_after_start else [])]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (spec_model.__doc__ or kind).strip().splitlines()[0],
                            "required": ["spec"],
                            "x-kubernetes-validations": rules,
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": structural_schema(status_model),
                            },
                        }
                    },
                }
            ],
        },
    }


def generate_crds(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """File name -> CRD object, for `accelbench crds` and the chart."""
    return {
        f"{GROUP}_{FinetuneJob.PLURAL}.yaml": _crd(
            FinetuneJob.KIND,
            FinetuneJob.PLURAL,
            FinetuneJob.SHORT_NAMES,
            FinetuneJobSpec,
            FinetuneJobStatus,
            _FINETUNE_COLUMNS,
            catalog,
        ),
        f"{GROUP}_{InferenceBench.PLURAL}.yaml": _crd(
            InferenceBench.KIND,
            InferenceBench.PLURAL,
            InferenceBench.SHORT_NAMES,
            InferenceBenchSpec,
            InferenceBenchStatus,
            _BENCH_COLUMNS,
            catalog,
        ),
        # A campaign's spec stays editable (Git edits add or drop cells; finished cells never
        # re-run), and its name leaves room for the cells' names.
        f"{GROUP}_{BenchCampaign.PLURAL}.yaml": _crd(
            BenchCampaign.KIND,
            BenchCampaign.PLURAL,
            BenchCampaign.SHORT_NAMES,
            BenchCampaignSpec,
            BenchCampaignStatus,
            _CAMPAIGN_COLUMNS,
            catalog,
            name_rule=CAMPAIGN_NAME_RULE,
            locked_after_start=False,
        ),
    }

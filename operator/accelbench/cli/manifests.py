"""Read manifest files (YAML, several documents, `-` for stdin) into typed resources."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..api import Resource, parse_resource
from ..api.campaign import BenchCampaign
from ..api.errors import describe_validation_error
from ..campaign.matrix import MatrixError, cells_of
from ..campaign.plan import arms, child_manifest
from ..controller.served import SERVED_MODEL_STATUS, resolve_served_model, served_from_finetune, source_name


class ManifestError(ValueError):
    """A file that cannot be used, with every problem in one readable message."""


@dataclass(frozen=True)
class LoadedResource:
    source: str  # file:document-index, for messages
    resource: Resource


def read_documents(path: str) -> list[dict[str, Any]]:
    text = _read_text(path)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML: {exc}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise ManifestError(f"{path}: document {i + 1} is a {type(doc).__name__}, not a mapping")
    if not docs:
        raise ManifestError(f"{path}: no documents")
    return docs


def campaign_runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A BenchCampaign's runs, one per cell and repeat, as the operator would make them."""
    campaign = BenchCampaign.model_validate(doc)
    runs = []
    for kind, template, matrix in arms(campaign):
        for cell in cells_of(kind, matrix.axes, matrix.include, matrix.exclude, campaign.spec.repeats):
            runs.append(child_manifest(campaign, cell, template))
    return runs


def load_resources(path: str) -> list[LoadedResource]:
    """Every document of the file as a FinetuneJob or InferenceBench (a BenchCampaign as the runs of
    its cells); all errors reported at once."""
    loaded: list[LoadedResource] = []
    problems: list[str] = []
    for i, doc in enumerate(read_documents(path)):
        where = f"{path}[{i}]" if i else path
        name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc.get("metadata"), dict) else "?"
        try:
            if doc.get("kind") == BenchCampaign.KIND:
                for run in campaign_runs(doc):
                    loaded.append(LoadedResource(f"{where} {run['metadata']['name']}", parse_resource(run)))
                continue
            loaded.append(LoadedResource(where, parse_resource(doc)))
        except ValidationError as exc:
            problems += [
                f"{where} ({doc.get('kind')} {name}): {line}" for line in describe_validation_error(exc)
            ]
        except (ValueError, MatrixError) as exc:
            problems.append(f"{where}: {exc}")
    if problems:
        raise ManifestError("\n".join(problems))
    return loaded


def load_all(paths: list[str]) -> list[LoadedResource]:
    """The resources of several files, an InferenceBench that serves a FinetuneJob's output resolved
    against that FinetuneJob's manifest among them, as if that run had succeeded (what the operator
    does once it has: controller/served.py)."""
    loaded = [item for path in paths for item in load_resources(path)]
    trained = {
        (item.resource.metadata.namespace, item.resource.metadata.name): item.resource
        for item in loaded
        if item.resource.kind == "FinetuneJob"
    }
    resolved: list[LoadedResource] = []
    problems: list[str] = []
    for item in loaded:
        wire = item.resource.to_wire()
        name = source_name(wire)
        if name is None:
            resolved.append(item)
            continue
        train = trained.get((item.resource.metadata.namespace, name))
        if train is None:
            problems.append(
                f"{item.source}: InferenceBench {item.resource.metadata.name} serves what FinetuneJob {name} "
                f"trains: pass that FinetuneJob's manifest too (-f train.yaml -f bench.yaml)"
            )
            continue
        served, why = served_from_finetune(name, {**train.to_wire(), "status": {"phase": "Succeeded"}})
        if served is None:
            problems.append(f"{item.source}: {why}")
            continue
        result = resolve_served_model(wire, {SERVED_MODEL_STATUS: served}, None)
        resolved.append(LoadedResource(item.source, parse_resource(dict(result.manifest or wire))))
    if problems:
        raise ManifestError("\n".join(problems))
    return resolved


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    file = Path(path)
    if not file.exists():
        raise ManifestError(f"{path}: no such file")
    if file.is_dir():
        raise ManifestError(f"{path}: is a directory; pass a manifest file")
    try:
        return file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from None

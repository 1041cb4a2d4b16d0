"""A finished campaign's results as one durable JSON document in object storage.

Status lives as long as the BenchCampaign does; the artifact outlives the cluster. It holds the
campaign's spec and status and each run's own status (results, cost, plan), so a report can be drawn
and runs compared from it alone, and `accelbench compare` can merge artifacts written by campaigns on
different clusters (GKE for TPU, another cloud for Gaudi). `artifact_document` is pure; the writer
uses the workers' object-storage clients (gs://, s3://) or writes a local file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..api import API_VERSION

ARTIFACT_KIND = "BenchCampaignResults"
ARTIFACT_SUFFIX = ".json"
_RUN_STATUS_FIELDS = (
    "phase",
    "accelerator",
    "plan",
    "cost",
    "results",
    "startTime",
    "completionTime",
    "message",
)


def artifact_document(
    campaign: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    written_at: str,
    cluster: str | None = None,
) -> dict[str, Any]:
    """The campaign (spec and status) and its runs (name, kind, labels, spec, the status fields that
    carry figures), in a stable order."""
    meta = campaign.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": ARTIFACT_KIND,
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "generation": meta.get("generation"),
            "cluster": cluster,
            "writtenAt": written_at,
        },
        "spec": campaign.get("spec") or {},
        "status": {k: v for k, v in (campaign.get("status") or {}).items() if k != "conditions"},
        "runs": [_run(r) for r in sorted(runs, key=lambda r: str((r.get("metadata") or {}).get("name")))],
    }


def _run(run: Mapping[str, Any]) -> dict[str, Any]:
    meta = run.get("metadata") or {}
    status = run.get("status") or {}
    return {
        "kind": run.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "labels", "annotations") if k in meta},
        "spec": run.get("spec") or {},
        "status": {k: status[k] for k in _RUN_STATUS_FIELDS if k in status},
    }


def artifact_uri(base: str, campaign: str) -> str:
    """`<base>/<campaign>.json`."""
    return f"{base.rstrip('/')}/{campaign}{ARTIFACT_SUFFIX}"


class ArtifactError(RuntimeError):
    """The artifact could not be written: the store refused or failed, no client for it is installed,
    or a local path is not writable. The message says which."""


def write_artifact(uri: str, document: Mapping[str, Any]) -> None:
    """Write the document to `uri` (gs://, s3://, file:// or a path), or raise ArtifactError."""
    data = json.dumps(document, indent=1, sort_keys=True).encode()
    if uri.startswith(("gs://", "s3://")):
        try:
            from ..workers.storage import parse_uri
            from ..workers.storage.stores import StoreError, open_store
        except ImportError as exc:  # the operator image carries the storage extra; a bare install may not
            raise ArtifactError(
                f"{uri}: no object-store client installed ({exc}): pip install accelbench[storage]"
            ) from None
        try:
            where = parse_uri(uri)
            open_store(where).upload_bytes(data, where.prefix, "application/json")
        except StoreError as exc:
            raise ArtifactError(f"{uri}: {exc.describe()}") from None
        except (ImportError, ValueError) as exc:
            raise ArtifactError(f"{uri}: {exc}") from None
        return
    path = Path(uri.removeprefix("file://"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".part") as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)  # a reader never sees half a document
    except OSError as exc:
        raise ArtifactError(f"{uri}: {exc}") from None


def read_artifact(uri: str) -> dict[str, Any]:
    """An artifact from gs://, s3://, file:// or a path; ValueError when it is not one."""
    if uri.startswith(("gs://", "s3://")):
        from ..workers.storage import parse_uri
        from ..workers.storage.stores import open_store

        where = parse_uri(uri)
        data = open_store(where).read_bytes(where.prefix)
    else:
        data = Path(uri.removeprefix("file://")).read_bytes()
    document = json.loads(data)
    if not isinstance(document, dict) or document.get("kind") != ARTIFACT_KIND:
        raise ValueError(f"{uri}: not a {ARTIFACT_KIND} document")
    return document

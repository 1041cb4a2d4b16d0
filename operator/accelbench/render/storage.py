"""Model, dataset and output locations: which become volumes, which pass through.

- `pvc://CLAIM/PATH`: a PersistentVolumeClaim volume. The engine or worker gets a local path.
- `gs://...`, `s3://...`: copied into an emptyDir (CACHE_DIR) by workers/storage.py, one behaviour for
  every pod: the fine-tuning worker copies its inputs itself and uploads its outputs after the run;
  a serving engine gets an init container (FETCH_CONTAINER) that copies the model before the engine
  starts, and the engine a local path (api.objects.cache_path), whatever engine it is.
- anything else (an absolute path, or a Hugging Face Hub id such as `google/gemma-3-1b-it`): passed
  as-is. A path must already exist in the container (baked into the image); the renderer never
  makes a hostPath volume, which would pin pods to one node and is refused by the baseline Pod
  Security Standard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.contract import ENV_CACHE_DIR
from ..api.objects import cache_path
from ..api.objects import is_object_store as is_object_store  # the renderers' one test for it
from .errors import RenderError

PVC_SCHEME = "pvc://"
CACHE_DIR = "/var/cache/accelbench"  # object-store copies (an emptyDir on the node's disk)
CACHE_VOLUME = "object-cache"
FETCH_CONTAINER = "fetch-model"
FETCH_MODULE = "accelbench.workers.storage"


@dataclass(frozen=True)
class PvcRef:
    claim: str
    path: str  # inside the claim, no leading slash; "" for the claim's root


def parse_pvc(uri: str) -> PvcRef | None:
    """pvc://CLAIM/PATH -> PvcRef; None for any other scheme."""
    if not uri.startswith(PVC_SCHEME):
        return None
    claim, _, path = uri[len(PVC_SCHEME) :].partition("/")
    if not claim:
        raise RenderError(f"{uri!r} names no claim; use pvc://CLAIM/PATH")
    return PvcRef(claim=claim, path=path.strip("/"))


def cache_volume(read_only: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The emptyDir object-store copies go to, and its mount at CACHE_DIR."""
    volume = {"name": CACHE_VOLUME, "emptyDir": {}}
    mount = {"name": CACHE_VOLUME, "mountPath": CACHE_DIR, **({"readOnly": True} if read_only else {})}
    return volume, mount


def cached_model_path(uri: str) -> str:
    """Where the fetch init container leaves a copy of `uri`: the path the engine is given."""
    return cache_path(CACHE_DIR, uri)


def fetch_command(uri: str) -> list[str]:
    """workers.storage's command line: the same copy code the fine-tuning worker runs."""
    return ["python", "-m", FETCH_MODULE, "fetch", uri, "--cache", CACHE_DIR]


def cache_env() -> dict[str, Any]:
    return {"name": ENV_CACHE_DIR, "value": CACHE_DIR}


def local_path(ref: PvcRef, mount_root: str) -> str:
    base = f"{mount_root}/{ref.claim}"
    return f"{base}/{ref.path}" if ref.path else base


@dataclass(frozen=True)
class ClaimUse:
    uri: str
    writable: bool


def build_claim_volumes(
    uses: list[ClaimUse], mount_root: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One volume per distinct claim, at `<mount_root>/<claim>`, writable if any use writes.

    Volume names are positional (`pvc-0`, ...) because a claim name may be longer than the 63
    characters a volume name allows; order of first use keeps them deterministic.
    """
    claims: dict[str, bool] = {}
    for use in uses:
        ref = parse_pvc(use.uri)
        if ref is not None:
            claims[ref.claim] = claims.get(ref.claim, False) or use.writable
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for index, (claim, writable) in enumerate(claims.items()):
        name = f"pvc-{index}"
        claim_ref = {"claimName": claim, "readOnly": not writable}
        volumes.append({"name": name, "persistentVolumeClaim": claim_ref})
        mounts.append({"name": name, "mountPath": f"{mount_root}/{claim}", "readOnly": not writable})
    return volumes, mounts


def is_local_path(uri: str) -> bool:
    """A plain filesystem path: neither a claim nor an object store (nor any other scheme)."""
    return "://" not in uri

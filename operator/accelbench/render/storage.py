"""Model, dataset and output locations: which become volumes, which pass through.

- `pvc://CLAIM/PATH`: a PersistentVolumeClaim volume. The engine or worker gets a local path.
- `gs://...`, `s3://...`: passed as-is. vLLM streams them (`--load-format runai_streamer`); the
  fine-tuning worker copies gs:// inputs into an emptyDir and uploads a gs:// output after the run
  (workers/storage.py); it refuses s3:// for now (InvalidConfig, exit 3).
- anything else (an absolute path, or a Hugging Face Hub id such as `google/gemma-3-1b-it`): passed
  as-is. A path must already exist in the container (baked into the image); the renderer never
  makes a hostPath volume, which would pin pods to one node and is refused by the baseline Pod
  Security Standard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import RenderError

PVC_SCHEME = "pvc://"
OBJECT_STORE_SCHEMES = ("gs://", "s3://")


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


def is_object_store(uri: str) -> bool:
    return uri.startswith(OBJECT_STORE_SCHEMES)


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

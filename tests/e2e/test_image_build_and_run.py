"""The operator and bench-client images, built here and run for real (issue 21).

hack/build-images.sh builds them with buildah on a Debian base made with debootstrap (cached under
~/.cache/accelbench, so a warm run only checks its layers) and smoke-runs each entrypoint. Then the
operator runs from its image, not from the source tree, against the local control plane under the
chart's ServiceAccount, and reconciles a run to its end: proof that the image holds everything the
operator needs. The file sorts after test_chart_install.py, whose ServiceAccount kubeconfig it uses.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_env import ROOT, Env, wait_for
from test_operator import finetune

STORE = [
    f"--root={Path.home() / '.cache/accelbench/containers/storage'}",
    f"--runroot={Path.home() / '.cache/accelbench/containers/run'}",
    "--storage-driver=vfs",
]
VERSION = "0.1.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("images") / "images.json"
    done = subprocess.run(
        [str(ROOT / "hack/build-images.sh"), "--smoke", "--out", str(out), "operator", "bench"],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return {i["image"]: i for i in json.loads(out.read_text())["images"]}


def test_the_operator_and_bench_images_build_and_their_entrypoints_start(built: dict[str, Any]) -> None:
    for name in ("operator", "bench"):
        image = built[f"ghcr.io/accelbench/{name}:{VERSION}"]
        assert image["smoke"] and image["layers"] >= 2, image
        print(f"{name}: {image['size_mb']} MB, {image['layers']} layers, built in {image['build_s']} s")


def test_the_release_workflow_passes_actionlint() -> None:
    """The workflow that would build and push multi-arch images on a tag cannot run here; actionlint
    (built from its pinned module, hack/servers/actionlint) checks it, shellcheck-free."""
    linter = ROOT / ".servers" / "actionlint"
    assert linter.exists(), "actionlint missing from .servers: run `make servers`"
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert workflows
    done = subprocess.run(
        [str(linter), "-shellcheck=", "-pyflakes=", *map(str, workflows)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def portable_kubeconfig(source: Path, directory: Path) -> Path:
    """The same identity with the CA embedded, readable by the image's uid 1000."""
    config = yaml.safe_load(source.read_text())
    for entry in config["clusters"]:
        cluster = entry["cluster"]
        if "certificate-authority" in cluster:
            ca = Path(cluster.pop("certificate-authority")).read_bytes()
            cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    return path


@pytest.fixture
def operator_from_image(env: Env, built: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    """The source-tree operator stopped; the image's operator running in its place."""
    kube_dir = Path("/tmp") / f"accelbench-image-kube-{tmp_path.name}"
    kubeconfig = portable_kubeconfig(env.operator.kubeconfig, kube_dir)
    ctr = subprocess.run(
        ["buildah", *STORE, "from", "--quiet", f"ghcr.io/accelbench/operator:{VERSION}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    log = tmp_path / "operator-image.log"
    env.operator.stop()
    process = subprocess.Popen(
        [
            "buildah", *STORE, "run", "--isolation", "chroot", "--network", "host",
            "--volume", f"{kubeconfig.parent}:/kube:ro", ctr, "--",
            "env", "KUBECONFIG=/kube/kubeconfig", f"POD_NAMESPACE={env.operator.namespace}",
            *[f"{k}={v}" for k, v in env.operator.extra_env.items()],
            "python", "-m", "accelbench.controller", "--metrics-port", "0",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield log
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        subprocess.run(["buildah", *STORE, "rm", ctr], capture_output=True)
        shutil.rmtree(kube_dir, ignore_errors=True)
        env.operator.start()


def test_the_operator_image_reconciles_a_run_against_the_cluster(env: Env, operator_from_image: Path) -> None:
    env.apply(finetune("from-image", {"type": "h100", "count": 1}))
    started = time.monotonic()
    obj = wait_for(
        lambda: (
            (o := env.get("finetunejobs", "from-image")).get("status", {}).get("phase") == "Succeeded" and o
        ),
        timeout=120,
        what="the run Succeeded, reconciled by the operator from its image",
    )
    log = operator_from_image.read_text(errors="replace")
    assert "accelbench controller configured" in log, log[-3000:]
    assert obj["status"]["children"]["job"] == "from-image-train", str(obj["status"])
    assert obj["status"]["cost"]["dollarsPerChipHour"] > 0
    print(f"run Succeeded {time.monotonic() - started:.1f} s after apply, operator from its image")
    env.kubectl("delete", "finetunejobs", "from-image", "--wait=false")

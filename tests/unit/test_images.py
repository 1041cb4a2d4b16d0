"""Every Dockerfile is buildable as far as this machine can tell without an engine: its files exist,
it installs the package with an extra pyproject defines, runs as non-root, and its entrypoint imports."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from accelbench.catalog import load_catalog

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, args = line.partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def test_there_is_an_image_for_every_role() -> None:
    names = {p.parent.name for p in DOCKERFILES}
    assert {
        "operator",
        "bench",
        "worker-torch-cuda",
        "worker-torch-gaudi",
        "worker-jax-cuda",
        "worker-jax-tpu",
    } <= names


def _arg_defaults(dockerfile: Path) -> dict[str, str]:
    pairs = [args.split("=", 1) for op, args in _instructions(dockerfile) if op == "ARG" and "=" in args]
    return {name: value for name, value in pairs}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_is_a_build_argument_whose_default_is_pinned(dockerfile: Path) -> None:
    """`make images` builds on a base made here (hack/build-images.sh); a user's build gets the
    pinned upstream image the argument defaults to."""
    defaults = _arg_defaults(dockerfile)
    bases = [args.split()[0] for op, args in _instructions(dockerfile) if op == "FROM"]
    assert bases and all(base == "${BASE_IMAGE}" for base in bases), bases
    image = defaults["BASE_IMAGE"]
    assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_the_image_carries_oci_labels(dockerfile: Path) -> None:
    labels = " ".join(args for op, args in _instructions(dockerfile) if op == "LABEL")
    for key in ("source", "version", "revision", "title"):
        assert f"org.opencontainers.image.{key}=" in labels, key


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_copied_files_exist(dockerfile: Path) -> None:
    for op, args in _instructions(dockerfile):
        if op == "COPY" and not args.startswith("--from="):  # --from: a stage's files
            sources = shlex.split(args)[:-1]
            for src in sources:
                if not src.startswith("--"):
                    assert (ROOT / src).exists(), f"{dockerfile}: COPY {src} does not exist"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_installs_the_package_with_known_extras(dockerfile: Path) -> None:
    runs = " ".join(args for op, args in _instructions(dockerfile) if op == "RUN")
    match = re.search(r"pip install (?:--no-compile )?(?:--constraint \S+ )?\"\.(?:\[([^\]]*)\])?\"", runs)
    assert match, f"{dockerfile} does not pip install the package"
    extras = {e for e in (match.group(1) or "").split(",") if e}
    assert extras <= EXTRAS, f"unknown extras {extras - EXTRAS}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_runs_as_non_root_and_entrypoint_imports(dockerfile: Path) -> None:
    instructions = _instructions(dockerfile)
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1] not in ("0", "root"), "the image must end as a non-root user"
    entry = next(args for op, args in instructions if op == "ENTRYPOINT")
    argv = json.loads(entry)  # the exec (JSON) form, so signals reach Python directly
    assert argv[:2] == ["python", "-m"]
    importlib.import_module(argv[2])


def test_catalog_images_of_ours_have_a_dockerfile() -> None:
    ours = {
        image
        for acc in load_catalog().accelerators.values()
        for image in acc.images.model_dump().values()
        if image and image.startswith("ghcr.io/accelbench/")
    }
    names = {p.parent.name for p in DOCKERFILES}
    for image in ours:
        name = image.removeprefix("ghcr.io/accelbench/").split(":")[0]
        assert name in names, f"catalog names {image} but images/{name}/Dockerfile is missing"


def test_the_chart_and_catalog_name_the_tags_make_images_builds() -> None:
    """hack/build-images.sh tags ghcr.io/accelbench/<dir>:<pyproject version>; the chart's default
    operator image (its appVersion) and every image of ours the catalog names must be those."""
    import yaml

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts/accelbench/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/accelbench/values.yaml").read_text())
    assert chart["appVersion"] == version and values["image"]["repository"] == "ghcr.io/accelbench/operator"
    assert not values["image"]["tag"]  # defaults to appVersion
    ours = {
        image
        for acc in load_catalog().accelerators.values()
        for image in acc.images.model_dump().values()
        if image and image.startswith("ghcr.io/accelbench/")
    }
    assert ours and all(image.endswith(f":{version}") for image in ours), ours

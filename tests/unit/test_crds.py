"""Generated CRDs: committed copies match the models, and the schemas are structural."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelbench.catalog import load_catalog
from accelbench.cli.crdgen import generate_crds

ROOT = Path(__file__).resolve().parents[2]
CRDS = generate_crds(load_catalog())


@pytest.mark.parametrize("filename", sorted(CRDS))
def test_committed_crd_matches_models(filename: str) -> None:
    committed = yaml.safe_load((ROOT / "crds" / filename).read_text())
    assert committed == CRDS[filename], f"crds/{filename} is stale: run `make crds` and commit"


class Yaml11Loader(yaml.SafeLoader):
    """Reads as Go's YAML 1.1 readers (kubectl, the apiserver) do: y/Y/n/N are booleans too."""


Yaml11Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


@pytest.mark.parametrize("folder", ["crds", "charts/accelbench/crds"])
@pytest.mark.parametrize("filename", sorted(CRDS))
def test_committed_crd_reads_the_same_to_a_yaml_1_1_reader(folder: str, filename: str) -> None:
    """A bare `n` (Spread.n) once reached the apiserver as `false` and every install failed."""
    committed = yaml.load((ROOT / folder / filename).read_text(), Loader=Yaml11Loader)
    assert committed == CRDS[filename], f"{folder}/{filename}: a word a YAML 1.1 reader takes as a bool"


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("filename", sorted(CRDS))
def test_schema_is_structural(filename: str) -> None:
    schema = CRDS[filename]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node, path
        assert "anyOf" not in node and "oneOf" not in node, path
        assert "const" not in node and "title" not in node, path
        # `true` reads as an empty schema per value there: a nested object's fields would be unknown
        assert node.get("additionalProperties") is not True, path
        if "properties" in node and path.rsplit(".", 1)[-1] != "properties":
            assert "additionalProperties" not in node, path
            assert node.get("type") == "object", path
        if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(
            node["exclusiveMinimum"], bool
        ):
            pytest.fail(f"{path}: exclusiveMinimum must be boolean in OpenAPI v3.0")


def test_cross_field_rules_are_cel() -> None:
    crd = CRDS["accelbench.io_finetunejobs.yaml"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    method_rules = [r["rule"] for r in spec["properties"]["method"]["x-kubernetes-validations"]]
    assert "self.type != 'lora' || has(self.rank)" in method_rules
    acc_rules = spec["properties"]["accelerator"]["x-kubernetes-validations"]
    topology = next(r for r in acc_rules if "topology in" in r["rule"])
    assert "'2x2x1'" in topology["rule"] and "tpu-v5p" in topology["message"]


def test_names_printer_columns_and_status_subresource() -> None:
    crd = CRDS["accelbench.io_finetunejobs.yaml"]
    names = crd["spec"]["names"]
    assert names["shortNames"] and names["categories"] == ["accelbench"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Accelerator", "Phase", "Step", "Tokens/s", "Cost $", "Age"} <= columns


def test_a_started_runs_spec_is_locked_except_what_acts_on_the_running_job() -> None:
    from accelbench.cli.crdgen import MUTABLE_AFTER_START

    crd = generate_crds(load_catalog())["accelbench.io_finetunejobs.yaml"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r for r in schema["x-kubernetes-validations"] if "oldSelf" in r["rule"]]  # not the name's
    locked = {r["message"].split(" ")[0] for r in rules}
    spec_fields = set(schema["properties"]["spec"]["properties"])
    assert locked == {f"spec.{f}" for f in spec_fields - set(MUTABLE_AFTER_START)}
    assert {"spec.model", "spec.training", "spec.accelerator"} <= locked and "spec.suspend" not in locked
    for rule in rules:  # transition rules, and only for a run that started
        assert "oldSelf.status.startTime" in rule["rule"] and "oldSelf.spec" in rule["rule"]

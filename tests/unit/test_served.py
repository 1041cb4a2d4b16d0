"""Issue 22: an InferenceBench serves what a FinetuneJob trained (controller/served.py, the render of a
LoRA adapter, the reconciler's wait)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
import render_fixtures as fx

from accelbench.catalog import load_catalog
from accelbench.controller.metrics import Metrics
from accelbench.controller.reconciler import Snapshot, reconcile
from accelbench.controller.served import resolve_served_model
from accelbench.controller.state import ControllerState
from accelbench.render import RenderError
from accelbench.render.inference import build_server_job, vllm_lora_rank

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)

BENCH: dict[str, Any] = {
    "apiVersion": "accelbench.io/v1alpha1",
    "kind": "InferenceBench",
    "metadata": {"name": "serve-tuned", "namespace": "team-a", "uid": "b-1", "generation": 1},
    "spec": {
        "model": {"finetuneJob": "gemma-lora"},
        "server": {"engine": "vllm"},
        "accelerator": {"type": "h100", "count": 1},
        "workload": {"inputLengths": [512], "outputLength": 64, "concurrency": [1]},
    },
}


def finetune(phase: str | None, **output: Any) -> dict[str, Any]:
    return {
        "kind": "FinetuneJob",
        "metadata": {"name": "gemma-lora", "namespace": "team-a", "uid": "f-1"},
        "spec": {
            "model": {"uri": "gs://models-bkt/gemma-3-1b", "family": "gemma3", "size": "1b"},
            "method": {"type": "lora", "rank": 24},
            "output": {"uri": "gs://out-bkt/gemma-lora", **output},
        },
        "status": {"phase": phase} if phase else {},
    }


def test_a_bench_with_its_own_model_is_served_as_written() -> None:
    plain = copy.deepcopy(BENCH)
    plain["spec"]["model"] = {"uri": "pvc://models/x", "family": "llama"}
    resolved = resolve_served_model(plain, {}, None)
    assert resolved.manifest == plain and resolved.served is None


@pytest.mark.parametrize(
    ("source", "says"),
    [
        (None, "FinetuneJob gemma-lora does not exist yet"),
        (finetune(None), "FinetuneJob gemma-lora is not started"),
        (finetune("Running"), "FinetuneJob gemma-lora is Running; serving starts when it succeeded"),
    ],
)
def test_it_waits_until_the_finetune_job_succeeded(source: dict[str, Any] | None, says: str) -> None:
    resolved = resolve_served_model(BENCH, {}, source)
    assert resolved.manifest is None and resolved.fail is None and says in str(resolved.wait)


@pytest.mark.parametrize(
    ("source", "says"),
    [
        (finetune("Failed"), "FinetuneJob gemma-lora failed: no trained model to serve"),
        (finetune("Succeeded", format="orbax"), "Orbax checkpoints, which no serving engine loads"),
    ],
)
def test_a_failed_or_unservable_finetune_job_ends_the_bench(source: dict[str, Any], says: str) -> None:
    resolved = resolve_served_model(BENCH, {}, source)
    assert resolved.manifest is None and resolved.wait is None and says in str(resolved.fail)


def test_a_merged_output_is_served_with_the_trained_shape() -> None:
    resolved = resolve_served_model(BENCH, {}, finetune("Succeeded"))
    assert resolved.manifest is not None
    assert resolved.manifest["spec"]["model"] == {
        "uri": "gs://out-bkt/gemma-lora",
        "family": "gemma3",
        "size": "1b",
    }
    assert resolved.served == {
        "finetuneJob": "gemma-lora",
        "finetuneJobUid": "f-1",
        "uri": "gs://out-bkt/gemma-lora",
        "family": "gemma3",
        "size": "1b",
    }
    assert BENCH["spec"]["model"] == {"finetuneJob": "gemma-lora"}  # the input is left alone


def test_an_adapter_output_is_served_on_the_base_model_it_trained() -> None:
    resolved = resolve_served_model(BENCH, {}, finetune("Succeeded", mergeLora=False))
    assert resolved.manifest is not None
    model = resolved.manifest["spec"]["model"]
    assert model["uri"] == "gs://models-bkt/gemma-3-1b"
    assert model["adapter"] == {"uri": "gs://out-bkt/gemma-lora", "name": "gemma-lora", "rank": 24}


def test_the_stored_choice_stands_once_applied_even_with_the_finetune_job_gone() -> None:
    first = resolve_served_model(BENCH, {}, finetune("Succeeded"))
    again = resolve_served_model(BENCH, {"servedModel": first.served}, None)
    assert again.manifest == first.manifest
    other = copy.deepcopy(BENCH)
    other["spec"]["model"]["finetuneJob"] = "another"  # an edit before the start: resolved anew
    assert resolve_served_model(other, {"servedModel": first.served}, None).wait is not None


# ---------------------------------------------------------------- render


def adapter_bench(engine: str = "vllm", rank: int = 24) -> Any:
    adapter = {"uri": "gs://out-bkt/gemma-lora", "name": "gemma-lora", "rank": rank}
    model = {"uri": "gs://models-bkt/gemma-3-27b", "family": "gemma3", "size": "27b", "adapter": adapter}
    return fx.inference("serve-lora", {"type": "h100", "count": 2}, {"engine": engine}, model=model)


def test_vllm_serves_the_adapter_fetched_beside_the_model() -> None:
    job = build_server_job(
        adapter_bench(), fx.make_plan(fx.H100, chips=2, tp=2), fx.H100, "ghcr.io/x/bench:1"
    )
    pod = job["spec"]["template"]["spec"]
    fetches = [(c["name"], c["command"][-3]) for c in pod["initContainers"]]
    assert fetches == [
        ("fetch-model", "gs://models-bkt/gemma-3-27b"),
        ("fetch-adapter", "gs://out-bkt/gemma-lora"),
    ]
    command = pod["containers"][0]["command"]
    at = command.index("--lora-modules")
    assert command[at + 1].startswith("gemma-lora=/") and command[at + 1].endswith("gemma-lora")
    assert command[command.index("--max-lora-rank") + 1] == "32"  # the next rank vLLM accepts
    assert "--enable-lora" in command
    rules = job["spec"]["podFailurePolicy"]["rules"]
    named = {r["onExitCodes"].get("containerName") for r in rules if "onExitCodes" in r}
    assert {"fetch-model", "fetch-adapter"} <= named  # a missing adapter fails the Job at once


def test_other_engines_refuse_an_adapter_with_the_way_out() -> None:
    with pytest.raises(RenderError, match=r"does not serve a LoRA adapter.*mergeLora"):
        build_server_job(adapter_bench("tgi"), fx.make_plan(fx.H100, chips=2, tp=2), fx.H100, "img")


def test_vllm_lora_ranks() -> None:
    assert [vllm_lora_rank(r) for r in (1, 8, 9, 64, 300, 512)] == [1, 8, 16, 64, 320, 512]
    with pytest.raises(RenderError, match="above the largest"):
        vllm_lora_rank(1024)


# ---------------------------------------------------------------- the reconciler


class Kube:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.status_writes: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.created.append(obj)
        return obj

    def create_many(self, objs: list[dict[str, Any]]) -> list[Exception | None]:
        return [self.create(obj) and None for obj in objs]

    def patch_status(self, obj: Any, status: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        self.status_writes.append(copy.deepcopy(status))
        return {}

    def post_event(self, obj: Any, type_: str, reason: str, message: str, now: str) -> None:
        self.events.append((type_, reason, message))


@pytest.fixture
def state() -> ControllerState:
    made = ControllerState(kube=Kube(), metrics=Metrics(), price_namespace="x", price_config_map="y")  # type: ignore[arg-type]
    made._catalog, made._loaded_at = load_catalog(), float("inf")
    return made


KEY = ("InferenceBench", "team-a", "serve-tuned")


def test_the_bench_waits_creates_nothing_then_serves_the_trained_model(state: ControllerState) -> None:
    kube: Kube = state.kube  # type: ignore[assignment]
    waiting = reconcile(Snapshot(KEY, copy.deepcopy(BENCH), source=finetune("Running")), state, NOW)
    assert waiting.label == "waiting-for-model" and waiting.requeue_after is None  # its events wake it
    status = kube.status_writes[-1]
    assert not kube.created and status["phase"] == "Pending" and status["observedGeneration"] == 1
    applied = next(c for c in status["conditions"] if c["type"] == "Applied")
    assert (applied["status"], applied["reason"]) == ("False", "WaitingForModel")
    assert kube.events[-1][1] == "WaitingForModel"

    body = {**copy.deepcopy(BENCH), "status": status}
    started = reconcile(Snapshot(KEY, body, source=finetune("Succeeded")), state, NOW)
    assert started.label == "applied"
    assert {c["kind"] for c in kube.created} >= {"Job", "ConfigMap"}
    assert kube.status_writes[-1]["servedModel"]["uri"] == "gs://out-bkt/gemma-lora"
    assert kube.status_writes[-1]["plan"]["chips"] == 1


def test_a_failed_finetune_job_fails_the_bench_before_it_costs_anything(state: ControllerState) -> None:
    kube: Kube = state.kube  # type: ignore[assignment]
    outcome = reconcile(Snapshot(KEY, copy.deepcopy(BENCH), source=finetune("Failed")), state, NOW)
    assert outcome.label == "model-unavailable" and not kube.created
    status = kube.status_writes[-1]
    assert status["phase"] == "Failed" and "no trained model to serve" in status["message"]
    assert next(c for c in status["conditions"] if c["type"] == "Applied")["reason"] == "ModelUnavailable"

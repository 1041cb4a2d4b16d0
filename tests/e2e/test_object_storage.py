"""The study manifests read their model and data from buckets and write their outputs back, on the
local control plane, against real object stores on loopback (hack/objectstores.py: fake-gcs-server
for gs://, versitygw for s3://). The pods reach the stores the way a user's would: endpoints in
spec.env, S3 keys from a Secret through secretKeyRef (never as plain values in the spec).

Each failure a user meets (a missing object, a refused account, a corrupt object, a full disk) ends
as a Failed run whose condition names the reason and the object, after one pod: no retry storm."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_env import Env, wait_for

from accelbench.api.contract import ENV_CACHE_DIR
from accelbench.workers import storage
from accelbench.workers.testing import make_chat_dataset, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import objectstores  # noqa: E402

FT = "finetunejobs"
CLI = str(Path(sys.executable).parent / "accelbench")  # the console script a user runs
BUCKET = "accelbench-study"
CREDENTIALS = "object-store-credentials"
READER_CREDENTIALS = "object-store-reader"
LOCAL_EXEC = {"nodeSelector": {"accelbench.io/local-exec": "true"}}
# The three study manifests: which store each reads from in this test, and the tiny model family
# that keeps its structure (gemma4 for the Gemma 4 study; JAX for the TPU one).
STUDIES = {
    "gemma4-31b-lora-tpu-v5p": ("gs", "jax"),
    "gemma4-31b-lora-h100x2": ("gs", "pytorch"),
    "gemma4-31b-lora-gaudi3": ("s3", "pytorch"),
}


def store_env(stores: objectstores.ObjectStores, secret: str = CREDENTIALS) -> list[dict[str, Any]]:
    """spec.env of a run that reads both stores: endpoints as values, keys from a Secret."""
    endpoints = {
        k: v for k, v in stores.env().items() if not k.startswith("AWS_ACCESS") and "SECRET" not in k
    }
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in endpoints.items()]
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


def secret(name: str, key: str, value: str) -> dict[str, Any]:
    encode = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"AWS_ACCESS_KEY_ID": encode(key), "AWS_SECRET_ACCESS_KEY": encode(value)},
    }


@pytest.fixture(scope="module")
def stores(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstores.ObjectStores]:
    """Both stores with the tiny model and data in them, and the Secrets the runs use."""
    running = objectstores.start_object_stores(tmp_path_factory.mktemp("stores"))
    try:
        base = tmp_path_factory.mktemp("inputs")
        for scheme in ("gs", "s3"):
            running.create_bucket(f"{scheme}://{BUCKET}")
            for family in ("gemma4", "llama"):
                model = make_tiny_model(base / family, family)
                running.put_dir(model, f"{scheme}://{BUCKET}/models/tiny-{family}")
            data = make_chat_dataset(base / "chat.jsonl", n=48)
            running.put_file(data, f"{scheme}://{BUCKET}/data/chat.jsonl")
        env.apply(secret(CREDENTIALS, objectstores.S3_ROOT_KEY, objectstores.S3_ROOT_SECRET))
        env.apply(secret(READER_CREDENTIALS, objectstores.S3_READER_KEY, objectstores.S3_READER_SECRET))
        yield running
    finally:
        running.stop()


def study(name: str, stores: objectstores.ObjectStores) -> dict[str, Any]:
    """The committed study manifest with its structure kept (LoRA r=64 on all projections, completion
    masking, cosine schedule, output format): tiny model, a few steps on the local-exec node."""
    scheme, framework = STUDIES[name]
    body = yaml.safe_load((ROOT / "examples" / "finetune" / f"{name}.yaml").read_text())
    spec = body["spec"]
    spec["model"].update({"uri": f"{scheme}://{BUCKET}/models/tiny-gemma4", "size": "tiny"})
    spec["dataset"]["uri"] = f"{scheme}://{BUCKET}/data/chat.jsonl"
    spec["output"]["uri"] = f"{scheme}://{BUCKET}/out/{body['metadata']['name']}"
    spec["training"].pop("epochs", None)
    spec["training"].update(
        {"seqLength": 128, "globalBatchSize": 4, "maxSteps": 3, "warmupSteps": 1, "precision": "fp32"}
    )
    spec["accelerator"] = {"type": "cpu", "count": 1}
    spec["framework"] = framework
    spec["scheduling"] = LOCAL_EXEC
    spec["env"] = store_env(stores)
    return body


def terminal(env: Env, name: str, plural: str = FT, timeout: float = 420) -> dict[str, Any]:
    return wait_for(
        lambda: (o := env.get(plural, name)).get("status", {}).get("phase") in ("Succeeded", "Failed") and o,
        timeout=timeout,
        what=f"{name} terminal phase",
    )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def pods_of(env: Env, name: str) -> list[Any]:
    return env.core.list_namespaced_pod("default", label_selector=f"accelbench.io/name={name}").items


def test_the_three_studies_train_from_buckets_and_their_outputs_load_again(
    env: Env, stores: objectstores.ObjectStores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = {example: study(example, stores) for example in STUDIES}
    for body in bodies.values():
        env.apply(body)
    for example, (scheme, _) in STUDIES.items():
        name = bodies[example]["metadata"]["name"]
        obj = terminal(env, name)
        assert obj["status"]["phase"] == "Succeeded", (name, obj["status"])
        assert obj["status"]["results"]["steps"] == 3
        # Nothing secret in what the operator wrote: the keys stay in the Secret.
        text = yaml.safe_dump(obj) + yaml.safe_dump([p.to_dict() for p in pods_of(env, name)])
        assert objectstores.S3_ROOT_SECRET not in text

        # The outputs outlive the resource: delete it, then read them from the bucket.
        env.kubectl("delete", f"{FT}/{name}", "--wait=true", "--timeout=60s")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the CLI's own object cache
        for key, value in stores.env().items():
            monkeypatch.setenv(key, value)
        out = f"{scheme}://{BUCKET}/out/{name}"
        listed = storage.read_manifest(out)
        names = {o["name"] for o in listed["objects"]}
        assert {"report.json", "config.json"} <= names and any(n.endswith(".safetensors") for n in names), (
            names
        )

        # ... and load again: the merged checkpoint converts to Orbax, read from one bucket and
        # written to the other store, through the CLI a user runs.
        other = "s3" if scheme == "gs" else "gs"
        converted = f"{other}://{BUCKET}/converted/{name}"
        done = subprocess.run(
            [CLI, "convert", "--from", "hf", "--to", "orbax", "--model-dir", out, "--out", converted],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert storage.read_manifest(converted)["objects"], converted


def failing_run(name: str, stores: objectstores.ObjectStores, model_uri: str, **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples/quickstart/finetune-tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["model"]["uri"] = model_uri
    body["spec"]["dataset"]["uri"] = f"s3://{BUCKET}/data/chat.jsonl"
    body["spec"]["maxRetries"] = 3  # a retryable failure would show as more than one pod
    body["spec"]["env"] = store_env(stores)
    body["spec"].update(spec)
    return body


def assert_failed_once(env: Env, name: str, reason: str, *needles: str) -> dict[str, Any]:
    obj = terminal(env, name, timeout=120)
    assert obj["status"]["phase"] == "Failed", str(obj["status"])
    failed = condition(obj, "Failed")
    assert failed["reason"] == reason, failed
    for needle in needles:
        assert needle in failed["message"], failed
    assert len(pods_of(env, name)) == 1  # failed at once: no retries of an input that cannot work
    return obj


def test_a_missing_model_fails_at_once_naming_the_object(env: Env, stores: objectstores.ObjectStores) -> None:
    missing = f"s3://{BUCKET}/models/no-such-model"
    env.apply(failing_run("missing-model", stores, missing))
    assert_failed_once(env, "missing-model", "ObjectNotFound", missing, "no such object")


def test_an_account_the_store_refuses_fails_at_once_as_access_denied(
    env: Env, stores: objectstores.ObjectStores
) -> None:
    model = f"s3://{BUCKET}/models/tiny-llama"
    body = failing_run("denied-model", stores, model)
    body["spec"]["env"] = store_env(stores, secret=READER_CREDENTIALS)
    env.apply(body)
    assert_failed_once(env, "denied-model", "ObjectAccessDenied", model, "permission denied")


def test_a_corrupt_object_fails_at_once_as_corrupt(
    env: Env, stores: objectstores.ObjectStores, tmp_path: Path
) -> None:
    model = make_tiny_model(tmp_path / "model", "llama")
    uri = f"s3://{BUCKET}/models/corrupt-llama"
    stores.put_dir(model, uri)
    weights = next(p for p in model.glob("*.safetensors"))
    on_disk = stores.object_file(f"{uri}/{weights.name}")
    damaged = bytearray(on_disk.read_bytes())
    damaged[-10] ^= 0xFF  # behind the store's back: its ETag still says the old bytes
    on_disk.write_bytes(bytes(damaged))
    env.apply(failing_run("corrupt-model", stores, uri))
    assert_failed_once(env, "corrupt-model", "ObjectCorrupt", f"{uri}/{weights.name}", "does not match")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB file system (tmpfs; the tests run as root, as CI does on this machine)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_cache_too_small_for_the_model_fails_before_downloading(
    env: Env, stores: objectstores.ObjectStores, small_disk: Path, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "model-00001-of-00001.safetensors").write_bytes(b"\0" * (3 << 20))
    uri = f"s3://{BUCKET}/models/too-big"
    stores.put_dir(big, uri)
    body = failing_run("full-disk", stores, uri)
    body["spec"]["env"].append({"name": ENV_CACHE_DIR, "value": str(small_disk)})
    env.apply(body)
    assert_failed_once(env, "full-disk", "InsufficientDisk", uri, "MB free")
    assert not list(small_disk.rglob("*.safetensors*"))  # nothing was half-written


def bench(name: str, stores: objectstores.ObjectStores, model_uri: str) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples/quickstart/inference-tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["model"]["uri"] = model_uri
    body["spec"]["env"] = store_env(stores)  # every pod of the bench: the fetch, the engine, the client
    body["spec"]["workload"].update({"inputLengths": [16], "concurrency": [1], "requestsPerPoint": 3})
    body["spec"]["capacitySearch"] = False
    return body


def test_a_serving_engine_loads_its_model_from_the_bucket_and_the_results_land_in_one(
    env: Env, stores: objectstores.ObjectStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = bench("bench-from-s3", stores, f"s3://{BUCKET}/models/tiny-llama")
    out = f"gs://{BUCKET}/bench-out/bench-from-s3"
    body["spec"]["output"] = {"uri": out}
    env.apply(body)

    def fetched() -> Any:
        """The server pod's fetch-model init container, once it ended (read while the pod exists:
        the operator stops the server as soon as the client is done)."""
        for pod in pods_of(env, "bench-from-s3"):
            if pod.metadata.labels["accelbench.io/role"] == "server":
                for status in pod.status.init_container_statuses or []:
                    if status.state.terminated is not None:
                        return status
        return None

    fetch = wait_for(fetched, timeout=180, what="the server's fetch-model init container done")
    assert (fetch.name, fetch.state.terminated.exit_code) == ("fetch-model", 0)
    obj = terminal(env, "bench-from-s3", plural="inferencebenches")
    assert obj["status"]["phase"] == "Succeeded", str(obj["status"])
    assert obj["status"]["results"]["cells"]
    # The results outlive the resource: JSON, the HTML report and its plots, in the bucket.
    for key, value in stores.env().items():
        monkeypatch.setenv(key, value)
    names = {o["name"] for o in storage.read_manifest(out)["objects"]}
    assert {"results.json", "report.json", "index.html", "ttft_vs_input.png"} <= names, names


def test_a_bench_whose_model_is_missing_fails_with_the_fetchs_reason_not_a_timeout(
    env: Env, stores: objectstores.ObjectStores
) -> None:
    missing = f"gs://{BUCKET}/models/absent"
    selector = "accelbench.io/name=bench-missing"
    env.apply(bench("bench-missing", stores, missing))
    obj = terminal(env, "bench-missing", plural="inferencebenches", timeout=120)
    assert obj["status"]["phase"] == "Failed", str(obj["status"])
    failed = condition(obj, "Failed")
    assert failed["reason"] == "ObjectNotFound" and missing in failed["message"], failed
    wait_for(  # the client, which was waiting for the endpoint, is stopped
        lambda: not env.batch.list_namespaced_job("default", label_selector=selector).items,
        timeout=60,
        what="bench-missing's Jobs removed",
    )


def test_secrets_reach_the_pods_and_appear_nowhere_else(
    env: Env, stores: objectstores.ObjectStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The S3 keys as a whole Secret (envFrom) and a private-registry Secret (imagePullSecrets): the
    bench fetches its model, serves it and uploads its results with them, which proves they reached
    every pod; then the key is searched for, and not found, in everything the operator, the cluster
    and the pods left behind: the resource (spec, status, annotations), its Jobs, pods and results
    ConfigMap, the namespace's Events, the pods' logs and the operator's log."""
    name = "bench-env-from"
    body = bench(name, stores, f"s3://{BUCKET}/models/tiny-llama")
    body["spec"]["env"] = [e for e in store_env(stores) if "valueFrom" not in e]  # endpoints only
    body["spec"]["envFrom"] = [{"secretRef": {"name": CREDENTIALS}}]
    body["spec"]["imagePullSecrets"] = [{"name": "registry-credentials"}]
    body["spec"]["output"] = {"uri": f"s3://{BUCKET}/bench-out/{name}"}
    env.apply(body)
    obj = terminal(env, name, plural="inferencebenches")
    assert obj["status"]["phase"] == "Succeeded", str(obj["status"])
    for key, value in stores.env().items():  # this test reads the bucket as the owner of the keys
        monkeypatch.setenv(key, value)
    assert storage.read_manifest(f"s3://{BUCKET}/bench-out/{name}")["objects"]  # written with the keys

    pods = pods_of(env, name)  # the client's (the server's went with its Job when the run ended)
    assert pods and all(p.spec.image_pull_secrets[0].name == "registry-credentials" for p in pods)
    dump = lambda objects: json.dumps(objects, default=str)  # noqa: E731
    left_behind = [
        dump(env.get("inferencebenches", name)),
        dump([j.to_dict() for j in env.batch.list_namespaced_job("default").items]),
        dump([p.to_dict() for p in pods]),
        dump(env.core.read_namespaced_config_map(f"{name}-results", "default").to_dict()),
        dump([e.to_dict() for e in env.core.list_namespaced_event("default").items]),
        env.operator.log(),
    ]
    logs = list((env.workdir / "localexec" / "default").glob(f"{name}-*/*.log"))
    assert logs, "the pods' logs"
    left_behind += [p.read_text(errors="replace") for p in logs]
    for text in left_behind:
        assert objectstores.S3_ROOT_SECRET not in text

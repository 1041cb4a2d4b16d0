"""gs:// inputs against a real GCS API server on loopback (fake-gcs-server, built by
hack/build-servers.sh), through the official google-cloud-storage client."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from accelbench.workers import InvalidConfigError, storage
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.jobenv import parse_job_payload

SERVER = Path(__file__).resolve().parents[2] / ".servers" / "fake-gcs-server"
BUCKET = "accelbench-test"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fake-gcs-server on a free port; STORAGE_EMULATOR_HOST points the client at it."""
    if not SERVER.exists():
        pytest.skip(f"{SERVER} is absent: run hack/build-servers.sh (make test does)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = f"127.0.0.1:{port}"
    args = ["-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory"]
    log = (tmp_path_factory.mktemp("gcs") / "server.log").open("wb")
    proc = subprocess.Popen([str(SERVER), *args, "-public-host", host], stdout=log, stderr=subprocess.STDOUT)
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://{host}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.1)
        from google.cloud import storage as gcs_storage

        gcs_storage.Client().create_bucket(BUCKET)
        yield f"http://{host}"
    finally:
        proc.terminate()
        proc.wait(10)
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous


def upload_dir(local: Path, prefix: str) -> int:
    """Upload every file under `local` to gs://BUCKET/prefix/...; return the bytes uploaded."""
    from google.cloud import storage as gcs_storage

    bucket = gcs_storage.Client().bucket(BUCKET)
    total = 0
    for path in sorted(local.rglob("*")):
        if path.is_file():
            bucket.blob(f"{prefix}/{path.relative_to(local)}").upload_from_filename(str(path))
            total += path.stat().st_size
    return total


def test_a_prefix_is_copied_verified_and_reused(gcs: str, tiny_llama: Path, tmp_path: Path) -> None:
    total = upload_dir(tiny_llama, "models/tiny-llama")
    first = storage.fetch(f"gs://{BUCKET}/models/tiny-llama", tmp_path, log=lambda _: None)
    assert first.path == tmp_path / BUCKET / "models" / "tiny-llama"
    assert first.bytes_downloaded == total and first.objects == len(list(tiny_llama.rglob("*.*")))
    for source in tiny_llama.rglob("*"):
        if source.is_file():
            assert (first.path / source.relative_to(tiny_llama)).read_bytes() == source.read_bytes()
    again = storage.fetch(f"gs://{BUCKET}/models/tiny-llama", tmp_path, log=lambda _: None)
    assert (again.bytes_downloaded, again.bytes_reused) == (0, total)  # a retried pod downloads nothing

    # A cached file that no longer matches the store is downloaded again.
    config = first.path / "config.json"
    config.write_bytes(b"x" * config.stat().st_size)
    healed = storage.fetch(f"gs://{BUCKET}/models/tiny-llama", tmp_path, log=lambda _: None)
    assert healed.bytes_downloaded == config.stat().st_size
    assert config.read_bytes() == (tiny_llama / "config.json").read_bytes()


def test_a_partial_download_resumes(gcs: str, tmp_path: Path) -> None:
    from google.cloud import storage as gcs_storage

    payload = os.urandom(3_000_000)
    gcs_storage.Client().bucket(BUCKET).blob("data/big.bin").upload_from_string(payload)
    target = tmp_path / BUCKET / "data" / "big.bin"
    target.parent.mkdir(parents=True)
    target.with_name("big.bin.part").write_bytes(payload[:1_000_000])  # an earlier attempt's part
    fetched = storage.fetch(f"gs://{BUCKET}/data/big.bin", tmp_path, log=lambda _: None)
    assert fetched.path == target and target.read_bytes() == payload
    assert fetched.bytes_downloaded == 2_000_000  # only the rest


def test_missing_objects_and_a_full_disk_are_invalid_config(
    gcs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidConfigError, match=f"gs://{BUCKET}/nope: no such object"):
        storage.fetch(f"gs://{BUCKET}/nope", tmp_path, log=lambda _: None)
    with pytest.raises(InvalidConfigError, match="gs://no-such-bucket/x: not found"):
        storage.fetch("gs://no-such-bucket/x", tmp_path, log=lambda _: None)
    from google.cloud import storage as gcs_storage

    gcs_storage.Client().bucket(BUCKET).blob("data/one.bin").upload_from_string(b"y" * 1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(free=10, total=10, used=0))
    with pytest.raises(InvalidConfigError, match=r"needs 0\.00 GB .* 0\.00 GB free"):
        storage.fetch(f"gs://{BUCKET}/data/one.bin", tmp_path / "small", log=lambda _: None)
    assert not (tmp_path / "small" / BUCKET / "data" / "one.bin").exists()  # nothing half-written


def test_the_worker_trains_from_gs(
    gcs: str, manifest_for, tiny_llama: Path, chat_dataset: Path, tmp_path: Path
) -> None:
    model_bytes = upload_dir(tiny_llama, "models/llama")
    from google.cloud import storage as gcs_storage

    gcs_storage.Client().bucket(BUCKET).blob("data/chat.jsonl").upload_from_filename(str(chat_dataset))
    manifest = manifest_for("llama", training={"maxSteps": 2})
    manifest["spec"]["model"]["uri"] = f"gs://{BUCKET}/models/llama"
    manifest["spec"]["dataset"]["uri"] = f"gs://{BUCKET}/data/chat.jsonl"
    env = {"ACCELBENCH_CACHE_DIR": str(tmp_path / "cache"), "STORAGE_EMULATOR_HOST": gcs}
    report, code = run_job(
        parse_job_payload(manifest), RunOptions(serve_metrics=False, log=lambda _: None, env=env)
    )
    assert code == 0 and report.ok, report.error
    assert report.finetune.steps == 2
    assert report.timings.load_bytes == model_bytes + chat_dataset.stat().st_size
    assert report.timings.load_seconds > 0

    manifest["spec"]["dataset"]["uri"] = f"gs://{BUCKET}/data/missing.jsonl"
    report, code = run_job(
        parse_job_payload(manifest), RunOptions(serve_metrics=False, log=lambda _: None, env=env)
    )
    assert code == 3 and report.error.type == "InvalidConfig" and "missing.jsonl" in report.error.message


def test_outputs_and_the_report_land_in_the_bucket_with_a_manifest(
    gcs: str, manifest_for, tmp_path: Path
) -> None:
    import json

    from google.cloud import storage as gcs_storage

    manifest = manifest_for("llama", training={"maxSteps": 2}, output=f"gs://{BUCKET}/out/run-1")
    manifest["spec"]["output"]["mergeLora"] = False  # the adapter alone: small
    env = {"ACCELBENCH_CACHE_DIR": str(tmp_path / "cache"), "STORAGE_EMULATOR_HOST": gcs}
    options = RunOptions(serve_metrics=False, log=lambda _: None, env=env)
    report, code = run_job(parse_job_payload(manifest), options)
    assert code == 0 and report.ok, report.error
    bucket = gcs_storage.Client().bucket(BUCKET)
    listed = json.loads(bucket.blob("out/run-1/manifest.json").download_as_bytes())
    names = {o["name"] for o in listed["objects"]}
    assert "report.json" in names and any(n.endswith(".safetensors") for n in names), names
    for entry in listed["objects"]:  # every file the manifest lists is there, at its size
        blob = bucket.get_blob(f"out/run-1/{entry['name']}")
        assert blob is not None and blob.size == entry["bytes"] and blob.md5_hash == entry["md5"]
    stored = json.loads(bucket.blob("out/run-1/report.json").download_as_bytes())
    assert stored["finetune"]["steps"] == 2
    assert stored["finetune"]["lossHistory"] == report.finetune.loss_history

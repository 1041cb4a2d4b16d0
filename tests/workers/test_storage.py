"""gs:// and s3:// against real servers on loopback (hack/objectstores.py: fake-gcs-server and
versitygw, built by hack/build-servers.sh), through the official SDKs (google-cloud-storage, boto3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from accelbench.api.contract import ENV_TERMINATION_LOG
from accelbench.workers import storage
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.jobenv import parse_job_payload

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

import objectstores  # noqa: E402

BUCKET = "accelbench-test"
SCHEMES = ["gs", "s3"]


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstores.ObjectStores]:
    """Both servers, each with BUCKET; the SDKs reach them through the environment, as in a pod."""
    running = objectstores.start_object_stores(tmp_path_factory.mktemp("stores"))
    saved = {k: os.environ.get(k) for k in running.env()}
    os.environ.update(running.env())
    try:
        for scheme in SCHEMES:
            running.create_bucket(f"{scheme}://{BUCKET}")
        yield running
    finally:
        running.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def read(stores: objectstores.ObjectStores, uri: str) -> bytes:
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if scheme == "gs":
        return stores.gcs_client().bucket(bucket).blob(key).download_as_bytes()
    return stores.s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_prefix_is_copied_verified_and_reused(
    stores: objectstores.ObjectStores, scheme: str, tiny_llama: Path, tmp_path: Path
) -> None:
    uri = f"{scheme}://{BUCKET}/models/tiny-llama"
    total = stores.put_dir(tiny_llama, uri)
    first = storage.fetch(uri, tmp_path, log=quiet)
    assert first.path == tmp_path / scheme / BUCKET / "models" / "tiny-llama"
    assert first.bytes_downloaded == total and first.objects == len(
        [p for p in tiny_llama.rglob("*") if p.is_file()]
    )
    for source in tiny_llama.rglob("*"):
        if source.is_file():
            assert (first.path / source.relative_to(tiny_llama)).read_bytes() == source.read_bytes()
    again = storage.fetch(uri, tmp_path, log=quiet)
    assert (again.bytes_downloaded, again.bytes_reused) == (0, total)  # a retried pod downloads nothing

    # A cached file that no longer matches the store is downloaded again.
    config = first.path / "config.json"
    config.write_bytes(b"x" * config.stat().st_size)
    healed = storage.fetch(uri, tmp_path, log=quiet)
    assert healed.bytes_downloaded == config.stat().st_size
    assert config.read_bytes() == (tiny_llama / "config.json").read_bytes()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_partial_download_resumes(stores: objectstores.ObjectStores, scheme: str, tmp_path: Path) -> None:
    payload = os.urandom(3_000_000)
    source = tmp_path / "big.bin"
    source.write_bytes(payload)
    uri = f"{scheme}://{BUCKET}/data/big.bin"
    stores.put_file(source, uri)
    cache = tmp_path / "cache"
    target = cache / scheme / BUCKET / "data" / "big.bin"
    target.parent.mkdir(parents=True)
    target.with_name("big.bin.part").write_bytes(payload[:1_000_000])  # an earlier attempt's part
    fetched = storage.fetch(uri, cache, log=quiet)
    assert fetched.path == target and target.read_bytes() == payload
    assert fetched.bytes_downloaded == 2_000_000  # only the rest


def test_a_multipart_s3_object_is_verified_by_its_etag_and_corruption_is_caught(
    stores: objectstores.ObjectStores, tmp_path: Path
) -> None:
    """boto3 uploads 20 MiB in 8 MiB parts: the ETag is md5-of-part-md5s-3, which fetch recomputes
    while streaming. Bytes changed behind the store's back (its ETag unchanged) are refused."""
    payload = os.urandom(20 << 20)
    source = tmp_path / "shard.safetensors"
    source.write_bytes(payload)
    uri = f"s3://{BUCKET}/sharded/model-00001-of-00001.safetensors"
    stores.put_file(source, uri)
    etag = stores.s3_client().head_object(Bucket=BUCKET, Key=uri.split("/", 3)[3])["ETag"]
    assert etag.strip('"').endswith("-3")
    fetched = storage.fetch(uri, tmp_path / "cache", log=quiet)
    assert fetched.path.read_bytes() == payload

    on_disk = stores.object_file(uri)
    corrupt = bytearray(on_disk.read_bytes())
    corrupt[12345] ^= 0xFF
    on_disk.write_bytes(bytes(corrupt))
    with pytest.raises(storage.ObjectCorruptError, match=rf"{uri}: .* does not match the store's ETag"):
        storage.fetch(uri, tmp_path / "other-cache", log=quiet)
    assert not list((tmp_path / "other-cache").rglob("*.safetensors*"))  # no copy, no .part left


@pytest.mark.parametrize("scheme", SCHEMES)
def test_missing_objects_and_a_full_disk_name_the_object_and_the_reason(
    stores: objectstores.ObjectStores, scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(storage.ObjectMissingError, match=f"{scheme}://{BUCKET}/nope: no such object"):
        storage.fetch(f"{scheme}://{BUCKET}/nope", tmp_path, log=quiet)
    with pytest.raises(storage.ObjectMissingError, match=f"{scheme}://no-such-bucket/x: not found"):
        storage.fetch(f"{scheme}://no-such-bucket/x", tmp_path, log=quiet)
    one = tmp_path / "one.bin"
    one.write_bytes(b"y" * 1000)
    stores.put_file(one, f"{scheme}://{BUCKET}/data/one.bin")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(free=10, total=10, used=0))
    with pytest.raises(storage.CacheFullError, match=r"needs 0\.0 MB .* 0\.0 MB free"):
        storage.fetch(f"{scheme}://{BUCKET}/data/one.bin", tmp_path / "small", log=quiet)
    assert not list((tmp_path / "small").rglob("one.bin*"))  # nothing half-written


def test_an_account_without_access_is_denied_naming_the_object(
    stores: objectstores.ObjectStores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = tmp_path / "one.bin"
    one.write_bytes(b"z" * 10)
    stores.put_file(one, f"s3://{BUCKET}/private/one.bin")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", objectstores.S3_READER_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", objectstores.S3_READER_SECRET)
    with pytest.raises(storage.ObjectDeniedError, match=f"s3://{BUCKET}/private: permission denied"):
        storage.fetch(f"s3://{BUCKET}/private", tmp_path, log=quiet)
    with pytest.raises(storage.OutputError, match=f"s3://{BUCKET}/out: permission denied"):
        storage.upload_dir(tmp_path, f"s3://{BUCKET}/out", log=quiet, attempts=1)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_worker_trains_from_the_bucket_and_its_outputs_land_there_with_a_manifest(
    stores: objectstores.ObjectStores,
    scheme: str,
    manifest_for,
    tiny_llama: Path,
    chat_dataset: Path,
    tmp_path: Path,
) -> None:
    base = f"{scheme}://{BUCKET}/worker"
    model_bytes = stores.put_dir(tiny_llama, f"{base}/models/llama")
    stores.put_file(chat_dataset, f"{base}/data/chat.jsonl")
    manifest = manifest_for("llama", training={"maxSteps": 2}, output=f"{base}/out/run-1")
    manifest["spec"]["model"]["uri"] = f"{base}/models/llama"
    manifest["spec"]["dataset"]["uri"] = f"{base}/data/chat.jsonl"
    manifest["spec"]["output"]["mergeLora"] = False  # the adapter alone: small
    options = RunOptions(
        serve_metrics=False, log=quiet, env={"ACCELBENCH_CACHE_DIR": str(tmp_path / "cache")}
    )
    report, code = run_job(parse_job_payload(manifest), options)
    assert code == 0 and report.ok, report.error
    assert report.finetune.steps == 2
    assert report.timings.load_bytes == model_bytes + chat_dataset.stat().st_size
    assert report.timings.load_seconds > 0

    listed = storage.read_manifest(f"{base}/out/run-1")
    names = {o["name"] for o in listed["objects"]}
    assert "report.json" in names and any(n.endswith(".safetensors") for n in names), names
    for entry in listed["objects"]:  # every file the manifest lists is there, with its bytes
        import hashlib

        data = read(stores, f"{base}/out/run-1/{entry['name']}")
        assert len(data) == entry["bytes"] and hashlib.md5(data).hexdigest() == entry["md5"]
    stored = json.loads(read(stores, f"{base}/out/run-1/report.json"))
    assert stored["finetune"]["steps"] == 2
    assert stored["finetune"]["lossHistory"] == report.finetune.loss_history

    manifest["spec"]["dataset"]["uri"] = f"{base}/data/missing.jsonl"
    report, code = run_job(parse_job_payload(manifest), options)
    assert code == 3 and report.error.type == "ObjectNotFound" and "missing.jsonl" in report.error.message


def test_outputs_the_store_refuses_fail_the_run_once_without_a_retry(
    stores: objectstores.ObjectStores, manifest_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trained, then the upload is refused: OutputNotWritten, exit INVALID_CONFIG (a retry would pay
    for the training again), and the message keeps what was measured."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", objectstores.S3_READER_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", objectstores.S3_READER_SECRET)
    manifest = manifest_for("llama", training={"maxSteps": 2}, output=f"s3://{BUCKET}/denied/run")
    manifest["spec"]["output"]["mergeLora"] = False
    options = RunOptions(
        serve_metrics=False, log=quiet, env={"ACCELBENCH_CACHE_DIR": str(tmp_path / "cache")}
    )
    report, code = run_job(parse_job_payload(manifest), options)
    assert code == 3 and report.error.type == "OutputNotWritten"
    assert "the run finished (2 steps" in report.error.message and "permission denied" in report.error.message


def test_the_fetch_command_exits_with_the_reason_in_its_termination_log(
    stores: objectstores.ObjectStores, tmp_path: Path
) -> None:
    """What a serving pod's init container runs: the path on stdout, or `Reason: message` and exit 3."""
    one = tmp_path / "tok.json"
    one.write_text("{}")
    stores.put_file(one, f"s3://{BUCKET}/cli/tok.json")
    log = tmp_path / "termination-log"
    env = {**os.environ, ENV_TERMINATION_LOG: str(log)}
    command = [sys.executable, "-m", "accelbench.workers.storage", "fetch", "--cache", str(tmp_path / "c")]
    ok = subprocess.run([*command, f"s3://{BUCKET}/cli"], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(tmp_path / "c" / "s3" / BUCKET / "cli")
    bad = subprocess.run(
        [*command, f"s3://{BUCKET}/absent"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 3
    assert log.read_text().startswith(f"ObjectNotFound: s3://{BUCKET}/absent: no such object")

"""Download throughput of a multi-shard model from the object stores on loopback: accelbench's copy
(workers/storage.fetch: objects in parallel, resumable parts, checksum verified while writing) at
several thread counts, against each store's official SDK copying the same objects one after the
other in a single stream (google-cloud-storage `download_to_filename`; boto3 `download_file` with
threads off), in the same run, on the same servers and disk.

    .venv/bin/python benchmarks/storage/run.py [--shards 4 --shard-mb 512 --repeats 2 --threads 1,2,4,8]

The servers are hack/objectstores.py's (fake-gcs-server for gs://, versitygw for s3://, both on
local files); the shards are random bytes named like a sharded safetensors checkpoint, uploaded
with each SDK's defaults (boto3: 8 MiB multipart parts, so the S3 ETags are multipart ones). Each
copy goes to a fresh directory; the page cache is shared, so the order alternates between repeats
and the best and median of `--repeats` are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))

import objectstores  # noqa: E402

BUCKET = "bench-models"


def sdk_single_stream(stores: objectstores.ObjectStores, scheme: str) -> Callable[[Path], None]:
    """The store's own SDK, one object after the other, one stream each (its checksum check on)."""
    if scheme == "gs":
        client = stores.gcs_client()

        def gcs_copy(dest: Path) -> None:
            for blob in client.list_blobs(BUCKET, prefix="model/"):
                target = dest / blob.name
                target.parent.mkdir(parents=True, exist_ok=True)
                blob.download_to_filename(str(target))

        return gcs_copy
    from boto3.s3.transfer import TransferConfig

    s3 = stores.s3_client()
    single = TransferConfig(use_threads=False)

    def s3_copy(dest: Path) -> None:
        for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="model/")["Contents"]:
            target = dest / item["Key"]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(BUCKET, item["Key"], str(target), Config=single)

    return s3_copy


def ours(scheme: str, threads: int) -> Callable[[Path], None]:
    from accelbench.workers import storage

    def copy(dest: Path) -> None:
        storage.fetch(f"{scheme}://{BUCKET}/model", dest, log=lambda _: None, threads=threads)

    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", default="1,2,4,8")
    parser.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory(prefix="storage-bench-") as tmp:
        stores = objectstores.start_object_stores(Path(tmp) / "stores")
        os.environ.update(stores.env())
        try:
            total = 0
            shard = Path(tmp) / "shard"
            for scheme in ("gs", "s3"):
                stores.create_bucket(f"{scheme}://{BUCKET}")
            for i in range(args.shards):
                shard.write_bytes(os.urandom(args.shard_mb << 20))
                name = f"model/model-{i + 1:05d}-of-{args.shards:05d}.safetensors"
                for scheme in ("gs", "s3"):
                    stores.put_file(shard, f"{scheme}://{BUCKET}/{name}")
                total += shard.stat().st_size
            shard.write_text('{"model_type": "llama"}')
            for scheme in ("gs", "s3"):
                stores.put_file(shard, f"{scheme}://{BUCKET}/model/config.json")
            shard.unlink()

            sides: dict[str, Callable[[Path], None]] = {}
            for scheme in ("gs", "s3"):
                sides[f"{scheme}/sdk_single_stream"] = sdk_single_stream(stores, scheme)
                for threads in thread_counts:
                    sides[f"{scheme}/accelbench_{threads}_threads"] = ours(scheme, threads)
            runs: dict[str, list[float]] = {side: [] for side in sides}
            for repeat in range(args.repeats):
                order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
                for side in order:
                    dest = Path(tmp) / "copy"
                    started = time.perf_counter()
                    sides[side](dest)
                    runs[side].append(time.perf_counter() - started)
                    shutil.rmtree(dest)
                    print(f"{side}: {total / 1e6 / runs[side][-1]:.0f} MB/s", flush=True)
        finally:
            stores.stop()
    best = {side: min(times) for side, times in runs.items()}
    ratios = {}
    for scheme in ("gs", "s3"):
        ours_best = min(best[f"{scheme}/accelbench_{t}_threads"] for t in thread_counts)
        ratios[scheme] = {
            "best_accelbench_over_sdk_single_stream": best[f"{scheme}/sdk_single_stream"] / ours_best,
            "default_8_threads_over_sdk_single_stream": (
                best[f"{scheme}/sdk_single_stream"] / best[f"{scheme}/accelbench_8_threads"]
                if 8 in thread_counts
                else None
            ),
        }
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "servers": (
            "hack/objectstores.py: fake-gcs-server (filesystem backend) and versitygw (posix), "
            "http on loopback, sharing the machine's cores with the client"
        ),
        "bytes": total,
        "seconds": runs,
        "mb_per_second_best": {side: total / 1e6 / s for side, s in best.items()},
        "mb_per_second_median": {side: total / 1e6 / statistics.median(t) for side, t in runs.items()},
        "ratios": ratios,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["mb_per_second_best"], indent=1), json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()

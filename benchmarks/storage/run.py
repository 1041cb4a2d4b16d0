"""Download throughput of a multi-shard model from a GCS server on loopback: accelbench's copy
(workers/storage.fetch: objects in parallel, resumable parts, checksum verified) against the
official SDK's single-stream copy of the same objects (google-cloud-storage, one object after the
other, `download_to_filename`), in the same run, on the same server and disk.

    .venv/bin/python benchmarks/storage/run.py [--shards 4 --shard-mb 512 --repeats 2]

The server is fake-gcs-server (hack/build-servers.sh) with its memory backend; the shards are random
bytes named like a sharded safetensors checkpoint. Each copy goes to a fresh directory; the page
cache is shared, so the order alternates and each side runs `--repeats` times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / ".servers" / "fake-gcs-server"
BUCKET = "bench"


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = f"127.0.0.1:{port}"
    args = ["-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory"]
    proc = subprocess.Popen([str(SERVER), *args, "-public-host", host, "-log-level", "error"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://{host}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fake-gcs-server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = parser.parse_args()
    proc, endpoint = start_server()
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    from google.cloud import storage as gcs

    from accelbench.workers import storage

    try:
        client = gcs.Client()
        bucket = client.create_bucket(BUCKET)
        total = 0
        with tempfile.TemporaryDirectory(prefix="storage-bench-") as tmp:
            shard = Path(tmp) / "shard"
            for i in range(args.shards):
                shard.write_bytes(os.urandom(args.shard_mb << 20))
                name = f"model/model-{i + 1:05d}-of-{args.shards:05d}.safetensors"
                bucket.blob(name).upload_from_filename(str(shard))
                total += shard.stat().st_size
            shard.unlink()
            bucket.blob("model/config.json").upload_from_string(b'{"model_type": "llama"}')
            runs: dict[str, list[float]] = {"accelbench": [], "sdk_single_stream": []}
            for repeat in range(args.repeats):
                order = ["accelbench", "sdk_single_stream"]
                for side in order if repeat % 2 == 0 else reversed(order):
                    dest = Path(tmp) / f"{side}-{repeat}"
                    started = time.perf_counter()
                    if side == "accelbench":
                        storage.fetch(f"gs://{BUCKET}/model", dest, log=lambda _: None, client=client)
                    else:
                        for blob in client.list_blobs(BUCKET, prefix="model/"):
                            target = dest / blob.name
                            target.parent.mkdir(parents=True, exist_ok=True)
                            blob.download_to_filename(str(target))
                    runs[side].append(time.perf_counter() - started)
                    subprocess.run(["rm", "-rf", str(dest)], check=True)
        best = {side: min(times) for side, times in runs.items()}
        result = {
            "command": "python " + " ".join(sys.argv),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "server": "fake-gcs-server v1.56.1, memory backend, http on loopback",
            "bytes": total,
            "seconds": runs,
            "mb_per_second_best": {side: total / 1e6 / s for side, s in best.items()},
            "mb_per_second_median": {side: total / 1e6 / statistics.median(t) for side, t in runs.items()},
            "ratio_accelbench_over_sdk_best": best["sdk_single_stream"] / best["accelbench"],
        }
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()

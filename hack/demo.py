"""`make demo`: the whole flow on this machine, from an empty one to throughput and cost in status.

1. the local control plane (hack/localcluster.py; reused when it already runs),
2. a tiny random-weight model and chat dataset under .demo/ in the real formats,
3. the CRDs, the local executor (hack/localexec.py) and the operator (python -m accelbench.controller),
4. the quickstart FinetuneJob and InferenceBench, and the six-cell CPU BenchCampaign, re-run from
   scratch each time,
5. a live table until all three finish, then the resources as `kubectl get` shows them.

`make demo-down` (python hack/demo.py down) stops everything and keeps .demo/ for a look.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "hack"))

import localcluster  # noqa: E402

DEMO = ROOT / ".demo"
CLUSTER_DIR = DEMO / "cluster"
PIDS = DEMO / "pids.json"
MODEL = DEMO / "models" / "tiny-llama"
DATASET = DEMO / "data" / "chat.jsonl"
MANIFESTS = [
    ROOT / "examples/quickstart/finetune-tiny-cpu.yaml",
    ROOT / "examples/quickstart/inference-tiny-cpu.yaml",
    ROOT / "examples/campaigns/cpu-demo.yaml",
]
RESOURCES = [
    ("finetunejobs", "quickstart-finetune"),
    ("inferencebenches", "quickstart-bench"),
    ("benchcampaigns", "cpu-demo"),
]
DONE = ("Succeeded", "Failed", "Finished", "Stalled")  # a run's end, a campaign's end
TIMEOUT_S = 900


def kubectl(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(localcluster.bin_dir() / "kubectl"), f"--kubeconfig={CLUSTER_DIR / 'kubeconfig'}", *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, input=stdin, timeout=120)


def cluster_running() -> bool:
    if not (CLUSTER_DIR / "kubeconfig").exists():
        return False
    with contextlib.suppress(Exception):
        components = localcluster.cluster_status(CLUSTER_DIR).get("components", {})
        return bool(components) and all(state == "running" for state in components.values())
    return False


def ensure_cluster() -> None:
    if cluster_running() and kubectl("get", "nodes", check=False).returncode == 0:
        print("• local control plane: already running")
        return
    print("• local control plane: starting (kube-apiserver, etcd, controller-manager, scheduler, kwok)")
    localcluster.stop_from_pid_file(CLUSTER_DIR)
    cluster = localcluster.start_cluster(CLUSTER_DIR, detach=True)
    api = cluster.api_client()
    nodes = localcluster.create_node_pools(api)
    localcluster.wait_nodes_ready(api, nodes)
    pools = "TPU v5p/v6e, H100, H200, A100, V100, Gaudi 2/3 and CPU pools"
    print(f"  {len(nodes)} nodes: {pools} (kwok) + local-exec-0")


def ensure_model() -> None:
    if (MODEL / "model.safetensors").exists() and DATASET.exists():
        print(f"• tiny model and dataset: reusing {MODEL.relative_to(ROOT)}")
        return
    print("• tiny model and dataset: creating (config.json, safetensors, tokenizer, JSONL)")
    from accelbench.workers.testing import make_chat_dataset, make_tiny_model

    make_tiny_model(MODEL, family="llama")
    make_chat_dataset(DATASET, n=64)


def spawn(name: str, argv: list[str]) -> int:
    log = (DEMO / "logs" / f"{name}.log").open("ab")
    env = {**os.environ, "KUBECONFIG": str(CLUSTER_DIR / "kubeconfig"), "POD_NAMESPACE": "default"}
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    return process.pid


def stop_helpers() -> None:
    if not PIDS.exists():
        return
    for name, pid in json.loads(PIDS.read_text()).items():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            print(f"  stopped {name} (pid {pid})")
    PIDS.unlink()


def start_helpers() -> None:
    stop_helpers()
    (DEMO / "logs").mkdir(parents=True, exist_ok=True)
    kubeconfig = str(CLUSTER_DIR / "kubeconfig")
    pids = {
        "localexec": spawn(
            "localexec",
            [
                sys.executable,
                str(ROOT / "hack/localexec.py"),
                f"--kubeconfig={kubeconfig}",
                f"--workdir={DEMO / 'pods'}",
            ],
        ),
        "operator": spawn(
            "operator", [sys.executable, "-m", "accelbench.controller", "--metrics-port", "8080"]
        ),
    }
    PIDS.write_text(json.dumps(pids))
    print("• operator and local executor: running (logs in .demo/logs/, metrics on :8080/metrics)")


def apply_quickstart() -> None:
    kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    for plural, name in RESOURCES:  # a demo run starts from scratch, so running it twice works
        kubectl("delete", plural, name, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
    for manifest in MANIFESTS:
        kubectl("apply", "-f", str(manifest))
        print(f"• applied {manifest.relative_to(ROOT)}")


def status_of(plural: str, name: str) -> dict[str, Any]:
    done = kubectl("get", plural, name, "-o", "json", check=False)
    return json.loads(done.stdout).get("status", {}) if done.returncode == 0 else {}


def wait_and_show() -> bool:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    console = Console()
    deadline = time.monotonic() + TIMEOUT_S
    statuses: dict[str, dict[str, Any]] = {}

    def table() -> Table:
        t = Table(title="quickstart (live)")
        for col in ("resource", "phase", "reason / message"):
            t.add_column(col)
        for plural, name in RESOURCES:
            st = statuses.get(name, {})
            t.add_row(f"{plural}/{name}", st.get("phase") or "…", (st.get("message") or "")[:90])
        return t

    with Live(table(), console=console, refresh_per_second=2) as live:
        while time.monotonic() < deadline:
            statuses = {name: status_of(plural, name) for plural, name in RESOURCES}
            live.update(table())
            if all(s.get("phase") in DONE for s in statuses.values()):
                break
            time.sleep(2)
    ok = all(s.get("phase") in ("Succeeded", "Finished") for s in statuses.values())
    print()
    print(kubectl("get", "finetunejobs,inferencebenches,benchcampaigns", "-o", "wide", check=False).stdout)
    ft = statuses.get("quickstart-finetune", {})
    if ft.get("results"):
        r = ft["results"]
        print(
            f"FinetuneJob: {r['tokensPerSecond']:.0f} trained tokens/s on {r.get('device') or 'cpu'}, "
            f"loss {r.get('firstLoss')} -> {r.get('finalLoss')}, {r['steps']} steps; "
            f"cost ${ft.get('cost', {}).get('dollars', 0)} (CPU is priced at $0)"
        )
    ib = statuses.get("quickstart-bench", {})
    if ib.get("results"):
        r = ib["results"]
        print(
            f"InferenceBench: peak {r.get('peakOutputTokensPerSecond')} output tokens/s, "
            f"SLO capacity {r.get('capacityConcurrency')} concurrent requests"
        )
    campaign = statuses.get("cpu-demo", {})
    if campaign.get("cells"):
        t = Table(title=f"BenchCampaign cpu-demo: {campaign.get('message', '')}")
        for col in ("run", "values", "phase", "tokens/s", "peak out tok/s", "cost $"):
            t.add_column(col)
        for row in campaign["cells"]:
            t.add_row(
                row["name"],
                row.get("values", ""),
                row.get("phase") or "",
                f"{row['tokensPerSecond']:.0f}" if row.get("tokensPerSecond") else "",
                f"{row['peakOutputTokensPerSecond']:.0f}" if row.get("peakOutputTokensPerSecond") else "",
                f"{row.get('costDollars', 0):.4f}",
            )
        console.print(t)
        print(f"winners: {campaign.get('winners')}")
    return ok


def up() -> int:
    DEMO.mkdir(exist_ok=True)
    ensure_cluster()
    ensure_model()
    start_helpers()
    apply_quickstart()
    ok = wait_and_show()
    kc = CLUSTER_DIR / "kubeconfig"
    print(
        "\nWhere to look next:\n"
        f"  export KUBECONFIG={kc}\n"
        "  .bin/kubectl get finetunejobs -o yaml          # status: plan, conditions, results, cost\n"
        "  .bin/kubectl get configmap quickstart-bench-results -o jsonpath='{.data.results\\.json}'\n"
        "  .bin/kubectl get events --sort-by=.lastTimestamp\n"
        "  .venv/bin/accelbench plan -f examples/finetune/gemma4-31b-lora-h100x2.yaml\n"
        "  .bin/kubectl get benchcampaign cpu-demo -o yaml  # the campaign's table and conditions\n"
        "  tail -f .demo/logs/operator.log\n"
        "  make demo-down                                  # stop it all"
    )
    return 0 if ok else 1


def down() -> int:
    stop_helpers()
    stopped = localcluster.stop_from_pid_file(CLUSTER_DIR)
    print(f"stopped the control plane ({', '.join(stopped) or 'nothing running'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["up", "down"], default="up")
    args = parser.parse_args(argv)
    return up() if args.action == "up" else down()


if __name__ == "__main__":
    sys.exit(main())

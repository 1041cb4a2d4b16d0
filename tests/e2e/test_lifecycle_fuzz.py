"""The cheap part of benchmarks/faults/lifecycle.py in `make test` (issue 14): a minute of random
creates, deletes, same-name re-creates, suspends, locked-field edits, deadline ends, Job deletions,
operator SIGKILLs, a `helm uninstall`/reinstall and a namespace deleted under each operator scope,
on a control plane of its own. Nothing orphaned, nothing waits over 2 minutes to go, cost never
decreases, one Job per run, no phase moves back, every live run caught up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_minute_of_random_lifecycle_operations_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "lifecycle.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/faults/lifecycle.py"),
            "--duration=70",
            "--helm-cycles=1",
            "--settle=90",
            "--seed=3",
            f"--out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"], json.dumps(result["checks"], indent=2)
    assert done.returncode == 0
    ops = result["operations"]
    # The fuzz did what it says (a seed that skipped the faults would prove nothing).
    assert ops.get("helm uninstall") == 1 and ops.get("operator SIGKILLed and restarted", 0) >= 2
    assert sum(v for k, v in ops.items() if k.startswith("delete namespace")) == 2
    assert ops.get("create", 0) >= 10 and result["runs_seen"] >= 10

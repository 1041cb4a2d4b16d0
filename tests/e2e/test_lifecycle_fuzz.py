"""The cheap part of benchmarks/faults/lifecycle.py in `make test` (issue 14): a minute of random
creates, deletes, same-name re-creates, suspends, locked-field edits, deadline ends, Job deletions,
operator SIGKILLs, a `helm uninstall`/reinstall and a namespace deleted under each operator scope,
on a control plane of its own. Nothing orphaned, nothing waits over 2 minutes to go, cost never
decreases, one Job per run, no phase moves back, every live run caught up."""

from __future__ import annotations

import json
from pathlib import Path

from e2e_env import run_benchmark


def test_a_minute_of_random_lifecycle_operations_leaves_nothing_behind(tmp_path: Path) -> None:
    result, returncode = run_benchmark(
        "benchmarks/faults/lifecycle.py",
        ["--duration=70", "--helm-cycles=1", "--settle=90", "--seed=3"],
        tmp_path / "lifecycle.json",
    )
    assert result["ok"], json.dumps(result["checks"], indent=2)
    assert returncode == 0
    ops = result["operations"]
    # The fuzz did what it says (a seed that skipped the faults would prove nothing).
    assert ops.get("helm uninstall") == 1 and ops.get("operator SIGKILLed and restarted", 0) >= 2
    assert sum(v for k, v in ops.items() if k.startswith("delete namespace")) == 2
    assert ops.get("create", 0) >= 10 and result["runs_seen"] >= 10

"""The cheap part of benchmarks/ingest_fuzz/run.py in `make test` (issue 15): generated reports and
metrics pages through ingestion, each outcome written as a dry-run status on a real apiserver of its
own. No exception, no write refused (a refused write is a status that freezes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_reports_and_pages_never_make_a_status_the_apiserver_refuses(tmp_path: Path) -> None:
    out = tmp_path / "ingest-fuzz.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/ingest_fuzz/run.py"),
            "--reports=4000",
            "--pages=1000",
            "--seed=7",
            f"--out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["exceptions"] == 0 and result["rejected_status_writes"] == 0, result["rejected_examples"]
    assert result["accepted"] > 200 and result["pages_accepted"] > 20  # acceptance was exercised too
    assert result["status_writes"] >= 4000 and done.returncode == 0

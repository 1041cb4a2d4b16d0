"""The cheap part of benchmarks/ingest_fuzz/run.py in `make test` (issue 15): generated reports and
metrics pages through ingestion, each outcome written as a dry-run status on a real apiserver of its
own. No exception, no write refused (a refused write is a status that freezes)."""

from __future__ import annotations

from pathlib import Path

from e2e_env import run_benchmark


def test_generated_reports_and_pages_never_make_a_status_the_apiserver_refuses(tmp_path: Path) -> None:
    result, returncode = run_benchmark(
        "benchmarks/ingest_fuzz/run.py",
        ["--reports=4000", "--pages=1000", "--seed=7"],
        tmp_path / "fuzz.json",
    )
    assert result["exceptions"] == 0 and result["rejected_status_writes"] == 0, result["rejected_examples"]
    assert result["accepted"] > 200 and result["pages_accepted"] > 20  # acceptance was exercised too
    assert result["status_writes"] >= 4000 and returncode == 0

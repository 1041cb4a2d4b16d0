"""VerilogEval problems -> the pass@k problem rows the workers read (one JSONL row per problem).

VerilogEval v2 (github.com/NVlabs/verilog-eval, the public study's pass@1 benchmark) keeps each
problem as plain files in a dataset folder (`dataset_spec-to-rtl/`, `dataset_code-complete-iccad2023/`):

    <name>_prompt.txt   the task given to the model (answer: a module named TopModule)
    <name>_ref.sv       the reference solution, module RefModule
    <name>_test.sv      the testbench, module tb: drives RefModule and TopModule with the same
                        stimulus and prints "Mismatches: N in M samples"

A row holds `id`, `prompt`, `reference` and `test` (the testbench followed by the reference, so one
file compiles beside the sample), plus `difficulty` when a grouping is given; the example checker
(examples/finetune/gemma4-31b-lora-verilog-passk-h100x2.yaml) compiles `test` with the sample under
Icarus Verilog and passes on "Mismatches: 0 in", as the benchmark's own harness scores it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data import DataError

PROMPT_SUFFIX = "_prompt.txt"
REFERENCE_SUFFIX = "_ref.sv"
TESTBENCH_SUFFIX = "_test.sv"


def verilogeval_rows(folder: str | Path, difficulty: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every problem of a VerilogEval v2 dataset folder, in name order. A problem missing its
    reference or testbench is an error naming it (a partial copy would score on fewer problems)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a VerilogEval dataset folder")
    prompts = sorted(folder.glob(f"*{PROMPT_SUFFIX}"))
    if not prompts:
        raise DataError(f"{folder}: no *{PROMPT_SUFFIX} files (a VerilogEval v2 dataset folder holds them)")
    rows = []
    for prompt in prompts:
        name = prompt.name.removesuffix(PROMPT_SUFFIX)
        reference, testbench = folder / f"{name}{REFERENCE_SUFFIX}", folder / f"{name}{TESTBENCH_SUFFIX}"
        missing = [p.name for p in (reference, testbench) if not p.is_file()]
        if missing:
            raise DataError(f"{folder}: problem {name} has no {' or '.join(missing)}")
        ref_text, test_text = reference.read_text(), testbench.read_text()
        row: dict[str, Any] = {
            "id": name,
            "prompt": prompt.read_text(),
            "reference": ref_text,
            "test": test_text.rstrip("\n") + "\n\n" + ref_text,
        }
        if difficulty and name in difficulty:
            row["difficulty"] = str(difficulty[name])
        rows.append(row)
    unknown = sorted(set(difficulty or {}) - {row["id"] for row in rows})
    if unknown:
        raise DataError(f"difficulty names problems the folder does not have: {', '.join(unknown[:5])}")
    return rows


def write_problems(rows: list[dict[str, Any]], out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    return out

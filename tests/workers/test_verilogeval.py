"""VerilogEval as the public study scored it: problems in the benchmark's own v2 folder layout (made
here, tiny), read into pass@k rows, checked by the example's Icarus Verilog checker; pass@1 with a
bootstrap interval over problems, and scores per difficulty when the problems carry one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from accelbench.api.finetune import PassAtK
from accelbench.cli import main
from accelbench.workers.data import DataError
from accelbench.workers.finetune.passk import (
    FAIL,
    PASS,
    PassAtKTask,
    Problem,
    bootstrap_interval,
    extract,
    pass_at_k,
    run_checker,
    summarize,
)
from accelbench.workers.finetune.verilogeval import verilogeval_rows

ROOT = Path(__file__).resolve().parents[2]

# Three problems as VerilogEval v2 writes them: the answer is TopModule, the reference RefModule,
# and the testbench tb compares the two and prints the benchmark's "Mismatches:" line.
GATES = {"Prob001_and2": "a & b", "Prob002_or2": "a | b", "Prob003_xor2": "a ^ b"}
TESTBENCH = """module tb;
  reg a, b; wire want, got; integer i, mismatches;
  RefModule ref_(.a(a), .b(b), .y(want));
  TopModule top(.a(a), .b(b), .y(got));
  initial begin
    mismatches = 0;
    for (i = 0; i < 4; i = i + 1) begin
      {a, b} = i; #1;
      if (got !== want) mismatches = mismatches + 1;
    end
    $display("Mismatches: %0d in %0d samples", mismatches, 4);
    $finish;
  end
endmodule
"""


def module(name: str, expression: str) -> str:
    return f"module {name}(input a, input b, output y);\n  assign y = {expression};\nendmodule\n"


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    folder = tmp_path / "dataset_spec-to-rtl"
    folder.mkdir()
    for name, expression in GATES.items():
        (folder / f"{name}_prompt.txt").write_text(f"Implement TopModule: y = {expression}.\n")
        (folder / f"{name}_ref.sv").write_text(module("RefModule", expression))
        (folder / f"{name}_test.sv").write_text(TESTBENCH)
    return folder


def example_checker() -> PassAtK:
    body = yaml.safe_load((ROOT / "examples/finetune/gemma4-31b-lora-verilog-passk-h100x2.yaml").read_text())
    return PassAtK.model_validate(body["spec"]["passAtK"])


def test_a_verilogeval_folder_becomes_rows_the_example_checker_scores(dataset: Path) -> None:
    """Needs Icarus Verilog (`make test` installs it, as the worker images do)."""
    rows = verilogeval_rows(dataset, {"Prob003_xor2": "hard"})
    assert [r["id"] for r in rows] == list(GATES)
    assert rows[0]["prompt"].startswith("Implement TopModule") and "module RefModule" in rows[0]["test"]
    assert rows[2]["difficulty"] == "hard" and "difficulty" not in rows[0]
    checker = example_checker().checker
    for row, expression in zip(rows, GATES.values(), strict=True):
        right = f"Here:\n```verilog\n{module('TopModule', expression)}```\n"
        wrong = f"```verilog\n{module('TopModule', '~(' + expression + ')')}```"
        assert run_checker(checker, extract(right, checker.extract), row).status == PASS, row["id"]
        assert run_checker(checker, extract(wrong, checker.extract), row).status == FAIL, row["id"]


def test_the_cli_writes_the_problems_jsonl_and_names_what_is_missing(dataset: Path, tmp_path: Path) -> None:
    difficulty = tmp_path / "difficulty.json"
    difficulty.write_text(json.dumps({"Prob001_and2": "easy"}))
    out = tmp_path / "problems.jsonl"
    assert main(["verilogeval", str(dataset), "--out", str(out), "--difficulty", str(difficulty)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and rows[0]["difficulty"] == "easy"
    (dataset / "Prob002_or2_ref.sv").unlink()
    with pytest.raises(DataError, match=r"Prob002_or2 has no Prob002_or2_ref\.sv"):
        verilogeval_rows(dataset)
    assert main(["verilogeval", str(dataset), "--out", str(out)]) == 2
    (dataset / "Prob002_or2_ref.sv").write_text(module("RefModule", "a | b"))
    with pytest.raises(DataError, match=r"difficulty names problems the folder does not have: Prob009_nope"):
        verilogeval_rows(dataset, {"Prob009_nope": "hard"})


def test_pass_at_1_has_a_bootstrap_interval_over_problems_and_scores_per_difficulty() -> None:
    # 20 problems, 4 samples each: problem p passes min(p % 5, 4) of 4 (0, 1, 2, 3, 4, 0, ...).
    passed = [min(p % 5, 4) for p in range(20)]
    rows = [{"id": f"p{p}", "prompt": "x", "difficulty": "easy" if p < 10 else "hard"} for p in range(20)]
    spec = PassAtK(
        dataset="p.jsonl", k=[1, 2], samplesPerProblem=4, temperature=0.8, checker={"command": ["true"]}
    )
    task = PassAtKTask(spec, [Problem(i, row, [1]) for i, row in enumerate(rows)], None, ())  # type: ignore[arg-type]
    outcomes = [(p, PASS if s < passed[p] else FAIL, "") for p in range(20) for s in range(4)]
    result = summarize(task, outcomes)
    mean = sum(c / 4 for c in passed) / 20
    assert result.scores["pass@1"] == pytest.approx(mean, abs=1e-6)
    low, high = result.intervals["pass@1"]
    assert low < result.scores["pass@1"] < high and high - low < 0.5
    assert result.intervals == summarize(task, outcomes).intervals  # seeded: the same every run
    easy = sum(pass_at_k(4, passed[p], 1) for p in range(10)) / 10
    assert result.by_difficulty["easy"]["pass@1"] == pytest.approx(easy, abs=1e-6)
    assert set(result.by_difficulty) == {"easy", "hard"} and set(result.by_difficulty["hard"]) == {
        "pass@1",
        "pass@2",
    }


def test_the_interval_of_all_or_nothing_is_a_point() -> None:
    assert bootstrap_interval(4, [4, 4, 4], 1) == (1.0, 1.0)
    assert bootstrap_interval(4, [0, 0], 1) == (0.0, 0.0)
    with pytest.raises(ValueError):
        bootstrap_interval(4, [], 1)

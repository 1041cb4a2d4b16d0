"""pass@k: the estimator, the checker contract, problems, the driver, and a PyTorch worker run."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelbench.api.finetune import Checker, PassAtK
from accelbench.workers.data import ChatTokenizer, DataError
from accelbench.workers.finetune.__main__ import RunOptions, run_job
from accelbench.workers.finetune.passk import (
    ERROR,
    FAIL,
    PASS,
    TIMEOUT,
    PassAtKTask,
    evaluate,
    extract,
    load_problems,
    mean_pass_at_k,
    pass_at_k,
    plan_batches,
    run_checker,
    run_checkers,
    stop_token_ids,
)
from accelbench.workers.jobenv import parse_job_payload

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------------------
# The estimator


def _exact(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 3, 1, 0.3),  # pass@1 is the pass rate
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),  # c = 0: never
        (5, 5, 1, 1.0),  # c = n: always
        (5, 5, 5, 1.0),
        (5, 1, 5, 1.0),  # n = k: any passing sample is drawn
        (5, 2, 4, 1.0),  # n - c < k: every draw holds a pass
        (1, 1, 1, 1.0),
    ],
)
def test_known_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_product_form_equals_the_binomial_form_and_is_stable() -> None:
    for n in range(1, 30):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_exact(n, c, k), abs=1e-12)
    value = pass_at_k(1000, 3, 100)  # C(1000, 100) is ~1e139: no overflow, no nan
    assert value == pytest.approx(_exact(1000, 3, 100), rel=1e-9) and 0 < value < 1


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_out_of_range_arguments_raise(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_over_problems() -> None:
    means = mean_pass_at_k(4, [0, 4, 2], [1, 2])
    assert means[1] == pytest.approx((0 + 1 + 0.5) / 3)
    assert means[2] == pytest.approx((0 + 1 + (1 - 1 / 6)) / 3)
    assert mean_pass_at_k(4, [], [1]) == {}


# --------------------------------------------------------------------------------------------------
# Extraction


def test_extract_raw_and_fenced() -> None:
    text = "Here:\n```verilog\nmodule m; endmodule\n```\nand ```py\nnot this\n```"
    assert extract(text, "raw") == text
    assert extract(text, "fenced") == "module m; endmodule\n"
    assert extract("```\nunclosed\nblock", "fenced") == "unclosed\nblock"
    assert extract("no fence at all", "fenced") == "no fence at all"


# --------------------------------------------------------------------------------------------------
# The checker

ROW = {"id": "p1", "answer": "42", "test": "assert f() == 42"}


def _checker(code: str, **kwargs: Any) -> Checker:
    return Checker(command=[PY, "-c", code, *kwargs.pop("args", [])], **kwargs)


def test_exit_zero_passes_and_the_env_points_at_the_files(tmp_path: Path) -> None:
    code = (
        "import json, os, sys\n"
        "s = open(os.environ['ACCELBENCH_SAMPLE']).read()\n"
        "p = json.load(open(os.environ['ACCELBENCH_PROBLEM']))\n"
        "assert os.getcwd() == os.environ['ACCELBENCH_WORKDIR']\n"
        "assert os.path.basename(os.environ['ACCELBENCH_SAMPLE']) == 'design.v'\n"
        "sys.exit(0 if s.strip() == p['answer'] else 1)\n"
    )
    checker = _checker(code, sample_file="design.v")
    assert run_checker(checker, " 42\n", ROW, scratch=tmp_path).status == PASS
    failed = run_checker(checker, "41", ROW, scratch=tmp_path)
    assert failed.status == FAIL and failed.returncode == 1 and "exit 1" in failed.detail
    assert list(tmp_path.iterdir()) == []  # every sample's directory is cleaned up


def test_placeholders_are_replaced_in_arguments(tmp_path: Path) -> None:
    code = (
        "import json, os, sys\n"
        "sample, problem, workdir = sys.argv[1:4]\n"
        "assert sample == os.environ['ACCELBENCH_SAMPLE'] and problem == os.environ['ACCELBENCH_PROBLEM']\n"
        "assert workdir == os.environ['ACCELBENCH_WORKDIR'] and sample.startswith(workdir)\n"
        "assert sys.argv[4] == 'x{literal}y'\n"  # other braces are left alone
        "sys.exit(0 if json.load(open(problem))['id'] == 'p1' and open(sample).read() == 'body' else 3)\n"
    )
    checker = _checker(code, args=["{sample}", "{problem}", "{workdir}", "x{literal}y"])
    result = run_checker(checker, "body", ROW, scratch=tmp_path)
    assert result.status == PASS, result.detail


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    checker = Checker(command=["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], timeout_seconds=0.5)
    started = time.perf_counter()
    result = run_checker(checker, "x", ROW)
    assert result.status == TIMEOUT and "timed out after 0.5 s" in result.detail
    assert time.perf_counter() - started < 5
    child = int(pid_file.read_text())
    deadline = time.time() + 5
    while time.time() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the checker's background child outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_missing_binary_is_an_error_result_not_an_exception() -> None:
    result = run_checker(Checker(command=["accelbench-no-such-checker", "{sample}"]), "x", ROW)
    assert (
        result.status == ERROR
        and "accelbench-no-such-checker" in result.detail
        and "not found" in result.detail
    )


def test_checkers_run_in_parallel_and_keep_order(tmp_path: Path) -> None:
    """Each checker stamps when it ran; parallel means their runs overlap (no wall-clock bound, so
    a slow interpreter start on a loaded machine cannot fail it, and serial runs always would)."""
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    code = (
        "import os, sys, time, uuid\n"
        "start = time.time(); time.sleep(1.0)\n"
        f"open(os.path.join({str(stamps)!r}, uuid.uuid4().hex), 'w').write(f'{{start}} {{time.time()}}')\n"
        "sys.exit(int(open(os.environ['ACCELBENCH_SAMPLE']).read()))"
    )
    items = [(str(i % 2), ROW) for i in range(8)]
    results = run_checkers(_checker(code), items, workers=8)
    assert [r.status for r in results] == [PASS, FAIL] * 4
    runs = [tuple(map(float, f.read_text().split())) for f in stamps.iterdir()]
    assert len(runs) == 8
    most_at_once = max(sum(start <= t < end for start, end in runs) for t, _ in runs)
    assert most_at_once >= 2, runs  # serial runs never overlap


# --------------------------------------------------------------------------------------------------
# Problems and the driver


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_problems_drop_the_reference_answer(tiny_llama: Path, tmp_path: Path) -> None:
    tok = ChatTokenizer.from_model_dir(tiny_llama, "llama")
    rows = [
        {
            "messages": [
                {"role": "user", "content": "What is 2 plus 2?"},
                {"role": "assistant", "content": "4"},
            ]
        },
        {"prompt": "What is 2 plus 2?", "test": "t"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    ]
    problems = load_problems(_write_jsonl(tmp_path / "p.jsonl", rows), tok)
    assert problems[0].prompt_ids == problems[1].prompt_ids  # the assistant turn is not in the prompt
    text = tok.tokenizer.decode(problems[0].prompt_ids, skip_special_tokens=False)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")  # the generation prompt
    assert problems[1].row == rows[1] and [p.index for p in problems] == [0, 1, 2]
    assert len(load_problems(tmp_path / "p.jsonl", tok, max_problems=2)) == 2
    assert stop_token_ids(tiny_llama, tok) == (tok.tokenizer.token_to_id("<|eot_id|>"),)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("not json", "not JSON"),
        ('{"completion": "x"}', "needs `messages` or a string `prompt`"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}', "no prompt turns"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "role in"),
    ],
)
def test_bad_problem_rows_name_the_line(tiny_llama: Path, tmp_path: Path, line: str, fragment: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(DataError, match=f"p.jsonl:2.*{fragment}"):
        load_problems(path, ChatTokenizer.from_model_dir(tiny_llama, "llama"))


def _task(tiny_llama: Path, tmp_path: Path, checker: Checker, **spec: Any) -> PassAtKTask:
    tok = ChatTokenizer.from_model_dir(tiny_llama, "llama")
    rows = [{"prompt": f"What is {i} plus 1?", "want": str(i % 2)} for i in range(5)]
    problems = load_problems(_write_jsonl(tmp_path / "p.jsonl", rows), tok)
    config = PassAtK(dataset="p.jsonl", checker=checker, **spec)
    return PassAtKTask(config, problems, tok, (tok.tokenizer.token_to_id("<|eot_id|>"),))


# Passes when the sample's text is the problem's `want` field.
WANT = "import json, os, sys; p = json.load(open(os.environ['ACCELBENCH_PROBLEM'])); " + (
    "sys.exit(0 if open(os.environ['ACCELBENCH_SAMPLE']).read() == p['want'] else 1)"
)


def test_driver_batches_checks_and_scores(tiny_llama: Path, tmp_path: Path) -> None:
    task = _task(
        tiny_llama, tmp_path, _checker(WANT), k=[1, 3], samples_per_problem=4, temperature=1.0, batch_size=3
    )
    tok = task.tokenizer.tokenizer
    eot = task.stop_ids[0]
    calls: list[int] = []

    def fake_generate(prompts: list[list[int]], batch_index: int) -> list[list[int]]:
        calls.append(batch_index)
        # "1" for every prompt, then a stop id and junk that must be cut off
        return [[*tok.encode("1").ids, eot, 7, 7] for _ in prompts]

    result = evaluate(task, fake_generate, log=lambda _: None)
    assert calls == list(range(7))  # 5 problems × 4 samples in batches of 3
    assert (result.problems, result.samples, result.passed, result.failed) == (5, 20, 8, 12)
    # problems 1 and 3 (want "1") pass 4/4, the others 0/4
    assert result.scores == {"pass@1": pytest.approx(0.4), "pass@3": pytest.approx(0.4)}
    assert result.note is None and result.seconds is not None


def test_greedy_checks_one_sample_per_problem_and_counts_it_n_times(tiny_llama: Path, tmp_path: Path) -> None:
    task = _task(tiny_llama, tmp_path, _checker(WANT), k=[1, 5], samples_per_problem=5, batch_size=16)
    tok = task.tokenizer.tokenizer
    result = evaluate(task, lambda prompts, b: [tok.encode("0").ids for _ in prompts], log=lambda _: None)
    assert (result.samples, result.passed, result.samples_per_problem) == (5, 3, 5)
    assert result.scores == {"pass@1": pytest.approx(0.6), "pass@5": pytest.approx(0.6)}
    assert "greedy" in result.note


def test_sharded_driver_pads_batches_and_gathers(tiny_llama: Path, tmp_path: Path) -> None:
    """Two ranks: each generates its batches (same count on both) and the results are combined."""
    task = _task(
        tiny_llama, tmp_path, _checker(WANT), k=[1], samples_per_problem=2, temperature=1.0, batch_size=3
    )
    assert len(plan_batches(task, 1)) == 4 and len(plan_batches(task, 3)) == 6  # filler batches
    tok = task.tokenizer.tokenizer
    seen: dict[int, list[int]] = {0: [], 1: []}
    outputs: dict[int, Any] = {}

    def run(rank: int, gather: Any) -> Any:
        def generate(prompts: list[list[int]], batch_index: int) -> list[list[int]]:
            seen[rank].append(batch_index)
            return [tok.encode("1").ids for _ in prompts]

        return evaluate(task, generate, rank=rank, world=2, gather=gather, log=lambda _: None)

    def keep(local: list[Any]) -> list[list[Any]]:  # rank 1 runs first and hands its results over
        outputs[1] = local
        return [local]

    run(1, keep)
    result = run(0, lambda local: [local, outputs[1]])
    assert seen == {0: [0, 2], 1: [1, 3]}
    assert (result.samples, result.passed) == (10, 4) and result.scores["pass@1"] == pytest.approx(0.4)


def test_missing_checker_fails_every_sample_with_a_note(tiny_llama: Path, tmp_path: Path) -> None:
    task = _task(tiny_llama, tmp_path, Checker(command=["no-such-iverilog", "{sample}"]), k=[1])
    result = evaluate(task, lambda prompts, b: [[] for _ in prompts], log=lambda _: None)
    assert (result.samples, result.passed, result.failed, result.checker_errors) == (5, 0, 5, 5)
    assert result.scores == {"pass@1": 0.0}
    assert "no-such-iverilog" in result.note and "not found" in result.note


# --------------------------------------------------------------------------------------------------
# The PyTorch worker, end to end

# Problems carry `expect`: pass always passes, fail always fails, coin passes on an even-length sample.
EXPECT = (
    "import json, os, sys; p = json.load(open(os.environ['ACCELBENCH_PROBLEM'])); "
    "s = open(os.environ['ACCELBENCH_SAMPLE']).read(); e = p['expect']; "
    "sys.exit(0 if e == 'pass' or (e == 'coin' and len(s) % 2 == 0) else 1)"
)


@pytest.fixture(scope="module")
def problems_file(chat_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [json.loads(line) for line in chat_dataset.read_text().splitlines()[:4]]
    for row, expect in zip(rows, ["pass", "pass", "fail", "coin"], strict=True):
        row["expect"] = expect
    return _write_jsonl(tmp_path_factory.mktemp("passk") / "problems.jsonl", rows)


def _run(manifest: dict[str, Any]):
    return run_job(parse_job_payload(manifest), RunOptions(serve_metrics=False, log=lambda _: None, env={}))


def test_torch_worker_reports_pass_at_k(manifest_for, problems_file: Path) -> None:
    manifest = manifest_for("llama", training={"maxSteps": 2})
    manifest["spec"]["passAtK"] = {
        "dataset": str(problems_file),
        "k": [1, 2],
        "samplesPerProblem": 3,
        "temperature": 1.0,
        "topP": 0.95,
        "maxNewTokens": 12,
        "batchSize": 8,
        "checker": {"command": [PY, "-c", EXPECT], "timeoutSeconds": 30},
    }
    report, code = _run(manifest)
    assert code == 0, report.error
    section = report.finetune.pass_at_k
    assert section is not None and set(section.scores) == {"pass@1", "pass@2"}
    assert all(0 <= v <= 1 for v in section.scores.values())
    assert (section.problems, section.samples_per_problem, section.samples) == (4, 3, 12)
    assert section.passed + section.failed == section.samples and section.checker_errors == 0
    assert 6 <= section.passed <= 9  # the two `pass` problems always, the `coin` one sometimes
    assert 0.5 <= section.scores["pass@1"] <= section.scores["pass@2"] <= 0.75
    assert len(report.to_termination_message().encode()) <= 4096


def test_torch_worker_survives_a_missing_checker(manifest_for, problems_file: Path) -> None:
    manifest = manifest_for("gemma3", training={"maxSteps": 1})
    manifest["spec"]["passAtK"] = {
        "dataset": str(problems_file),
        "maxNewTokens": 4,
        "checker": {"command": ["accelbench-no-such-checker", "{sample}"]},
    }
    report, code = _run(manifest)
    assert code == 0, report.error
    section = report.finetune.pass_at_k
    assert (section.samples, section.passed, section.checker_errors) == (4, 0, 4)
    assert section.scores == {"pass@1": 0.0} and "not found" in section.note


def test_missing_problems_file_is_invalid_config_before_training(manifest_for, tmp_path: Path) -> None:
    manifest = manifest_for("llama")
    manifest["spec"]["passAtK"] = {"dataset": str(tmp_path / "nope.jsonl"), "checker": {"command": ["true"]}}
    report, code = _run(manifest)
    assert code == 3 and report.error.type == "InvalidConfig" and "nope.jsonl" in report.error.message
    assert report.finetune is None


# --------------------------------------------------------------------------------------------------
# The example's Verilog checker (needs Icarus Verilog, as the worker images have it)

AND_TESTBENCH = """module tb;
  reg a, b; wire y; integer i, mismatches;
  top_module dut(.a(a), .b(b), .y(y));
  initial begin
    mismatches = 0;
    for (i = 0; i < 4; i = i + 1) begin
      {a, b} = i; #1;
      if (y !== (a & b)) mismatches = mismatches + 1;
    end
    $display("Mismatches: %0d in %0d samples", mismatches, 4);
    $finish;
  end
endmodule
"""


def _example_pass_at_k() -> dict:
    example = ROOT / "examples" / "finetune" / "gemma4-31b-lora-verilog-passk-h100x2.yaml"
    return yaml.safe_load(example.read_text())["spec"]["passAtK"]


def _documented_pass_at_k() -> dict:
    """The first YAML block of docs/finetune-eval.md, as a user would copy it."""
    text = (ROOT / "docs" / "finetune-eval.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)["spec"]["passAtK"]


@pytest.mark.parametrize("source", [_example_pass_at_k, _documented_pass_at_k], ids=["example", "docs"])
@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("assign y = a & b;", PASS),
        ("assign y = a | b;", FAIL),  # simulates, but with mismatches
        ("assign y = a &;", FAIL),  # does not compile
    ],
)
def test_the_published_verilog_checkers(source, body: str, status: str) -> None:
    """Needs Icarus Verilog, as the worker images have it (`make test` installs it)."""
    checker = PassAtK.model_validate(source()).checker
    completion = (
        f"Sure:\n```verilog\nmodule top_module(input a, input b, output y);\n  {body}\nendmodule\n```\n"
    )
    row = {"id": "and2", "messages": [{"role": "user", "content": "An AND gate."}], "test": AND_TESTBENCH}
    result = run_checker(checker, extract(completion, checker.extract), row)
    assert result.status == status, result.detail

"""pass@k after training: problems, the estimator, the checker contract, and the driver.

Framework-free (the shared tokenizer of workers.data, subprocess, threads): the PyTorch and JAX
workers only supply a `GenerateFn` that turns prompt token ids into completion token ids, so both
frameworks sample from identically tokenized prompts and are scored by the same code.

Problems: one JSONL row each, chat `messages` or a `prompt` string, plus any other fields (tests,
ids) the checker reads. The prompt is the chat template with the generation prompt: a `prompt` row
is one user turn; a `messages` row whose last turn is the assistant's drops that turn (it is the
reference answer, not part of the prompt).

Estimator (Chen et al. 2021, unbiased): with n samples of which c pass,
    pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k/i)
averaged over problems. The product form never builds large binomials.

Checker contract: for each sample, a fresh directory holding the sample text (`sample_file`) and the
problem row (problem.json); the command runs there with ACCELBENCH_SAMPLE, ACCELBENCH_PROBLEM and
ACCELBENCH_WORKDIR set, and `{sample}`, `{problem}`, `{workdir}` in its arguments replaced by the
same paths. Exit status 0 = pass; anything else, a timeout (the whole process group is killed) or a
command that cannot start = fail, counted separately and never raised.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...api.contract import ENV_CHECKER_PROBLEM, ENV_CHECKER_SAMPLE, ENV_CHECKER_WORKDIR
from ...api.finetune import Checker, ExtractMode, PassAtK
from ...api.status import PassAtKResults
from ..data import ROLES, ChatTokenizer, DataError, jsonl_rows

PROBLEM_FILE = "problem.json"
DIFFICULTY_FIELD = "difficulty"  # a problem row's optional group: scores are also given per value
OUTPUT_FILE = "checker-output.txt"
DETAIL_CHARS = 240  # how much of a checker's output a result keeps (for the report's note)
MAX_CHECKERS = 8  # checker processes at a time, at most


# --------------------------------------------------------------------------------------------------
# The estimator


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` of `n` samples passing."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every draw of k samples contains a passing one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(n: int, passed: Sequence[int], ks: Sequence[int]) -> dict[int, float]:
    """pass@k for each k, averaged over problems (`passed[p]` of `n` samples of problem p passed)."""
    if not passed:
        return {}
    return {k: sum(pass_at_k(n, c, k) for c in passed) / len(passed) for k in ks}


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # fixed: the same samples give the same interval on every run and machine


def bootstrap_interval(
    n: int, passed: Sequence[int], k: int, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """The percentile bootstrap interval of mean pass@k over problems: the problems are what was
    sampled from a larger population of tasks, so they are what is resampled (with replacement)."""
    if not passed:
        raise ValueError("a bootstrap interval needs at least one problem")
    scores = [pass_at_k(n, c, k) for c in passed]
    rng = random.Random(BOOTSTRAP_SEED)
    means = sorted(sum(rng.choices(scores, k=len(scores))) / len(scores) for _ in range(resamples))
    tail = (1.0 - level) / 2
    low = means[math.floor(tail * (resamples - 1))]
    high = means[math.ceil((1.0 - tail) * (resamples - 1))]
    return low, high


# --------------------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True)
class Problem:
    index: int
    row: dict[str, Any]  # the JSONL row as read: the checker gets it as problem.json
    prompt_ids: list[int]  # the rendered chat prompt, generation prompt included


def problem_messages(row: Any, where: str) -> list[dict[str, str]]:
    """The prompt turns of a problem row (a trailing assistant turn, the reference, is dropped)."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a problem must be a JSON object, got {type(row).__name__}")
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: `messages` must be a non-empty list")
        out = []
        for k, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise DataError(f"{where}: message {k} needs role in {'/'.join(ROLES)} and string content")
            out.append({"role": m["role"], "content": m["content"]})
        if out[-1]["role"] == "assistant":
            out.pop()
        if not out:
            raise DataError(f"{where}: no prompt turns left once the reference answer is dropped")
        return out
    if isinstance(row.get("prompt"), str):
        return [{"role": "user", "content": row["prompt"]}]
    raise DataError(f"{where}: a problem needs `messages` or a string `prompt`")


def load_problems(
    path: str | Path, tokenizer: ChatTokenizer, max_problems: int | None = None
) -> list[Problem]:
    path = Path(path)
    problems: list[Problem] = []
    for where, row in jsonl_rows(path, "pass@k problems"):
        text = tokenizer.render(problem_messages(row, where), add_generation_prompt=True)
        ids = tokenizer.encode_text(text)
        if not ids:
            raise DataError(f"{where}: the prompt renders to no tokens")
        problems.append(Problem(len(problems), row, ids))
        if max_problems is not None and len(problems) >= max_problems:
            break
    if not problems:
        raise DataError(f"pass@k problems {path} has no rows")
    return problems


def stop_token_ids(model_dir: str | Path, tokenizer: ChatTokenizer) -> tuple[int, ...]:
    """Ids that end a completion: the tokenizer's EOS plus the model's eos_token_id(s) from
    generation_config.json and config.json (Gemma ends a turn with <end_of_turn>, not <eos>)."""
    ids: set[int] = set()
    eos = tokenizer.tokenizer.token_to_id(tokenizer.eos_token) if tokenizer.eos_token else None
    if eos is not None:
        ids.add(int(eos))
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((Path(model_dir) / name).read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and not isinstance(item, bool):
                ids.add(item)
    return tuple(sorted(ids))


@dataclass(frozen=True)
class PassAtKTask:
    """What a framework needs to run pass@k: the spec, tokenized problems, the stop ids."""

    spec: PassAtK
    problems: list[Problem]
    tokenizer: ChatTokenizer
    stop_ids: tuple[int, ...]

    @property
    def greedy(self) -> bool:
        return self.spec.temperature == 0

    @property
    def n(self) -> int:
        return self.spec.n

    @property
    def generations_per_problem(self) -> int:
        # Greedy decoding gives n identical samples: generate and check one, count it n times.
        return 1 if self.greedy else self.n

    @property
    def max_prompt_tokens(self) -> int:
        return max(len(p.prompt_ids) for p in self.problems)


def load_task(spec: PassAtK, dataset: str | Path, model_dir: str | Path, family: str) -> PassAtKTask:
    tokenizer = ChatTokenizer.from_model_dir(model_dir, family)
    problems = load_problems(dataset, tokenizer, spec.max_problems)
    return PassAtKTask(spec, problems, tokenizer, stop_token_ids(model_dir, tokenizer))


def trim_at_stop(ids: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """The completion up to (not including) its first stop token."""
    stops = set(stop_ids)
    out: list[int] = []
    for token in ids:
        if token in stops:
            break
        out.append(int(token))
    return out


# --------------------------------------------------------------------------------------------------
# The checker

PASS, FAIL, TIMEOUT, ERROR = "pass", "fail", "timeout", "error"

_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract(text: str, mode: ExtractMode | str) -> str:
    """raw: the text; fenced: the body of its first ``` block (to its end if never closed), or the
    whole text when it has none."""
    if ExtractMode(mode) == ExtractMode.RAW:
        return text
    match = _FENCE.search(text)
    return match.group(1) if match else text


@dataclass(frozen=True)
class CheckResult:
    status: str  # pass | fail | timeout | error
    seconds: float
    returncode: int | None = None
    detail: str = ""  # the tail of the checker's output, or why it could not run

    @property
    def passed(self) -> bool:
        return self.status == PASS


def expand(arg: str, paths: dict[str, str]) -> str:
    """`{sample}`, `{problem}`, `{workdir}` -> paths; other braces (Verilog, shell) stay as they are."""
    for name, value in paths.items():
        arg = arg.replace("{" + name + "}", value)
    return arg


def run_checker(
    checker: Checker, sample: str, row: dict[str, Any], *, scratch: str | Path | None = None
) -> CheckResult:
    """Run the checker on one sample; never raises."""
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="passk-", dir=scratch) as tmp:
            workdir = Path(tmp)
            sample_path = workdir / checker.sample_file
            problem_path = workdir / PROBLEM_FILE
            sample_path.write_text(sample, encoding="utf-8")
            problem_path.write_text(json.dumps(row), encoding="utf-8")
            paths = {"sample": str(sample_path), "problem": str(problem_path), "workdir": str(workdir)}
            env = dict(os.environ)
            env.update(
                {
                    ENV_CHECKER_SAMPLE: paths["sample"],
                    ENV_CHECKER_PROBLEM: paths["problem"],
                    ENV_CHECKER_WORKDIR: paths["workdir"],
                }
            )
            argv = [expand(a, paths) for a in checker.command]
            return _run(argv, workdir, env, checker.timeout_seconds, started)
    except Exception as exc:  # a full disk, an unwritable scratch dir: this sample fails, the run goes on
        return CheckResult(ERROR, time.perf_counter() - started, detail=f"{type(exc).__name__}: {exc}")


def _run(argv: list[str], workdir: Path, env: dict[str, str], timeout: float, started: float) -> CheckResult:
    # Output goes to a file, not a pipe: a grandchild left holding a pipe open would block us.
    with open(workdir / OUTPUT_FILE, "w+b") as output:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so a timeout kills its children too
            )
        except OSError as exc:
            what = "not found" if isinstance(exc, FileNotFoundError) else "cannot start"
            return CheckResult(
                ERROR, time.perf_counter() - started, detail=f"checker {argv[0]!r} {what}: {exc}"
            )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            detail = f"timed out after {timeout:g} s; " + _tail(output)
            return CheckResult(TIMEOUT, time.perf_counter() - started, None, detail)
        seconds = time.perf_counter() - started
        if code == 0:
            return CheckResult(PASS, seconds, code)
        return CheckResult(FAIL, seconds, code, f"exit {code}; " + _tail(output))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this Popen created (start_new_session)
    except OSError:
        proc.kill()
    proc.wait()


def _tail(output: Any) -> str:
    output.flush()
    output.seek(0, os.SEEK_END)
    size = output.tell()
    output.seek(max(0, size - DETAIL_CHARS))
    return output.read().decode("utf-8", errors="replace").strip()


def run_checkers(
    checker: Checker,
    items: Sequence[tuple[str, dict[str, Any]]],
    *,
    workers: int | None = None,
    scratch: str | Path | None = None,
) -> list[CheckResult]:
    """(sample, problem row) pairs -> results in the same order, a few checkers at a time."""
    if not items:
        return []
    workers = workers or min(MAX_CHECKERS, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        return list(pool.map(lambda item: run_checker(checker, item[0], item[1], scratch=scratch), items))


# --------------------------------------------------------------------------------------------------
# The driver

# (prompts as token ids, batch index) -> completion token ids per prompt, cut at the first stop id.
# The batch index seeds sampling, so a batch's samples do not depend on which process draws it.
GenerateFn = Callable[[list[list[int]], int], list[list[int]]]
# Every process's list -> all of them, in rank order (torch.distributed.all_gather_object).
GatherFn = Callable[[list[Any]], list[list[Any]]]


@dataclass
class _Tally:
    passed_per_problem: dict[int, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {PASS: 0, FAIL: 0, TIMEOUT: 0, ERROR: 0})
    first_detail: dict[str, str] = field(default_factory=dict)  # status -> first detail seen


def plan_batches(task: PassAtKTask, world: int = 1) -> list[list[tuple[int, int]]]:
    """(problem index, sample index) per sequence, cut into batches of `batch_size`; the number of
    batches is rounded up to a multiple of `world` with empty batches (every process of a sharded
    model must make the same number of generate calls)."""
    sequences = [(p.index, s) for p in task.problems for s in range(task.generations_per_problem)]
    size = task.spec.batch_size
    batches = [sequences[i : i + size] for i in range(0, len(sequences), size)]
    while len(batches) % max(world, 1):
        batches.append([])
    return batches


def evaluate(
    task: PassAtKTask,
    generate: GenerateFn,
    *,
    rank: int = 0,
    world: int = 1,
    gather: GatherFn | None = None,
    check: bool = True,
    log: Callable[[str], None] = print,
    scratch: str | Path | None = None,
) -> PassAtKResults | None:
    """Generate this process's batches (r, r+world, ...), check them and, with `gather`, combine
    every process's results. `check=False` generates only and returns None (JAX processes other
    than 0: they run the same SPMD program, process 0 scores it)."""
    started = time.perf_counter()
    batches = plan_batches(task, world)
    checker = Path(task.spec.checker.command[0]).name
    log(f"pass@k: {len(task.problems)} problems × {task.n} samples, checked by {checker}")
    mine = list(range(rank, len(batches), world))
    by_index = {p.index: p for p in task.problems}
    completions: list[tuple[int, str]] = []  # (problem index, text for the checker)
    for count, b in enumerate(mine, start=1):
        batch = batches[b]
        # An empty (filler) batch still calls generate, on the first problem's prompt, and drops it.
        prompts = [by_index[p].prompt_ids for p, _ in batch] or [task.problems[0].prompt_ids]
        outputs = generate(prompts, b)
        for (p, _), ids in zip(batch, outputs, strict=False):
            text = task.tokenizer.tokenizer.decode(trim_at_stop(ids, task.stop_ids), skip_special_tokens=True)
            completions.append((p, extract(text, task.spec.checker.extract)))
        log(f"pass@k: generated batch {count}/{len(mine)}")
    generated = time.perf_counter()
    if not check:
        return None
    results = run_checkers(
        task.spec.checker, [(text, by_index[p].row) for p, text in completions], scratch=scratch
    )
    local = [(p, r.status, r.detail) for (p, _), r in zip(completions, results, strict=True)]
    everything = [item for part in gather(local) for item in part] if gather is not None else local
    checked = time.perf_counter()
    return summarize(task, everything, generated - started, checked - generated, checked - started)


def summarize(
    task: PassAtKTask,
    outcomes: Sequence[tuple[int, str, str]],
    generate_seconds: float | None = None,
    check_seconds: float | None = None,
    seconds: float | None = None,
) -> PassAtKResults:
    """(problem index, status, detail) of every checked sample -> the report section."""
    tally = _Tally({p.index: 0 for p in task.problems})
    for problem, status, detail in outcomes:
        tally.counts[status] += 1
        tally.first_detail.setdefault(status, detail)
        if status == PASS:
            tally.passed_per_problem[problem] += 1
    n, weight = task.n, task.n // task.generations_per_problem
    passed = [min(c * weight, n) for c in tally.passed_per_problem.values()]
    ks = sorted(set(task.spec.k))
    scores = {f"pass@{k}": round(v, 6) for k, v in mean_pass_at_k(n, passed, ks).items()}
    intervals = (
        {f"pass@{k}": [round(bound, 6) for bound in bootstrap_interval(n, passed, k)] for k in ks}
        if passed
        else {}
    )
    groups: dict[str, list[int]] = {}
    for index, count in zip(tally.passed_per_problem, passed, strict=True):
        difficulty = task.problems[index].row.get(DIFFICULTY_FIELD)
        if isinstance(difficulty, str | int) and not isinstance(difficulty, bool):
            groups.setdefault(str(difficulty), []).append(count)
    by_difficulty = {
        name: {f"pass@{k}": round(v, 6) for k, v in mean_pass_at_k(n, counts, ks).items()}
        for name, counts in sorted(groups.items())
    }
    samples = len(outcomes)
    good = tally.counts[PASS]
    return PassAtKResults(
        scores=scores,
        problems=len(task.problems),
        samples_per_problem=n,
        samples=samples,
        passed=good,
        failed=samples - good,
        timeouts=tally.counts[TIMEOUT],
        checker_errors=tally.counts[ERROR],
        seconds=seconds,
        generate_seconds=generate_seconds,
        check_seconds=check_seconds,
        note=_note(task, tally),
        intervals=intervals,
        by_difficulty=by_difficulty,
    )


def _note(task: PassAtKTask, tally: _Tally) -> str | None:
    parts = []
    if task.greedy and task.n > 1:
        parts.append("greedy: one sample per problem stands for all n")
    if tally.counts[ERROR]:
        parts.append(f"checker error: {tally.first_detail[ERROR]}")
    elif tally.counts[TIMEOUT] and not tally.counts[PASS]:
        parts.append(f"checker {tally.first_detail[TIMEOUT]}")
    text = "; ".join(parts)
    return (text if len(text) <= 300 else text[:299] + "…") or None

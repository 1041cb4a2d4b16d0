"""Every name that crosses the operator / pod / Prometheus / chart boundary is spelled once, in
api/contract.py: a literal of one elsewhere in the package fails this test."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from accelbench.api import contract

PACKAGE = Path(contract.__file__).resolve().parents[1]
CONTRACT = Path(contract.__file__).resolve()

# Shapes of boundary names: environment variables of ours, our label/annotation keys, Prometheus
# annotation keys, worker gauges, and the Kubernetes-owned keys the contract names.
PATTERNS = [
    re.compile(r"^ACCELBENCH_[A-Z0-9_]+$"),
    re.compile(r"^accelbench\.io/(?!v\d)[a-z0-9.-]+$"),  # not the apiVersion accelbench.io/v1alpha1
    re.compile(r"^app\.kubernetes\.io/[a-z-]+$"),
    re.compile(r"^prometheus\.io/[a-z]+$"),
    re.compile(r"^accelbench_worker_[a-z_]*$"),
]
EXACT = {
    contract.TERMINATION_LOG_PATH,
    contract.COMPLETION_INDEX_KEY,
    contract.LABEL_KUEUE_QUEUE,
    contract.RESULTS_CONFIGMAP_KEY,
    contract.REPORT_LOG_PREFIX,
    *contract.JOB_NAME_LABELS,
}
# Names whose definitions belong to the contract alone.
DEFINED_ONLY_THERE = re.compile(r"^(EXIT_[A-Z_]+|[A-Z_]*_ENV|JOB_ENV|RESULTS_KEY|REPORT_PREFIX)$")


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def boundary_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant outside docstrings that is a boundary name."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            if text in EXACT or any(p.match(text) for p in PATTERNS):
                found.append((node.lineno, text))
    return found


def local_definitions(source: str) -> list[tuple[int, str]]:
    """Module-level assignments that re-define a contract-like name (EXIT_OK, JOB_ENV, ...)."""
    found = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Name) and DEFINED_ONLY_THERE.match(target.id):
                found.append((node.lineno, target.id))
    return found


def test_no_boundary_name_is_spelled_outside_the_contract() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.resolve() == CONTRACT:
            continue
        source = path.read_text(encoding="utf-8")
        rel = path.relative_to(PACKAGE)
        offenders += [f"{rel}:{line}: {text!r}" for line, text in boundary_literals(source)]
        offenders += [f"{rel}:{line}: defines {name}" for line, name in local_definitions(source)]
    assert not offenders, "import these from accelbench.api.contract:\n" + "\n".join(offenders)


def test_the_guard_catches_a_literal_and_a_local_definition() -> None:
    sample = (
        'X = "ACCELBENCH_JOB"\nEXIT_OK = 0\ny = {"prometheus.io/port": 1}\n'
        'def f():\n    """ACCELBENCH_JOB"""\n'
    )
    assert boundary_literals(sample) == [(1, "ACCELBENCH_JOB"), (3, "prometheus.io/port")]
    assert local_definitions(sample) == [(2, "EXIT_OK")]


def test_contract_values_are_unique() -> None:
    """Two names for one value would be two meanings for one wire string (the operator's metrics
    port and the pods' once shared ACCELBENCH_METRICS_PORT)."""
    names = {
        k: v for k, v in vars(contract).items() if k.startswith(("ENV_", "LABEL_", "ANNOTATION_", "GAUGE_"))
    }
    values = list(names.values())
    assert len(values) == len(set(values)), sorted(names.items(), key=lambda kv: kv[1])


def test_the_chart_sets_only_variables_the_operator_reads() -> None:
    deployment = PACKAGE.parents[1] / "charts" / "accelbench" / "templates" / "deployment.yaml"
    set_by_chart = set(re.findall(r"- name: (ACCELBENCH_[A-Z_]+)", deployment.read_text()))
    operator_env = {v for k, v in vars(contract).items() if k.startswith("ENV_OPERATOR_")}
    assert set_by_chart and set_by_chart <= operator_env, set_by_chart - operator_env

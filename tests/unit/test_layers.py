"""The import rules of the package (README "Import rules"), read from the code's own imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import accelbench

PACKAGE = Path(accelbench.__file__).resolve().parent
NETWORK = ("kubernetes", "kopf", "urllib", "urllib3", "requests", "aiohttp", "http", "socket")


def imports_of(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    # accelbench/x/y.py is in package accelbench.x; accelbench/x/__init__.py is package accelbench.x.
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.add(node.module)
    return found


def layer_imports(layer: str) -> dict[str, set[str]]:
    root = PACKAGE / layer
    files = [root.with_suffix(".py")] if root.with_suffix(".py").exists() else sorted(root.rglob("*.py"))
    return {str(f.relative_to(PACKAGE)): imports_of(f) for f in files}


def _project(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "accelbench" and len(parts) > 1 else None


def test_api_imports_nothing_else_of_the_project() -> None:
    bad = {
        f: sorted(m for m in mods if _project(m) not in (None, "api"))
        for f, mods in layer_imports("api").items()
    }
    assert not {f: m for f, m in bad.items() if m}


@pytest.mark.parametrize("layer", ["catalog", "plan", "render", "cost", "views", "campaign"])
def test_pure_layers_do_no_network_io(layer: str) -> None:
    bad = {
        f: sorted(m for m in mods if m.split(".")[0] in NETWORK or _project(m) == "kubeapi")
        for f, mods in layer_imports(layer).items()
    }
    assert not {f: m for f, m in bad.items() if m}


def test_kubeapi_stands_alone() -> None:
    """The transport knows nothing of the project: the controller, the CLI and the reporting pod
    all use it, so it must not pull any of them in."""
    bad = {
        f: sorted(m for m in mods if _project(m) not in (None, "kubeapi"))
        for f, mods in layer_imports("kubeapi").items()
    }
    assert not {f: m for f, m in bad.items() if m}


def test_workers_never_import_the_controller_or_the_renderer() -> None:
    bad = {
        f: sorted(m for m in mods if _project(m) in ("controller", "render"))
        for f, mods in layer_imports("workers").items()
    }
    assert not {f: m for f, m in bad.items() if m}


def test_relative_imports_resolve() -> None:
    """The reader above must see `from ..render import x` in workers/ as accelbench.render."""
    assert "accelbench.api.contract" in imports_of(PACKAGE / "workers" / "metrics.py")
    assert "accelbench.render" in imports_of(PACKAGE / "controller" / "children.py")

"""A campaign's matrix -> its cells, each with a stable key that names its child. Pure.

A matrix maps spec paths (dotted, as in the manifest: `accelerator`, `training.seqLength`) to the
values to try. Its cells are the product of those lists, in the order written, minus the `exclude`
entries (a cell is dropped when it has every path=value of one entry), plus the `include` entries
(each a whole assignment of its own, added unless an identical cell is already there).

A cell's key is a hash of its kind and assignment only, never of its position: adding a value to
the matrix in Git adds cells and leaves the existing ones (and their children's names) as they were,
so a re-sync or a restart finds every child it made instead of making it again.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.campaign import CELL_KEY_LENGTH, MAX_CAMPAIGN_NAME_LENGTH, MAX_REPEATS

KIND_LETTER = {"FinetuneJob": "t", "InferenceBench": "s"}  # train, serve: in the child's name
__all__ = [
    "MAX_CAMPAIGN_NAME_LENGTH",
    "MAX_REPEATS",
    "Cell",
    "MatrixError",
    "apply_assignment",
    "cells_of",
    "expand",
]


class MatrixError(ValueError):
    """A matrix that cannot be expanded (a path that is not in the template, an empty axis)."""


@dataclass(frozen=True)
class Cell:
    kind: str  # FinetuneJob or InferenceBench
    assignment: tuple[tuple[str, Any], ...]  # (path, value), sorted by path
    repeat: int  # 0 .. repeats-1

    @property
    def key(self) -> str:
        """Stable across matrix edits and restarts: kind + assignment, not the repeat or position."""
        canonical = json.dumps([self.kind, self.assignment], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:CELL_KEY_LENGTH]

    def child_name(self, campaign: str) -> str:
        """`<campaign>-<t|s><key>[-<repeat+1>]`: at most campaign + 12 characters."""
        suffix = f"-{self.repeat + 1}" if self.repeat else ""
        return f"{campaign}-{KIND_LETTER[self.kind]}{self.key}{suffix}"

    def values(self) -> dict[str, Any]:
        return dict(self.assignment)


def _freeze(assignment: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    # JSON round trip: values become plain, comparable data whatever YAML gave (ints, dicts).
    return tuple(sorted((path, json.loads(json.dumps(value))) for path, value in assignment.items()))


def _canonical(assignment: Mapping[str, Any]) -> str:
    return json.dumps(assignment, sort_keys=True, separators=(",", ":"))


def _matches(assignment: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    return all(path in assignment and assignment[path] == value for path, value in entry.items())


def expand(
    axes: Mapping[str, Sequence[Any]],
    include: Sequence[Mapping[str, Any]] = (),
    exclude: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The assignments of a matrix, in a stable order (product order, then includes)."""
    for path, values in axes.items():
        if not values:
            raise MatrixError(f"matrix axis {path!r} has no values")
    paths = list(axes)
    if paths:
        cells = [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*axes.values())]
    else:
        cells = [] if include else [{}]  # no matrix: the template once
    cells = [c for c in cells if not any(_matches(c, entry) for entry in exclude)]
    seen = {_canonical(c) for c in cells}
    for entry in include:
        if _canonical(entry) not in seen:
            cells.append(dict(entry))
            seen.add(_canonical(entry))
    return cells


def cells_of(
    kind: str,
    axes: Mapping[str, Sequence[Any]],
    include: Sequence[Mapping[str, Any]] = (),
    exclude: Sequence[Mapping[str, Any]] = (),
    repeats: int = 1,
) -> list[Cell]:
    """Every cell to run: each assignment `repeats` times."""
    return [
        Cell(kind, _freeze(assignment), repeat)
        for assignment in expand(axes, include, exclude)
        for repeat in range(repeats)
    ]


def apply_assignment(template: Mapping[str, Any], assignment: Mapping[str, Any]) -> dict[str, Any]:
    """The template spec with each path set to its value (a value replaces the whole subtree: an
    `accelerator` value is the full accelerator). A path through a missing parent creates it; a
    path through a value that is not an object is an error."""
    spec = copy.deepcopy(dict(template))
    for path, value in assignment.items():
        parts = path.split(".")
        node: dict[str, Any] = spec
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise MatrixError(f"matrix path {path!r}: {part!r} is not an object in the template")
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return spec

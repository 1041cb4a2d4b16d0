"""`accelbench`: generate CRDs, plan and render manifests, (later) run workers locally and report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from . import __version__
from .manifests import LoadedResource, ManifestError, load_resources


def _dump_yaml(objects: Sequence[dict]) -> str:
    return "".join("---\n" + yaml.safe_dump(o, sort_keys=False) for o in objects)


def cmd_crds(args: argparse.Namespace) -> int:
    from .catalog import load_catalog
    from .crdgen import generate_crds

    crds = generate_crds(load_catalog())
    if args.out == "-":
        sys.stdout.write(_dump_yaml(list(crds.values())))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for filename, crd in crds.items():
        (out / filename).write_text(yaml.safe_dump(crd, sort_keys=False))
        print(f"wrote {out / filename}")
    return 0


def _plans(loaded: list[LoadedResource]):
    from .catalog import load_catalog
    from .plan import plan_for

    catalog = load_catalog()
    for item in loaded:
        yield item, plan_for(item.resource, catalog), catalog


def cmd_plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="accelbench plan", show_lines=False)
    for col in (
        "resource",
        "accelerator",
        "framework",
        "chips",
        "hosts",
        "topology",
        "fsdp×tp",
        "GB/chip (need/HBM)",
        "$/hour",
        "price source",
    ):
        table.add_column(col, overflow="fold")
    notes: list[str] = []
    sources: dict[str, str] = {}
    for item, plan, _ in _plans(load_resources(args.file)):
        res = item.resource
        mem = plan.memory.total / 1e9
        table.add_row(
            f"{res.kind}/{res.metadata.name}",
            plan.accelerator,
            plan.framework,
            str(plan.chips),
            str(plan.hosts),
            plan.topology or "-",
            f"{plan.fsdp}×{plan.tp}",
            f"{mem:.1f} / {plan.hbm_per_chip_gb:g}",
            f"{plan.dollars_per_hour:.2f}",
            _price_label(plan.price_source),
        )
        sources[_price_label(plan.price_source)] = plan.price_source
        notes += [f"{res.metadata.name}: {n}" for n in plan.notes]
    console = Console(width=max(Console().width, 140))
    console.print(table)
    for note in notes:
        console.print(f"  note: {note}")
    for source in sources.values():
        console.print(f"  price: {source}")
    return 0


def _price_label(source: str) -> str:
    """The short head of a price source ('catalog h100 on-demand'); the rest is printed below."""
    return source.split(",")[0]


def cmd_render(args: argparse.Namespace) -> int:
    from .render import render

    objects: list[dict] = []
    for item, plan, catalog in _plans(load_resources(args.file)):
        res = item.resource
        if args.namespace and not res.metadata.namespace:
            res.metadata.namespace = args.namespace
        objects += render(res, plan, catalog)
    sys.stdout.write(_dump_yaml(objects))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelbench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"accelbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    crds = sub.add_parser("crds", help="write the CustomResourceDefinitions generated from the API models")
    crds.add_argument("--out", default="crds", help="directory to write, or - for stdout (default: crds)")
    crds.set_defaults(func=cmd_crds)

    plan = sub.add_parser("plan", help="show chips, memory and $/hour the planner picks for a manifest")
    plan.add_argument(
        "-f", "--file", required=True, help="manifest file (YAML, several documents ok; - = stdin)"
    )
    plan.set_defaults(func=cmd_plan)

    render = sub.add_parser("render", help="print the child Kubernetes objects, like `helm template`")
    render.add_argument("-f", "--file", required=True, help="manifest file (- = stdin)")
    render.add_argument("-n", "--namespace", default="default", help="namespace for resources that set none")
    render.set_defaults(func=cmd_render)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .plan.types import PlanError
    from .render.errors import RenderError

    try:
        return int(args.func(args) or 0)
    except (ManifestError, PlanError, RenderError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""`accelbench`: generate CRDs, plan and render manifests, run the fine-tuning worker locally,
convert checkpoints, compare finished runs (read through the controller's client) and render
InferenceBench reports. Heavy imports stay inside the commands, so `--help` is quick."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .. import __version__
from ..api.contract import ENV_METRICS_PORT, ExitCode
from ..kubeapi.config import ConfigError
from .manifests import LoadedResource, ManifestError, load_all, load_resources


# YAML 1.1 (what Go's yaml readers in kubectl and the apiserver speak) also reads y/Y/n/N as booleans;
# PyYAML's resolver does not, so without this a schema's `required: [n]` would be written bare and
# reach the apiserver as `false`. Teaching the dumper that these words are booleans makes it quote them.
class KubeYamlDumper(yaml.SafeDumper):
    pass


KubeYamlDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


def to_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=KubeYamlDumper, sort_keys=False)


def _dump_yaml(objects: Sequence[dict]) -> str:
    return "".join("---\n" + to_yaml(o) for o in objects)


def cmd_crds(args: argparse.Namespace) -> int:
    from ..catalog import load_catalog
    from .crdgen import generate_crds

    crds = generate_crds(load_catalog())
    if args.out == "-":
        sys.stdout.write(_dump_yaml(list(crds.values())))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for filename, crd in crds.items():
        (out / filename).write_text(to_yaml(crd))
        print(f"wrote {out / filename}")
    return 0


def _plans(loaded: list[LoadedResource]):
    from ..catalog import load_catalog
    from ..plan import plan_for

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
    for item, plan, _ in _plans(load_all(args.file)):
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
            f"{plan.dollars_per_hour:.2f}" if plan.dollars_per_hour is not None else "unpriced",
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
    from ..render import render

    objects: list[dict] = []
    for item, plan, catalog in _plans(load_all(args.file)):
        res = item.resource
        if args.namespace and not res.metadata.namespace:
            res.metadata.namespace = args.namespace
        objects += render(res, plan, catalog).objects
    sys.stdout.write(_dump_yaml(objects))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run the fine-tuning worker here for each FinetuneJob of the manifest; no cluster needed."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..api import FinetuneJob
    from ..catalog import load_catalog
    from ..plan import local_worker_plan
    from ..workers.finetune.__main__ import RunOptions, run_job
    from ..workers.jobenv import JobInput

    console = Console(stderr=True)
    try:
        loaded = load_resources(args.file)
    except ManifestError as exc:
        console.print(f"error: invalid config: {exc}")
        return ExitCode.INVALID_CONFIG  # as the worker would exit
    jobs = [item for item in loaded if isinstance(item.resource, FinetuneJob)]
    if not jobs:
        console.print(f"error: {args.file} holds no FinetuneJob")
        return ExitCode.INVALID_CONFIG
    base = Path(args.file).resolve().parent if args.file != "-" else Path.cwd()
    worst = 0
    for item in jobs:
        job = item.resource
        plan, note = local_worker_plan(job, load_catalog())
        if note:
            console.print(f"note: {note}")
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            task = progress.add_task(job.metadata.name, total=None, detail="")
            sink = _ProgressSink(progress, task)
            options = RunOptions(
                base_dir=base,
                max_steps=args.steps,
                extra_sink=sink,
                serve_metrics=args.metrics_port is not None,
                log=lambda message: progress.console.print(message),
                download_progress=_DownloadBars(progress),
            )
            if args.metrics_port is not None:
                options.env = {**options.env, ENV_METRICS_PORT: str(args.metrics_port)}
            report, code = run_job(JobInput(job, plan), options)
        _print_report(Console(), job.metadata.name, report)
        if args.json:
            sys.stdout.write(report.model_dump_json(by_alias=True, exclude_none=True) + "\n")
        worst = max(worst, code)
    return worst


class _ProgressSink:
    """workers.finetune.MetricsSink that drives a rich progress bar."""

    def __init__(self, progress, task) -> None:
        self.progress, self.task = progress, task

    def on_step(self, step, total_steps, loss, tokens_per_second, mfu) -> None:
        tps = f"{tokens_per_second:,.0f}" if tokens_per_second is not None else "-"
        detail = f"step {step}/{total_steps}  loss {loss:.4f}  {tps} tok/s"
        self.progress.update(self.task, completed=step, total=total_steps, detail=detail)

    def on_eval(self, step, eval_loss) -> None:
        self.progress.console.print(f"step {step}: eval loss {eval_loss:.4f}")


class _DownloadBars:
    """One bar per object-store URI the worker copies (bytes done of total, and the rate)."""

    def __init__(self, progress) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}
        self.started: dict[str, float] = {}

    def __call__(self, uri: str, done: int, total: int) -> None:
        import time

        if uri not in self.tasks:
            self.tasks[uri] = self.progress.add_task(f"copy {uri}", total=max(total, 1), detail="")
            self.started[uri] = time.monotonic()
        rate = done / max(time.monotonic() - self.started[uri], 1e-6) / 1e6
        detail = f"{done / 1e6:,.1f} of {total / 1e6:,.1f} MB  {rate:,.1f} MB/s"
        self.progress.update(self.tasks[uri], completed=done, detail=detail)


def _figure(value: float | None, spec: str) -> str:
    """A measured figure in `spec`, or '-' where the report has none."""
    return "-" if value is None else format(value, spec)


def _print_report(console, name: str, report) -> None:
    from rich.table import Table

    table = Table(title=f"accelbench run {name}: {'ok' if report.ok else 'FAILED'}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, str]] = [("framework", str(report.framework)), ("device", str(report.device))]
    rows.append(("chips", str(report.chips)))
    if report.error is not None:
        rows.append(("error", f"{report.error.type}: {report.error.message}"))
    ft = report.finetune
    if ft is not None:
        rows += [
            ("steps", str(ft.steps)),
            ("trained tokens", _figure(ft.trained_tokens, ",")),
            ("tokens/s", _figure(ft.tokens_per_second, ",.1f")),
            ("tokens/s/chip", _figure(ft.tokens_per_second_per_chip, ",.1f")),
            ("MFU", _figure(ft.mfu, ".2%")),
            ("FLOPs/token", f"{ft.flops_per_token:.4g}  ({ft.mfu_formula})" if ft.flops_per_token else "-"),
            ("loss first → final", f"{ft.first_loss:.4f} → {ft.final_loss:.4f}" if ft.first_loss else "-"),
            ("eval loss / perplexity", f"{ft.eval_loss:.4f} / {ft.perplexity:.2f}" if ft.eval_loss else "-"),
        ]
    if (sr := report.super_resolution) is not None:
        rows += [
            ("images/s", _figure(sr.images_per_second, ",.1f")),
            ("images/s/chip", _figure(sr.images_per_second_per_chip, ",.1f")),
            ("UNet parameters", _figure(sr.parameters, ",")),
            (
                f"held-out PSNR / SSIM ({sr.eval_images} images)",
                f"{_figure(sr.psnr, '.2f')} dB / {_figure(sr.ssim, '.4f')}",
            ),
            (
                "bicubic PSNR / SSIM",
                f"{_figure(sr.bicubic_psnr, '.2f')} dB / {_figure(sr.bicubic_ssim, '.4f')}",
            ),
        ]
    if (q := report.quantization) is not None:
        rows += [
            ("effective bits (layers / model)", f"{q.effective_bits:.3f} / {q.model_effective_bits:.3f}"),
            ("budget bits", f"{q.budget_bits:g}"),
            ("formats (layers)", ", ".join(f"{k} {v}" for k, v in sorted(q.formats_used.items()))),
            ("compression", f"{q.compression:.2f}x"),
            (
                "perplexity bf16 → quantized",
                f"{q.perplexity_bf16:.3f} → {q.perplexity_quantized:.3f} ({q.perplexity_increase:+.2%})",
            ),
            (
                "weights bf16 → quantized",
                f"{q.weight_bytes_bf16 / 1e6:,.1f} → {q.weight_bytes_quantized / 1e6:,.1f} MB",
            ),
            (
                "prefill tokens/s bf16 → quantized",
                f"{_figure(q.prefill_tokens_per_second_bf16, ',.0f')} → "
                f"{_figure(q.prefill_tokens_per_second_quantized, ',.0f')}",
            ),
            ("sensitivity table", q.sensitivity_table or "-"),
        ]
    if report.timings is not None:
        t = report.timings
        rows.append(
            (
                "seconds total / setup / train",
                f"{t.total_seconds:.1f} / {t.setup_seconds or 0:.1f} / {t.train_seconds or 0:.1f}",
            )
        )
        if t.load_bytes:
            rows.append(
                ("copied from object storage", f"{t.load_bytes / 1e6:,.1f} MB in {t.load_seconds or 0:.1f} s")
            )
    if report.memory is not None and report.memory.peak_bytes_per_chip:
        rows.append(("peak memory/chip", f"{report.memory.peak_bytes_per_chip / 1e9:.2f} GB"))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def cmd_report(args: argparse.Namespace) -> int:
    """An InferenceBench's results JSON, or a BenchCampaign (its results artifact, or the campaign
    and its runs read from the cluster), as index.html with PNG plots."""
    sources = [s for s in (args.file, args.input, args.campaign) if s]
    if len(sources) != 1:
        print("error: give one of FILE, --in FILE or --campaign NAME", file=sys.stderr)
        return 2
    if args.campaign:
        try:
            document = _campaign_from_cluster(args)
        except (ConfigError, LookupError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # the apiserver's refusal or an unreachable address: say which, briefly
            print(f"error: cannot read BenchCampaign {args.campaign}: {_first_line(exc)}", file=sys.stderr)
            return 2
    else:
        try:
            document = _read_report_input(sources[0])
        except (OSError, ValueError) as exc:
            print(f"error: cannot read {sources[0]}: {_first_line(exc)}", file=sys.stderr)
            return 2
    return _write_report(document, args.out)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def _read_report_input(source: str) -> dict[str, Any]:
    """A BenchCampaignResults document (a path, file://, gs:// or s3://) or bench results JSON (a
    path); ValueError for anything else."""
    import json

    from ..campaign.artifact import ARTIFACT_KIND, read_artifact

    if source.startswith(("gs://", "s3://")):
        return read_artifact(source)  # only campaign artifacts live in object storage under one URI
    document = json.loads(Path(source.removeprefix("file://")).read_text())
    if not isinstance(document, dict) or not (
        document.get("kind") == ARTIFACT_KIND or isinstance(document.get("cells"), list)
    ):
        raise ValueError(
            f"neither a {ARTIFACT_KIND} document (kind: {ARTIFACT_KIND}) nor InferenceBench results "
            "JSON (a list of cells)"
        )
    return document


def _write_report(document: dict[str, Any], out: str | None) -> int:
    from ..campaign.artifact import ARTIFACT_KIND

    if document.get("kind") == ARTIFACT_KIND:
        from ..views.campaign_page import render_campaign_report

        name = str((document.get("metadata") or {}).get("name") or "campaign")
        paths = render_campaign_report(document, out or f"{name}-report")
    else:
        from ..views import render_report

        paths = render_report(document, out or "report")
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    print(f"report: {paths['html']}")
    return 0


def _kube_for(args: argparse.Namespace) -> Any:
    from ..controller.kube import Kube
    from ..kubeapi import load_connection

    try:
        return Kube(load_connection(args.kubeconfig, args.context))
    except ConfigError as exc:
        raise ConfigError(f"no cluster to read: kubeconfig {args.kubeconfig or '(default)'}: {exc}") from None


def _context_name(args: argparse.Namespace) -> str | None:
    """The kubeconfig context the cluster was read through (None in a pod): the rows' cluster."""
    if args.context:
        return str(args.context)
    from ..kubeapi import current_context

    return current_context(args.kubeconfig)


def _campaign_from_cluster(args: argparse.Namespace) -> dict[str, Any]:
    """The BenchCampaign and its runs (labelled with its name) as a results document, as the operator
    would write it now."""
    from datetime import UTC, datetime

    from ..api import API_VERSION, FinetuneJob, InferenceBench
    from ..api.contract import LABEL_CAMPAIGN
    from ..views.campaign_page import campaign_document

    kube = _kube_for(args)
    body = kube.get(API_VERSION, "BenchCampaign", args.namespace, args.campaign)
    if body is None:
        raise LookupError(f"no BenchCampaign {args.campaign} in namespace {args.namespace}")
    selector = f"{LABEL_CAMPAIGN}={args.campaign}"
    runs = [
        {"kind": kind, **run}
        for kind in (FinetuneJob.KIND, InferenceBench.KIND)
        for run in kube.list(API_VERSION, kind, args.namespace, selector)
    ]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return campaign_document(body, runs, now, _context_name(args))


def _list_resources(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """FinetuneJobs and InferenceBenches from the cluster, through the controller's client."""
    from ..api import API_VERSION, FinetuneJob, InferenceBench

    kube = _kube_for(args)
    namespace = None if args.all_namespaces else args.namespace
    selector = args.selector or ""
    return tuple(  # type: ignore[return-value]
        kube.list(API_VERSION, kind, namespace, selector) for kind in (FinetuneJob.KIND, InferenceBench.KIND)
    )


def _read_artifacts(uris: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """(cluster, document) per --artifact; two artifacts naming the same cluster keep their rows
    apart by their URIs. Raises ValueError/OSError naming the artifact that cannot be read."""
    from ..campaign.artifact import read_artifact
    from ..views.compare import artifact_cluster

    out: list[tuple[str, dict[str, Any]]] = []
    for uri in uris:
        try:
            document = read_artifact(uri)
        except (OSError, ValueError) as exc:
            raise ValueError(f"artifact {uri}: {_first_line(exc)}") from None
        except Exception as exc:  # an object store's refusal or a missing client: say which, briefly
            raise ValueError(f"artifact {uri}: {type(exc).__name__}: {_first_line(exc)}") from None
        cluster = artifact_cluster(document, uri)
        if any(cluster == taken for taken, _ in out):
            cluster = f"{cluster} ({uri})"
        out.append((cluster, document))
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    """Finished runs side by side: speed, MFU and $ per 1M tokens, with ratios against the best; with
    --artifact, the runs of campaign results artifacts (other clusters) join them."""
    import json

    from rich.console import Console
    from rich.table import Table

    from ..views.compare import COLUMNS, TITLES, as_records, compare, format_value

    try:
        artifacts = _read_artifacts(args.artifact or [])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finetunes: list[dict] = []
    benches: list[dict] = []
    try:
        finetunes, benches = _list_resources(args)
    except Exception as exc:  # no kubeconfig, the apiserver's refusal or an unreachable address
        what = (
            str(exc)
            if isinstance(exc, ConfigError)
            else f"cannot list accelbench resources: {_first_line(exc)}"
        )
        if not artifacts:
            print(f"error: {what}", file=sys.stderr)
            return 2
        print(f"note: only the artifacts' runs: {what}", file=sys.stderr)
    rows = compare(finetunes, benches, artifacts)
    if artifacts:  # the cluster read now is named too, so its rows stand apart from the artifacts'
        here = _context_name(args) or "(this cluster)"
        rows = {
            kind: [r if r.cluster else _tagged(r, here) for r in kind_rows]
            for kind, kind_rows in rows.items()
        }
    if args.output == "json":
        print(json.dumps(as_records(rows), indent=2))
        return 0
    # Piped output (files, scripts) gets wide lines rather than rich's 80-column fallback.
    console = Console() if sys.stdout.isatty() else Console(width=240)
    for group, kind_rows in rows.items():
        if not kind_rows:
            continue
        table = Table(title=TITLES[group], title_justify="left")
        with_cluster = any(r.cluster for r in kind_rows)
        with_setup = any(r.setup for r in kind_rows)
        headings = ["cluster"] * with_cluster + ["name", "accelerator"] + ["setup"] * with_setup + ["phase"]
        for heading in headings:
            table.add_column(heading)
        for heading, _ in COLUMNS[group]:
            table.add_column(heading, justify="right")
        for r in kind_rows:
            name = r.name if not args.all_namespaces else f"{r.namespace}/{r.name}"
            cells = [format_value(key, r.figures.get(key)) for _, key in COLUMNS[group]]
            lead: list[str] = [r.cluster] if with_cluster else []
            setup = [r.setup] if with_setup else []
            table.add_row(*lead, name, r.accelerator, *setup, r.phase, *cells)
        console.print(table)
    if not any(rows.values()):
        console.print("no FinetuneJobs or InferenceBenches found")
    else:
        console.print("speed × / cost ×: against the fastest and the cheapest per token (1.00 = best)")
    return 0


def _tagged(row: Any, cluster: str) -> Any:
    from dataclasses import replace

    return replace(row, cluster=cluster)


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert a checkpoint between Hugging Face safetensors, JAX-layout safetensors and Orbax."""
    from ..bridge.cli import run

    return run(args)


def cmd_verilogeval(args: argparse.Namespace) -> int:
    """A VerilogEval v2 dataset folder -> the pass@k problems JSONL (spec.passAtK.dataset)."""
    import json

    from ..workers.data import DataError
    from ..workers.finetune.verilogeval import verilogeval_rows, write_problems

    try:
        difficulty = json.loads(Path(args.difficulty).read_text()) if args.difficulty else None
        if difficulty is not None and not isinstance(difficulty, dict):
            raise DataError(f"{args.difficulty}: a JSON object of problem name -> difficulty")
        rows = verilogeval_rows(args.folder, difficulty)
    except (OSError, ValueError) as exc:  # DataError and JSON errors are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {write_problems(rows, args.out)}: {len(rows)} problems")
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
        "-f",
        "--file",
        required=True,
        action="append",
        help="manifest file (YAML, several documents ok; - = stdin); repeat for several files",
    )
    plan.set_defaults(func=cmd_plan)

    render = sub.add_parser("render", help="print the child Kubernetes objects, like `helm template`")
    render.add_argument(
        "-f", "--file", required=True, action="append", help="manifest file (- = stdin); repeat for several"
    )
    render.add_argument("-n", "--namespace", default="default", help="namespace for resources that set none")
    render.set_defaults(func=cmd_render)

    run = sub.add_parser(
        "run", help="run the fine-tuning worker here for a FinetuneJob manifest (no cluster)"
    )
    run.add_argument("-f", "--file", required=True, help="FinetuneJob manifest (- = stdin)")
    run.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides epochs/maxSteps)")
    run.add_argument("--metrics-port", type=int, default=None, help="also serve Prometheus metrics (0 = any)")
    run.add_argument("--json", action="store_true", help="print the full WorkerReport JSON after the table")
    run.set_defaults(func=cmd_run)

    convert = sub.add_parser(
        "convert", help="convert a checkpoint: Hugging Face safetensors <-> JAX (Orbax), LoRA merge on export"
    )
    formats = ("hf", "jax", "orbax")  # jax: the JAX tree in einsum layout as safetensors
    convert.add_argument("--from", dest="source", choices=formats, required=True, help="what --model-dir is")
    convert.add_argument("--to", dest="target", choices=formats, required=True, help="format to write")
    convert.add_argument("--model-dir", required=True, help="checkpoint directory to read")
    convert.add_argument("--out", required=True, help="directory to write")
    convert.add_argument(
        "--merge-lora",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="to hf: fold LoRA adapters into the weights (default), or write a PEFT adapter",
    )
    convert.set_defaults(func=cmd_convert)

    comp = sub.add_parser(
        "compare", help="finished runs side by side from the cluster: speed, MFU, $ per 1M tokens, ratios"
    )
    comp.add_argument("-n", "--namespace", default="default")
    comp.add_argument("-A", "--all-namespaces", action="store_true")
    comp.add_argument(
        "-l", "--selector", default=None, help="label selector, e.g. accelbench.io/study=gemma4-31b-lora"
    )
    comp.add_argument("-o", "--output", choices=("table", "json"), default="table")
    comp.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    comp.add_argument("--context", default=None)
    comp.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="URI",
        help="a campaign results artifact (path, file://, gs://, s3://) whose runs join the rows, tagged "
        "with its cluster; repeatable",
    )
    comp.set_defaults(func=cmd_compare)

    report = sub.add_parser(
        "report",
        help="HTML tables and PNG plots: InferenceBench results JSON, or a BenchCampaign (its results "
        "artifact, or --campaign from the cluster)",
    )
    report.add_argument(
        "file",
        nargs="?",
        default=None,
        help="bench results JSON, or a BenchCampaignResults artifact (path, file://, gs://, s3://)",
    )
    report.add_argument("--in", dest="input", default=None, help="bench results JSON (--out or ConfigMap)")
    report.add_argument(
        "--campaign", default=None, help="a BenchCampaign to read with its runs from the cluster"
    )
    report.add_argument("-n", "--namespace", default="default", help="the campaign's namespace")
    report.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    report.add_argument("--context", default=None)
    report.add_argument(
        "--out",
        default=None,
        help="directory for index.html and the PNGs (default: report, or <campaign>-report)",
    )
    report.set_defaults(func=cmd_report)

    verilog = sub.add_parser(
        "verilogeval", help="a VerilogEval v2 dataset folder -> the pass@k problems JSONL the workers read"
    )
    verilog.add_argument("folder", help="e.g. verilog-eval/dataset_spec-to-rtl")
    verilog.add_argument("--out", required=True, help="problems JSONL to write")
    verilog.add_argument(
        "--difficulty", default=None, help="JSON object of problem name -> difficulty, to score per group"
    )
    verilog.set_defaults(func=cmd_verilogeval)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..plan.types import PlanError
    from ..render.errors import RenderError

    try:
        return int(args.func(args) or 0)
    except (ManifestError, PlanError, RenderError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m accelbench.workers.finetune [--job FILE]`: the FinetuneJob container's command.

Reads the job (the ENV_JOB payload or --job), prepares the shared data, serves metrics, runs the
JAX or PyTorch path, writes the WorkerReport and exits with an api.contract.ExitCode: OK, ERROR
(unexpected) or INVALID_CONFIG.

PyTorch with more than one process (NNODES × NPROC_PER_NODE > 1, as the renderer sets them) and no
RANK yet: this process becomes the launcher and re-runs itself under torchrun (torch.distributed.run)
with the rendezvous env; it then exits with the code the workers' report implies.

Every fact the operator decided (framework, chips, mesh, micro-batch, the chips' peak FLOP/s) comes
from the payload's plan; the worker measures the model it loads (FLOPs from its config.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...api import FinetuneJob, Framework, MethodType, Task, WorkerReport
from ...api.contract import (
    ENV_COMPILE,
    ENV_COMPLETION_INDEX,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_LORA_AUTOCAST,
    ENV_LOSS_CHUNK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_NPROC_PER_NODE,
    ENV_RANDOM_INIT,
    ENV_RANK,
    ENV_REMAT,
    ExitCode,
)
from ...api.payload import WorkerPlan
from ...api.report import Timings
from .. import InvalidConfigError, storage
from ..data import PreparedData, data_config_from_spec, prepare_data
from ..flops import flops_per_token, shape_from_hf_config
from ..jobenv import DistEnv, JobInput, dist_env, load_job, resolve_uri
from ..metrics import WorkerMetrics, metrics_port, start_metrics_server
from ..report import (
    build_report,
    error_report,
    exit_code,
    exit_code_of_type,
    termination_log_path,
    write_report,
)
from . import FinetuneOutcome, MetricsSink, TrainContext, compile_mode, loss_chunk_tokens, remat_policy
from .passk import PassAtKTask, load_task

REPORT_FILE = "report.json"  # the full WorkerReport beside the outputs in object storage


class TeeSink:
    """Fans progress out to several sinks (Prometheus gauges and a CLI progress bar)."""

    def __init__(self, *sinks: MetricsSink) -> None:
        self.sinks = sinks

    def on_step(
        self, step: int, total_steps: int, loss: float, tokens_per_second: float | None, mfu: float | None
    ) -> None:
        for sink in self.sinks:
            sink.on_step(step, total_steps, loss, tokens_per_second, mfu)

    def on_eval(self, step: int, eval_loss: float) -> None:
        for sink in self.sinks:
            sink.on_eval(step, eval_loss)


@dataclass
class RunOptions:
    base_dir: Path | None = None  # relative URIs in the spec resolve against this (manifest dir)
    max_steps: int | None = None  # overrides epochs/maxSteps (accelbench run --steps)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    extra_sink: MetricsSink | None = None
    serve_metrics: bool = True
    log: Any = None  # callable(str); default: print to stderr
    download_progress: Any = None  # callable(uri, bytes done, bytes in total) while copying inputs


def read_model_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise InvalidConfigError(f"model dir {model_dir} has no readable config.json") from None
    except ValueError as exc:
        raise InvalidConfigError(f"{path} is not JSON: {exc}") from None


def job_flops(job: FinetuneJob, model_dir: Path) -> tuple[float, str]:
    """FLOPs per trained token of the model actually loaded (its config.json, not the catalog)."""
    shape = shape_from_hf_config(read_model_config(model_dir), job.spec.base_model.family.value)
    method = job.spec.method
    rank = method.rank if method.type == MethodType.LORA else None
    result = flops_per_token(shape, job.spec.training.seq_length, rank, method.target_modules)
    return result.total, result.formula


def chips_for(plan: WorkerPlan, dist: DistEnv) -> int:
    # torch runs one process per chip; a JAX process drives all chips of its host.
    if plan.framework == Framework.PYTORCH:
        return max(dist.world_size, 1)
    return plan.chips


@dataclass
class Staged:
    """What copying inputs from object storage cost this run (WorkerReport timings)."""

    seconds: float = 0.0
    bytes: int = 0
    any: bool = False
    upload_to: str | None = None  # object-store URI of spec.output, written after the run


def local_input(uri: str, options: RunOptions, staged: Staged) -> Path:
    """A local path for a model or dataset URI: gs:// and s3:// are copied into the cache first."""
    if not storage.is_object_store(uri):
        return resolve_uri(uri, options.env, options.base_dir)
    hook = options.download_progress
    progress = (lambda done, total: hook(uri, done, total)) if hook is not None else None
    cache = storage.default_cache_dir(options.env)
    fetched = storage.fetch(uri, cache, log=options.log or _stderr, progress=progress)
    staged.seconds += fetched.seconds
    staged.bytes += fetched.bytes_downloaded
    staged.any = True
    return fetched.path


def local_output(uri: str, job: FinetuneJob, options: RunOptions, staged: Staged) -> Path:
    """Where the worker writes its outputs: the URI's path, or for gs:// a staging directory in
    the cache that run_job uploads once the run has finished."""
    if not storage.is_object_store(uri):
        return resolve_uri(uri, options.env, options.base_dir)
    storage.parse_uri(uri)  # a malformed URI fails now, not after training
    staged.upload_to = uri
    run = job.metadata.uid or job.metadata.name
    return storage.default_cache_dir(options.env) / "outputs" / run


def build_context(
    job_input: JobInput, dist: DistEnv, sink: MetricsSink, options: RunOptions, staged: Staged
) -> TrainContext:
    job, plan = job_input.job, job_input.plan
    spec = job.spec
    model_dir = local_input(spec.base_model.uri, options, staged)
    if not model_dir.is_dir():
        raise InvalidConfigError(f"model dir {model_dir} (from {spec.base_model.uri}) does not exist")
    dataset = local_input(spec.dataset.uri, options, staged)
    if not dataset.is_file():
        raise InvalidConfigError(f"dataset {dataset} (from {spec.dataset.uri}) does not exist")
    random_init = options.env.get(ENV_RANDOM_INIT, "") == "1"
    if random_init and spec.output is not None:
        # Random weights are a throughput fixture, never an artifact someone could mistake for a model.
        raise InvalidConfigError(f"{ENV_RANDOM_INIT}=1 (random weights, benchmarks only) writes no output")
    output_dir = None
    if spec.output is not None:
        output_dir = local_output(spec.output.uri, job, options, staged)
    config = data_config_from_spec(spec, plan, options.max_steps)
    data: PreparedData = prepare_data(model_dir, dataset, config, spec.base_model.family.value)
    data.micro_batch_size(max(dist.world_size, 1) if plan.framework == Framework.PYTORCH else 1)  # fail early
    flops, _ = job_flops(job, model_dir)
    return TrainContext(
        job=job,
        plan=plan,
        model_dir=model_dir,
        data=data,
        dist=dist,
        metrics=sink,
        flops_per_token=flops,
        peak_tflops_per_chip=plan.peak_tflops_per_chip,
        chips=chips_for(plan, dist),
        output_dir=output_dir,
        warmup_steps_excluded=1 if data.total_steps > 1 else 0,
        compile=compile_mode(options.env.get(ENV_COMPILE)),
        loss_chunk_tokens=loss_chunk_tokens(options.env.get(ENV_LOSS_CHUNK)),
        remat_policy=remat_policy(options.env.get(ENV_REMAT)),
        lora_autocast=options.env.get(ENV_LORA_AUTOCAST, "1") != "0",
        random_init=random_init,
        log=options.log or _stderr,
        pass_at_k=pass_at_k_task(job, model_dir, options, staged),
    )


def pass_at_k_task(
    job: FinetuneJob, model_dir: Path, options: RunOptions, staged: Staged
) -> PassAtKTask | None:
    """spec.passAtK with its problems read and tokenized now: a bad file fails before training."""
    spec = job.spec.pass_at_k
    if spec is None:
        return None
    path = local_input(spec.dataset, options, staged)
    if not path.is_file():
        raise InvalidConfigError(f"pass@k problems {path} (from {spec.dataset}) do not exist")
    return load_task(spec, path, model_dir, job.spec.base_model.family.value)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def train_with(framework: Framework, ctx: TrainContext) -> FinetuneOutcome:
    if framework == Framework.PYTORCH:
        from . import torch_worker

        return torch_worker.train(ctx)
    if framework == Framework.JAX:
        try:
            from . import jax_worker  # type: ignore[attr-defined]
        except ImportError as exc:
            raise InvalidConfigError(f"the JAX worker is not available in this image: {exc}") from None
        return jax_worker.train(ctx)
    raise InvalidConfigError(f"framework {framework!r} is neither jax nor pytorch")


def run_job(job_input: JobInput, options: RunOptions | None = None) -> tuple[WorkerReport, int]:
    """Run one worker process to the end; never raises for job errors: they become the report."""
    options = options or RunOptions()
    started = time.perf_counter()
    framework = job_input.plan.framework
    dist = DistEnv()
    server = None
    try:
        dist = dist_env(framework, options.env)
        metrics = WorkerMetrics()
        port = metrics_port(options.env) if options.serve_metrics else None
        if port is not None and dist.local_rank == 0:
            server = start_metrics_server(port, metrics)
            (options.log or _stderr)(f"metrics: serving on port {server.port}")
        sink: MetricsSink = TeeSink(metrics, options.extra_sink) if options.extra_sink else metrics
        staged = Staged()
        job = job_input.job
        if job.spec.task == Task.CAUSAL_LM:
            report, output_dir = run_causal_lm(job_input, dist, sink, options, staged)
        else:
            report, output_dir = run_other_task(job, dist, sink, options, staged)
        report = with_run_timings(report, time.perf_counter() - started, staged)
        if staged.upload_to is not None and dist.rank == 0 and output_dir is not None:
            try:
                deliver(report, output_dir, staged.upload_to, options.log or _stderr)
            except storage.OutputError as exc:
                # Trained, but the outputs are not where the spec says. Not retried (that would pay
                # for the run again); the failure's message keeps what was measured.
                raise storage.OutputError(f"the run finished ({_summary(report)}) but {exc}") from None
        end_process_group(wait_for_peers=True, log=options.log or _stderr)
        return report, ExitCode.OK
    except Exception as exc:  # the report carries it; the exit code says whether to retry
        (options.log or _stderr)(f"error: {type(exc).__name__}: {exc}")
        report = error_report(
            exc, framework=framework, rank=dist.rank, total_seconds=time.perf_counter() - started
        )
        return report, exit_code(exc)
    finally:
        end_process_group(wait_for_peers=False, log=options.log or _stderr)
        if server is not None:
            server.stop()


def end_process_group(*, wait_for_peers: bool, log: Callable[[str], None]) -> None:
    """Leave torch.distributed before the process exits. A gloo rank that exits while its peer's
    connection is still open can abort in gloo's I/O thread (SIGABRT after a good report), so a
    finished rank waits at a barrier for the others (rank 0 may still be uploading) and then
    closes the group. After an error there is no barrier: the peer may be gone. A failed barrier
    is logged, not raised: this rank's report is already complete."""
    dist_module = sys.modules.get("torch.distributed")  # never imports torch for the JAX path
    if dist_module is None or not dist_module.is_available() or not dist_module.is_initialized():
        return
    if wait_for_peers:
        try:
            dist_module.barrier()
        except Exception as exc:  # a peer that failed reports its own error
            log(f"warning: the closing barrier failed ({type(exc).__name__}: {exc})")
    try:
        dist_module.destroy_process_group()
    except Exception as exc:  # run_job never raises; the report is what counts
        log(f"warning: leaving the process group failed ({type(exc).__name__}: {exc})")


def run_causal_lm(
    job_input: JobInput, dist: DistEnv, sink: MetricsSink, options: RunOptions, staged: Staged
) -> tuple[WorkerReport, Path | None]:
    ctx = build_context(job_input, dist, sink, options, staged)
    outcome = train_with(job_input.plan.framework, ctx)
    flops, formula = job_flops(job_input.job, ctx.model_dir)
    report = build_report(
        outcome,
        flops_per_token=flops,
        mfu_formula=formula,
        peak_tflops_per_chip=ctx.peak_tflops_per_chip,
        rank=dist.rank,
    )
    return report, ctx.output_dir


def run_other_task(
    job: FinetuneJob, dist: DistEnv, sink: MetricsSink, options: RunOptions, staged: Staged
) -> tuple[WorkerReport, Path | None]:
    """Tasks superResolution and quantize (workers/finetune/tasks.py), inputs staged as for causalLM."""
    from . import tasks

    spec, log = job.spec, options.log or _stderr
    output_dir = local_output(spec.output.uri, job, options, staged) if spec.output is not None else None
    dataset = local_input(spec.dataset.uri, options, staged)
    if spec.task == Task.SUPER_RESOLUTION:
        return tasks.run_super_resolution(job, dist, sink, dataset, output_dir, log), output_dir
    model_dir = local_input(spec.base_model.uri, options, staged)
    if not model_dir.is_dir():
        raise InvalidConfigError(f"model dir {model_dir} (from {spec.base_model.uri}) does not exist")
    if not dataset.is_file():
        raise InvalidConfigError(f"dataset {dataset} (from {spec.dataset.uri}) does not exist")
    if output_dir is None:
        raise InvalidConfigError("task quantize needs spec.output for the export")
    return tasks.run_quantize(job, model_dir, dataset, output_dir, log), output_dir


def with_run_timings(report: WorkerReport, total_seconds: float, staged: Staged) -> WorkerReport:
    """The whole run's wall time and the object-storage copy, which only the entrypoint sees."""
    timings = report.timings or Timings(total_seconds=0.0)
    update: dict[str, float | int | None] = {"total_seconds": max(total_seconds, 0.0)}
    if staged.any:
        update |= {"load_seconds": staged.seconds, "load_bytes": staged.bytes}
    return report.model_copy(update={"timings": timings.model_copy(update=update)})


def _summary(report: WorkerReport) -> str:
    if report.quantization is not None:
        q = report.quantization
        return f"{q.effective_bits:.3f} effective bits, perplexity {100 * q.perplexity_increase:+.2f} %"
    if report.super_resolution is not None and report.super_resolution.images_per_second is not None:
        return f"{report.super_resolution.images_per_second:.1f} images/s"
    metrics = report.finetune
    if metrics is None or metrics.tokens_per_second is None:
        return "no metrics"
    return f"{metrics.steps} steps, {metrics.tokens_per_second:.1f} tokens/s"


def deliver(report: WorkerReport, output_dir: Path, uri: str, log: Callable[[str], None]) -> None:
    """Upload the run's outputs and its full WorkerReport to `uri` (object storage), so they
    outlive the resource and the cluster. A failure raises OutputError: the run is then not done."""
    output_dir.mkdir(parents=True, exist_ok=True)
    full = json.dumps(report.to_wire(), indent=1, allow_nan=False)
    (output_dir / REPORT_FILE).write_text(full)
    storage.upload_dir(output_dir, uri, log=log)


def needs_launcher(framework: Framework, env: Mapping[str, str]) -> bool:
    if framework != Framework.PYTORCH or env.get(ENV_RANK) is not None:
        return False
    nnodes = int(env.get(ENV_NNODES) or 1)
    nproc = int(env.get(ENV_NPROC_PER_NODE) or 1)
    return nnodes * nproc > 1


def host_rank(env: Mapping[str, str]) -> int:
    """This host's index before the job is read: only index 0 writes the run's results ConfigMap."""
    try:
        return max(int(env.get(ENV_NODE_RANK) or env.get(ENV_COMPLETION_INDEX) or 0), 0)
    except ValueError:
        return 0


def launch_torchrun(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Re-run this module under torchrun; map the workers' outcome to this pod's exit code."""
    node_rank = env.get(ENV_NODE_RANK) or env.get(ENV_COMPLETION_INDEX) or 0
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={env.get(ENV_NNODES) or 1}",
        f"--nproc-per-node={env.get(ENV_NPROC_PER_NODE) or 1}",
        f"--node-rank={node_rank}",
        f"--master-addr={env.get(ENV_MASTER_ADDR) or '127.0.0.1'}",
        f"--master-port={env.get(ENV_MASTER_PORT) or 29500}",
        "-m",
        "accelbench.workers.finetune",
        *argv,
    ]
    rc = subprocess.call(command, env=dict(env))
    path = termination_log_path(env)
    text = path.read_text() if path is not None and path.is_file() else ""
    if text.strip():
        report = WorkerReport.model_validate_json(text)
        if report.ok:
            return ExitCode.OK if rc == 0 else ExitCode.ERROR
        return exit_code_of_type(report.error.type) if report.error else ExitCode.ERROR
    if rc != 0:
        crash = error_report(
            RuntimeError(f"torchrun exited with {rc} before a report was written"), rank=host_rank(env)
        )
        write_report(crash, env=env)
        return ExitCode.ERROR
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelbench.workers.finetune", description=__doc__)
    parser.add_argument("--job", help=f"job file (JSON/YAML payload or manifest); default: ${ENV_JOB}")
    parser.add_argument("--steps", type=int, default=None, help="override the number of optimizer steps")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        job_input = load_job(args.job, env)
    except InvalidConfigError as exc:
        _stderr(f"error: invalid config: {exc}")
        write_report(error_report(exc, rank=host_rank(env)), env=env)
        return ExitCode.INVALID_CONFIG
    if needs_launcher(job_input.plan.framework, env):
        return launch_torchrun(list(argv if argv is not None else sys.argv[1:]), env)
    base = Path(args.job).resolve().parent if args.job else None
    report, code = run_job(job_input, RunOptions(base_dir=base, max_steps=args.steps, env=env))
    if report.rank == 0 or int(env.get(ENV_LOCAL_RANK) or 0) == 0:
        write_report(report, env=env)
    return code


if __name__ == "__main__":
    sys.exit(main())

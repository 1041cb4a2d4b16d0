"""The contract between the operator, the pods it starts, Prometheus and the chart, defined once.

Every name that crosses a process boundary lives here: label and annotation keys, environment
variables, the termination-log path, exit codes, gauge names, the results ConfigMap key, port names.
Each line says who writes it and who reads it. Render, controller, workers, CLI and hack/ import
these; nobody spells one of them as a literal (tests/unit/test_contract.py fails when one does).

Layers: "operator" = accelbench.controller (kopf), "render" = accelbench.render (pure), "worker" =
the fine-tuning worker, "client" = the bench load generator, "chart" = charts/accelbench.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

# --------------------------------------------------------------------------- labels on children

APP_NAME = "accelbench"  # value of LABEL_APP_NAME on every child
MANAGED_BY = "accelbench-operator"  # value of LABEL_MANAGED_BY; also the server-side-apply field manager

LABEL_APP_NAME = "app.kubernetes.io/name"  # render writes; Prometheus relabelling reads
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # render writes; users' selectors read
LABEL_INSTANCE = "app.kubernetes.io/instance"  # render writes (parent name); Service selectors read
LABEL_KIND = "accelbench.io/kind"  # render writes (parent kind); Service selectors, PodMonitor read
LABEL_NAME = "accelbench.io/name"  # render writes (parent name); the operator's Job/Pod indexes read
LABEL_ROLE = "accelbench.io/role"  # render writes (a Role); the progress scrape and Services read
LABEL_ACCELERATOR = "accelbench.io/accelerator"  # render writes; PodMonitor target labels read
LABEL_CAMPAIGN = "accelbench.io/campaign"  # campaign writes on its runs (its name); `-l` selectors read
LABEL_CELL = "accelbench.io/cell"  # campaign writes on its runs: the cell's key, shared by its repeats
ANNOTATION_CELL_VALUES = "accelbench.io/cell-values"  # campaign writes on its runs: the cell as JSON
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"  # render writes on a queued Job; Kueue and observe read


class Role(StrEnum):
    """The part a child plays (LABEL_ROLE): training workers, the serving engine, the load generator."""

    TRAIN = "train"
    SERVER = "server"
    CLIENT = "client"


# --------------------------------------------------------------------------- written by Kubernetes

# The Job controller labels each pod with its Job's name (the old key is still written by 1.2x).
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
# The Job controller's completion index of a pod (label and annotation); render points env at it.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# Where a container's termination message is read from: workers write their WorkerReport here,
# the kubelet copies it into the pod status, the operator ingests it.
TERMINATION_LOG_PATH = "/dev/termination-log"

# --------------------------------------------------------------------------- Prometheus

METRICS_PORT = 9090  # the port workers and the client serve gauges on (render sets it)
METRICS_PORT_NAME = "metrics"  # container port name; the operator's scrape falls back to it
METRICS_PATH = "/metrics"
ANNOTATION_SCRAPE = "prometheus.io/scrape"  # render writes on train/client pods; Prometheus reads
ANNOTATION_PORT = "prometheus.io/port"  # render writes (hack/localexec.py rewrites); the operator reads
ANNOTATION_PATH = "prometheus.io/path"  # render writes; the operator reads

# Gauges a worker serves (workers/metrics.py) and the operator scrapes into status.progress
# (controller/progress.py): gauge name -> status.progress field.
GAUGE_STEP = "accelbench_worker_step"
GAUGE_TOTAL_STEPS = "accelbench_worker_total_steps"
GAUGE_LOSS = "accelbench_worker_loss"
GAUGE_TOKENS_PER_SECOND = "accelbench_worker_tokens_per_second"
GAUGE_MFU = "accelbench_worker_mfu"
GAUGE_EVAL_LOSS = "accelbench_worker_eval_loss"
PROGRESS_GAUGES: dict[str, str] = {
    GAUGE_STEP: "step",
    GAUGE_TOTAL_STEPS: "totalSteps",
    GAUGE_LOSS: "loss",
    GAUGE_TOKENS_PER_SECOND: "tokensPerSecond",
    GAUGE_MFU: "mfu",
}

# --------------------------------------------------------------------------- pod environment

ENV_JOB = "ACCELBENCH_JOB"  # render writes the JobPayload JSON (api/payload.py); worker, client read
ENV_TERMINATION_LOG = "ACCELBENCH_TERMINATION_LOG"  # render writes TERMINATION_LOG_PATH; pods write there
ENV_METRICS_PORT = "ACCELBENCH_METRICS_PORT"  # render writes METRICS_PORT; worker and client serve on it
ENV_PVC_ROOT = "ACCELBENCH_PVC_ROOT"  # render writes; worker maps pvc://CLAIM/PATH under it
ENV_CACHE_DIR = "ACCELBENCH_CACHE_DIR"  # render writes (an emptyDir); worker copies gs:// objects there
ENV_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # render writes (from COMPLETION_INDEX_KEY); worker reads
ENV_ENDPOINT = "ACCELBENCH_ENDPOINT"  # render writes the server URL; client reads
ENV_HEALTH_PATH = "ACCELBENCH_HEALTH_PATH"  # render writes; client polls it (absent: TCP connect)
ENV_READY_TIMEOUT = "ACCELBENCH_READY_TIMEOUT_SECONDS"  # render writes; client's wait for the server
ENV_RESULTS_CONFIGMAP = "ACCELBENCH_RESULTS_CONFIGMAP"  # render writes; the reporting pod patches it
ENV_POD_NAMESPACE = "POD_NAMESPACE"  # render (downward API) and chart write; client and operator read
ENV_OUTPUT_URI = "ACCELBENCH_OUTPUT_URI"  # render writes spec.output.uri; the bench client uploads there
ENV_TOKENIZER_DIR = "ACCELBENCH_TOKENIZER_DIR"  # render writes for local model paths; client reads

# Distributed rendezvous: render writes from the plan; the worker (and torchrun, jax) read.
ENV_JAX_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_JAX_PROCESSES = "JAX_NUM_PROCESSES"
ENV_JAX_PROCESS_ID = "JAX_PROCESS_ID"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_NNODES = "NNODES"
ENV_NPROC_PER_NODE = "NPROC_PER_NODE"
ENV_NODE_RANK = "NODE_RANK"
# torchrun writes these for each process it starts; the worker reads them.
ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
# DeepSpeed reads it once, at import: the ZeRO-3 path sets "cpu" where no GPU is present.
ENV_DEEPSPEED_ACCELERATOR = "DS_ACCELERATOR"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"

# Worker tuning a user may set in spec.env (read by the workers only).
ENV_COMPILE = "ACCELBENCH_COMPILE"  # PyTorch: "1"/"model" whole forward + loss, "layers" each block
ENV_TORCH_ATTENTION = "ACCELBENCH_TORCH_ATTENTION"  # force a transformers attention implementation
ENV_JAX_ATTENTION = "ACCELBENCH_JAX_ATTENTION"  # einsum | xla | cudnn | auto
ENV_REMAT = "ACCELBENCH_REMAT"  # full | dots: what a checkpointed block saves (both frameworks)
# Gaudi (spec.gaudi): render writes them; Habana's PyTorch bridge reads the first, the worker the second.
ENV_HPU_LAZY_MODE = "PT_HPU_LAZY_MODE"
ENV_HPU_GRAPHS = "ACCELBENCH_HPU_GRAPHS"
# "0": bf16 LoRA runs its fp32 adapters' matmuls in fp32, not under bf16 autocast (benchmark A/B).
ENV_LORA_AUTOCAST = "ACCELBENCH_LORA_AUTOCAST"
ENV_LOSS_CHUNK = "ACCELBENCH_LOSS_CHUNK"  # tokens per chunk of the LM head + loss (0 = whole)
ENV_RANDOM_INIT = "ACCELBENCH_RANDOM_INIT"  # "1": benchmarks only: random weights from config.json

# What the pass@k checker command gets (worker writes; the user's checker reads).
ENV_CHECKER_SAMPLE = "ACCELBENCH_SAMPLE"
ENV_CHECKER_PROBLEM = "ACCELBENCH_PROBLEM"
ENV_CHECKER_WORKDIR = "ACCELBENCH_WORKDIR"

# --------------------------------------------------------------------------- operator environment
# The chart (or the e2e harness) writes these on the operator's Deployment; only the operator reads.
# The operator's own metrics port is not ENV_METRICS_PORT: that one is the pods'.

ENV_OPERATOR_METRICS_PORT = "ACCELBENCH_OPERATOR_METRICS_PORT"
ENV_OPERATOR_NAMESPACES = "ACCELBENCH_NAMESPACES"  # comma-separated watch scope; empty = cluster
ENV_OPERATOR_LIVENESS = "ACCELBENCH_LIVENESS_ENDPOINT"
ENV_OPERATOR_LEADER_ELECTION = "ACCELBENCH_LEADER_ELECTION"  # chart writes: the Lease name; empty = off
ENV_POD_NAME = "POD_NAME"  # chart writes (downward API): this replica's identity in the Lease
ENV_OPERATOR_OBSERVE_INTERVAL = "ACCELBENCH_OBSERVE_INTERVAL"
ENV_OPERATOR_API_QPS = "ACCELBENCH_API_QPS"  # chart writes (apiQPS): the operator's request rate
ENV_OPERATOR_API_BURST = "ACCELBENCH_API_BURST"  # chart writes (apiBurst): requests it may save up
ENV_OPERATOR_WORKERS = "ACCELBENCH_WORKERS"  # chart writes (workers): passes at once
ENV_OPERATOR_EVENT_LEVEL = "ACCELBENCH_EVENT_LEVEL"
ENV_OPERATOR_PRICES_CONFIGMAP = "ACCELBENCH_PRICES_CONFIGMAP"
ENV_OPERATOR_PRICES_NAMESPACE = "ACCELBENCH_PRICES_NAMESPACE"
# Chart writes (networkPolicy.*): render each run's NetworkPolicies ("true"), and the namespaces that
# may scrape the pods' metrics port besides the operator's own (comma-separated, e.g. Prometheus').
ENV_OPERATOR_NETWORK_POLICIES = "ACCELBENCH_NETWORK_POLICIES"
ENV_OPERATOR_METRICS_NAMESPACES = "ACCELBENCH_METRICS_NAMESPACES"
# chart writes (values.clusterName): names this cluster in a campaign's results artifact, so `compare`
# tells runs from several clusters apart.
ENV_OPERATOR_CLUSTER_NAME = "ACCELBENCH_CLUSTER_NAME"

# --------------------------------------------------------------------------- results


class ExitCode(IntEnum):
    """How a worker or the client exits; render's podFailurePolicy acts on INVALID_CONFIG."""

    OK = 0  # the WorkerReport is in the termination log
    ERROR = 1  # unexpected (crash, lost peer, I/O): the Job retries, counted against backoffLimit
    INVALID_CONFIG = 3  # retrying the same input cannot succeed: the Job fails at once


# The operator replica that lost its Lease exits with this; its Deployment restarts it as a standby.
EXIT_LOST_LEASE = 75


# The worker's full report is the last stdout line with this prefix (a log reader finds it there).
REPORT_LOG_PREFIX = "ACCELBENCH_REPORT "
# The bench client writes its full results JSON under this key of the results ConfigMap (the one
# write a pod makes to the Kubernetes API; see render/results.py for its Role). Users and the report
# read it.
RESULTS_CONFIGMAP_KEY = "results.json"
# The reporting pod (rank 0, the bench client) writes its full WorkerReport under this key: the
# operator reads it when the termination message is gone (pods garbage-collected, Job deleted).
REPORT_CONFIGMAP_KEY = "report.json"

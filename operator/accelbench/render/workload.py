"""Building blocks shared by the training, server and client Jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.common import EnvFromSource, EnvVar, RunControl
from ..api.contract import COMPLETION_INDEX_KEY, LABEL_KUEUE_QUEUE, TERMINATION_LOG_PATH


def env_value(name: str, value: str | int) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def env_field(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def env_completion_index(name: str) -> dict[str, Any]:
    """The pod's index in its Indexed Job, read from the annotation the Job controller sets."""
    return env_field(name, f"metadata.annotations['{COMPLETION_INDEX_KEY}']")


def merge_env(rendered: list[dict[str, Any]], user: list[EnvVar]) -> list[dict[str, Any]]:
    """The user's variables come last and replace rendered ones of the same name.

    Replacing rather than appending duplicates: env is a list keyed by name, and server-side apply
    refuses a list with two entries for one key.
    """
    names = {var.name for var in user}
    kept = [var for var in rendered if var["name"] not in names]
    return kept + [var.to_container_env() for var in user]


def env_from(sources: list[EnvFromSource]) -> dict[str, Any]:
    """A container's `envFrom`: whole Secrets/ConfigMaps, resolved by the kubelet, never read here."""
    return {"envFrom": [source.to_wire() for source in sources]} if sources else {}


def pull_secrets(spec: RunControl) -> dict[str, Any]:
    """A pod's `imagePullSecrets`, for the private images of a run."""
    secrets = [secret.to_wire() for secret in spec.image_pull_secrets]
    return {"imagePullSecrets": secrets} if secrets else {}


def build_pod_failure_policy(containers: tuple[str, ...], fail_job_exit_codes: list[int]) -> dict[str, Any]:
    """Disruptions (preemption, node drain, spot reclaim) do not count as failures; an exit of one of
    our containers that says retrying cannot help ends the Job at once."""
    rules: list[dict[str, Any]] = [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    if fail_job_exit_codes:
        rules += [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": name, "operator": "In", "values": fail_job_exit_codes},
            }
            for name in containers
        ]
    return {"rules": rules}


@dataclass(frozen=True)
class JobShape:
    hosts: int
    backoff_limit: int
    fail_job_exit_codes: list[int]
    containers: tuple[str, ...]  # whose fail_job_exit_codes end the Job (ours, not third-party engines)
    suspend: bool
    queue_name: str | None  # Kueue LocalQueue label, on this Job only


def is_suspended(control: RunControl) -> bool:
    """A Kueue-queued Job must be created suspended: Kueue admits it by clearing suspend."""
    return control.suspend or bool(control.queue_name)


def build_job(
    metadata: dict[str, Any], shape: JobShape, control: RunControl, pod_template: dict[str, Any]
) -> dict[str, Any]:
    """An Indexed Job with completions = parallelism = hosts.

    Indexed even for one host: every pod then has a stable index (and hostname), the same code
    path serves single- and multi-host, and JOB_COMPLETION_INDEX always exists.
    backoffLimitPerIndex is deliberately not used: SPMD ranks cannot be retried one by one, a
    lost rank makes its peers fail too, so retries are counted for the Job as a whole.
    """
    meta = dict(metadata)
    if shape.queue_name:
        meta["labels"] = {**meta["labels"], LABEL_KUEUE_QUEUE: shape.queue_name}
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": shape.hosts,
        "parallelism": shape.hosts,
        "backoffLimit": shape.backoff_limit,
        "podFailurePolicy": build_pod_failure_policy(shape.containers, shape.fail_job_exit_codes),
        "suspend": shape.suspend,
    }
    if control.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = control.active_deadline_seconds
    # No ttlSecondsAfterFinished here: the Job controller would delete the Job whether or not the
    # operator had recorded the run's result. The operator applies spec.ttlSecondsAfterFinished
    # itself, after the result is stored (controller/reconcile.jobs_to_clean).
    spec["template"] = pod_template
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def build_headless_service(
    metadata: dict[str, Any], selector: dict[str, str], port_name: str, port: int
) -> dict[str, Any]:
    """Gives each pod of a multi-host Job a DNS name `<job>-<index>.<service>` for rendezvous.

    publishNotReadyAddresses: peers must resolve each other before any of them is Ready,
    otherwise the coordinator of rank 0 is unreachable during start-up and nothing starts.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": dict(selector),
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def container_base(name: str, image: str) -> dict[str, Any]:
    # FallbackToLogsOnError: when a container dies before writing its report (OOM, crash), the
    # tail of its log becomes the termination message, which the controller shows as the reason.
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }

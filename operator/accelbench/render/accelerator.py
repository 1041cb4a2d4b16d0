"""Pod-spec facts per accelerator: node selection, tolerations, device requests, privileges.

See docs/design.md "Accelerators (pod-spec facts)". Everything here reads the catalog entry and the
plan; nothing is looked up in a cluster.
"""

from __future__ import annotations

from typing import Any

from ..api.common import Accelerator, Capacity, Resources, Scheduling
from ..catalog.types import AcceleratorSpec
from ..plan.types import Plan
from .errors import RenderError

VENDOR_GOOGLE = "google"
VENDOR_NVIDIA = "nvidia"
VENDOR_HABANA = "habana"

TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
SPOT_LABEL = "cloud.google.com/gke-spot"
RESERVATION_NAME_LABEL = "cloud.google.com/reservation-name"
RESERVATION_AFFINITY_LABEL = "cloud.google.com/reservation-affinity"

# Habana's Kubernetes examples give a pod 95000Mi of 2 MiB huge pages; that is spread over the
# cards here so an 8-card host gets about the same. The PyTorch bridge pins host buffers in huge
# pages. The apiserver refuses an amount that is not a whole number of 2 MiB pages (11875Mi was
# refused by the local control plane), so the per-card share is rounded to an even MiB count.
GAUDI_HUGEPAGES_MI_PER_CARD = 11876
# Kubernetes refuses huge pages without a cpu or memory request; a share of the host's memory
# proportional to the cards taken, minus headroom for the kubelet and system daemons.
GAUDI_MEMORY_SHARE = 0.75

# Our worker and client images run as this user; fsGroup makes mounted volumes writable for it.
NON_ROOT_UID = 1000


def is_tpu(accel: AcceleratorSpec) -> bool:
    return accel.vendor == VENDOR_GOOGLE


def needs_shm(accel: AcceleratorSpec) -> bool:
    """NCCL and the Habana collectives pass tensors through /dev/shm; the runtime default is 64 MiB."""
    return accel.vendor in (VENDOR_NVIDIA, VENDOR_HABANA)


def build_node_selector(plan: Plan, accel: AcceleratorSpec, accelerator: Accelerator) -> dict[str, str]:
    selector = dict(accel.node_labels)
    if is_tpu(accel):
        # The accelerator label alone matches every slice shape of that generation; GKE only
        # schedules a pod onto the nodes of one slice when the topology is selected as well.
        if not plan.topology:
            raise RenderError(f"plan for {accel.name} has no TPU topology")
        selector[TPU_TOPOLOGY_LABEL] = plan.topology
    if accelerator.capacity == Capacity.SPOT:
        selector[SPOT_LABEL] = "true"
    elif accelerator.capacity == Capacity.RESERVATION:
        if not accelerator.reservation_name:
            raise RenderError("capacity reservation needs reservationName")
        selector[RESERVATION_NAME_LABEL] = accelerator.reservation_name
        selector[RESERVATION_AFFINITY_LABEL] = "specific"
    return selector


def build_tolerations(accel: AcceleratorSpec, accelerator: Accelerator) -> list[dict[str, Any]]:
    tolerations = [{"key": t.key, "operator": t.operator, "effect": t.effect} for t in accel.tolerations]
    if accelerator.capacity == Capacity.SPOT:
        # GKE taints Spot nodes it provisions itself; tolerating the taint is harmless where absent.
        tolerations.append({"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    return tolerations


def build_device_resources(plan: Plan, accel: AcceleratorSpec) -> dict[str, dict[str, str]]:
    """Requests and limits for the chips of one host (none for cpu)."""
    if accel.resource_name is None:
        return {"requests": {}, "limits": {}}
    chips = str(plan.chips_per_host)
    # Extended resources cannot be overcommitted: request and limit must be equal.
    requests = {accel.resource_name: chips}
    limits = {accel.resource_name: chips}
    if accel.vendor == VENDOR_HABANA:
        hugepages = f"{GAUDI_HUGEPAGES_MI_PER_CARD * plan.chips_per_host}Mi"
        share = plan.chips_per_host / max(accel.max_chips_per_host, 1)
        memory = f"{max(int(accel.host_memory_gb * share * GAUDI_MEMORY_SHARE), 1)}Gi"
        for part in (requests, limits):
            part["hugepages-2Mi"] = hugepages
            part["memory"] = memory
    return {"requests": requests, "limits": limits}


def merge_resources(base: dict[str, dict[str, str]], override: Resources | None) -> dict[str, Any]:
    """spec.resources wins key by key; empty sections are dropped so the object stays minimal."""
    requests = dict(base.get("requests", {}))
    limits = dict(base.get("limits", {}))
    if override is not None:
        requests.update(override.requests or {})
        limits.update(override.limits or {})
    merged: dict[str, Any] = {}
    if requests:
        merged["requests"] = requests
    if limits:
        merged["limits"] = limits
    return merged


def non_root_pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def build_pod_security(accel: AcceleratorSpec, run_as_non_root: bool) -> dict[str, Any]:
    """Pod securityContext.

    Gaudi runs as root, said explicitly (the worker image ends as uid 1000): the SYS_NICE the
    container adds is effective only for uid 0, since Kubernetes sets no ambient capabilities, and
    the Habana runtime expects root. `run_as_non_root` is False for an engine image that needs root
    (spec.server.runAsRoot); vLLM and TGI run as uid 1000 with a writable HOME.
    """
    if accel.vendor == VENDOR_HABANA:
        return {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_non_root:
        return non_root_pod_security()
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def build_container_security(accel: AcceleratorSpec) -> dict[str, Any]:
    """Container securityContext: nothing beyond what the device needs.

    Gaudi's runtime needs SYS_NICE (it sets thread priorities of its scheduler threads); the other
    accelerators work with every capability dropped (GKE TPU and GPU devices need no privileges).
    """
    if accel.vendor == VENDOR_HABANA:
        return {"allowPrivilegeEscalation": False, "capabilities": {"add": ["SYS_NICE"]}}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def uses_host_ipc(accel: AcceleratorSpec) -> bool:
    # The Habana collectives share memory across the per-card processes through the host's IPC
    # namespace; without it multi-card runs fail at initialisation.
    return accel.vendor == VENDOR_HABANA


def shm_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """A memory-backed /dev/shm. No sizeLimit: it counts against the pod's memory, and a fixed cap
    small enough to be safe would starve NCCL on 8-GPU hosts."""
    return {"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "dshm", "mountPath": "/dev/shm"}


def mount_volumes(
    container: dict[str, Any],
    accel: AcceleratorSpec,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Mount the pod's volumes in its container, plus a memory-backed /dev/shm where the
    accelerator's collectives need one; returns the pod's volume list."""
    if needs_shm(accel):
        shm, shm_mount = shm_volume()
        volumes = [*volumes, shm]
        mounts = [*mounts, shm_mount]
    if mounts:
        container["volumeMounts"] = mounts
    return volumes


def place_on_accelerator(
    pod: dict[str, Any],
    plan: Plan,
    accel: AcceleratorSpec,
    accelerator: Accelerator,
    scheduling: Scheduling | None,
) -> dict[str, Any]:
    """Everything that puts a pod on the accelerator's pool: host IPC, selector, tolerations,
    then the user's own placement on top."""
    if uses_host_ipc(accel):
        pod["hostIPC"] = True
    node_selector = build_node_selector(plan, accel, accelerator)
    if node_selector:
        pod["nodeSelector"] = node_selector
    tolerations = build_tolerations(accel, accelerator)
    if tolerations:
        pod["tolerations"] = tolerations
    return apply_scheduling(pod, scheduling)


def apply_scheduling(pod: dict[str, Any], scheduling: Scheduling | None) -> dict[str, Any]:
    """The user's extra placement over the catalog's: their selector keys win, tolerations add up."""
    if scheduling is None:
        return pod
    if scheduling.node_selector:
        pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **scheduling.node_selector}
    if scheduling.tolerations:
        pod["tolerations"] = [*pod.get("tolerations", []), *(t.to_wire() for t in scheduling.tolerations)]
    if scheduling.priority_class_name:
        pod["priorityClassName"] = scheduling.priority_class_name
    return pod

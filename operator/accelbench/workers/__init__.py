"""What runs inside the pods: the fine-tuning workers (JAX, PyTorch) and the bench client.

Shared by both fine-tuning frameworks, so a TPU-vs-GPU comparison trains on the same tokens with the
same loss: `data` (tokenization, masking, packing, batches, the loss formula), `flops` (FLOPs per
token and MFU), `report` (the WorkerReport and how a worker exits), `metrics` (Prometheus), `jobenv`
(the JobPayload and the distributed environment), `testing` (tiny random-weight models).

Names shared with the operator (env vars, gauges, exit codes, paths) come from api.contract.
Workers never import `accelbench.controller` or `accelbench.render`.
"""

from ..api.status import Reason


class InvalidConfigError(ValueError):
    """The spec, model or dataset cannot work as given; retrying cannot help (ExitCode.INVALID_CONFIG).
    `reason` is the report's error.type and the run's Failed reason (subclasses name their case)."""

    reason: str = Reason.INVALID_CONFIG.value

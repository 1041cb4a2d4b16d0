"""What runs inside the pods: the fine-tuning workers (JAX, PyTorch) and the bench client.

Shared by both fine-tuning frameworks, so a TPU-vs-GPU comparison trains on the same tokens with the
same loss: `data` (tokenization, masking, packing, batches, the loss formula), `flops` (FLOPs per
token and MFU), `report` (the WorkerReport and exit codes), `metrics` (Prometheus), `jobenv` (the
ACCELBENCH_JOB payload and the distributed environment), `testing` (tiny random-weight models).

Workers never import `accelbench.controller`.
"""


class InvalidConfigError(ValueError):
    """The spec, model or dataset cannot work as given; retrying cannot help (worker exit code 3)."""

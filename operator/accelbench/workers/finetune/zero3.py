"""parallelism zero3: DeepSpeed ZeRO stage 3, as the Gaudi-vs-NVIDIA study ran it.

The train loop stays the PyTorch worker's (same batches, same loss, same learning-rate schedule); only
the wrapping, backward and optimizer step go through DeepSpeed's engine, which partitions weights,
gradients and optimizer state over the ranks and gathers each layer's weights for its forward.

- Gradient accumulation: the loop says which micro-batch ends the step (the engine's boundary), and
  the loss it passes is already the global-token mean, so the engine must not divide it again
  (`scale_wrt_gas=False`).
- Precision: bf16 and fp16 are DeepSpeed's own mixed-precision modes (fp32 master weights in the
  partitioned optimizer; fp16 with DeepSpeed's dynamic loss scaler, not torch's GradScaler).
- Clipping: the engine's (`gradient_clipping`), over the partitioned gradients.
- On CPU, DeepSpeed's CPU accelerator with the process group the worker already made (gloo).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from ...api.contract import ENV_DEEPSPEED_ACCELERATOR
from ...api.finetune import Precision
from .. import InvalidConfigError


def deepspeed_config(
    precision: Precision, micro_batch_size: int, grad_accumulation: int, max_grad_norm: float
) -> dict[str, Any]:
    """The engine's config: stage 3, the loop's batch shape, clipping and the precision mode. The
    optimizer is the worker's own AdamW (DeepSpeed calls it untested, it is torch's)."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accumulation,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision == Precision.BF16},
        "fp16": {"enabled": precision == Precision.FP16},
        "steps_per_print": 2**31 - 1,  # the worker logs its own steps
        "wall_clock_breakdown": False,
    }


class Zero3:
    """The engine behind the loop's three calls: forward (`module`), backward, step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @classmethod
    def start(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> Zero3:
        if not torch.cuda.is_available():
            os.environ.setdefault(ENV_DEEPSPEED_ACCELERATOR, "cpu")
        try:
            import deepspeed
        except ImportError as exc:
            raise InvalidConfigError(
                f"parallelism zero3 needs the deepspeed package, which this worker image lacks ({exc})"
            ) from exc
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        return cls(engine)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.engine.optimizer.param_groups

    def backward(self, loss: torch.Tensor, last_micro_batch: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last_micro_batch)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> bool:
        """Clip, step and zero the gradients; True when fp16's scaler skipped the step (overflow)."""
        self.engine.step()
        return bool(getattr(self.engine.optimizer, "overflow", False))

    @contextlib.contextmanager
    def gathered(self, model: torch.nn.Module) -> Iterator[None]:
        """Every rank holds the whole model inside (a collective on entry and exit): saving then
        works as in one process. Changes made inside (a LoRA merge) are dropped on exit."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            yield

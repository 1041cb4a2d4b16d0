"""pass@k generation on the PyTorch path: transformers' `generate` on the trained (LoRA) model.

Prompts come tokenized from `passk` (the shared chat template), are left-padded into a batch with an
attention mask, and decode greedily (temperature 0) or by temperature/top-p sampling, with
`torch.manual_seed(seed, batch index)` before each batch. The generation config is built here, not
read from the model dir, so a checkpoint's own sampling defaults (top_k 64, say) cannot creep in.

Distributed: each rank generates and checks batches r, r+world, ... and the results are gathered.
Under DDP the unwrapped module generates on its own; under FSDP2 every forward gathers shards, so
`generate` is registered as an FSDP forward method, runs with `synced_gpus` (ranks keep stepping
until all are done) and every rank makes the same number of calls (`passk.plan_batches`).
"""

from __future__ import annotations

from typing import Any

import torch

from ...api.status import PassAtKResults
from . import TrainContext
from .passk import GenerateFn, PassAtKTask, evaluate, trim_at_stop
from .torch_attention import generation_attention


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
            continue
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
            continue
        return model


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both [B, longest prompt], prompts right-aligned."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def generation_config(task: PassAtKTask) -> Any:
    from transformers import GenerationConfig

    spec = task.spec
    sampling = {"do_sample": False}
    if not task.greedy:
        sampling = {"do_sample": True, "temperature": spec.temperature, "top_p": spec.top_p, "top_k": 0}
    return GenerationConfig(
        max_new_tokens=spec.max_new_tokens,
        eos_token_id=list(task.stop_ids) or None,
        pad_token_id=task.tokenizer.pad_id,
        **sampling,
    )


def batch_seed(seed: int, batch_index: int) -> int:
    return (seed * 1_000_003 + batch_index) % (2**63)


def make_generate(
    model: torch.nn.Module, task: PassAtKTask, device: torch.device, *, synced: bool = False
) -> GenerateFn:
    config = generation_config(task)

    @torch.no_grad()
    def generate(prompts: list[list[int]], batch_index: int) -> list[list[int]]:
        ids, mask = left_padded(prompts, task.tokenizer.pad_id)
        torch.manual_seed(batch_seed(task.spec.seed, batch_index))
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            synced_gpus=synced,
        )
        return [trim_at_stop(row, task.stop_ids) for row in out[:, ids.shape[1] :].tolist()]

    return generate


def all_gather_objects(items: list[Any]) -> list[list[Any]]:
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, items)
    return gathered


def run_pass_at_k(
    model: torch.nn.Module, ctx: TrainContext, device: torch.device, distributed: bool
) -> PassAtKResults:
    """Sample, check and score `ctx.pass_at_k` with the trained model (left in train mode after)."""
    task = ctx.pass_at_k
    assert task is not None
    module = unwrap(model)
    fsdp = distributed and ctx.plan.fsdp > 1
    if fsdp:
        from torch.distributed.fsdp import register_fsdp_forward_method

        register_fsdp_forward_method(module, "generate")
    world = ctx.dist.world_size if distributed else 1
    was_training = module.training
    module.eval()
    try:
        with generation_attention(module):
            result = evaluate(
                task,
                make_generate(module, task, device, synced=fsdp),
                rank=ctx.dist.rank if distributed else 0,
                world=world,
                gather=all_gather_objects if distributed else None,
                log=ctx.log,
            )
    finally:
        module.train(was_training)
    assert result is not None
    return result

"""The LM head and cross-entropy computed a chunk of tokens at a time (ENV_LOSS_CHUNK, PyTorch side).

The plain path (torch_worker.forward_ce) materialises float32 logits for every token of a
micro-batch: 8,192 tokens × a 128k vocabulary are 4.2 GB, and the log-softmax and its gradient as
many again, all alive at the loss's peak. Here each chunk's logits exist only while that chunk is
computed: the chunk runs under activation checkpointing, so its logits are recomputed in the
backward pass instead of kept (the price: one more head matmul per token, as in the JAX worker's
chunked_ce_sum). Same sums as the plain path, to float rounding.

The loss lives inside a module (ChunkedLossModel) so that DDP and FSDP2 wrap the whole forward: the
head's weight is used outside the head's own forward, which is only safe while the wrapper's root
forward holds it (FSDP2 unshards root-owned parameters for the root's forward). ZeRO-3 gathers a
parameter only inside its owning module's forward, so the chunked loss is refused there.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .. import InvalidConfigError


def _chunk_ce_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    softcap: float | None,
) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()
    if softcap:  # Gemma's final-logit soft cap, as the model's own forward applies it
        logits = torch.tanh(logits / softcap) * softcap
    ce = F.cross_entropy(logits, targets, reduction="none")
    return (ce * mask).sum()


def chunked_ce_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk_tokens: int,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum(ce·mask), sum(mask)) over [B, T, H] hidden states, `chunk_tokens` tokens at a time."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    weights = loss_mask.reshape(-1)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, flat.shape[0], chunk_tokens):
        end = start + chunk_tokens
        piece = (flat[start:end], weight, flat_targets[start:end], weights[start:end], softcap)
        if torch.is_grad_enabled():
            total = total + checkpoint(_chunk_ce_sum, *piece, use_reentrant=False)
        else:
            total = total + _chunk_ce_sum(*piece)
    return total, weights.sum()


def causal_lm_parts(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear, float | None]:
    """(decoder, LM head, final-logit soft cap) of a transformers *ForCausalLM, PEFT-wrapped or not.

    The *ForCausalLM forward of the families served here is `lm_head(model(...).last_hidden_state)`
    plus, for Gemma, the soft cap; anything else (an adapted head, another layout) is refused.
    """
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = getattr(causal, "model", None)
    head = getattr(causal, "lm_head", None)
    if decoder is None or type(head) is not torch.nn.Linear:
        raise InvalidConfigError(
            f"the chunked loss needs a causal LM with a plain linear lm_head; {type(causal).__name__} has "
            f"{type(head).__name__ if head is not None else 'none'} (unset ACCELBENCH_LOSS_CHUNK)"
        )
    config = causal.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return decoder, head, getattr(text, "final_logit_softcapping", None)


class ChunkedLossModel(torch.nn.Module):
    """forward(input_ids, positions, mask, targets, loss_mask) -> (sum(ce·mask), sum(mask)) of a
    causal LM, its head and loss chunked. The wrapped model stays reachable as `.causal_lm`."""

    def __init__(self, causal_lm: torch.nn.Module, chunk_tokens: int) -> None:
        super().__init__()
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.causal_lm = causal_lm
        self.chunk_tokens = chunk_tokens
        causal_lm_parts(causal_lm)  # refuse an unsupported model now, not at the first step

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: Any,
        targets: torch.Tensor,
        loss_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        decoder, head, softcap = causal_lm_parts(self.causal_lm)
        out = decoder(input_ids=input_ids, position_ids=positions, attention_mask=mask, use_cache=False)
        return chunked_ce_sum(
            out.last_hidden_state, head.weight, targets, loss_mask, self.chunk_tokens, softcap
        )


def forward_chunked(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    mask: Any,
    targets: torch.Tensor,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LossFn of a (maybe DDP/FSDP-wrapped) ChunkedLossModel: calls it through its wrapper."""
    return model(input_ids, positions, mask, targets, loss_mask)

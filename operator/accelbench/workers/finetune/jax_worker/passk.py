"""pass@k generation on the JAX path: `jaxmodels.generate` on the trained split, on the job's mesh.

Every process runs the same SPMD program over every batch (the parameters are sharded over the
mesh; the token buffer is replicated), so the samples are the same everywhere; process 0 runs the
checkers and reports. One buffer shape for the whole eval (batch_size rows × the longest prompt plus
max_new_tokens, rounded up to 8) means one compile. See jaxmodels/generate.py for the cost: one
prefill over the buffer, then one cached single-token step per new token; the KV cache takes
2 × layers × rows × buffer length × kv_heads × head_dim × dtype bytes.
"""

from __future__ import annotations

import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jax

from ....api.status import PassAtKResults
from ....jaxmodels.generate import buffer, completions, make_decoder
from .. import TrainContext
from ..passk import GenerateFn, PassAtKTask, evaluate, trim_at_stop
from .step import Split


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _host(x: jax.Array) -> np.ndarray:
    """A replicated array's value on this process."""
    return np.asarray(x.addressable_shards[0].data)


def make_generate(task: PassAtKTask, split: Split, mesh: Mesh) -> GenerateFn:
    spec = task.spec
    rows = min(spec.batch_size, len(task.problems) * task.generations_per_problem)
    length = _round_up(task.max_prompt_tokens + spec.max_new_tokens, 8)
    replicated = NamedSharding(mesh, PartitionSpec())
    decode = make_decoder(
        split.graphdef,
        max_new_tokens=spec.max_new_tokens,
        stop_ids=task.stop_ids,
        temperature=spec.temperature,
        top_p=spec.top_p,
        out_sharding=replicated,
    )
    key = jax.random.key(spec.seed)

    def generate(prompts: list[list[int]], batch_index: int) -> list[list[int]]:
        tokens, lengths = buffer(prompts, rows, length, task.tokenizer.pad_id)
        out, ends = decode(
            (split.trainable, split.frozen),
            jax.make_array_from_process_local_data(replicated, tokens),
            jax.make_array_from_process_local_data(replicated, lengths),
            jax.random.fold_in(key, batch_index),
        )
        new = completions(_host(out), lengths, _host(ends), len(prompts))
        return [trim_at_stop(ids, task.stop_ids) for ids in new]

    return generate


def run_pass_at_k(ctx: TrainContext, split: Split, mesh: Mesh) -> PassAtKResults | None:
    """Sample, check and score `ctx.pass_at_k`; None on processes other than 0."""
    task = ctx.pass_at_k
    assert task is not None
    return evaluate(task, make_generate(task, split, mesh), check=jax.process_index() == 0, log=ctx.log)

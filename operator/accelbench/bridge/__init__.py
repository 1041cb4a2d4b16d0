"""Hugging Face safetensors <-> JAX parameter trees for the llama, gemma3 and gemma4 families.

`mapping` names and reshapes (HF q/k/v/o, gate/up/down <-> Gemma-style einsum weights), `hf_files`
reads sharded safetensors lazily and writes them back with the side files, `convert` builds NNX
models from a directory and exports merged-LoRA checkpoints, PEFT adapters and Orbax checkpoints.
"""

from .convert import (
    LoadedModel,
    export_hf,
    export_peft_adapter,
    load_hf,
    load_orbax,
    merged_params,
    save_jax_safetensors,
    save_orbax,
    sharded_placer,
)
from .mapping import HfLayout

__all__ = [
    "HfLayout",
    "LoadedModel",
    "export_hf",
    "export_peft_adapter",
    "load_hf",
    "load_orbax",
    "merged_params",
    "save_jax_safetensors",
    "save_orbax",
    "sharded_placer",
]

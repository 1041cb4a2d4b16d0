"""Flax NNX models for the JAX fine-tuning path: Gemma 3, Gemma 4 (dense text) and Llama decoders with LoRA.

One package rather than `models/` so that importing it clearly means importing JAX; the rest of the
operator never does. `config` reads a Hugging Face config.json, `layers` holds the blocks,
`transformer` the decoder, `lora` the adapters (and why not qwix).
"""

from .config import ModelConfig, UnsupportedModelError, config_from_hf, load_config
from .lora import BASE_PARAMS, TRAINABLE_LORA, LoRA, lora_parameter_count
from .transformer import Transformer, abstract_model

__all__ = [
    "BASE_PARAMS",
    "TRAINABLE_LORA",
    "LoRA",
    "ModelConfig",
    "Transformer",
    "UnsupportedModelError",
    "abstract_model",
    "config_from_hf",
    "load_config",
    "lora_parameter_count",
]

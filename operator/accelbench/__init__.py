"""accelbench: fine-tune and serve LLMs on TPU, H100/H200 and Gaudi, and measure what it costs."""

__version__ = "0.1.0"

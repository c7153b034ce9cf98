"""Sampling from a policy: one entry point (:func:`generate`), two engines (``hf``:
transformers ``generate``; ``vllm``: an in-process vLLM engine kept in step with training)."""

from pofe.generation.base import ENGINES, Generator, SamplingConfig, VLLMSettings, make_generator
from pofe.generation.sampling import HFGenerator, generate

__all__ = ["ENGINES", "Generator", "SamplingConfig", "VLLMSettings", "HFGenerator", "generate", "make_generator"]

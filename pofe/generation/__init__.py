"""Sampling from a policy: batched generation with a KV cache (transformers ``generate``)."""

from pofe.generation.sampling import SamplingConfig, Generator, HFGenerator, generate

__all__ = ["SamplingConfig", "Generator", "HFGenerator", "generate"]

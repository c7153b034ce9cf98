"""Sampling from a policy: one entry point (:func:`generate`), three engines (``hf``:
transformers ``generate``; ``vllm``: an in-process vLLM engine kept in step with training;
``vllm-server``: ``vllm serve`` processes over HTTP, sent the trained weights).

``generate``/``HFGenerator``/``make_generator``/``ENGINES`` are imported on first use, so that
configs which embed a ``SamplingConfig`` (judge configs, every command's config) validate
without importing torch."""

from pofe.generation.base import Generator, HFSettings, SamplingConfig, ServerSettings, VLLMSettings

__all__ = ["ENGINES", "Generator", "HFSettings", "SamplingConfig", "ServerSettings", "VLLMSettings", "HFGenerator",
           "generate", "make_generator"]


def __getattr__(name: str):
    if name in ("ENGINES", "HFGenerator", "generate", "make_generator"):
        from pofe.generation import sampling

        return getattr(sampling, name)
    raise AttributeError(f"module 'pofe.generation' has no attribute {name!r}")

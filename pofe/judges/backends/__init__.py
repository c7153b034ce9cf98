"""Where judge reads come from, one file per backend, behind the
:class:`~pofe.judges.base.JudgeBackend` protocol:

* ``transformers`` — a causal LM in this process (:mod:`.transformers`);
* ``llamacpp`` — a local llama.cpp server over a GGUF (:mod:`.llamacpp`);
* ``openai`` — any OpenAI-compatible HTTP endpoint (:mod:`.endpoint`);
* ``vllm`` — an in-process vLLM engine, shared with a vLLM policy of the same model (:mod:`.vllm`).

``BACKENDS`` is the plain name -> class mapping; a new backend is one file plus one entry.
Importing this package imports neither torch nor httpx (each backend imports them on use).
"""

from __future__ import annotations

from pofe.judges.backends.endpoint import EndpointBackend, parse_choice_response, parse_retry_after
from pofe.judges.backends.llamacpp import LlamaCppBackend, LlamaCppServer, _free_port
from pofe.judges.backends.transformers import TransformersBackend, _weights_identity, weights_hash
from pofe.judges.backends.vllm import VLLMBackend
from pofe.judges.base import BackendStats, ChoiceRead, EndpointError, GenOut, JudgeBackend, choice_variants

BACKENDS: dict[str, type] = {
    "transformers": TransformersBackend,
    "llamacpp": LlamaCppBackend,
    "openai": EndpointBackend,
    "vllm": VLLMBackend,
}

__all__ = ["BACKENDS", "BackendStats", "ChoiceRead", "EndpointBackend", "EndpointError", "GenOut", "JudgeBackend",
           "LlamaCppBackend", "LlamaCppServer", "TransformersBackend", "VLLMBackend", "choice_variants", "parse_choice_response",
           "parse_retry_after", "weights_hash", "_free_port", "_weights_identity"]

"""Where judge reads come from, one file per backend, behind the
:class:`~pofe.judges.base.JudgeBackend` protocol:

* ``transformers`` — a causal LM in this process (:mod:`.transformers`);
* ``llamacpp`` — a local llama.cpp server over a GGUF (:mod:`.llamacpp`);
* ``openai`` — any OpenAI-compatible HTTP endpoint (:mod:`.endpoint`);
* ``vllm`` — an in-process vLLM engine, shared with a vLLM policy of the same model (:mod:`.vllm`).

``BACKENDS`` is the plain name -> builder mapping, ``(judge_config, **runtime) -> backend``: the
contract a ``pofe.judge_backends`` plugin follows too (a built-in's builder is its class's
``from_config``). What the config must know of a built-in without importing it is its row in
:data:`pofe.judges.config.BACKEND_SPECS`. A new backend is one file, one entry, one spec row.
Importing this package imports neither torch nor httpx (each backend imports them on use).
"""

from __future__ import annotations

from collections.abc import Callable

from pofe.judges.backends.endpoint import EndpointBackend, parse_choice_response, parse_retry_after
from pofe.judges.backends.llamacpp import LlamaCppBackend, LlamaCppServer, _free_port
from pofe.judges.backends.transformers import TransformersBackend, _weights_identity, weights_hash
from pofe.judges.backends.vllm import VLLMBackend
from pofe.judges.base import BackendStats, ChoiceRead, EndpointError, GenOut, JudgeBackend, choice_variants

BACKENDS: dict[str, Callable[..., JudgeBackend]] = {
    "transformers": TransformersBackend.from_config,
    "llamacpp": LlamaCppBackend.from_config,
    "openai": EndpointBackend.from_config,
    "vllm": VLLMBackend.from_config,
}

__all__ = ["BACKENDS", "BackendStats", "ChoiceRead", "EndpointBackend", "EndpointError", "GenOut", "JudgeBackend",
           "LlamaCppBackend", "LlamaCppServer", "TransformersBackend", "VLLMBackend", "choice_variants", "parse_choice_response",
           "parse_retry_after", "weights_hash", "_free_port", "_weights_identity"]

"""The system under test: an LLM engine for Llama-family models with a paged KV cache, continuous
batching with chunked prefill, preemption, and greedy or seeded sampling."""

from sut.engine import LLMEngine, RequestOutput
from sut.errors import CheckpointError, ConfigError, InvalidRequestError, SaafError, UnsupportedModelError
from sut.llm import LLM
from sut.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams", "SaafError", "InvalidRequestError",
           "ConfigError", "UnsupportedModelError", "CheckpointError"]

"""The system under test: an LLM engine for Llama, gpt-oss and DeepSeek-V3 models with a paged KV
cache, continuous batching with chunked prefill, preemption, greedy or seeded sampling, speculative
decoding (n-gram, draft-model, EAGLE3 and MTP proposers, exact verification), data-parallel
replicas, tensor and expert parallelism and disaggregated prefill and decode workers. Its CPU
backend lives in sut/cpu/."""

import torch

from sut.cpu.build import cpu_description
from sut.engine.client import EngineClient, make_engine
from sut.engine.disaggregated import DisaggregatedPool
from sut.engine.llm import LLM
from sut.engine.llm_engine import LLMEngine
from sut.engine.replicas import ReplicaPool
from sut.errors import CheckpointError, ConfigError, InvalidRequestError, SaafError, UnsupportedModelError, WorkerError
from sut.outputs import RequestOutput
from sut.sampling_params import SamplingParams


def machine_description() -> str:
    """This machine, for run records: its CPU (with the C kernels' level), and the GPUs once this
    process uses CUDA (asking does not start it)."""
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_initialized() else []
    )
    return cpu_description() + "".join(f"; GPU {i}: {name}" for i, name in enumerate(gpus))


__all__ = [
    "LLM",
    "LLMEngine",
    "EngineClient",
    "RequestOutput",
    "SamplingParams",
    "SaafError",
    "InvalidRequestError",
    "ConfigError",
    "UnsupportedModelError",
    "CheckpointError",
    "machine_description",
    "make_engine",
    "ReplicaPool",
    "DisaggregatedPool",
    "WorkerError",
]

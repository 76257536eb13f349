"""The engine-client interface: what the LoadGen harness, `LLM` and the report drive, whichever
engine runs behind it. `LLMEngine` is one engine in this process; `ReplicaPool` runs one in each of
several processes; `DisaggregatedPool` runs prefill and decode workers. `make_engine` returns the one
the settings ask for."""

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from sut.config import EngineConfig
from sut.engine.disaggregated import DisaggregatedPool
from sut.engine.llm_engine import LLMEngine
from sut.engine.replicas import ReplicaPool
from sut.engine.resolve import resolve
from sut.outputs import RequestOutput
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence


@runtime_checkable
class EngineClient(Protocol):
    """Requests go in with `add_request` (or `make_sequence` then `submit`, which checks a batch of
    them before any is queued) from any thread; the owner calls `step` in a loop, which returns the
    requests that finished since the last call (each exactly once) and calls their `on_token` as
    tokens come. A dead worker makes `step` raise WorkerError; `fail_all` then answers every request
    in flight with an error output."""

    max_model_len: int
    device: torch.device  # where the model runs (the first replica's kind of device)
    dtype: torch.dtype
    tokenizer: object  # transformers' tokenizer, or None when the model folder has none

    def make_sequence(self, prompt, params: SamplingParams | None = None, request_id=None, on_token=None) -> Sequence:
        """A checked request, not yet queued (InvalidRequestError naming what is wrong)."""
        ...

    def submit(self, seqs: list[Sequence]) -> None: ...

    def add_request(self, prompt, params: SamplingParams | None = None, request_id=None, on_token=None): ...

    def abort(self, request_id) -> None: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def fail_all(self, error: str) -> list[RequestOutput]: ...

    def warmup(self) -> float:
        """What the first timed requests would otherwise compile or fault in; the seconds it took."""
        ...

    def reset(self) -> None:
        """Between timed runs, on an idle engine: nothing cached, counted or timed."""
        ...

    def spec_stats(self) -> dict | None: ...

    def kv_cache_stats(self) -> dict: ...

    def busy_stats(self) -> dict: ...

    def close(self) -> None:
        """End every worker process; none is left behind."""
        ...


def make_engine(model: str | Path, **settings) -> EngineClient:
    """The engine client the settings ask for: one LLMEngine, with data_parallel_size > 1 a pool of
    them, with disaggregation prefill and decode workers."""
    resolved = resolve(model, EngineConfig.from_kwargs(**settings))  # the one settings check
    if resolved.engine.disaggregation is not None:
        return DisaggregatedPool.from_resolved(resolved)
    if resolved.engine.data_parallel_size == 1:
        return LLMEngine.from_resolved(resolved)
    return ReplicaPool.from_resolved(resolved)

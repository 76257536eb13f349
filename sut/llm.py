"""The offline API: `LLM(model_path, **engine_settings).generate(prompts, SamplingParams(...))`."""

from contextlib import nullcontext
from pathlib import Path

from sut.engine import RequestOutput
from sut.replicas import make_engine
from sut.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | Path, **engine_settings):
        self.engine = make_engine(model, **engine_settings)  # several replicas with data_parallel_size > 1
        self.tokenizer = self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for a prompt or a list of prompts (text or token ids); outputs in input order.
        Every request is validated before any runs, so a bad one fails the call up front."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} sampling params")
        seqs = [self.engine.make_sequence(p, sp) for p, sp in zip(prompts, sampling_params)]
        self.engine.submit(seqs)
        order = {seq.request_id: i for i, seq in enumerate(seqs)}
        results: list[RequestOutput | None] = [None] * len(seqs)
        if use_tqdm:
            from tqdm import tqdm  # here: sut imports with torch and numpy alone (gpu_check)

        with tqdm(total=len(seqs), desc="generate") if use_tqdm else nullcontext() as bar:
            while any(r is None for r in results):
                for out in self.engine.step():
                    if out.request_id in order:
                        results[order[out.request_id]] = out
                        if bar is not None:
                            bar.update(1)
        return results

    def kv_cache_stats(self) -> dict:
        return self.engine.kv_cache_stats()

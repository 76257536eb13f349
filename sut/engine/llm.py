"""The offline API: `LLM(model_path, **engine_settings).generate(prompts, SamplingParams(...))`."""

from contextlib import nullcontext
from pathlib import Path

from sut.engine.client import make_engine
from sut.errors import InvalidRequestError, WorkerError
from sut.outputs import RequestOutput
from sut.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | Path, **engine_settings):
        self.engine = make_engine(model, **engine_settings)  # several replicas with data_parallel_size > 1
        self.tokenizer = self.engine.tokenizer

    def generate(
        self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = False
    ) -> list[RequestOutput]:
        """Generate for a prompt or a list of prompts (text or token ids); outputs in input order.
        Every request is validated before any runs, so a bad one fails the call up front (an
        InvalidRequestError naming its index). A step that raises (other than a dead worker, which
        is fatal) gives the requests in flight error outputs and leaves the engine empty and usable,
        so one poisoned request cannot break the calls after it."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} sampling params")
        seqs = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params)):
            try:
                seqs.append(self.engine.make_sequence(prompt, params))
            except InvalidRequestError as e:
                raise InvalidRequestError(f"prompt {i} of {len(prompts)}: {e}") from None
        self.engine.submit(seqs)
        order = {seq.request_id: i for i, seq in enumerate(seqs)}
        results: list[RequestOutput | None] = [None] * len(seqs)
        if use_tqdm:
            from tqdm import tqdm  # here: sut imports with torch and numpy alone (gpu_check)

        with tqdm(total=len(seqs), desc="generate") if use_tqdm else nullcontext() as bar:
            while any(r is None for r in results):
                try:
                    outputs = self.engine.step()
                except WorkerError:
                    raise
                except Exception as e:  # noqa: BLE001 - answered in the outputs, and the engine goes on
                    outputs = self.engine.fail_all(f"engine step failed: {e!r}")
                for out in outputs:
                    if out.request_id in order:
                        results[order[out.request_id]] = out
                        if bar is not None:
                            bar.update(1)
        return results

    def kv_cache_stats(self) -> dict:
        return self.engine.kv_cache_stats()

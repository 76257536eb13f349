"""A request's life in the engine: its tokens, how many of them are in the KV cache, its blocks.

The scheduler alone changes this state (sut/engine/scheduler.py): it admits, preempts and finishes, and
after each step `update_from_output` advances the computed tokens and appends the sampled ones.
"""

from collections.abc import Callable
from enum import Enum, auto

import torch

from sut.clock import MACHINE
from sut.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(
        self,
        request_id,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_tokens: int,
        on_token: Callable[[int], None] | None = None,
        generator: torch.Generator | None = None,
        arrival_time: float | None = None,
    ):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.max_tokens = max_tokens  # params.max_tokens, capped by the model length
        self.on_token = on_token
        self.generator = generator
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        # Prefilling: computing the tokens it has (the prompt, or after a preemption the prompt and
        # what it produced) before it samples; then decoding, one new token per step.
        self.is_prefill = True
        self.block_table: list[int] = []
        self.block_row: int | None = None  # its row of BlockManager.block_tables while it holds blocks
        # With sliding-window layers beside full ones: their blocks, by position; the first
        # `window_freed` left the window and went back to the pool (-1).
        self.window_table: list[int] = []
        self.window_freed = 0
        self.block_hashes: list[int] = []  # prefix-cache hashes of its full, computed blocks
        self.num_preemptions = 0
        # Speculative decoding: the drafts proposed for its next step, the probabilities each was
        # sampled from ([k, vocab], None for deterministic drafts), the tokens whose K/V the draft
        # model's cache holds, and how many drafts to propose next (lowered by adaptive speculation).
        self.spec_token_ids: list[int] = []
        self.spec_probs: torch.Tensor | None = None
        self.draft_num_computed = 0
        self.num_spec_tokens: int | None = None
        # When it was added, on the engine's clock (sut/clock.py): its first token's wait starts here.
        self.arrival_time = MACHINE.now() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None  # on the same clock, when its first token came
        # Static batching: (reason, output length) once it has finished while its batch goes on.
        self.batch_done: tuple[str, int] | None = None
        self.finish_reason: str | None = None  # "stop", "length", "abort" or "error"
        self.error: str | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building the whole list (a decode needs one token)."""
        n_prompt = len(self.prompt_token_ids)
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def __repr__(self):
        return (
            f"Sequence({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )

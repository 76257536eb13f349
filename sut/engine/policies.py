"""What the scheduler asks, apart from its step loop: how requests are batched (continuous, or
static as the MLPerf reference SUTs batch) and how much prefill a step may carry under a TPOT
bound, from what recent steps cost."""

import statistics
from collections import deque

from sut.config import EngineConfig
from sut.sequence import Sequence

RECENT_STEPS = 5


class StepCosts:
    """What recent steps cost: the medians of the last RECENT_STEPS decode-only steps, and of those
    with a prefill chunk (their time, and the cost per prefill token beyond a decode step). A
    median, so that one slow step (a pause of the whole process) does not stand for the next."""

    def __init__(self):
        self.chunk_steps: deque[tuple[float, float]] = deque(maxlen=RECENT_STEPS)
        self.decode_steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self.chunk_step_s = 0.0
        self.prefill_token_s = 0.0
        self.decode_step_s = 0.0

    def record(self, prefill_tokens: int, seconds: float) -> None:
        if prefill_tokens:
            self.chunk_steps.append((seconds, max(seconds - self.decode_step_s, 0.0) / prefill_tokens or 1e-6))
            self.chunk_step_s = statistics.median(s for s, _ in self.chunk_steps)
            self.prefill_token_s = statistics.median(t for _, t in self.chunk_steps)
        else:
            self.decode_steps.append(seconds)
            self.decode_step_s = statistics.median(self.decode_steps)


class TpotGuard:
    """With `tpot_target_ms`: a step carries prefill only when every decoding sequence's time per
    output token stays under the target were the step to cost as much as a recent one with prefill
    and the sequence to end right after it; and then only as many prefill tokens as keep it so
    (the scheduler's docstring says why). With `tpot_cap_ms` and `ttft_patience_ms`, a prompt that
    has waited the patience for its first token raises the bound to the cap."""

    def __init__(self, config: EngineConfig, costs: StepCosts):
        self.target_s = config.tpot_target_ms / 1000
        self.cap_s = None if config.tpot_cap_ms is None else config.tpot_cap_ms / 1000
        self.patience_s = None if config.ttft_patience_ms is None else config.ttft_patience_ms / 1000
        self.costs = costs

    def prefill_budget(self, now: float, running: list[Sequence], waiting, unlimited: int) -> int:
        """Prefill tokens this step may carry, 0 to `unlimited` (`unlimited` when nothing bounds it)."""
        costs = self.costs
        if costs.prefill_token_s == 0.0:  # no step with prefill measured yet
            return unlimited
        bound = self.cap_s if self._prompt_waited_patience(now, running, waiting) else self.target_s
        slack = min(
            (
                bound * len(s.output_token_ids) - (now - s.first_token_time)
                for s in running
                if s.first_token_time is not None and not s.is_prefill
            ),
            default=None,
        )
        if slack is None:
            return unlimited
        if slack < costs.chunk_step_s:  # no chunk smaller than recent ones: small chunks cost more per token
            return 0
        # Never below 0: the medians are of different steps, so recent decode-only steps can cost more
        # than recent chunk steps (a loaded machine, decodes slower than the target), and a slack
        # between the two would give a negative count, which the scheduler took as a chunk of minus
        # that many tokens for a prefilling sequence (num_computed_tokens going backwards).
        return max(0, min(int((slack - costs.decode_step_s) / costs.prefill_token_s), unlimited))

    def _prompt_waited_patience(self, now: float, running, waiting) -> bool:
        if self.patience_s is None:
            return False
        return any(s.first_token_time is None and now - s.arrival_time >= self.patience_s for s in (*running, *waiting))


class ContinuousBatching:
    """Requests join and leave the batch at every step (the default)."""

    def __init__(self, chunked_prefill: bool = True):
        self.chunked_prefill = chunked_prefill

    def admits(self, running: list[Sequence]) -> bool:
        """Whether waiting requests may join this step."""
        return True

    def blocks_to_reserve(self, seq: Sequence, num_new_tokens: int) -> int:
        """Tokens to allocate KV blocks for when `seq` is admitted with `num_new_tokens` this step."""
        return num_new_tokens

    def holds_finished_rows(self) -> bool:
        """Whether a finished sequence stays in the batch, computing on, until its batch ends."""
        return False

    def end_batch(self, running: list[Sequence]) -> list[Sequence]:
        """The sequences whose batch ends now (to be finished by the scheduler)."""
        return []


class StaticBatching(ContinuousBatching):
    """The MLPerf reference SUTs' batching with transformers' generate, as a baseline: a batch of up
    to max_num_seqs whole prompts is admitted only when the last batch has ended, with KV blocks for
    every row's prompt and max_tokens reserved up front (generate's padded tensors), and a row that
    finishes computes on (its tokens discarded) until every row of its batch has, when all are
    returned together. Prompts are not padded: the prefill is variable-length either way."""

    def __init__(self):
        super().__init__(chunked_prefill=False)

    def admits(self, running: list[Sequence]) -> bool:
        return not running

    def blocks_to_reserve(self, seq: Sequence, num_new_tokens: int) -> int:
        return num_new_tokens + seq.max_tokens - len(seq.output_token_ids)

    def holds_finished_rows(self) -> bool:
        return True

    def end_batch(self, running: list[Sequence]) -> list[Sequence]:
        return list(running) if running and all(s.batch_done for s in running) else []


def batching_policy(config: EngineConfig) -> ContinuousBatching:
    if config.static_batching:
        return StaticBatching()
    return ContinuousBatching(config.enable_chunked_prefill)

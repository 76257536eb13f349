"""Iteration-level scheduling: every step mixes decodes and prefill chunks under a token budget,
and the scheduler alone moves sequences along (`update_from_output` after each step).

Each running sequence wants its uncomputed tokens computed: one for a decode, the rest of the
prompt for a prefill (cut to the budget, so long prompts go in chunks). Decodes go first, then
unfinished prefills, then waiting requests are admitted. When the KV pool runs out, the most
recently admitted sequence is preempted: its blocks are freed and it is recomputed later from
its prompt and the tokens it already produced, so its output does not change.

A step that carries a prefill chunk costs far more than a decode step, and every sequence
decoding meanwhile waits for it. With a `tpot_target_ms`, a step carries prefill only when every
decoding sequence's time per output token (since its first token) stays under the target were the
step to cost as much as a recent one with prefill and the sequence to end right after it; and then
only as many prefill tokens as keep it so, at the recent chunks' cost per token. Young decodes first
bank the slack that a chunk uses up, and chunks do not shrink step by step (small ones cost more
per token). The costs are medians of the last RECENT_STEPS steps of each kind: after one slow step
(a pause of the whole process) the last one alone would hold prefill back until a decode had banked
that step's time. That bounds every request's TPOT, under bursts of arrivals too, and otherwise
lets prefill through at once (the Server setting). The bound is loose (most sequences go on after
the step and pay it back), so with `tpot_cap_ms` and `ttft_patience_ms` a prompt that has waited
the patience for its first token raises it to the cap: in a burst the oldest prompts then get
through before their TTFT limit, at the decodes' slack.

With speculative decoding, a decoding sequence carries the drafts proposed for it (`propose`, at the
start of a step) and computes its last token and the drafts in one go, all counted against the
budget (a sequence whose drafts do not fit waits a step rather than drop them, so what it emits does
not depend on what else is in the batch); `update_from_output` keeps the verified prefix of them
and sets the computed tokens back past the rejected ones. Prefilling sequences do not speculate.

Two settings take features away, for the report's ablation (harness/ablation.py). Without
`enable_chunked_prefill` a prompt is computed whole in one step or waits for a step with room.
`static_batching` batches as the MLPerf reference SUTs do with transformers' generate: a batch of
up to max_num_seqs whole prompts is admitted only when the last batch has ended, with KV blocks for
every row's prompt and max_tokens reserved up front (generate's padded tensors), and a row that
finishes computes on (its tokens discarded) until every row of its batch has, when all are
returned together. Prompts are not padded: the prefill is variable-length either way.
"""

import statistics
from collections import deque

from sut.batch import ScheduledBatch
from sut.config import EngineConfig
from sut.engine.block_manager import BlockManager
from sut.sample.sampler import NONFINITE_LOGITS
from sut.sequence import Sequence, SequenceStatus
from sut.spec_decode.metrics import SpecMetrics

RECENT_STEPS = 5


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_token_ids: tuple[int, ...] = ()):
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.static_batching = config.static_batching
        self.chunked_prefill = config.enable_chunked_prefill and not config.static_batching
        self.tpot_target_s = None if config.tpot_target_ms is None else config.tpot_target_ms / 1000
        self.tpot_cap_s = None if config.tpot_cap_ms is None else config.tpot_cap_ms / 1000
        self.ttft_patience_s = None if config.ttft_patience_ms is None else config.ttft_patience_ms / 1000
        # Recent steps with a chunk, as (seconds, cost per prefill token beyond a decode step), and
        # decode-only ones; the medians of each are what a step is predicted to cost.
        self.chunk_steps: deque[tuple[float, float]] = deque(maxlen=RECENT_STEPS)
        self.decode_steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self.chunk_step_s = 0.0
        self.prefill_token_s = 0.0
        self.decode_step_s = 0.0
        self.busy_s = {"prefill": 0.0, "decode": 0.0}
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0
        self.peak_blocks_used = 0
        self.tokens_at_peak = 0
        spec = config.speculative_config
        self.num_spec_tokens = spec.num_speculative_tokens if spec else 0
        self.adaptive_spec = bool(spec and spec.adaptive)
        self.spec_metrics = SpecMetrics(self.num_spec_tokens) if spec else None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float = 0.0) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        batch_open = not (self.static_batching and self.running)
        scheduled: dict[Sequence, int] = {}
        preempted = False
        prefill_left = self._prefill_budget(now)
        # Decodes first, those without drafts before those verifying some: the attention kernels take
        # a step's leading one-token rows on the decode kernel (kernels/attention.py).
        for seq in sorted(self.running, key=lambda s: (s.is_prefill, bool(s.spec_token_ids))):
            prefill = seq.is_prefill
            if budget == 0 or (prefill and prefill_left == 0):
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            if seq.batch_done and len(seq.output_token_ids) >= seq.max_tokens:
                continue  # finished, and its batch's reserved blocks end here
            n = min(seq.num_uncomputed_tokens, budget, prefill_left) if prefill else 1 + len(seq.spec_token_ids)
            if n > budget or (prefill and not self.chunked_prefill and n < seq.num_uncomputed_tokens):
                continue  # its drafts, or its whole prompt without chunking, do not fit: it waits a step
            while not self.block_manager.allocate(seq, n):
                victim = self.running[-1]
                budget += scheduled.pop(victim, 0)
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status == SequenceStatus.RUNNING:
                scheduled[seq] = n
                budget -= n
                prefill_left -= n if prefill else 0
        # Admit waiting requests only when nothing was preempted: there is room to spare (with static
        # batching, only when the last batch has ended: `running` is this batch).
        admit = not preempted and batch_open
        while admit and prefill_left > 0 and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            seq.num_computed_tokens = self.block_manager.match_prefix(seq)
            n = min(seq.num_uncomputed_tokens, budget, prefill_left)
            if not self.chunked_prefill and n < seq.num_uncomputed_tokens:
                break
            reserve = n + (seq.max_tokens - len(seq.output_token_ids) if self.static_batching else 0)
            if not self.block_manager.allocate(seq, reserve):
                self._release(seq)
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled[seq] = n
            budget -= n
            prefill_left -= n
        self._track_peak(scheduled)
        is_prefill = [s.is_prefill for s in scheduled]
        num_draft = [len(s.spec_token_ids) for s in scheduled]
        # A decode samples (after each of its drafts too); a prefill chunk samples when it reaches
        # the sequence's last token.
        num_logits = [
            1 + d if not p else int(s.num_computed_tokens + n == s.num_tokens)
            for (s, n), p, d in zip(scheduled.items(), is_prefill, num_draft)
        ]
        return ScheduledBatch(
            list(scheduled),
            list(scheduled.values()),
            is_prefill,
            num_logits,
            num_draft,
            self.block_manager.block_tables,
        )

    def propose(self, proposer) -> None:
        """Ask `proposer` for drafts for the decoding sequences that have none, up to k each (fewer
        near max_tokens, and per sequence with adaptive speculation), after reserving their slots:
        the verification's k + 1 (which the draft model also writes into). A sequence whose slots
        are not free gets no drafts (nothing is preempted for speculation)."""
        seqs, counts = [], []
        for seq in self.running:
            if seq.is_prefill or seq.spec_token_ids:
                continue
            k = min(seq.num_spec_tokens or self.num_spec_tokens, seq.max_tokens - len(seq.output_token_ids) - 1)
            if k > 0 and self.block_manager.allocate(seq, 1 + k):
                seqs.append(seq)
                counts.append(k)
        if not seqs:
            return
        for seq, (tokens, probs) in zip(seqs, proposer.propose(seqs, counts, self.block_manager.block_tables)):
            seq.spec_token_ids, seq.spec_probs = tokens, probs

    def update_from_output(self, batch: ScheduledBatch, sampled: list[list[int]], now: float) -> list[Sequence]:
        """After the step's forward: advance each sequence's computed tokens (past the drafts it
        accepted, not the rejected ones), append the tokens it emitted (`sampled`: a list per sequence
        with logits, in batch order: its accepted drafts, then one token of the target's; None where
        its logits were NaN or inf, which fails it alone) up to a stop, call their `on_token`, cache
        its full verified blocks and apply the stop rules; return the sequences that finished."""
        finished: list[Sequence] = []
        outputs = iter(sampled)
        cache_blocks = self.block_manager.enable_prefix_caching
        for seq, n, k, prefill, d in zip(
            batch.seqs, batch.num_new_tokens, batch.num_logits, batch.is_prefill, batch.num_draft
        ):
            if not k:
                seq.num_computed_tokens += n
                if cache_blocks:
                    self.block_manager.cache_computed_blocks(seq)
                continue
            tokens = next(outputs)
            if seq.batch_done:  # static batching: finished, computing on until its batch has
                seq.output_token_ids += [0] if tokens is None else tokens  # dropped at the batch's end: any will do
                seq.num_computed_tokens += n
                continue
            if tokens is None:  # the sampler found its logits NaN or inf
                seq.error = NONFINITE_LOGITS
                self.finish(seq, "error")
                finished.append(seq)
                continue
            if d:
                accepted = len(tokens) - 1
                self.spec_metrics.record(d, accepted)
                if self.adaptive_spec:  # one more after a full run, else just past what was accepted
                    seq.num_spec_tokens = min(self.num_spec_tokens, d + 1 if accepted == d else accepted + 1)
                seq.spec_token_ids, seq.spec_probs = [], None
            seq.num_computed_tokens += n - d + len(tokens) - 1
            if prefill:  # its last prompt (or recomputed) token: it decodes from now on
                seq.is_prefill = False
            reason = None
            for token in tokens:
                reason = self._append_token(seq, token, now)
                if reason:
                    break
            # K/V exist for every token but the last emitted one (fewer when a stop cut the run short).
            seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens - 1)
            if cache_blocks:
                self.block_manager.cache_computed_blocks(seq)
            if reason and self.static_batching:
                seq.batch_done = (reason, len(seq.output_token_ids))
            elif reason:
                self.finish(seq, reason)
                finished.append(seq)
        return finished + self.end_static_batch()

    def end_static_batch(self) -> list[Sequence]:
        """Static batching: once every row of the batch has finished, finish them all, each cut where
        it finished (also called after aborts, which can leave only finished rows)."""
        if not (self.static_batching and self.running and all(s.batch_done for s in self.running)):
            return []
        ended = list(self.running)
        for seq in ended:
            reason, length = seq.batch_done
            del seq.output_token_ids[length:]
            self.finish(seq, reason)
        return ended

    def _append_token(self, seq: Sequence, token: int, now: float) -> str | None:
        """Append one emitted token; return the reason it finishes the sequence, if it does."""
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.output_token_ids.append(token)
        if seq.on_token is not None:
            try:
                seq.on_token(token)
            except Exception as e:  # the callback's failure ends its own request only
                seq.error = f"on_token callback raised {e!r}"
                return "error"
        p = seq.params
        if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= seq.max_tokens:
            return "length"
        return None

    def _prefill_budget(self, now: float) -> int:
        """How many prefill tokens this step may carry without pushing a decoding sequence's time
        per output token past the bound, were it to end right after the step."""
        unlimited = self.max_num_batched_tokens
        if self.tpot_target_s is None or self.prefill_token_s == 0.0:
            return unlimited
        bound = self.tpot_cap_s if self._prompt_waited_patience(now) else self.tpot_target_s
        slack = min(
            (
                bound * len(s.output_token_ids) - (now - s.first_token_time)
                for s in self.running
                if s.first_token_time is not None and not s.is_prefill
            ),
            default=None,
        )
        if slack is None:
            return unlimited
        if slack < self.chunk_step_s:  # no chunk smaller than recent ones: small chunks cost more per token
            return 0
        return min(int((slack - self.decode_step_s) / self.prefill_token_s), unlimited)

    def _prompt_waited_patience(self, now: float) -> bool:
        if self.ttft_patience_s is None:
            return False
        return any(
            s.first_token_time is None and now - s.arrival_time >= self.ttft_patience_s
            for s in (*self.running, *self.waiting)
        )

    def record_step(self, batch: ScheduledBatch, seconds: float) -> None:
        """Called by the engine after each step with its duration. `busy_s` splits the steps' time
        between prefill and decode: a step with both gives its decodes what a decode-only step costs
        now (the median of recent ones), its prefill the rest."""
        prefill = sum(n for n, is_prefill in zip(batch.num_new_tokens, batch.is_prefill) if is_prefill)
        if not prefill:
            decode = seconds
        elif all(batch.is_prefill):
            decode = 0.0
        else:
            decode = min(seconds, self.decode_step_s)
        self.busy_s["decode"] += decode
        self.busy_s["prefill"] += seconds - decode
        if prefill:
            self.chunk_steps.append((seconds, max(seconds - self.decode_step_s, 0.0) / prefill or 1e-6))
            self.chunk_step_s = statistics.median(s for s, _ in self.chunk_steps)
            self.prefill_token_s = statistics.median(t for _, t in self.chunk_steps)
        else:
            self.decode_steps.append(seconds)
            self.decode_step_s = statistics.median(self.decode_steps)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _release(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.is_prefill = True
        seq.spec_token_ids, seq.spec_probs, seq.draft_num_computed = [], None, 0

    def _track_peak(self, scheduled: dict[Sequence, int]) -> None:
        used = self.block_manager.num_blocks - self.block_manager.num_free_blocks
        if used > self.peak_blocks_used:
            self.peak_blocks_used = used
            self.tokens_at_peak = sum(s.num_computed_tokens + scheduled.get(s, 0) for s in self.running)

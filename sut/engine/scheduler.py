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

Two settings take features away, for the report's ablation (harness/measure/ablation.py). Without
`enable_chunked_prefill` a prompt is computed whole in one step or waits for a step with room.
`static_batching` batches as the MLPerf reference SUTs do with transformers' generate. How requests
are batched and the TPOT bound are policies the scheduler asks (sut/engine/policies.py); drafts
are proposed by the engine for the sequences the scheduler reserves slots for (`reserve_drafts`).
"""

from collections import deque
from collections.abc import Callable

from sut.batch import ScheduledBatch
from sut.config import EngineConfig
from sut.engine.block_manager import BlockManager
from sut.engine.policies import StepCosts, TpotGuard, batching_policy
from sut.engine.profile import step_terms
from sut.sample.sampler import NONFINITE_LOGITS
from sut.sequence import Sequence, SequenceStatus
from sut.spec_decode.metrics import SpecMetrics


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_token_ids: tuple[int, ...] = ()):
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.batching = batching_policy(config)
        self.costs = StepCosts()
        self.tpot_guard = TpotGuard(config, self.costs) if config.tpot_target_ms is not None else None
        self.step_log: list | None = None  # where set, each step's terms and seconds (harness/run.py's steps.json)
        self.busy_s = {"prefill": 0.0, "decode": 0.0}
        # What the steps did, for the report's hardware bound (harness/measure/roofline.py): steps, tokens
        # computed, and tokens attended (each row's context through its last new token: the K/V it reads).
        self.work = {"steps": 0, "tokens": 0, "attended_tokens": 0}
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
        # Disaggregated serving's prefill side (sut/engine/disaggregated.py): called with a sequence that
        # reached its max_tokens, before its blocks go, to copy out their K/V for a decode worker.
        self.kv_export: Callable[[Sequence], None] | None = None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit_prefilled(self, seq: Sequence) -> None:
        """Disaggregated serving's decode side: a sequence whose prompt's K/V another engine computed
        and this one's blocks now hold (`num_computed_tokens` of them), with its first token: it
        decodes from the next step on, as if this scheduler had prefilled it."""
        seq.status = SequenceStatus.RUNNING
        seq.is_prefill = False
        self.running.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float = 0.0) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        batch_open = self.batching.admits(self.running)
        chunked = self.batching.chunked_prefill
        scheduled: dict[Sequence, int] = {}
        preempted = False
        prefill_left = budget
        if self.tpot_guard is not None:
            prefill_left = self.tpot_guard.prefill_budget(now, self.running, self.waiting, budget)
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
            if n > budget or (prefill and not chunked and n < seq.num_uncomputed_tokens):
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
            if not chunked and n < seq.num_uncomputed_tokens:
                break
            if not self.block_manager.allocate(seq, self.batching.blocks_to_reserve(seq, n)):
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
            self.block_manager.window_tables,
        )

    def reserve_drafts(self) -> tuple[list[Sequence], list[int]]:
        """The decoding sequences that have no drafts, and how many each may get: up to k (fewer near
        max_tokens, and per sequence with adaptive speculation), after reserving their slots, the
        verification's k + 1 (which the draft model also writes into). A sequence whose slots are
        not free gets no drafts (nothing is preempted for speculation). The engine has them
        proposed before the step is scheduled."""
        seqs, counts = [], []
        for seq in self.running:
            if seq.is_prefill or seq.spec_token_ids:
                continue
            k = min(seq.num_spec_tokens or self.num_spec_tokens, seq.max_tokens - len(seq.output_token_ids) - 1)
            if k > 0 and self.block_manager.allocate(seq, 1 + k):
                seqs.append(seq)
                counts.append(k)
        return seqs, counts

    def update_from_output(self, batch: ScheduledBatch, sampled: list[list[int]], now: float) -> list[Sequence]:
        """After the step's forward: advance each sequence's computed tokens (past the drafts it
        accepted, not the rejected ones), append the tokens it emitted (`sampled`: a list per sequence
        with logits, in batch order: its accepted drafts, then one token of the target's; None where
        its logits were NaN or inf, which fails it alone) up to a stop, call their `on_token`, cache
        its full verified blocks and apply the stop rules; return the sequences that finished."""
        finished: list[Sequence] = []
        outputs = iter(sampled)
        cache_blocks = self.block_manager.enable_prefix_caching
        # Window layers' blocks go back as soon as the window has moved past them.
        windowed = self.block_manager.sliding_window is not None
        for seq, n, k, prefill, d in zip(
            batch.seqs, batch.num_new_tokens, batch.num_logits, batch.is_prefill, batch.num_draft
        ):
            if not k:
                seq.num_computed_tokens += n
                if cache_blocks:
                    self.block_manager.cache_computed_blocks(seq)
                if windowed:
                    self.block_manager.release_window_blocks(seq)
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
            if windowed and seq.block_table:
                self.block_manager.release_window_blocks(seq)
            if reason and self.batching.holds_finished_rows():
                seq.batch_done = (reason, len(seq.output_token_ids))
            elif reason:
                self.finish(seq, reason)
                finished.append(seq)
        return finished + self.end_batch()

    def end_batch(self) -> list[Sequence]:
        """Finish the sequences whose batch the batching policy ends now (static batching: once every
        row has finished, each cut where it finished; also called after aborts, which can leave only
        finished rows)."""
        ended = self.batching.end_batch(self.running)
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
            decode = min(seconds, self.costs.decode_step_s)
        self.busy_s["decode"] += decode
        self.busy_s["prefill"] += seconds - decode
        self.work["steps"] += 1
        self.work["tokens"] += sum(batch.num_new_tokens)
        self.work["attended_tokens"] += sum(s.num_computed_tokens + n for s, n in zip(batch.seqs, batch.num_new_tokens))
        self.costs.record(prefill, seconds)
        if self.step_log is not None:
            self.step_log.append((step_terms(batch), seconds))

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
        if reason == "length" and self.kv_export is not None:
            self.kv_export(seq)
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

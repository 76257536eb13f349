"""The online engine: requests come in with `add_request` (from any thread), `step` runs one
iteration and returns the requests that finished in it: schedule (with speculation, drafts proposed
first for the sequences the scheduler reserved slots for), execute (the runner prepares the step
input, runs the forward and samples or verifies) and update (the scheduler moves each sequence on).

A bad request is refused in `add_request` with an InvalidRequestError; a request whose token
callback raises, or whose logits come out NaN or inf, is finished alone with an error; none of
these disturbs the others.
"""

import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from sut.clock import MACHINE, Clock
from sut.config import EngineConfig
from sut.config.resolved import ResolvedConfig
from sut.engine.block_manager import BlockManager
from sut.engine.processes import WorkerGroup
from sut.engine.requests import load_tokenizer, make_sequence
from sut.engine.resolve import resolve
from sut.engine.scheduler import Scheduler
from sut.errors import ConfigError, InvalidRequestError, WorkerError
from sut.outputs import RequestOutput
from sut.parallel import Shard, TorchrunGroup, broadcast, free_port, init_group, torchrun_group
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence
from sut.spec_decode.factory import make_proposer
from sut.worker.model_runner import ModelRunner
from sut.worker.tp_worker import worker_main


class LLMEngine:
    clock: Clock = MACHINE  # what the step loop and arrivals read (a test may give a VirtualClock)

    def __init__(self, model_path: str | Path, **settings):
        config = EngineConfig.from_kwargs(**settings)
        if config.data_parallel_size > 1 or config.disaggregation is not None:
            raise ConfigError(
                "engine settings data_parallel_size > 1 and disaggregation run several engines: use "
                "sut.make_engine (or LLM), which starts them"
            )
        self._start(resolve(model_path, config))

    @classmethod
    def from_resolved(cls, resolved: ResolvedConfig) -> "LLMEngine":
        """An engine from settings already resolved (a data-parallel replica's, by its pool)."""
        engine = cls.__new__(cls)
        engine._start(resolved)
        return engine

    def _start(self, resolved: ResolvedConfig) -> None:
        self.config, self.model_config, mc = resolved.engine, resolved.model, resolved.model
        self.max_model_len, self.dtype = resolved.max_model_len, resolved.dtype
        self.device = torch.device(resolved.device)
        self.tokenizer = load_tokenizer(resolved.folder)
        self.eos_token_ids = mc.eos_token_ids
        draft = resolved.draft
        self.ranks, shard = self._start_ranks(resolved)
        try:
            self.runner = ModelRunner(
                resolved.folder,
                mc,
                self.config,
                self.max_model_len,
                self.dtype,
                self.device,
                draft=None if draft is None else (draft.config, draft.weight_bytes),
                shard=shard,
            )
            if shard is not None:  # the other ranks size their caches as this one, then say what they hold
                broadcast(self.runner.num_blocks)
                self.rank_weight_bytes = [None] * shard.size
                dist.all_gather_object(self.rank_weight_bytes, self.runner.weight_bytes)
        except BaseException:
            self.close()
            raise
        self.kv_export = None  # set_kv_export's, kept across resets
        self._reset_scheduling()
        self.default_generator = torch.Generator().manual_seed(self.config.seed)
        self.proposer = make_proposer(resolved, self.runner, self.device, self.default_generator)
        # An EAGLE3 head or the MTP module reads the target's hidden states at these layer boundaries:
        # the steps return them, and the proposer observes them after each update.
        self.aux_layers: tuple[int, ...] = getattr(self.proposer, "aux_layers", ())
        # Sample through the verifier (a sequence with no drafts too), as a speculating engine does; a
        # disaggregated prefill worker of a speculating pool sets it, so its first tokens draw as that.
        self.verify_drafts = self.proposer is not None
        self._lock = threading.Lock()
        self._inbox: list[tuple[str, object]] = []  # ("add", Sequence) or ("abort", request_id)
        self._live: dict[object, Sequence] = {}  # request_id -> its sequence, until finished
        self._next_id = itertools.count()

    def _start_ranks(self, resolved: ResolvedConfig):
        """With tensor_parallel_size > 1: the other ranks' processes, and this one's shard (rank 0);
        under torchrun (sut/worker/torchrun_entry.py) the ranks it started, told to build this engine."""
        size = self.config.tensor_parallel_size
        if size == 1:
            return None, None
        group = torchrun_group()
        if group is not None:  # resolve() checked that this is rank 0 of `size` ranks
            self.device = group.device(self.device.type)
            group.start_engine(resolved)
            return group, Shard(0, size)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", 0)  # rank r runs on the r-th visible GPU
        elif hasattr(os, "sched_getaffinity"):
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // size))
        port = free_port()
        ranks = WorkerGroup(
            worker_main,
            [(r, size, port, resolved, self.device.type) for r in range(1, size)],
            [f"tensor-parallel rank {r}" for r in range(1, size)],
        )
        try:
            ranks.wait_started()  # before joining the group, which would wait a minute for a dead rank
            init_group(0, size, port, self.device)
        except BaseException:
            ranks.stop()
            raise
        return ranks, Shard(0, size)

    def reset(self) -> None:
        """Between timed runs on one engine (harness/run_worker.py): nothing cached, counted or timed,
        as after warmup(), so that each run's figures are its own."""
        if self.has_unfinished():
            raise ConfigError("reset() runs on an idle engine, between runs")
        self._reset_scheduling()

    def _reset_scheduling(self) -> None:
        """A block manager and scheduler with nothing cached, counted or timed."""
        self.block_manager = BlockManager(
            self.runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching, self.runner.kv_window
        )
        self.scheduler = Scheduler(self.config, self.block_manager, self.eos_token_ids)
        self.scheduler.kv_export = self.kv_export

    def set_kv_export(self, export: Callable[[Sequence], None] | None) -> None:
        """Disaggregated serving's prefill side: `export(seq)` is called when a sequence reaches its
        max_tokens, before its blocks are freed (Scheduler.kv_export)."""
        self.kv_export = self.scheduler.kv_export = export

    def add_prefilled(self, seq: Sequence) -> None:
        """Disaggregated serving's decode side, from the thread that steps the engine: `seq` holds
        blocks of this engine's pool with its prompt's K/V in them (`num_computed_tokens`) and its
        first token in `output_token_ids`; it decodes from the next step on."""
        with self._lock:
            if seq.request_id in self._live:
                raise InvalidRequestError(f"request id {seq.request_id!r} is already in use")
            self._live[seq.request_id] = seq
        self.scheduler.admit_prefilled(seq)

    def warmup(self) -> float:
        """Run, before a timed run starts, what its steps will run for the first time: a prompt alone
        (batch 1), then prompts that fill steps to the token budget in chunks beside decodes (mixed
        steps) and decode together, greedy and sampled, speculating where the engine does; on CUDA
        also the decode kernel at every split count. Triton compiles each kernel variant on first use
        (seconds each) and the CPU backend's GEMMs pack and fault their weights in; here, not in the
        first queries. Leaves nothing cached, counted or timed; returns the seconds it took."""
        if self.has_unfinished():
            raise ConfigError("warmup() runs on an idle engine, before requests arrive")
        start = time.perf_counter()
        vocab, budget = self.model_config.vocab_size, self.config.max_num_batched_tokens
        longest = max(1, min(self.max_model_len - 8, budget + budget // 2))  # two chunks
        lengths = [7, longest] + [1 + (13 * i) % 48 for i in range(max(0, min(self.config.max_num_seqs, 16) - 2))]
        prompts = [[(31 * i + 7 * j + 1) % vocab for j in range(n)] for i, n in enumerate(lengths)]
        params = [
            SamplingParams(max_tokens=6, ignore_eos=True, **({} if i % 2 else {"temperature": 1.0, "seed": i}))
            for i in range(len(prompts))
        ]
        for group in ([0], range(1, len(prompts))):
            self.submit([self.make_sequence(prompts[i], params[i]) for i in group])
            while self.has_unfinished():
                self.step()
        self.runner.warmup_kernels()
        self._reset_scheduling()
        return time.perf_counter() - start

    # ---- requests -------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id=None,
        on_token: Callable[[int], None] | None = None,
    ):
        """Queue a request; return its id. `on_token(token_id)` is called as each token is sampled."""
        seq = self.make_sequence(prompt, params, request_id, on_token)
        self.submit([seq])
        return seq.request_id

    def make_sequence(self, prompt, params=None, request_id=None, on_token=None) -> Sequence:
        """Validate a request and build its sequence without queueing it."""
        if request_id is None:
            request_id = next(self._next_id)
        return make_sequence(
            prompt,
            params,
            request_id,
            on_token,
            self.tokenizer,
            self.model_config.vocab_size,
            self.max_model_len,
            self.clock.now(),
        )

    def submit(self, seqs: list[Sequence]) -> None:
        with self._lock:
            for seq in seqs:
                if seq.request_id in self._live:
                    raise InvalidRequestError(f"request id {seq.request_id!r} is already in use")
            for seq in seqs:
                self._live[seq.request_id] = seq
                self._inbox.append(("add", seq))

    def abort(self, request_id) -> None:
        with self._lock:
            self._inbox.append(("abort", request_id))

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._inbox) or self.scheduler.has_unfinished()

    # ---- the step loop --------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        finished = self._take_inbox()
        finished += self.scheduler.end_batch()
        start = self.clock.now()
        if self.proposer is not None:
            self._propose_drafts()
        batch = self.scheduler.schedule(start)
        if batch:
            # An EAGLE3 or MTP head is handed the step's hidden states after the update (the positions kept).
            starts = [s.num_computed_tokens for s in batch.seqs] if self.aux_layers else None
            sampled, aux = self._execute(batch)
            now = self.clock.now()
            self.scheduler.record_step(batch, now - start)
            finished += self.scheduler.update_from_output(batch, sampled, now)
            if aux is not None:
                self.proposer.observe(batch.seqs, starts, batch.num_new_tokens, aux)
        return [self._output(seq) for seq in self._forget(finished)]

    def _propose_drafts(self) -> None:
        """Drafts for the decoding sequences the scheduler reserved verification slots for."""
        seqs, counts = self.scheduler.reserve_drafts()
        if seqs:
            for seq, (tokens, probs) in zip(seqs, self.proposer.propose(seqs, counts, self.block_manager.block_tables)):
                seq.spec_token_ids, seq.spec_probs = tokens, probs

    def _execute(self, batch) -> tuple[list[list[int] | None], torch.Tensor | None]:
        """The step's forward and sampling, on the runner (and the other tensor-parallel ranks): the
        tokens each sequence emits, and the hidden states at `aux_layers` where the proposer reads them."""
        try:
            step = self.runner.prepare(batch)
            if self.aux_layers:
                logits, aux = self.runner.execute(step, self.aux_layers)
            else:
                logits, aux = self.runner.execute(step), None
        except RuntimeError as e:  # a collective fails when a rank has gone
            dead = self.ranks is not None and self.ranks.dead(grace_s=2.0)
            if dead:
                raise WorkerError(dead) from e
            raise
        sampled = self.runner.sample(
            logits, batch, self.eos_token_ids, self.default_generator, verify_drafts=self.verify_drafts
        )
        return sampled, aux

    def _take_inbox(self) -> list[Sequence]:
        """Hand new requests to the scheduler and abort the ones asked; return those aborted."""
        aborted: list[Sequence] = []
        with self._lock:
            inbox, self._inbox = self._inbox, []
        for kind, item in inbox:
            if kind == "add":
                self.scheduler.add(item)
            else:
                seq = self._live.get(item)
                if seq is not None and not seq.is_finished:
                    self.scheduler.finish(seq, "abort")
                    aborted.append(seq)
        return aborted

    def _forget(self, finished: list[Sequence]) -> list[Sequence]:
        with self._lock:
            for seq in finished:
                self._live.pop(seq.request_id, None)
        return finished

    def fail_all(self, error: str) -> list[RequestOutput]:
        """Finish every unfinished request with `error` (after a step raised): callers get an
        answer for each instead of waiting forever, and the engine is empty and usable again."""
        with self._lock:
            inbox, self._inbox = self._inbox, []
            # Those that finished (or were aborted) in the step that raised, before it returned them.
            finished = [seq for seq in self._live.values() if seq.is_finished]
        for kind, item in inbox:  # queued requests join the scheduler's waiting list, then fail with it
            if kind == "add":
                self.scheduler.add(item)
        for seq in self.scheduler.running + list(self.scheduler.waiting):
            seq.error = error
            self.scheduler.finish(seq, "error")
            finished.append(seq)
        return [self._output(seq) for seq in self._forget(finished)]

    def _output(self, seq: Sequence) -> RequestOutput:
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        return RequestOutput(
            seq.request_id,
            seq.prompt_token_ids,
            list(seq.output_token_ids),
            text,
            seq.finish_reason,
            seq.error,
            seq.num_preemptions,
        )

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any, and wait for them (killing one that does not
        stop): none is left behind."""
        ranks = getattr(self, "ranks", None)
        if ranks is None:
            return
        if isinstance(ranks, TorchrunGroup):  # torchrun's: they wait for the next engine, in the group
            ranks.end_engine()
            return
        n = len(ranks.procs)
        ranks.stop(ask=lambda alive: broadcast(None) if len(alive) == n and dist.is_initialized() else None)
        if dist.is_initialized():
            dist.destroy_process_group()

    def spec_stats(self) -> dict | None:
        """Speculative decoding's counts and rates (sut/spec_decode/metrics.py), with the method; None when
        the engine does not speculate."""
        spec = self.config.speculative_config
        if spec is None:
            return None
        return {
            "method": spec.method,
            "description": spec.describe(),
            "num_speculative_tokens": spec.num_speculative_tokens,
            "adaptive": spec.adaptive,
            **self.scheduler.spec_metrics.summary(),
        }

    def busy_stats(self) -> dict:
        """Seconds the steps took since the engine started (or warmed up), split between prefill and
        decode (Scheduler.record_step says how), what they did (Scheduler.work), and the least they had
        to move and compute for it (harness/measure/roofline.py): the weights read once per step, each attended
        token's K/V read once, the linears' FLOPs per token; a tensor-parallel engine's over its ranks."""
        work, r = self.scheduler.work, self.runner
        ranks = len(self.rank_weight_bytes) if self.runner.shard is not None else 1
        return {
            **{f"{kind}_s": seconds for kind, seconds in self.scheduler.busy_s.items()},
            **work,
            "min_bytes_read": ranks
            * (work["steps"] * r.weight_bytes_read + work["attended_tokens"] * r.bytes_per_block // r.block_size),
            "min_flops": ranks * work["tokens"] * r.flops_per_token,
        }

    def kv_cache_stats(self) -> dict:
        return {
            "block_size": self.config.block_size,
            "num_blocks": self.block_manager.num_blocks,
            "peak_blocks_used": self.scheduler.peak_blocks_used,
            "tokens_at_peak": self.scheduler.tokens_at_peak,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_prefix_hit_tokens": self.block_manager.num_prefix_hit_tokens,
        }

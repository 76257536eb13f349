"""A LoadGen Server (or Interactive) run in virtual time: the engine's own Scheduler, BlockManager
and policies (the TPOT guard, static or continuous batching, chunked prefill, preemption, prefix
caching, the slots speculation reserves) step on a virtual clock, each step lasting what the
step-cost model says it costs; queries arrive on LoadGen's own schedule (loadgen_schedule.py) and
each emits as many tokens as the model produces for its sample (an accuracy run's log), then the run
is judged by LoadGen's rules (verdict.py). The step loop is the engine's (sut/engine/llm_engine.py
`step`) without a forward.

A layout is one engine, data-parallel replicas (each request to the replica with the least
outstanding prompt + max_tokens, as sut/engine/replicas.py routes), or disaggregated prefill and
decode workers (to the prefill worker with the fewest prompt tokens queued and the decode worker
with the most free blocks less those on their way, the prompt's blocks moved in what the measured
transfer costs, admitted in the order handed when blocks and a running slot allow, as
sut/engine/disaggregated.py does). Every worker steps on its own: the run is a sequence of events
(an arrival, a step's end, a transfer's arrival) in time order. A speculating worker's drafts are
accepted position by position at the rates measured on the dataset (the output, and so its
length, is the same as without: the verifier is exact)."""

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from harness.predict.loadgen_schedule import server_schedule
from harness.predict.step_costs import StepCostModel
from harness.predict.verdict import server_result
from sut.config import EngineConfig
from sut.engine.block_manager import BlockManager
from sut.engine.profile import step_terms
from sut.engine.scheduler import Scheduler
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence

EOS, TOKEN = 0, 1  # what a simulated sequence emits: TOKEN until its sample's length, then EOS
DRAW_SEED = 0  # the acceptance draws': the same run twice is the same run
# Which sample each query carries is LoadGen's draw, not reproduced (its order goes through
# libstdc++'s shuffle and uniform_int_distribution, not matched to a LoadGen trace here). A p99 of
# 100 queries is nearly their slowest, and which samples come when moves it by 2x (continuous
# batching at 3.7 QPS: 53-118 ms over five draws, the run's own 65): each rate is simulated with
# this many uniform draws, and meets the limits where most of them do.
SAMPLE_DRAWS = 5


@dataclass
class Workload:
    """The samples a run draws from: each one's prompt and how many tokens the model answers it with."""

    prompts: list[list[int]]
    output_lengths: list[int]

    def __post_init__(self):
        if len(self.prompts) != len(self.output_lengths) or not self.prompts:
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.output_lengths)} output lengths")


@dataclass
class Engine:
    """What of an engine the simulation needs: its settings, KV pool and step costs."""

    config: EngineConfig
    num_blocks: int
    costs: StepCostModel
    max_tokens: int  # the benchmark's cap on an answer
    cost_scale: float = 1.0  # the band: the model's costs scaled by its error
    # Speculation: position j's draft is accepted with this probability when those before it were.
    acceptance: list[float] = field(default_factory=list)
    # Real steps' costs over the model's, in the order a run measured them (step_costs.step_ratios):
    # the simulated steps cost the model's times them in that order, from a random place (and round
    # again), so that the simulation meets the run's level of step times, their spread, and their
    # slow stretches (a stall of the machine slows many steps running: drawn independently they
    # predicted a chain's Server capacity 15-28% high, in order 5-13%). Empty: the model's alone.
    cost_ratios: list[float] = field(default_factory=list)
    # A run re-simulated (harness/measure/resimulate.py): its own steps' ratios from the first on,
    # the simulated steps meeting the real ones in their order.
    ratios_from_first: bool = False


@dataclass
class Layout:
    """The engines a run spreads over: replicas, or with `decode` the prefill workers."""

    workers: list[Engine]
    decode: list[Engine] = field(default_factory=list)  # disaggregated: the decode workers
    transfer_s_per_block: float = 0.0  # a prompt's KV blocks, prefill worker to decode worker

    def scaled(self, scale: float = 1.0, cost_ratios: list[float] | None = None) -> "Layout":
        """Every step costing `scale` times the model's, or with `cost_ratios` times one of them."""

        def each(engines):
            return [
                Engine(e.config, e.num_blocks, e.costs, e.max_tokens, scale, e.acceptance, cost_ratios or [])
                for e in engines
            ]

        return Layout(each(self.workers), each(self.decode), self.transfer_s_per_block * scale)


class Worker:
    """One engine's scheduler on the virtual clock: a step starts (`start`) and, at `ends`, its
    tokens are emitted (`finish`)."""

    def __init__(self, engine: Engine, draws: random.Random):
        config = engine.config
        self.engine, self.draws = engine, draws
        self.blocks = BlockManager(engine.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.blocks, (EOS,))
        self.speculates = config.speculative_config is not None and bool(engine.acceptance)
        self.batch, self.ends = None, math.inf
        self.next_ratio = draws.randrange(len(engine.cost_ratios)) if engine.cost_ratios else 0
        if engine.ratios_from_first:
            self.next_ratio = 0
        self.wanted: dict = {}  # request id -> tokens its answer has
        self.incoming: deque = deque()  # disaggregated decode side: arrived, not yet admitted

    def busy(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.incoming)

    def admit_incoming(self, now: float) -> None:
        """A decode worker's: arrived requests in the order handed, while slots and blocks allow."""
        while self.incoming and len(self.scheduler.running) < self.engine.config.max_num_seqs:
            seq = self.incoming[0]
            if not self.blocks.allocate(seq, len(seq.prompt_token_ids)):
                return
            self.incoming.popleft()
            seq.num_computed_tokens = len(seq.prompt_token_ids)
            seq.first_token_time = now  # this engine's clock, for its TPOT guard
            self.scheduler.admit_prefilled(seq)

    def start(self, now: float) -> list[Sequence]:
        """The next step, if there is one to run; returns the sequences a static batch's end finished."""
        finished = self.scheduler.end_batch()
        self.admit_incoming(now)
        if self.speculates:
            for seq, k in zip(*self.scheduler.reserve_drafts()):
                seq.spec_token_ids = [TOKEN] * k
        batch = self.scheduler.schedule(now)
        if batch:
            cost = self.engine.costs.seconds(step_terms(batch), self.engine.cost_scale)
            if self.engine.cost_ratios:
                cost *= self.engine.cost_ratios[self.next_ratio % len(self.engine.cost_ratios)]
                self.next_ratio += 1
            self.scheduler.record_step(batch, cost)
            self.batch, self.ends = batch, now + cost
        return finished

    def finish(self) -> list[Sequence]:
        batch, now = self.batch, self.ends
        self.batch, self.ends = None, math.inf
        return self.scheduler.update_from_output(batch, [self.emitted(s) for s in batch.sampling_seqs], now)

    def emitted(self, seq: Sequence) -> list[int]:
        """Its accepted drafts and the target's token: EOS where its answer ends."""
        count = 1
        for rate in self.engine.acceptance[: len(seq.spec_token_ids)]:
            if self.draws.random() >= rate:
                break
            count += 1
        have, wanted = len(seq.output_token_ids), self.wanted[seq.request_id]
        return [EOS if have + i + 1 >= wanted else TOKEN for i in range(count)]


def run(
    layout: Layout | Engine, arrivals_s: list[float], samples: list[int], workload: Workload, in_flight=None, steps=None
):
    """Each query's (arrival, admission to a scheduler, first token, completion) seconds and its
    output tokens, in arrival order.
    `in_flight`: a list to which each stretch of virtual time is appended as (seconds, requests in
    the schedulers then). `steps`: a list to which each step's terms and seconds are appended, as a
    real run logs them (harness/run.py's steps.json)."""
    layout = layout if isinstance(layout, Layout) else Layout([layout])
    draws = random.Random(DRAW_SEED)
    front = [Worker(e, draws) for e in layout.workers]
    back = [Worker(e, draws) for e in layout.decode]
    for worker in front + back:
        worker.scheduler.step_log = steps
    outstanding = [0] * len(front)  # replicas: prompt + max_tokens in flight; prefill workers: prompt tokens
    claimed = [0] * len(back)  # blocks on their way to each decode worker
    transfers: list = []  # heap of (arrival, query, decode worker, its sequence there, blocks claimed)
    queries: dict[int, list] = {}  # id -> [arrival, admitted, first token, end, tokens, answer's tokens]
    where: dict[int, tuple[int, int | None]] = {}  # id -> its front worker, and its decode worker
    next_query, now, last, count = 0, 0.0, 0.0, 0

    def arrive(q: int) -> None:
        i, at = samples[q], arrivals_s[q]
        max_tokens = layout.workers[0].max_tokens
        prompt, wanted = workload.prompts[i], min(workload.output_lengths[i], max_tokens)
        f = min(range(len(front)), key=outstanding.__getitem__)
        outstanding[f] += len(prompt) + (0 if back else max_tokens)
        d = None
        if back:  # its decode worker named at once, its prompt's blocks (and one more) claimed there
            d = max(range(len(back)), key=lambda i: back[i].blocks.num_free_blocks - claimed[i])
            claimed[d] += -(-len(prompt) // back[d].engine.config.block_size) + 1
        seq = Sequence(q, prompt, SamplingParams(max_tokens=max_tokens), max_tokens, arrival_time=at)
        front[f].wanted[q] = 1 if back else wanted  # a prefill worker's answer ends at its first token
        front[f].scheduler.add(seq)
        where[q] = (f, d)
        queries[q] = [at, now, None, None, 0, wanted]

    def done(worker: Worker, seqs: list[Sequence]) -> None:
        nonlocal count
        for seq in seqs:
            q = seq.request_id
            record = queries[q]
            if record[2] is None:
                record[2] = seq.first_token_time
            f, d = where[q]
            if worker in front:
                outstanding[f] -= len(seq.prompt_token_ids) + (0 if back else seq.max_tokens)
            if worker in front and back:
                claim = -(-len(seq.prompt_token_ids) // back[d].engine.config.block_size) + 1
                if record[5] > 1:  # on to its decode worker, the prompt's blocks moved
                    handed = Sequence(q, seq.prompt_token_ids, seq.params, seq.max_tokens, arrival_time=record[0])
                    handed.output_token_ids.append(TOKEN)
                    back[d].wanted[q] = record[5]
                    heapq.heappush(transfers, (now + (claim - 1) * layout.transfer_s_per_block, q, d, handed, claim))
                    continue
                claimed[d] -= claim  # it ends with its first token: nothing goes on
            record[3], record[4] = now, len(seq.output_token_ids)
            count -= 1

    while True:
        t_arrival = arrivals_s[next_query] if next_query < len(arrivals_s) else math.inf
        t_transfer = transfers[0][0] if transfers else math.inf
        t_step = min((w.ends for w in front + back), default=math.inf)
        now = min(t_arrival, t_transfer, t_step)
        if now == math.inf:
            if any(w.busy() for w in front + back):
                raise RuntimeError("the simulated scheduler holds requests it never schedules (a KV pool too small?)")
            break
        if in_flight is not None and now > last:
            in_flight.append((now - last, count))
        last = now
        if t_arrival == now:  # every query due by now, before any step starts
            while next_query < len(arrivals_s) and arrivals_s[next_query] <= now:
                arrive(next_query)
                next_query += 1
                count += 1
        elif t_transfer == now:
            while transfers and transfers[0][0] <= now:
                _, _, d, handed, claim = heapq.heappop(transfers)
                claimed[d] -= claim  # arrived: its worker's admission (next step) counts its blocks
                back[d].incoming.append(handed)
        else:
            for w in front + back:
                if w.ends == now:
                    done(w, w.finish())
        for w in front + back:
            if w.batch is None and w.busy():
                done(w, w.start(now))
    return [tuple(queries[q][:5]) for q in range(len(arrivals_s))]


def latencies_ns(queries) -> tuple[list[int], list[int]]:
    """LoadGen's: TTFT from the scheduled time, TPOT as (latency - TTFT) / (tokens - 1)."""
    ttft, tpot = [], []
    for arrival, _, first, end, tokens in queries:
        ttft.append(int((first - arrival) * 1e9))
        tpot.append(int((end - first) * 1e9) // (tokens - 1) if tokens > 1 else 0)
    return ttft, tpot


def server_run(layout, workload: Workload, target_qps: float, schedule: dict, limits_ms: tuple) -> dict:
    """A simulated run at `target_qps` as LoadGen's detail log would have it. `schedule`: the run's
    schedule_rng_seed, sample_index_rng_seed, min_duration_ms and min_query_count (or
    `queries_at`, a function of the rate: the report's trials), `percentiles_only` where a run is
    judged by its p99s alone (the report's short trials), not by early stopping, and
    `sample_draws` where not SAMPLE_DRAWS (one, where every sample is alike)."""
    queries_at = schedule.get("queries_at")
    count = queries_at(target_qps) if queries_at else schedule["min_query_count"]
    duration = 0 if queries_at else schedule["min_duration_ms"]
    times_ns, _ = server_schedule(target_qps, schedule["schedule_rng_seed"], duration, count)
    results = []
    for draw in range(schedule.get("sample_draws", SAMPLE_DRAWS)):
        rng = random.Random(f"{schedule['sample_index_rng_seed']}/{draw}")
        samples = [rng.randrange(len(workload.prompts)) for _ in times_ns]
        ttft, tpot = latencies_ns(run(layout, [t / 1e9 for t in times_ns], samples, workload))
        result = server_result(ttft, tpot, int(limits_ms[0] * 1e6), int(limits_ms[1] * 1e6))
        if schedule.get("percentiles_only"):
            result["result_validity"] = "VALID" if result["result_perf_constraints_met"] else "INVALID"
        results.append(result)
    met = sum(r["result_validity"] == "VALID" for r in results)
    middle = sorted(results, key=lambda r: r["result_first_token_99.00_percentile_latency_ns"])[len(results) // 2]
    return {
        "effective_target_qps": target_qps,
        **middle,
        "result_validity": "VALID" if 2 * met > len(results) else "INVALID",
        "sample_draws_valid": f"{met} of {len(results)}",
    }


def capacity(
    layout,
    workload: Workload,
    schedule: dict,
    limits_ms: tuple,
    start_qps: float = 1.0,
    tolerance: float = 0.02,
) -> tuple[float | None, list[dict]]:
    """The highest rate whose simulated run is VALID (to `tolerance`, by bisection in ratio after a
    bracket found by doubling or halving from `start_qps`), and every simulated run's result."""
    runs = []

    def valid(qps):
        runs.append(server_run(layout, workload, qps, schedule, limits_ms))
        return runs[-1]["result_validity"] == "VALID"

    low, high = None, None
    qps = start_qps
    for _ in range(40):
        if valid(qps):
            low = qps
            if high is not None:
                break
            qps *= 2
        else:
            high = qps
            if low is not None:
                break
            qps /= 2
    if low is None:
        return None, runs
    while high is not None and high / low > 1 + tolerance:
        mid = (low * high) ** 0.5
        if valid(mid):
            low = mid
        else:
            high = mid
    return low, runs

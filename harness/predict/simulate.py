"""A LoadGen Server (or Interactive) run in virtual time: the engine's own Scheduler, BlockManager
and policies (the TPOT guard, static or continuous batching, chunked prefill, preemption, prefix
caching) step on a VirtualClock that each step moves by what the step-cost model says it costs;
queries arrive on LoadGen's own schedule (loadgen_schedule.py) and each emits as many tokens as the
model produces for its sample (an accuracy run's log), then the run is judged by LoadGen's rules
(verdict.py). The step loop is the engine's (sut/engine/llm_engine.py `step`) without a forward."""

import random
from dataclasses import dataclass

from harness.predict.loadgen_schedule import server_schedule
from harness.predict.step_costs import StepCostModel, step_shape
from harness.predict.verdict import server_result
from sut.clock import VirtualClock
from sut.config import EngineConfig
from sut.engine.block_manager import BlockManager
from sut.engine.scheduler import Scheduler
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence

EOS, TOKEN = 0, 1  # what a simulated sequence emits: TOKEN until its sample's length, then EOS


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


def run(engine: Engine, arrivals_s: list[float], samples: list[int], workload: Workload, in_flight=None) -> list:
    """Each query's (arrival, admission to the scheduler at a step's start, first token, completion)
    seconds and its output tokens, in arrival order.
    `in_flight`: a list to which each stretch of virtual time is appended as (seconds, requests in
    the scheduler then)."""
    clock = VirtualClock()
    config = engine.config
    blocks = BlockManager(engine.num_blocks, config.block_size, config.enable_prefix_caching)
    scheduler = Scheduler(config, blocks, (EOS,))
    params = SamplingParams(max_tokens=engine.max_tokens)
    seqs, wanted, admitted, done, next_query = [], {}, [], {}, 0
    while next_query < len(arrivals_s) or scheduler.has_unfinished():
        while next_query < len(arrivals_s) and arrivals_s[next_query] <= clock.now():
            i, at = samples[next_query], arrivals_s[next_query]
            seqs.append(Sequence(next_query, workload.prompts[i], params, engine.max_tokens, arrival_time=at))
            wanted[next_query] = min(workload.output_lengths[i], engine.max_tokens)
            scheduler.add(seqs[-1])
            admitted.append(clock.now())
            next_query += 1
        finished = scheduler.end_batch()
        batch = scheduler.schedule(clock.now())
        before, count = clock.now(), len(scheduler.running) + len(scheduler.waiting)
        if batch:
            cost = engine.costs.seconds(step_shape(batch), engine.cost_scale)
            clock.advance(cost)
            scheduler.record_step(batch, cost)
            emitted = [
                [EOS if len(s.output_token_ids) + 1 >= wanted[s.request_id] else TOKEN] for s in batch.sampling_seqs
            ]
            finished += scheduler.update_from_output(batch, emitted, clock.now())
        elif not finished:
            if next_query == len(arrivals_s):
                raise RuntimeError("the simulated scheduler holds requests it never schedules (a KV pool too small?)")
            clock.advance_to(arrivals_s[next_query])
        if in_flight is not None and clock.now() > before:
            in_flight.append((clock.now() - before, count))
        for s in finished:
            done[s.request_id] = clock.now()
    return [
        (s.arrival_time, at, s.first_token_time, done[s.request_id], len(s.output_token_ids))
        for s, at in zip(seqs, admitted)
    ]


def latencies_ns(queries) -> tuple[list[int], list[int]]:
    """LoadGen's: TTFT from the scheduled time, TPOT as (latency - TTFT) / (tokens - 1)."""
    ttft, tpot = [], []
    for arrival, _, first, end, tokens in queries:
        ttft.append(int((first - arrival) * 1e9))
        tpot.append(int((end - first) * 1e9) // (tokens - 1) if tokens > 1 else 0)
    return ttft, tpot


def server_run(engine: Engine, workload: Workload, target_qps: float, schedule: dict, limits_ms: tuple) -> dict:
    """A simulated run at `target_qps` as LoadGen's detail log would have it. `schedule`: the run's
    schedule_rng_seed, sample_index_rng_seed, min_duration_ms and min_query_count."""
    times_ns, _ = server_schedule(
        target_qps, schedule["schedule_rng_seed"], schedule["min_duration_ms"], schedule["min_query_count"]
    )
    # Which sample each query carries: LoadGen's draw is not reproduced (its sample order goes
    # through libstdc++'s shuffle); a uniform draw on its seed stands for it.
    rng = random.Random(schedule["sample_index_rng_seed"])
    samples = [rng.randrange(len(workload.prompts)) for _ in times_ns]
    queries = run(engine, [t / 1e9 for t in times_ns], samples, workload)
    ttft, tpot = latencies_ns(queries)
    result = server_result(ttft, tpot, int(limits_ms[0] * 1e6), int(limits_ms[1] * 1e6))
    return {"effective_target_qps": target_qps, **result}


def capacity(
    engine: Engine,
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
        runs.append(server_run(engine, workload, qps, schedule, limits_ms))
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

"""A configuration's predicted capacity: its step-cost model (fitted on this machine's engine, or a
saved one that holds for this machine, commit and settings), its samples' output lengths (an
accuracy run's log) and its LoadGen settings (mlperf.conf and the user.conf), simulated."""

import dataclasses
import hashlib
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from harness.config import RunConfig
from harness.predict.simulate import Engine, Layout, Workload, capacity
from harness.predict.step_costs import StepCostModel, fit, machine_context, step_ratios
from harness.run import code_commit
from sut.engine.profile import profile_steps
from systems.paths import build_dir, run_logs
from systems.schema import REPO

PROFILE_S = 90.0  # the profiling sweep's budget: a few minutes at most on 2 cores, warm-up included
TRANSFER_REQUESTS = 8  # a disaggregated pool's handoffs measured
# Engine settings that decide which steps run, not what a step of a given shape costs: configurations
# that differ only in these share one step-cost model (one profile serves a scheduling ablation).
SCHEDULING_SETTINGS = {
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_chunked_prefill",
    "static_batching",
    "tpot_target_ms",
    "tpot_cap_ms",
    "ttft_patience_ms",
    "enable_prefix_caching",
    "num_kv_blocks",
    "kv_cache_memory_gb",
    "max_model_len",
    "seed",
}


class PredictError(ValueError):
    """What a prediction lacks (its message names it)."""


@dataclass
class Prediction:
    qps: float | None  # the highest rate whose simulated run is VALID; None: not even the lowest tried
    low: float | None  # the same with every step costing the model's median error more
    high: float | None  # and less
    costs: StepCostModel
    simulated_runs: int
    simulation: tuple | None = None  # (layout, workload, schedule): to simulate again, rescaled

    def rescaled(self, ratios: list[float]) -> float | None:
        """The capacity were the steps to cost what the model says times `ratios` in turn (Engine.
        cost_ratios): a real run's steps measured against it (step_costs.step_ratios) re-anchor the
        prediction to the machine as that run found it, the level of its step times (a shared
        machine's speed moves by tens of percent within the hour), their spread and their slow
        stretches (which the TPOT guard and the p99s feel, and a quiet profile does not show)."""
        layout, workload, schedule = self.simulation
        start = (self.qps or 1.0) / statistics.mean(ratios)
        found, _ = capacity(layout.scaled(cost_ratios=ratios), workload, schedule, schedule["limits_ms"], start)
        return found

    def reanchored(self, steps_files: list[Path]) -> tuple[list[float], float | None]:
        """Runs' steps (their steps.json, in order) against the model, and the capacity `rescaled`
        by them: the one re-anchoring that the chain's search and the report share; no capacity
        where the runs logged no steps or none was predicted."""
        ratios = [r for steps in steps_files for r in step_ratios(Path(steps), self.costs)]
        return ratios, self.rescaled(ratios) if ratios and self.qps is not None else None

    def describe(self) -> str:
        if self.qps is None:
            return f"no rate meets the limits in simulation (step costs: {self.costs.describe()})"
        band = f"band {self.low or 0:.3f}-{self.high or 0:.3f}"
        return f"{self.qps:.3f} QPS ({band}; {self.simulated_runs} simulated runs; step costs: {self.costs.describe()})"


def output_lengths(accuracy_log: Path, num_samples: int) -> list[int]:
    """Each sample's output tokens in an accuracy run's mlperf_log_accuracy.json (every sample once)."""
    if not accuracy_log.is_file():
        raise PredictError(f"no accuracy log at {accuracy_log}: the output lengths come from an accuracy run")
    lengths: dict[int, int] = {}
    for entry in json.loads(accuracy_log.read_text()):
        lengths[entry["qsl_idx"]] = entry["token_count"]
    missing = [i for i in range(num_samples) if i not in lengths]
    if missing:
        raise PredictError(f"{accuracy_log}: samples {missing[:5]} have no response (not a whole accuracy run)")
    return [lengths[i] for i in range(num_samples)]


def schedule_settings(cfg: RunConfig) -> dict:
    """The run's LoadGen settings the schedule and verdict read: mlperf.conf's seeds, the user.conf's
    counts, and the latency limits, as LoadGen itself loads them."""
    from harness.run import loadgen_settings

    settings = loadgen_settings(cfg)
    return {
        "schedule_rng_seed": settings.schedule_rng_seed,
        "sample_index_rng_seed": settings.sample_index_rng_seed,
        "min_duration_ms": settings.min_duration_ms,
        "min_query_count": settings.min_query_count,
        "limits_ms": (settings.ttft_latency / 1e6, settings.tpot_latency / 1e6),
    }


def cost_settings(settings: dict) -> dict:
    """The settings a step's cost depends on (all but SCHEDULING_SETTINGS)."""
    return {k: v for k, v in settings.items() if k not in SCHEDULING_SETTINGS}


def saved_costs_path(root: Path, cfg: RunConfig, settings: dict) -> Path:
    key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return build_dir(root) / "predict" / cfg.system.name / cfg.benchmark.name / f"step-costs-{key}.json"


def step_costs(
    engine,
    cfg: RunConfig,
    prompts,
    settings: dict,
    root: Path = REPO,
    log=print,
    profile_s: float = PROFILE_S,
    costs_dir: Path | None = None,
) -> StepCostModel:
    """The saved model where it holds for this machine, commit and the settings a step's cost depends
    on; else profiled now on `engine` (idle): every worker of a pool at once, each on its own cores.
    Saved under the build folder, or `costs_dir` (the report's runs folder: a profile of its own)."""
    settings = cost_settings(settings)
    context = json.loads(json.dumps(machine_context(settings, code_commit()), default=str))
    path = saved_costs_path(root, cfg, settings)
    if costs_dir is not None:
        path = costs_dir / path.name
    if path.is_file():
        saved = StepCostModel.load(path)
        if saved.context == context:
            log(f"step costs: reused {path}")
            return saved
    log(f"step costs: profiling the engine's steps for up to {profile_s:.0f} s")
    if hasattr(engine, "runner"):
        profiles = [profile_steps(engine, prompts, profile_s)]
    else:
        profiles = engine.profile_steps(prompts, profile_s)
    model = fit(
        [shape for p in profiles for shape in p["shapes"]], [t for p in profiles for t in p["seconds"]], context
    )
    model.acceptance = next((p["acceptance"] for p in profiles if p["acceptance"]), [])
    if hasattr(engine, "transfer_stats"):
        model.transfer_s_per_block = transfer_seconds_per_block(engine, prompts)
    model.save(path)
    return model


def transfer_seconds_per_block(pool, prompts) -> float:
    """A disaggregated pool's handoff, from the first token on a prefill worker to admission on a
    decode worker (the KV blocks' transfer and the messages), per block moved: the median over
    TRANSFER_REQUESTS requests sent one at a time, so that no queue adds to it."""
    from sut import SamplingParams

    chosen = prompts[:TRANSFER_REQUESTS]
    for prompt in chosen:
        pool.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
        while pool.has_unfinished():
            pool.step()
    handoffs = [w["handoff_p50_ms"] for w in pool.transfer_stats()["decode"] if w["handoff_p50_ms"] is not None]
    pool.reset()
    if not handoffs:
        raise PredictError("the disaggregated pool handed no request over: no transfer to measure")
    blocks = statistics.mean(-(-len(p) // pool.config.block_size) for p in chosen)
    return statistics.median(handoffs) / 1e3 / blocks


def simulated_layout(engine, costs: StepCostModel, max_tokens: int) -> Layout:
    """`engine`'s workers (one engine, its replicas, or its prefill and decode workers) with their
    settings and KV pools, each costing what `costs` says."""
    if hasattr(engine, "runner"):
        return Layout([Engine(engine.config, engine.runner.num_blocks, costs, max_tokens, acceptance=costs.acceptance)])
    if not hasattr(engine, "num_blocks"):
        raise PredictError(f"{type(engine).__name__}: not an engine, replica pool or disaggregated pool")
    if engine.config.disaggregation is None:
        config = dataclasses.replace(engine.config, data_parallel_size=1)
        return Layout([Engine(config, n, costs, max_tokens, acceptance=costs.acceptance) for n in engine.num_blocks])
    prefill = dataclasses.replace(engine.config, disaggregation=None, speculative_config=None)
    decode = dataclasses.replace(engine.config, disaggregation=None)
    p = engine.num_prefill
    return Layout(
        [Engine(prefill, n, costs, max_tokens) for n in engine.num_blocks[:p]],
        [Engine(decode, n, costs, max_tokens, acceptance=costs.acceptance) for n in engine.num_blocks[p:]],
        costs.transfer_s_per_block,
    )


def predict(layout: Layout, workload: Workload, schedule: dict, start_qps: float = 1.0) -> Prediction:
    """The capacity, and its band from the step-cost model's median error."""
    qps, runs = capacity(layout, workload, schedule, schedule["limits_ms"], start_qps)
    costs = layout.workers[0].costs
    bounds = []
    for scale in (1 + costs.median_error, 1 - costs.median_error):
        found, more = capacity(layout.scaled(scale), workload, schedule, schedule["limits_ms"], qps or start_qps)
        bounds.append(found)
        runs += more
    low, high = bounds
    if qps is not None:  # a bisection's noise near the knee must not put the band off its centre
        low, high = min(low or qps, qps), max(high or qps, qps)
    return Prediction(qps, low, high, costs, len(runs), (layout, workload, schedule))


def predict_engine(
    engine,
    cfg: RunConfig,
    dataset,
    root: Path = REPO,
    accuracy_log: Path | None = None,
    limits_ms: tuple | None = None,
    log=print,
    trials: dict | None = None,
    profile_s: float = PROFILE_S,
    costs_dir: Path | None = None,
) -> Prediction:
    """`engine`'s capacity at `cfg`'s scenario: its step costs (saved, or profiled on it for up to
    `profile_s`), the output lengths of `accuracy_log` (default: the system's Offline accuracy run),
    the run's LoadGen settings with `limits_ms` (TTFT, TPOT; either None: the scenario's) over its
    latency limits. `trials`: the report's short trials instead of the scenario's runs, {"seconds",
    "min_queries", "samples"}: `seconds` of arrivals, at least `min_queries` and at most `samples`
    queries (the first `samples` of the dataset, which the accuracy log covers), judged by their
    p99s alone (harness/measure/ablation.py `trial_queries`). `profile_s`, `costs_dir`: step_costs'."""
    if accuracy_log is None:
        accuracy_log = (
            run_logs(root, cfg.system.name, cfg.benchmark.name, "Offline", "accuracy") / "mlperf_log_accuracy.json"
        )
    prompts = dataset.input_ids[: trials["samples"]] if trials else dataset.input_ids
    workload = Workload(prompts, output_lengths(accuracy_log, len(prompts)))
    schedule = schedule_settings(cfg)
    if limits_ms is not None:
        schedule["limits_ms"] = tuple(mine or theirs for mine, theirs in zip(limits_ms, schedule["limits_ms"]))
    if trials:
        seconds, least, most = trials["seconds"], trials["min_queries"], trials["samples"]
        schedule["queries_at"] = lambda qps: min(most, max(least, round(qps * seconds)))
        schedule["percentiles_only"] = True
    settings = cfg.system.engine_settings(cfg.scenario, cfg.benchmark.name)
    costs = step_costs(engine, cfg, dataset.input_ids, settings, root, log, profile_s, costs_dir)
    return predict(simulated_layout(engine, costs, cfg.benchmark.max_tokens("performance")), workload, schedule)


def predict_configuration(
    system: str,
    benchmark: str,
    scenario: str,
    root: Path = REPO,
    engine_settings: dict | None = None,
    accuracy_log: Path | None = None,
    limits_ms: tuple | None = None,
    log=print,
    user_conf: Path | None = None,
    **options,
) -> Prediction:
    """One configuration's prediction: the system's `scenario` engine with `engine_settings` over it,
    built here, profiled where no saved step-cost model holds for it, then simulated
    (predict_engine, which takes `options`) with the LoadGen settings of `user_conf` (default: the
    scenario's committed one) over mlperf.conf."""
    from accuracy.datasets.reader import load_dataset
    from sut import make_engine

    cfg = RunConfig.resolve(system, benchmark, scenario, "performance", root, user_conf, engine_settings)
    dataset = load_dataset(cfg.system.datasets[cfg.benchmark.name])
    engine = make_engine(cfg.system.model_for(benchmark), **cfg.system.engine_settings(scenario, benchmark))
    try:
        return predict_engine(engine, cfg, dataset, root, accuracy_log, limits_ms, log, **options)
    finally:
        engine.close()

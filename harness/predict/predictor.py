"""A configuration's predicted capacity: its step-cost model (fitted on this machine's engine, or a
saved one that holds for this machine, commit and settings), its samples' output lengths (an
accuracy run's log) and its LoadGen settings (mlperf.conf and the user.conf), simulated."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from harness.config import RunConfig
from harness.predict.simulate import Engine, Workload, capacity
from harness.predict.step_costs import StepCostModel, fit, machine_context, profile
from harness.run import code_commit
from systems.paths import build_dir, run_logs
from systems.schema import REPO

PROFILE_S = 90.0  # the profiling sweep's budget: a few minutes at most on 2 cores, warm-up included
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


def step_costs(engine, cfg: RunConfig, prompts, settings: dict, root: Path = REPO, log=print) -> StepCostModel:
    """The saved model where it holds for this machine, commit and the settings a step's cost depends
    on; else profiled now on `engine` (idle)."""
    settings = cost_settings(settings)
    context = machine_context(settings, code_commit())
    path = saved_costs_path(root, cfg, settings)
    if path.is_file():
        saved = StepCostModel.load(path)
        if saved.context == json.loads(json.dumps(context, default=str)):
            log(f"step costs: reused {path}")
            return saved
    log(f"step costs: profiling the engine's steps for up to {PROFILE_S:.0f} s")
    shapes, seconds = profile(engine, prompts, PROFILE_S)
    model = fit(shapes, seconds, json.loads(json.dumps(context, default=str)))
    model.save(path)
    return model


def simulated_engine(engine, costs: StepCostModel, max_tokens: int) -> Engine:
    """`engine`'s settings and KV pool with `costs`: PredictError for what is not simulated yet."""
    if not hasattr(engine, "runner"):
        raise PredictError(
            f"{type(engine).__name__}: only a single engine is simulated so far (not replicas or disaggregated pools)"
        )
    if engine.config.speculative_config is not None:
        raise PredictError("speculative decoding is not simulated yet (its drafts and their acceptance)")
    return Engine(engine.config, engine.runner.num_blocks, costs, max_tokens)


def predict(engine: Engine, workload: Workload, schedule: dict, start_qps: float = 1.0) -> Prediction:
    """The capacity, and its band from the step-cost model's median error."""
    qps, runs = capacity(engine, workload, schedule, schedule["limits_ms"], start_qps)
    bounds = []
    for scale in (1 + engine.costs.median_error, 1 - engine.costs.median_error):
        scaled = Engine(engine.config, engine.num_blocks, engine.costs, engine.max_tokens, scale)
        found, more = capacity(scaled, workload, schedule, schedule["limits_ms"], qps or start_qps)
        bounds.append(found)
        runs += more
    low, high = bounds
    if qps is not None:  # a bisection's noise near the knee must not put the band off its centre
        low, high = min(low or qps, qps), max(high or qps, qps)
    return Prediction(qps, low, high, engine.costs, len(runs))


def predict_engine(
    engine,
    cfg: RunConfig,
    dataset,
    root: Path = REPO,
    accuracy_log: Path | None = None,
    limits_ms: tuple | None = None,
    log=print,
) -> Prediction:
    """`engine`'s capacity at `cfg`'s scenario: its step costs (saved, or profiled on it), the output
    lengths of `accuracy_log` (default: the system's Offline accuracy run), the run's LoadGen settings
    with `limits_ms` (TTFT, TPOT; either None: the scenario's) over its latency limits."""
    if accuracy_log is None:
        accuracy_log = (
            run_logs(root, cfg.system.name, cfg.benchmark.name, "Offline", "accuracy") / "mlperf_log_accuracy.json"
        )
    workload = Workload(dataset.input_ids, output_lengths(accuracy_log, len(dataset)))
    schedule = schedule_settings(cfg)
    if limits_ms is not None:
        schedule["limits_ms"] = tuple(mine or theirs for mine, theirs in zip(limits_ms, schedule["limits_ms"]))
    settings = cfg.system.engine_settings(cfg.scenario, cfg.benchmark.name)
    costs = step_costs(engine, cfg, dataset.input_ids, settings, root, log)
    return predict(simulated_engine(engine, costs, cfg.benchmark.max_tokens("performance")), workload, schedule)

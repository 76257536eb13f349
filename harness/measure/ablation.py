"""The measurement report's runs: one engine configuration after another on the same model and
samples, each building on the last, every one measured the same way:

1. static batching, as the MLPerf reference SUTs batch (sut/engine/scheduler.py says what is emulated);
2. continuous batching on the paged KV cache, whole prompts;
3. chunked prefill, with the system's TPOT guard where it has one: the system's own batching;
4. each speculative proposer of the system's `report.proposers`, on 3;
5. each numerics option of `report.numerics` (an engine setting set to its `value`, true unless
   given), cumulatively on 3: each on the last, but an option with `cumulative: false`, which
   builds on 3 alone, and on which none builds (a setting that another one's arithmetic would
   hide, or that would hide it: with `quantization` set the CPU backend drops the GGUF blocks
   that `cpu.int16_activations` computes from);
6. each layout of `report.layouts` (engine settings that place the engine on the machine's devices
   otherwise: data-parallel replicas, disaggregated prefill and decode workers; for the benchmarks
   it names, all without) on the last cumulative configuration of 5, the system's own settings.
Configurations 1-4 run with every numerics option off (at the setting's EngineConfig default:
false, or None for `quantization`), so that only 5 can move quality; a system that speculates in
its own settings has that taken out of 1-3 and 5. A numerics option's `note` (what its numbers
mean on this system) goes with its configuration onto the page.

The searches' targets are the Server limits and the engine's settings the system's Server ones, or
another scenario's (`scenario`: Interactive), or targets given (`targets`); `only` runs the
configurations whose labels name one of its words (a comparison at tighter targets).

Each configuration gets, in its folder under the runs folder:
- `offline/`: a LoadGen Offline run of `report.samples` samples, each once: its throughput at
  saturation, and its responses for the quality figures (the whole demo set on the CPU demo);
- `server/`: the capacity search (harness/measure/capacity.py) at the latency targets, from START_SHARE of
  the Offline run's samples/s, LoadGen Server runs of `trial_queries(rate)` queries each (each a
  different sample), judged by LoadGen's p99 check; a failed trial hints the next rate down by its
  goodput, and the lowest rate failed above a pass, where at most MARGINAL_SHARE of its queries were
  late, is run again (RETRIES) before the search goes below it. Every response is logged
  (`--log-responses`), so each trial gives its goodput and cost as well as its latencies;
- `server/` also holds, where the configuration's share of the budget allows, one trial at
  LOW_LOAD_SHARE of the capacity: goodput well below it, where the search's trials do not go;
- `capacity.json`: the search's account and that trial's; `worker.log`: what its run worker (harness/run_worker.py:
  one engine for the configuration's runs, loaded and warmed up once) printed.
The searches share `report.budget_min`: each configuration gets an equal share of what is left
when it starts, and a trial that would end past its share is not run (the search says so).
"""

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from accuracy.datasets.reader import Dataset, load_dataset
from compliance.loadgen_logs import STEPS_FILE, read_detail_log
from harness.config import HarnessConfigError, RunConfig
from harness.measure.capacity import (
    CapacitySearch,
    LoadGenTrials,
    Trial,
    run_trial,
    search_capacity,
    trial_from_detail,
)
from harness.measure.estimates import RUN_START_S
from harness.measure.run_logs import read_run
from harness.run_worker import RunWorker, worker_command
from systems.benchmarks import BENCHMARKS
from systems.schema import REPO, System, expand_path

PLAN = "ablation.json"  # in the runs folder: the configurations in order (harness/measure/report.py reads it)
TRAFFIC = "traffic.json"  # in the runs folder: a user's traffic as a dataset file (harness/measure/traffic.py)
ARRIVALS = "arrivals.json"  # in the runs folder: a traffic sample's arrival times, where it has them
PEAKS = "peaks.json"  # in the runs folder: the machine's measured bandwidth and FLOP/s (harness/measure/roofline.py)
SCENARIO = "Server"
GUARD = ("tpot_target_ms", "tpot_cap_ms", "ttft_patience_ms")
DEFAULTS = {
    "samples": 100,
    "budget_min": 27,
    "max_trials": 6,
    "proposers": [],
    "numerics": [],
    "layouts": [],
    "capacity_spread": 0.0,
    "profile_s": 45,  # each configuration's step-cost profile for its prediction (harness/predict), at most
}
NUMERICS_FOLDER = "05-numerics-"  # a numerics option's configuration: its arithmetic is not fp32's
START_SHARE = 0.7  # of the Offline run's samples/s: the search's first rate
LOW_LOAD_SHARE = 0.5  # of the capacity: the rate of the trial that shows goodput well below it
GROW, TOLERANCE = 1.25, 0.1
# The bracket's top is run once more before the search goes below it: a short trial's p99 is its
# slowest query or two, which one stall of a shared machine can spoil (measurements/README.md).
RETRIES = 1
MARGINAL_SHARE = 0.05  # a failed trial with at most this share of its queries late is retried
TRIAL_SECONDS = 40  # a trial's arrivals last about this long ...
MIN_TRIAL_QUERIES = 40  # ... but it has at least this many queries (and at most report.samples)


@dataclass
class Config:
    folder: str  # its runs' folder, under the runs folder
    label: str
    change: str  # what it changes against `builds_on`, in words
    builds_on: str | None
    engine: dict  # every engine setting of its runs (over the system's)
    note: str = ""  # what its numbers mean on this system, for the page (a numerics option's `note`)


PRICES = ("price_per_hour", "price_per_accelerator_hour", "price_note")


def report_settings(system: System, benchmark: str) -> dict:
    """The system file's `saaf_harness.report` over DEFAULTS, for `benchmark`: a
    `price_per_accelerator_hour` becomes the machine's `price_per_hour` (times the description's
    accelerators_per_node and number_of_nodes)."""
    settings = {**DEFAULTS, **system.report}
    where = f"{system.path}: saaf_harness.report"
    unknown = sorted(set(settings) - set(DEFAULTS) - set(PRICES))
    if unknown:
        raise HarnessConfigError(f"{where} has unknown keys {unknown}; known: {sorted([*DEFAULTS, *PRICES])}")
    for key in ("samples", "max_trials"):
        if isinstance(settings[key], bool) or not isinstance(settings[key], int) or settings[key] < 1:
            raise HarnessConfigError(f"{where}.{key} must be a positive integer, got {settings[key]!r}")
    if "price_per_accelerator_hour" in settings:
        if "price_per_hour" in settings:
            raise HarnessConfigError(
                f"{where}: give price_per_hour (a machine's) or price_per_accelerator_hour, not both"
            )
        description = json.loads(system.path.read_text())
        try:
            accelerators = int(description["accelerators_per_node"]) * int(description.get("number_of_nodes", 1))
        except (KeyError, ValueError) as e:
            raise HarnessConfigError(
                f"{where}.price_per_accelerator_hour needs the description's accelerators_per_node ({e!r})"
            ) from None
        settings["price_per_hour"] = settings.pop("price_per_accelerator_hour") * accelerators
    for i, layout in enumerate(settings["layouts"]):
        if not (
            isinstance(layout, dict)
            and {"name", "engine"} <= set(layout) <= {"name", "engine", "benchmarks"}
            and isinstance(layout["engine"], dict)
            and isinstance(layout.get("benchmarks", []), list)
        ):
            raise HarnessConfigError(
                f"{where}.layouts[{i}] must be an object with a name, its engine settings and optionally the "
                f"benchmarks it is for, got {layout!r}"
            )
    settings["layouts"] = [
        layout for layout in settings["layouts"] if benchmark in layout.get("benchmarks", [benchmark])
    ]
    if not isinstance(settings["proposers"], list):
        raise HarnessConfigError(f"{where}.proposers must be a list of speculative_config values")
    for i, proposer in enumerate(settings["proposers"]):
        if not isinstance(proposer, dict) or not isinstance(proposer.get("benchmarks", []), list):
            raise HarnessConfigError(
                f"{where}.proposers[{i}] must be a speculative_config object, optionally with the benchmarks it "
                f"is for, got {proposer!r}"
            )
    # A proposer may be one model's own (MTP: DeepSeek's; an EAGLE3 head: its target's).
    settings["proposers"] = [
        {k: v for k, v in proposer.items() if k != "benchmarks"}
        for proposer in settings["proposers"]
        if benchmark in proposer.get("benchmarks", [benchmark])
    ]
    if not isinstance(settings["numerics"], list):
        raise HarnessConfigError(f"{where}.numerics must be a list of numerics options, got {settings['numerics']!r}")
    settings["numerics"] = [
        numerics_option(option, f"{where}.numerics[{i}]") for i, option in enumerate(settings["numerics"])
    ]
    spread = settings["capacity_spread"]
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or spread < 0:
        raise HarnessConfigError(f"{where}.capacity_spread must be a fraction >= 0, got {spread!r}")
    for key in ("budget_min", "price_per_hour", "profile_s"):
        value = settings.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise HarnessConfigError(f"{where}.{key} must be a positive number, got {value!r}")
    return settings


# A numerics option's keys: its label, the (dotted) engine setting, what it sets (true unless given),
# false to build on 3 alone, and what its numbers mean on this system (the page shows it).
NUMERICS_KEYS = ("name", "setting", "value", "cumulative", "note")


def setting_default(path: str, where: str):
    """EngineConfig's default of the (dotted) engine setting `path` (a numerics option's "off"), or
    HarnessConfigError naming `where` for a setting EngineConfig does not have."""
    from dataclasses import is_dataclass

    from sut.config import EngineConfig

    value, parts = EngineConfig(), path.split(".")
    for depth, part in enumerate(parts):
        group = ".".join(parts[:depth])
        if not is_dataclass(value):  # speculative_config, disaggregation: whole objects (None by default)
            raise HarnessConfigError(
                f"{where}.setting: the engine has no setting {path!r}: {group!r} is not a group of settings"
            )
        known = [f.name for f in fields(value)]
        if part not in known:
            raise HarnessConfigError(
                f"{where}.setting: the engine has no setting {path!r}; "
                + (f"{group!r} holds {known}" if group else f"known: {known}")
            )
        value = getattr(value, part)
    if is_dataclass(value):
        raise HarnessConfigError(
            f"{where}.setting: {path!r} is a group of engine settings; name one of {[f.name for f in fields(value)]}"
        )
    return value


def numerics_option(option, where: str) -> dict:
    """A numerics option of the system file (`where` names it), checked, with its defaults: `value`
    True, `cumulative` True, `note` ""; its `value` checked by EngineConfig itself."""
    from sut.config import EngineConfig
    from sut.errors import ConfigError

    if not isinstance(option, dict):
        raise HarnessConfigError(
            f"{where} must be an object with a name and an engine setting (and optionally {list(NUMERICS_KEYS[2:])}), "
            f"got {option!r}"
        )
    unknown = sorted(set(option) - set(NUMERICS_KEYS))
    if unknown:
        raise HarnessConfigError(f"{where} has unknown keys {unknown}; known: {list(NUMERICS_KEYS)}")
    for key in ("name", "setting"):
        if not isinstance(option.get(key), str) or not option[key]:
            raise HarnessConfigError(f"{where}.{key} must be a non-empty string, got {option.get(key)!r}")
    option = {"value": True, "cumulative": True, "note": "", **option}
    if not isinstance(option["cumulative"], bool):
        raise HarnessConfigError(f"{where}.cumulative must be true or false, got {option['cumulative']!r}")
    if not isinstance(option["note"], str):
        raise HarnessConfigError(f"{where}.note must be a string, got {option['note']!r}")
    off = setting_default(option["setting"], where)
    try:
        EngineConfig.from_kwargs(**with_setting({}, option["setting"], option["value"]))
    except ConfigError as e:
        raise HarnessConfigError(f"{where}.value: {e}") from None
    if option["value"] == off:
        raise HarnessConfigError(
            f"{where}.value: {option['value']!r} is the default of {option['setting']}, the option's off: "
            "it would change nothing"
        )
    return option


def with_setting(engine: dict, path: str, value) -> dict:
    """`engine` with the (dotted) setting `path` set, copying what it changes."""
    head, _, rest = path.partition(".")
    if not rest:
        return {**engine, head: value}
    return {**engine, head: with_setting(dict(engine.get(head) or {}), rest, value)}


def configurations(system: System, benchmark: str, longest_prompt: int, scenario: str = SCENARIO) -> list[Config]:
    from sut.config import EngineConfig
    from sut.config.speculative import SpeculativeConfig

    report = report_settings(system, benchmark)
    own = system.engine_settings(scenario, benchmark)
    # Every setting another scenario sets, at this one's value (its default where it sets none): a
    # run's settings are the system's for its own scenario under these (harness/config.py).
    defaults = {f.name: f.default for f in fields(EngineConfig)}
    others = system.scenario_setting_keys(benchmark)
    own = {**{key: defaults[key] for key in sorted(others - set(own))}, **own}
    # Speculation off in 1-3 and 5: said outright where some scenario speculates (a benchmark's own
    # Interactive engine), so that neither of the worker's runs (Offline, Server) inherits it.
    exact = {**own, "speculative_config": None} if "speculative_config" in own else dict(own)
    for option in report["numerics"]:
        exact = with_setting(exact, option["setting"], setting_default(option["setting"], "report.numerics"))
    # Without chunking every sequence must fit one step (sut/engine/llm_engine.py refuses otherwise).
    longest = longest_prompt + BENCHMARKS[benchmark].max_new_tokens
    unguarded = {
        **exact,
        **dict.fromkeys(GUARD),
        "max_model_len": longest,
        "max_num_batched_tokens": max(own.get("max_num_batched_tokens", 2048), longest),
    }
    seqs = own.get("max_num_seqs", 64)
    guard = f", the TPOT guard at {own['tpot_target_ms']} ms" if own.get("tpot_target_ms") else ""
    configs = [
        Config(
            "01-static",
            "static batching",
            f"batches of up to {seqs} whole prompts, each run until its longest row ends (the MLPerf reference SUT's)",
            None,
            {**unguarded, "static_batching": True},
        ),
        Config(
            "02-continuous",
            "continuous batching",
            "requests join and leave the batch at every step (paged KV cache), whole prompts",
            "static batching",
            {**unguarded, "enable_chunked_prefill": False},
        ),
        Config(
            "03-chunked",
            "chunked prefill" + (" + TPOT guard" if guard else ""),
            f"prompts cut to the step budget of {exact.get('max_num_batched_tokens', 2048)} tokens{guard}",
            "continuous batching",
            exact,
        ),
    ]
    chunked = configs[-1]
    for i, proposer in enumerate(report["proposers"], 1):
        if "model" in proposer:  # a draft's folder, written as the system file's model folders are
            proposer = {**proposer, "model": str(expand_path(proposer["model"]))}
        name = {
            "ngram": "n-gram speculation",
            "draft_model": "draft-model speculation",
            "eagle3": "EAGLE3 speculation",
            "mtp": "MTP speculation",
        }.get(proposer.get("method"), "speculation")
        configs.append(
            Config(
                f"04-speculative-{i}",
                name,
                SpeculativeConfig.from_value(proposer).describe(),
                chunked.label,
                {**exact, "speculative_config": proposer},
            )
        )
    last = chunked
    for i, option in enumerate(report["numerics"], 1):
        on = last if option["cumulative"] else chunked
        value = option["value"]
        change = f"engine setting {option['setting']} " + ("on" if value is True else json.dumps(value))
        if not option["cumulative"]:
            change += f", on {chunked.label} alone (not on the numerics options before it)"
        configs.append(
            Config(
                f"{NUMERICS_FOLDER}{i}",
                option["name"],
                change,
                on.label,
                with_setting(on.engine, option["setting"], value),
                option["note"],
            )
        )
        if option["cumulative"]:
            last = configs[-1]
    for i, layout in enumerate(report["layouts"], 1):
        configs.append(
            Config(
                f"06-layout-{i}",
                layout["name"],
                "engine settings " + json.dumps(layout["engine"], sort_keys=True),
                last.label,
                {**last.engine, **layout["engine"]},
            )
        )
    return configs


def select(configs: list[Config], only: list[str] | None) -> list[Config]:
    """The configurations whose labels contain one of the words of `only` (all without it)."""
    if not only:
        return configs
    chosen = [c for c in configs if any(word.lower() in c.label.lower() for word in only)]
    if not chosen:
        raise HarnessConfigError(
            f"no configuration's label contains any of {only}; labels: {[c.label for c in configs]}"
        )
    return chosen


def offline_conf(loadgen_model: str, samples: int) -> str:
    key = f"{loadgen_model}.Offline"
    return "\n".join(
        [
            "# harness.measure.ablation: the report's Offline run, every sample once (--log-responses logs them all)",
            f"{key}.min_duration = 0",
            f"{key}.min_query_count = {samples}",
            f"{key}.performance_sample_count_override = {samples}",
            f"{key}.sample_concatenate_permutation = 1",
            "",
        ]
    )


def trial_queries(qps: float, samples: int) -> int:
    """A report trial's queries at `qps`: TRIAL_SECONDS of arrivals, within [MIN_TRIAL_QUERIES, samples]."""
    return min(samples, max(MIN_TRIAL_QUERIES, round(qps * TRIAL_SECONDS)))


def replay_command(system: str, benchmark: str, root: Path, runs_dir: Path, qps: float, engine: dict, logs: Path):
    """`python -m harness.measure.replay` of the traffic's arrivals at `qps`."""
    return [
        sys.executable,
        *("-m", "harness.measure.replay", "--system", system, "--benchmark", benchmark, "--root", str(root)),
        *("--dataset", str(runs_dir / TRAFFIC), "--arrivals", str(runs_dir / ARRIVALS), "--qps", f"{qps:.4f}"),
        *("--engine", json.dumps(engine), "--log-dir", str(logs)),
    ]


@dataclass
class ReplayTrials:
    """The search's run on a traffic sample with arrival times: a replay per rate (harness/measure/replay.py),
    in `folder`/NN-QPSqps/, judged as the report's LoadGen trials are, by the p99s against the limits."""

    folder: Path
    command: Callable[[float, Path], list[str]]
    arrivals: int
    log: Callable[[str], None] = print

    def seconds(self, qps: float) -> float:
        return (self.arrivals - 1) / qps + RUN_START_S

    def __call__(self, qps: float) -> Trial:
        self.folder.mkdir(parents=True, exist_ok=True)
        logs = self.folder / f"{sum(1 for p in self.folder.iterdir() if p.is_dir()) + 1:02d}-{qps:.3f}qps"
        self.log(f"capacity: replaying at {qps:.3f} QPS (about {self.seconds(qps) / 60:.1f} min; logs in {logs})")
        run_trial(self.command(qps, logs), f"the replay at {qps:.3f} QPS")
        trial = trial_from_detail(qps, read_run(logs).detail, percentiles_only=True)
        trial.logs = logs
        self.log(f"capacity: {qps:.3f} QPS: {'pass' if trial.passed else 'FAIL'}: {trial.detail}")
        return trial


@dataclass
class WorkerTrials(LoadGenTrials):
    """The report's LoadGen trials, each run by the configuration's run worker (harness/run_worker.py)."""

    worker: RunWorker | None = None

    def execute(self, conf: Path, logs: Path, what: str) -> None:
        self.worker.run(SCENARIO, conf, logs, what)


def search_record(search: CapacitySearch, start_qps: float, runs_dir: Path, low: Trial | str | None) -> dict:
    """capacity.json: the search, and its low-load trial (or why it was not run)."""
    return {
        "start_qps": start_qps,
        "capacity_qps": search.passed_qps,
        "failed_qps": search.failed_qps,
        "stopped": search.stopped,
        "summary": search.summary(),
        "trials": [t.record(runs_dir) for t in search.trials],
        "low_load": low.record(runs_dir) if isinstance(low, Trial) else None,
        "low_load_not_run": low if isinstance(low, str) else None,
    }


def low_load_trial(search: CapacitySearch, start_qps: float, trial, affordable) -> Trial | str:
    """Goodput well below the capacity (the report's goodput curve starts there, not at the search's
    first rate): a trial at LOW_LOAD_SHARE of the capacity (of the lowest rate failed where none
    passed), where the configuration's share of the budget still allows one; else why not."""
    low_qps = LOW_LOAD_SHARE * (search.passed_qps or search.failed_qps or start_qps)
    if any(t.qps <= low_qps / LOW_LOAD_SHARE**0.5 for t in search.trials):
        return f"the search ran a rate near {low_qps:.3f} QPS already"
    return affordable(low_qps) or trial(low_qps)


def predicted_capacity(
    system: str,
    benchmark: str,
    root: Path,
    config: Config,
    targets: tuple,
    samples: int,
    profile_s: float,
    folder: Path,
    runs_dir: Path,
    first_trial: Trial | None = None,
    log=print,
) -> dict:
    """The configuration's capacity as harness/predict simulates the report's trials (their query
    counts, judged by the p99s alone, at `targets`) on its engine's step costs, profiled afresh for
    this report (in the runs folder, shared by the configurations whose steps cost the same) after its
    LoadGen runs, with its Offline run's output lengths; or why there is none. Made after the
    measurement, with nothing from it but the output lengths (which the exact verifier and fp32 keep
    the same), so that the two can be compared. Beside it, `reanchored`: the same prediction with the
    steps costing what `first_trial`'s steps cost against the model, in their order, as the chain's
    search re-anchors (harness/measure/calibrate.py): what one trial of the search tells the
    prediction of the machine as the search found it."""
    from harness.predict.predictor import PredictError, predict_configuration
    from sut import SaafError

    start = time.monotonic()
    try:
        prediction = predict_configuration(
            system,
            benchmark,
            SCENARIO,
            root,
            config.engine,
            folder / "offline" / "mlperf_log_accuracy.json",
            targets,
            log=lambda line: log(f"report:   {config.label}: predict: {line}"),
            user_conf=runs_dir / "predict.conf",
            trials={"seconds": TRIAL_SECONDS, "min_queries": MIN_TRIAL_QUERIES, "samples": samples},
            profile_s=profile_s,
            costs_dir=runs_dir / "step-costs",
        )
    except (PredictError, HarnessConfigError, SaafError) as e:
        log(f"report:   {config.label}: no prediction: {e}")
        return {"qps": None, "why_not": str(e)}
    seconds = time.monotonic() - start
    log(f"report:   {config.label}: predicted {prediction.describe()} in {seconds:.0f} s")
    record = {
        "qps": prediction.qps,
        "low": prediction.low,
        "high": prediction.high,
        "fit_median_error": prediction.costs.median_error,
        "account": prediction.describe(),
        "seconds": round(seconds, 1),
    }
    ratios, again = prediction.reanchored([first_trial.logs / STEPS_FILE] if first_trial and first_trial.logs else [])
    if ratios and prediction.qps is not None:
        median = statistics.median(ratios)
        record["reanchored"] = {"qps": again, "on_trial_qps": first_trial.qps, "median_ratio": round(median, 3)}
        said = f"{again:.3f} QPS" if again is not None else "no rate meets the targets"
        log(
            f"report:   {config.label}: re-anchored on its first trial's {len(ratios)} steps "
            f"({median:.2f}x the model's, median): {said}"
        )
    return record


def samples_from(
    system: System, benchmark: str, traffic: Path | None, runs_dir: Path, plan: dict
) -> tuple[Dataset, list[float] | None]:
    """The benchmark's dataset, or a user's traffic converted into runs_dir/TRAFFIC (said in `plan`)
    with its arrival times where it has them."""
    if traffic is None:
        return load_dataset(system.datasets[benchmark]), None
    from transformers import AutoTokenizer

    from harness.measure.traffic import TrafficError, convert, mean_interval_s

    try:
        arrivals = convert(traffic, AutoTokenizer.from_pretrained(system.model_for(benchmark)), runs_dir / TRAFFIC)
    except TrafficError as e:
        raise HarnessConfigError(str(e)) from None
    interval = mean_interval_s(arrivals) if arrivals else None
    plan["traffic"] = {"file": str(traffic), "mean_interval_s": interval, "replayed": interval is not None}
    return load_dataset(runs_dir / TRAFFIC), arrivals if interval is not None else None


def run_configurations(
    system_name: str,
    benchmark: str,
    runs_dir: Path,
    root: Path = REPO,
    log=print,
    clock: Callable[[], float] = time.monotonic,
    traffic: Path | None = None,
    scenario: str = SCENARIO,
    targets: tuple[float, float] | None = None,
    only: list[str] | None = None,
    budget_min: float | None = None,
) -> list[Config]:
    """Run every configuration (each checked before any starts): its Offline run, then its capacity
    search (module doc); return them. With `traffic` (harness/measure/traffic.py), on its requests in place
    of the benchmark's dataset. Raises HarnessConfigError naming the run that failed."""
    system = System.load(system_name, root)
    report = report_settings(system, benchmark)
    if budget_min is not None:
        report["budget_min"] = budget_min
    bench = BENCHMARKS[benchmark]
    if scenario not in bench.latency_limits_ms:
        raise HarnessConfigError(f"{benchmark} has no latency limits for {scenario}: {sorted(bench.latency_limits_ms)}")
    targets = tuple(targets or bench.latency_limits_ms[scenario])
    runs_dir.mkdir(parents=True, exist_ok=True)
    plan = {
        "system": system_name,
        "benchmark": benchmark,
        "settings_scenario": scenario,
        "targets_ms": list(targets),
        "capacity_spread": report["capacity_spread"],
    }
    dataset, arrivals = samples_from(system, benchmark, traffic, runs_dir, plan)
    dataset_args = ("--dataset", runs_dir / TRAFFIC) if traffic is not None else ()
    samples = plan["samples"] = min(report["samples"], len(dataset))
    if arrivals and targets != tuple(bench.latency_limits_ms[SCENARIO]):
        raise HarnessConfigError("a traffic sample's replays are judged at the Server limits: give no other targets")
    if arrivals:  # replayed: the first `samples` arrivals, request i sample i
        (runs_dir / ARRIVALS).write_text(json.dumps(arrivals[:samples]) + "\n")
    configs = select(configurations(system, benchmark, max(map(len, dataset.input_ids)), scenario), only)
    (runs_dir / "offline.conf").write_text(offline_conf(bench.loadgen_name("Offline"), samples))
    # The predictions' LoadGen settings: mlperf.conf's seeds (the trials' counts are set per rate).
    (runs_dir / "predict.conf").write_text("# harness.measure.ablation: the predictions' (mlperf.conf's seeds)\n")
    for config in configs:
        RunConfig.resolve(
            system_name, benchmark, "Offline", "performance", root, runs_dir / "offline.conf", config.engine
        )
    (runs_dir / PLAN).write_text(json.dumps({**plan, "configs": [asdict(c) for c in configs]}, indent=2) + "\n")
    import torch

    from harness.measure.roofline import measure_peaks

    gpu = torch.cuda.is_available()
    peaks = measure_peaks("cuda" if gpu else "cpu", torch.bfloat16 if gpu else torch.float32)
    (runs_dir / PEAKS).write_text(json.dumps(peaks, indent=2) + "\n")
    log(
        f"report: measured {peaks['bandwidth_gbps']:.1f} GB/s and {peaks['flops_tflops'] * 1e3:.0f} GFLOP/s "
        f"({peaks['method']})"
    )
    start = clock()
    deadline = start + report["budget_min"] * 60
    for n, config in enumerate(configs):
        share_ends = clock() + (deadline - clock()) / (len(configs) - n)
        folder = runs_dir / config.folder
        log(
            f"report: [{n + 1}/{len(configs)}] {config.label}: Offline, {samples} samples "
            f"({(clock() - start) / 60:.1f} min so far, {(deadline - clock()) / 60:.1f} left of the budget)"
        )
        # One engine for the configuration's runs: its load and warm-up once, not once per trial.
        command = worker_command(system_name, benchmark, root, config.engine, ("--log-responses", *dataset_args))
        with RunWorker(command, folder / "worker.log") as worker:
            offline = folder / "offline"
            line = worker.run("Offline", runs_dir / "offline.conf", offline, f"{config.label}'s Offline run")
            log(f"report:   {line}")
            samples_per_s = read_detail_log(offline / "mlperf_log_detail.txt")[0]["result_samples_per_second"]
            if arrivals:
                trials = ReplayTrials(
                    folder / "server",
                    lambda qps, logs: replay_command(system_name, benchmark, root, runs_dir, qps, config.engine, logs),
                    samples,
                    log=lambda line: log(f"report:   {line}"),
                )
            else:
                trials = WorkerTrials(
                    "",
                    bench.loadgen_name(SCENARIO),
                    folder / "server",
                    log=lambda line: log(f"report:   {line}"),
                    queries=lambda qps: trial_queries(qps, samples),
                    worker=worker,
                    limits_ms=targets,
                )

            def trial(qps: float) -> Trial:
                result = trials(qps)
                if not result.passed:  # where its queries met the targets: the next rate down
                    logs = read_run(result.logs)
                    good = logs.goodput(*targets)
                    result.hint_qps = good[1] if good else None
                    result.marginal = good is not None and len(logs.queries) - good[0] <= MARGINAL_SHARE * len(
                        logs.queries
                    )
                return result

            def affordable(qps: float, ends: float = share_ends, kept: str = "") -> str | None:
                if clock() + trials.seconds(qps) <= ends:
                    return None
                return (
                    f"a trial at {qps:.3f} QPS (about {trials.seconds(qps) / 60:.1f} min) would end past this "
                    f"configuration's share of the report's {report['budget_min']}-min budget{kept}"
                )

            start_qps = START_SHARE * samples_per_s
            # The search leaves time for the low-load trial (its rate guessed from the start's).
            low_s = trials.seconds(LOW_LOAD_SHARE * start_qps)
            search = search_capacity(
                trial,
                start_qps,
                TOLERANCE,
                report["max_trials"],
                GROW,
                affordable=lambda qps: affordable(qps, share_ends - low_s, " less the low-load trial's time"),
                retries=RETRIES,
            )
            low = low_load_trial(search, start_qps, trials, affordable)
        log(f"report:   {config.label}: {search.summary()}")
        if isinstance(low, str):
            log(f"report:   {config.label}: no low-load trial: {low}")
        record = search_record(search, start_qps, runs_dir, low)
        if traffic is None:
            record["predicted"] = predicted_capacity(
                system_name,
                benchmark,
                root,
                config,
                targets,
                samples,
                report["profile_s"],
                folder,
                runs_dir,
                search.trials[0] if search.trials else None,
                log,
            )
        else:
            record["predicted"] = {"qps": None, "why_not": "on a user's traffic the capacity is not predicted yet"}
        (folder / "capacity.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"report: {len(configs)} configurations in {(clock() - start) / 60:.1f} min")
    return configs

"""The measurement report's runs: one engine configuration after another on the same model and
samples, each building on the last, then a load sweep, every one a LoadGen Server run through
`python -m harness run` (one LoadGen run per process).

1. static batching, as the MLPerf reference SUTs batch (sut/engine/scheduler.py says what is emulated);
2. continuous batching on the paged KV cache, whole prompts;
3. chunked prefill, with the system's TPOT guard where it has one: the system's own batching;
4. each speculative proposer of the system's `report.proposers`, on 3;
5. each numerics option of `report.numerics` (an engine setting turned on), cumulatively on 3;
and the system's own Server settings at several arrival rates (`report.sweep`, multiples of
`report.target_qps`), past the knee included. Configurations 1-4 run with every numerics option
off, so that only 5 can move quality; a system that speculates in its own settings has that
taken out of 1-3 and 5.

Every run issues the same `report.samples` samples once each (LoadGen's equal-issue mode with as
many queries as samples; the schedule and sample seeds are mlperf.conf's), and logs every response
(`harness run --log-responses`), so one run gives both its latencies and its quality.
"""

import json
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from accuracy.dataset import load_dataset
from compliance.submission import harness_command
from harness.config import HarnessConfigError, RunConfig
from systems.benchmarks import BENCHMARKS
from systems.schema import REPO, System, expand_path

PLAN = "ablation.json"  # in the runs folder: the configurations in order (harness/report.py reads it)
SCENARIO = "Server"
GUARD = ("tpot_target_ms", "tpot_cap_ms", "ttft_patience_ms")
DEFAULTS = {"samples": 40, "target_qps": 0.5, "sweep": [0.5, 1, 2, 4], "proposers": [], "numerics": []}


@dataclass
class Config:
    folder: str  # its run's folder, under the runs folder
    label: str
    change: str  # what it changes against `builds_on`, in words
    builds_on: str | None
    kind: str  # "ablation" or "sweep"
    target_qps: float
    engine: dict  # every engine setting of the run (over the system's)
    in_sweep: bool = (
        False  # a point of the load sweep (the sweep's own runs, and the ablation's run of the system's settings)
    )


PRICES = ("price_per_hour", "price_per_accelerator_hour", "price_note")


def report_settings(system: System, benchmark: str) -> dict:
    """The system file's `saaf_harness.report` over DEFAULTS, for `benchmark`: `target_qps` may be one
    number or one per benchmark; a `price_per_accelerator_hour` becomes the machine's `price_per_hour`
    (times the description's accelerators_per_node and number_of_nodes)."""
    settings = {**DEFAULTS, **system.report}
    where = f"{system.path}: saaf_harness.report"
    unknown = sorted(set(settings) - set(DEFAULTS) - set(PRICES))
    if unknown:
        raise HarnessConfigError(f"{where} has unknown keys {unknown}; known: {sorted([*DEFAULTS, *PRICES])}")
    if not isinstance(settings["samples"], int) or settings["samples"] < 1:
        raise HarnessConfigError(f"{where}.samples must be a positive integer")
    if isinstance(settings["target_qps"], dict):
        if benchmark not in settings["target_qps"]:
            raise HarnessConfigError(f"{where}.target_qps names no rate for {benchmark}")
        settings["target_qps"] = settings["target_qps"][benchmark]
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
    for key in ("target_qps", "price_per_hour"):
        value = settings.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise HarnessConfigError(f"{where}.{key} must be a positive number, got {value!r}")
    return settings


def with_setting(engine: dict, path: str, value) -> dict:
    """`engine` with the (dotted) setting `path` set, copying what it changes."""
    head, _, rest = path.partition(".")
    if not rest:
        return {**engine, head: value}
    return {**engine, head: with_setting(dict(engine.get(head) or {}), rest, value)}


def configurations(system: System, benchmark: str, longest_prompt: int) -> list[Config]:
    from sut.config.speculative import SpeculativeConfig

    report = report_settings(system, benchmark)
    own = system.engine_settings(SCENARIO, benchmark)
    exact = {k: v for k, v in own.items() if k != "speculative_config"}
    for option in report["numerics"]:
        exact = with_setting(exact, option["setting"], False)
    # Without chunking every sequence must fit one step (sut/engine/llm_engine.py refuses otherwise).
    longest = longest_prompt + BENCHMARKS[benchmark].max_new_tokens
    unguarded = {
        **exact,
        **dict.fromkeys(GUARD),
        "max_model_len": longest,
        "max_num_batched_tokens": max(own.get("max_num_batched_tokens", 2048), longest),
    }
    rate = report["target_qps"]
    seqs = own.get("max_num_seqs", 64)
    guard = f", the TPOT guard at {own['tpot_target_ms']} ms" if own.get("tpot_target_ms") else ""
    configs = [
        Config(
            "01-static",
            "static batching",
            f"batches of up to {seqs} whole prompts, each run until its longest row ends (the MLPerf reference SUT's)",
            None,
            "ablation",
            rate,
            {**unguarded, "static_batching": True},
        ),
        Config(
            "02-continuous",
            "continuous batching",
            "requests join and leave the batch at every step (paged KV cache), whole prompts",
            "static batching",
            "ablation",
            rate,
            {**unguarded, "enable_chunked_prefill": False},
        ),
        Config(
            "03-chunked",
            "chunked prefill" + (" + TPOT guard" if guard else ""),
            f"prompts cut to the step budget of {exact.get('max_num_batched_tokens', 2048)} tokens{guard}",
            "continuous batching",
            "ablation",
            rate,
            exact,
        ),
    ]
    chunked = configs[-1]
    for i, proposer in enumerate(report["proposers"], 1):
        if "model" in proposer:  # a draft's folder, written as the system file's model folders are
            proposer = {**proposer, "model": str(expand_path(proposer["model"]))}
        name = {"ngram": "n-gram speculation", "draft_model": "draft-model speculation"}.get(
            proposer.get("method"), "speculation"
        )
        configs.append(
            Config(
                f"04-speculative-{i}",
                name,
                SpeculativeConfig.from_value(proposer).describe(),
                chunked.label,
                "ablation",
                rate,
                {**exact, "speculative_config": proposer},
            )
        )
    last = chunked
    for i, option in enumerate(report["numerics"], 1):
        configs.append(
            Config(
                f"05-numerics-{i}",
                option["name"],
                f"engine setting {option['setting']} on",
                last.label,
                "ablation",
                rate,
                with_setting(last.engine, option["setting"], True),
            )
        )
        last = configs[-1]
    for multiple in report["sweep"]:
        qps = multiple * rate
        if multiple == 1 and last.engine == own:
            last.in_sweep = True  # the ablation's run of the system's own settings is this point
            continue
        configs.append(
            Config(
                f"sweep-{qps:.3f}",
                f"system settings x{multiple:g}",
                f"{multiple:g}x the arrival rate",
                None,
                "sweep",
                qps,
                own,
                in_sweep=True,
            )
        )
    return configs


def user_conf(loadgen_model: str, qps: float, samples: int) -> str:
    key = f"{loadgen_model}.{SCENARIO}"
    return "\n".join(
        [
            "# harness.ablation: the report's run, every sample once (harness run --log-responses logs them all)",
            f"{key}.target_qps = {qps:.4f}",
            f"{key}.min_duration = 0",
            f"{key}.min_query_count = {samples}",
            f"{key}.performance_sample_count_override = {samples}",
            f"{key}.sample_concatenate_permutation = 1",
            "",
        ]
    )


def run_configurations(system_name: str, benchmark: str, runs_dir: Path, root: Path = REPO, log=print) -> list[Config]:
    """Run every configuration (each checked before any starts); return them. Raises
    HarnessConfigError naming the run whose `harness run` failed, with its error."""
    system = System.load(system_name, root)
    report = report_settings(system, benchmark)
    dataset = load_dataset(system.datasets[benchmark])
    samples = min(report["samples"], len(dataset))
    configs = configurations(system, benchmark, max(map(len, dataset.input_ids)))
    runs_dir.mkdir(parents=True, exist_ok=True)
    for config in configs:
        conf = runs_dir / f"{config.folder}.conf"
        conf.write_text(user_conf(BENCHMARKS[benchmark].loadgen_name(SCENARIO), config.target_qps, samples))
        RunConfig.resolve(system_name, benchmark, SCENARIO, "performance", root, conf, config.engine)
    (runs_dir / PLAN).write_text(
        json.dumps(
            {
                "system": system_name,
                "benchmark": benchmark,
                "samples": samples,
                "configs": [asdict(c) for c in configs],
            },
            indent=2,
        )
        + "\n"
    )
    start = time.perf_counter()
    for n, config in enumerate(configs, 1):
        log(
            f"report: [{n}/{len(configs)}] {config.label} at {config.target_qps:.3f} QPS "
            f"({(time.perf_counter() - start) / 60:.1f} min so far)"
        )
        command = harness_command(
            system_name,
            benchmark,
            SCENARIO,
            "performance",
            root,
            "--user-conf",
            str(runs_dir / f"{config.folder}.conf"),
            "--engine",
            json.dumps(config.engine),
            "--log-dir",
            str(runs_dir / config.folder),
            "--log-responses",
        )
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            errors = [
                line for line in done.stderr.splitlines() if line.startswith("error")
            ] or done.stderr.splitlines()[-3:]
            raise HarnessConfigError(f"run {config.folder} ({config.label}) failed: {' '.join(errors)}")
        log(f"report:   {done.stdout.strip().splitlines()[-1]}")
    return configs

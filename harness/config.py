"""What a run is made of: the benchmark (its entry in systems/benchmarks.py), the scenario, the
system (systems/<system>.json, read by systems/schema.py; its engine settings checked by the
engine's own rules), and the user.conf under measurements/<system>/<benchmark>/<Scenario>/, all
checked before LoadGen starts so a bad file fails with its line and key instead of being
half-applied."""

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import mlperf_loadgen as lg

from accuracy.evaluate import TokenizerError, load_tokenizer
from compliance.audit_config import AUDIT_CONFIGS
from systems.benchmarks import BENCHMARKS, ENTRIES, Benchmark
from systems.paths import committed_user_conf, run_logs
from systems.schema import REPO, System, SystemConfigError


class HarnessConfigError(ValueError):
    pass


# The registry's scenarios as LoadGen runs them.
SCENARIOS = {
    "Offline": lg.TestScenario.Offline,
    "Server": lg.TestScenario.Server,
    "Interactive": lg.TestScenario.Server,  # LoadGen's Server with the "-interactive" model's limits
    "SingleStream": lg.TestScenario.SingleStream,
}
# A compliance test (TEST06; gpt-oss-120b's TEST07 and TEST09) is a performance run under the audit
# settings of its compliance/TEST0x.audit.config (compliance/audit_config.py AUDIT_CONFIGS).
MODES = {
    "performance": lg.TestMode.PerformanceOnly,
    "accuracy": lg.TestMode.AccuracyOnly,
    **{test: lg.TestMode.PerformanceOnly for test in AUDIT_CONFIGS},
}

# user.conf keys LoadGen reads (test_settings_internal.cc); seeds come only from mlperf.conf.
USER_CONF_KEYS = {
    "target_qps",
    "target_latency",
    "target_latency_percentile",
    "min_duration",
    "max_duration",
    "min_query_count",
    "max_query_count",
    "performance_sample_count_override",
    "accuracy_sample_count_override",
    "samples_per_query",
    "max_async_queries",
    "coalesce_queries",
    "ttft_latency",
    "tpot_latency",
    "use_token_latencies",
    "infer_token_latencies",
    "token_latency_scaling_factor",
    "sample_concatenate_permutation",
    "print_timestamps",
    "mode",
    "accuracy_log_probability",
    "accuracy_log_sampling_target",
    "test05",
}
USER_CONF_LINE = re.compile(r"^\s*([\w.*-]+)\.([\w*]+)\.(\w+)\s*=\s*(\S+)\s*$")


def check_user_conf(path: Path) -> None:
    """Every non-comment line is `model.scenario.key = number` with a key LoadGen knows."""
    if not path.is_file():
        raise HarnessConfigError(f"{path}: user.conf not found")
    for n, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = USER_CONF_LINE.match(text)
        if not match:
            raise HarnessConfigError(f"{path}:{n}: expected 'model.scenario.key = value', got {line!r}")
        _, scenario, key, value = match.groups()
        if scenario != "*" and scenario not in ("Offline", "Server", "SingleStream", "MultiStream"):
            raise HarnessConfigError(f"{path}:{n}: unknown scenario {scenario!r}")
        if key not in USER_CONF_KEYS:
            raise HarnessConfigError(f"{path}:{n}: unknown key {key!r}; known keys: {sorted(USER_CONF_KEYS)}")
        try:
            number = float(value)
        except ValueError:
            raise HarnessConfigError(f"{path}:{n}: {key} must be a number, got {value!r}") from None
        if number < 0:
            raise HarnessConfigError(f"{path}:{n}: {key} must not be negative, got {value}")


def check_engine_settings(system: System, benchmark: str, scenario: str, overrides: dict | None = None) -> None:
    """The engine refuses bad settings only once it starts; this finds them before a run does, and
    names where the bad one came from: the system file, or `overrides` (`--engine`) over it."""
    from sut.config import EngineConfig
    from sut.errors import ConfigError

    def check(settings: dict) -> ConfigError | None:
        try:
            EngineConfig.from_kwargs(**settings)
        except ConfigError as e:
            return e
        return None

    own = system.engine_settings(scenario, benchmark)
    error = check({**own, **(overrides or {})})
    if error is None:
        return
    if overrides and check(own) is None:  # the file's settings alone are good: --engine's broke them
        raise HarnessConfigError(
            f"--engine {json.dumps(overrides)}: over {system.path.name}'s settings for {benchmark} {scenario}: {error}"
        )
    raise HarnessConfigError(f"{system.path}: saaf_harness engine settings for {benchmark} {scenario}: {error}")


def check_speculation_allowed(system: System, benchmark: Benchmark, scenario: str) -> None:
    """MLPerf's closed division allows speculative decoding only where a benchmark's rules name it
    (deepseek-r1 and gpt-oss-120b Interactive), and there only as the reference runs it: its method
    with its own head and number of drafts (gpt-oss-120b: EAGLE3 with
    nvidia/gpt-oss-120b-Eagle3-long-context, 3 drafts), checked here by the head folder's name."""
    spec = system.engine_settings(scenario, benchmark.name).get("speculative_config")
    if system.division != "closed" or spec is None:
        return
    allowed = ", ".join(f"{b.name} {s}" for b in ENTRIES for s in b.speculative_scenarios)
    if scenario not in benchmark.speculative_scenarios:
        raise HarnessConfigError(
            f"{system.path}: the closed division allows speculative decoding only for {allowed} "
            f"(with the reference's MTP/EAGLE head), but the engine settings for {benchmark.name} "
            f"{scenario} set speculative_config; remove it, or submit in the open division"
        )
    rule = benchmark.speculation
    spec = spec if isinstance(spec, dict) else {}
    differences = []
    if rule is None or spec.get("method") != rule.method:
        differences.append(f"method {spec.get('method')!r}")
    elif spec.get("num_speculative_tokens") != rule.num_speculative_tokens:
        differences.append(f"num_speculative_tokens {spec.get('num_speculative_tokens')!r}")
    elif spec.get("adaptive"):
        differences.append("adaptive drafting (the number of drafts is fixed)")
    elif rule.head is not None and Path(str(spec.get("model") or "")).name != rule.head.rsplit("/", 1)[-1]:
        differences.append(f"head {spec.get('model')!r} (its folder must be named {rule.head.rsplit('/', 1)[-1]!r})")
    if differences:
        reference = rule.describe() if rule else "none here yet"
        raise HarnessConfigError(
            f"{system.path}: the closed division allows speculative decoding for {benchmark.name} "
            f"{scenario} only with the reference's MTP/EAGLE head and settings ({reference}), not with "
            f"{differences[0]}"
        )


def check_mode(system: System, benchmark: Benchmark, mode: str) -> None:
    """A compliance test runs only for a benchmark whose rules name it (gpt-oss-120b: TEST07 and
    TEST09, not TEST06), and a mode whose set is not the performance set (gpt-oss-120b's accuracy
    set and TEST07's GPQA set) needs the system to name its file."""
    tests = benchmark.compliance_tests
    if mode in AUDIT_CONFIGS and tests and mode not in tests:
        raise HarnessConfigError(
            f"{benchmark.name}'s compliance tests are {', '.join(tests)}, not {mode} (the v6.1 checker's list)"
        )
    own = benchmark.mode_datasets.get(mode)
    if own is not None and mode not in system.mode_datasets.get(benchmark.name, {}):
        raise HarnessConfigError(
            f"{system.path}: saaf_harness.datasets.{benchmark.name} names no {mode!r} set: {benchmark.name}'s "
            f"{mode} runs read their own ({own.name} of the reference's download, {own.samples} samples), "
            f'not the performance set; write it as {{"performance": ..., "{mode}": ...}}'
        )


def _check_reference(reference: Path, dataset: Path, system: str) -> None:
    """A recorded reference holds only for the dataset file it was recorded on."""
    if not reference.is_file():
        raise HarnessConfigError(
            f"system {system!r} names accuracy reference {reference}, which does not exist "
            "(record it with `python -m accuracy.reference_run`)"
        )
    expected = json.loads(reference.read_text()).get("dataset_sha256")
    if expected and dataset.is_file() and hashlib.sha256(dataset.read_bytes()).hexdigest() != expected:
        raise HarnessConfigError(
            f"{dataset} is not the dataset accuracy reference {reference} was recorded on "
            f"(SHA-256 {expected}); remove it and build it again (for the demo: `make data`)"
        )


@dataclass
class RunConfig:
    system: System
    benchmark: Benchmark
    scenario: str
    mode: str
    user_conf: Path | None  # None: a run without LoadGen (harness/measure/replay.py)
    log_dir: Path
    warmup: bool = True  # the engine's warm-up before LoadGen starts
    log_responses: bool = False  # every response in the accuracy log, in performance mode too (the report's runs)
    tokenizer: object = None  # the model's, loaded by `resolve` for an accuracy run (its scoring)

    @property
    def dataset(self) -> Path:
        """The dataset file this run reads (its mode's: systems/schema.py System.dataset_for)."""
        return self.system.dataset_for(self.benchmark.name, self.mode)

    @staticmethod
    def resolve(
        system: str,
        benchmark: str,
        scenario: str,
        mode: str,
        root: Path = REPO,
        user_conf: Path | None = None,
        engine: dict | None = None,
        log_dir: Path | None = None,
        loadgen: bool = True,
    ) -> "RunConfig":
        """`user_conf`: instead of the committed measurements/<system>/<benchmark>/<Scenario>/user.conf
        (harness.measure.calibrate writes one for this machine). `engine`: settings over the system's for this
        run (one configuration of a comparison), checked like the file's; `log_dir`: instead of
        build/logs/<system>/<benchmark>/<Scenario>/<mode>/, so such a run keeps the system's logs.
        `loadgen` False: a run that reads no user.conf (harness/measure/replay.py)."""
        if benchmark not in BENCHMARKS:
            raise HarnessConfigError(f"unknown benchmark {benchmark!r}; known: {sorted(BENCHMARKS)}")
        if scenario not in SCENARIOS:
            raise HarnessConfigError(f"unknown scenario {scenario!r}; known: {sorted(SCENARIOS)}")
        if mode not in MODES:
            raise HarnessConfigError(f"unknown mode {mode!r}; known: {sorted(MODES)}")
        try:
            sys_config = System.load(system, root)
        except SystemConfigError as e:
            raise HarnessConfigError(str(e)) from None
        if engine is not None and not isinstance(engine, dict):
            raise HarnessConfigError(
                f"--engine: engine settings over the system's must be a JSON object, got {engine!r}"
            )
        check_engine_settings(sys_config, benchmark, scenario, engine)
        if engine is not None:
            sys_config.lay_over(scenario, engine)
        check_speculation_allowed(sys_config, BENCHMARKS[benchmark], scenario)
        if benchmark not in sys_config.datasets:
            raise HarnessConfigError(f"system {system!r} has no dataset for benchmark {benchmark!r}")
        check_mode(sys_config, BENCHMARKS[benchmark], mode)
        reference = sys_config.accuracy_reference
        if mode == "accuracy" and reference is not None:
            _check_reference(reference, sys_config.dataset_for(benchmark, mode), system)
        if loadgen:
            user_conf = user_conf or committed_user_conf(root, system, benchmark, scenario)
            check_user_conf(user_conf)
        if log_dir is not None and log_dir.exists() and not log_dir.is_dir():
            raise HarnessConfigError(f"--log-dir {log_dir} is a file, not a folder")
        log_dir = log_dir or run_logs(root, system, benchmark, scenario, mode)
        tokenizer = None
        if mode == "accuracy":  # scoring needs it: found missing now, not after the whole run
            try:
                tokenizer = load_tokenizer(sys_config.model_for(benchmark))
            except TokenizerError as e:
                raise HarnessConfigError(str(e)) from None
        return RunConfig(sys_config, BENCHMARKS[benchmark], scenario, mode, user_conf, log_dir, tokenizer=tokenizer)

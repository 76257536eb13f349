"""The schema of systems/<system>.json: the MLPerf system description, and our `saaf_harness`
block in it (model folder, dataset files, engine settings, scenarios), read into `System`. A bad
file fails with its path and what is wrong.

`saaf_harness.datasets` names each benchmark's dataset file: one path for every run, or, for a
benchmark whose runs read several sets (gpt-oss-120b), an object naming the file of each:
`{"performance": P, "accuracy": A, "TEST07": T}` (a mode it leaves out runs on "performance"), and
the files its accuracy script reads beside them (`"lcb_problems"`: LiveCodeBench's problems).

Engine settings come in four levels, the most specific winning (`System.engine_settings`): `engine`,
`benchmark_engine[benchmark]`, `scenario_engine[scenario]`, and a benchmark's own
`benchmark_engine[benchmark]["scenario_engine"][scenario]` (e.g. one benchmark's Interactive engine
speculating, which the closed division allows for no other). A `speculative_config.model` at any
level (a draft or head folder) is a path as the model folders are: `${SAAF_CACHE}` expanded."""

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from systems.benchmarks import SCENARIOS

REPO = Path(__file__).resolve().parents[1]


class SystemConfigError(ValueError):
    pass


# The keys of a benchmark's dataset object: the runs' modes (harness/config.py MODES), and the files
# an accuracy script reads beside the dataset.
DATASET_MODES = ("performance", "accuracy", "TEST06", "TEST07", "TEST09")
ACCURACY_FILES = ("lcb_problems",)


# A system, benchmark, scenario, model or submitter name becomes a folder name in build/ and in the
# submission tree: it must be a plain name, never a path ("..", "a/b", "/x").
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def check_name(value, what: str) -> str:
    """`value` if it is a plain name (PLAIN_NAME, not "." or ".."), else SystemConfigError."""
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value) or value in (".", ".."):
        raise SystemConfigError(
            f"{what} {value!r} is not a plain name (letters, digits, '.', '_', '+', '-', "
            "starting with a letter or digit): names become folder names, never paths"
        )
    return value


@dataclass
class System:
    name: str
    models: dict[str, Path]  # benchmark -> model folder ("model": one for all, or "models": one each)
    datasets: dict[str, Path]  # benchmark -> its performance set (and every mode's without a file of its own)
    engine: dict  # LLM engine settings
    scenario_engine: dict[str, dict]  # per-scenario settings over those (e.g. a smaller step budget for Server)
    accuracy_reference: Path | None  # a substituted model's recorded reference scores (its targets: 99%)
    scenarios: list[str]  # what `make submission` runs for each benchmark
    model_name: str | None  # open division: the substituted model, named in the tree and mapped to the benchmark
    demo: bool  # shortened runs: the checker warns about run length and dataset size instead of failing
    path: Path  # the file it was read from
    division: str = "closed"  # the description's "division"
    # Per-benchmark settings between `engine` and `scenario_engine` (a rig's split of replicas and
    # tensor-parallel ranks per model), without the entry's own "scenario_engine" ...
    benchmark_engine: dict[str, dict] = field(default_factory=dict)
    # ... which is here: benchmark -> scenario -> settings, over `scenario_engine` (the most specific).
    benchmark_scenario_engine: dict[str, dict[str, dict]] = field(default_factory=dict)
    # The measurement report's settings (harness/measure/ablation.py): samples, rates, proposers, numerics, price.
    report: dict = field(default_factory=dict)
    # benchmark -> {mode or accuracy file -> path}: the sets of modes other than performance, and the
    # files its accuracy script reads (ACCURACY_FILES), where the system file names them.
    mode_datasets: dict[str, dict[str, Path]] = field(default_factory=dict)

    @staticmethod
    def load(name: str, root: Path = REPO) -> "System":
        """`root/systems/<name>.json`; `root` is the repository except in tests."""
        check_name(name, "system name")
        path = root / "systems" / f"{name}.json"
        if not path.is_file():
            known = sorted(p.stem for p in (root / "systems").glob("*.json"))
            raise SystemConfigError(f"unknown system {name!r}: no {path}; known systems: {known}")
        try:
            raw = json.loads(path.read_text())
            harness = raw["saaf_harness"]
            reference = harness.get("accuracy_reference")
            datasets, mode_datasets = _datasets(harness["datasets"], path)
            models = (
                {b: expand_path(p) for b, p in harness["models"].items()}
                if "models" in harness
                else {b: expand_path(harness["model"]) for b in datasets}
            )
            benchmark_engine, benchmark_scenario_engine = _benchmark_engine(harness.get("benchmark_engine", {}), path)
            system = System(
                name,
                models,
                datasets,
                _settings(harness.get("engine", {}), f"{path}: saaf_harness.engine"),
                _per_scenario(harness.get("scenario_engine", {}), f"{path}: saaf_harness.scenario_engine"),
                root / reference if reference else None,
                list(harness.get("scenarios", ["Offline", "Server"])),
                harness.get("model_name"),
                bool(harness.get("demo", False)),
                path,
                division=raw.get("division", "closed"),
                benchmark_engine=benchmark_engine,
                benchmark_scenario_engine=benchmark_scenario_engine,
                report=dict(harness.get("report", {})),
                mode_datasets=mode_datasets,
            )
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise SystemConfigError(
                f"{path}: needs a 'saaf_harness' object with 'model' (or 'models') and 'datasets' ({e!r})"
            ) from e
        for benchmark in system.datasets:
            check_name(benchmark, f"{path}: saaf_harness.datasets: benchmark name")
        if system.model_name is not None:
            check_name(system.model_name, f"{path}: saaf_harness.model_name")
        if "submitter" in raw:
            check_name(raw["submitter"], f"{path}: submitter")
        if system.division not in ("closed", "open"):
            raise SystemConfigError(f"{path}: division {system.division!r} is not 'closed' or 'open'")
        without = sorted(set(system.datasets) - set(system.models))
        if without:
            raise SystemConfigError(f"{path}: saaf_harness.models names no model folder for benchmarks {without}")
        unknown = [s for s in [*system.scenarios, *system.scenario_engine] if s not in SCENARIOS]
        if unknown:
            raise SystemConfigError(
                f"{path}: saaf_harness.scenarios or scenario_engine names unknown scenarios "
                f"{unknown}; known: {sorted(SCENARIOS)}"
            )
        absent = sorted(set(system.benchmark_engine) - set(system.datasets))
        if absent:
            raise SystemConfigError(
                f"{path}: saaf_harness.benchmark_engine names benchmarks {absent} that saaf_harness.datasets "
                f"does not; its benchmarks: {sorted(system.datasets)}"
            )
        for benchmark, per_scenario in system.benchmark_scenario_engine.items():
            unknown = [s for s in per_scenario if s not in SCENARIOS]
            if unknown:
                raise SystemConfigError(
                    f"{path}: saaf_harness.benchmark_engine.{benchmark}.scenario_engine names unknown scenarios "
                    f"{unknown}; known: {sorted(SCENARIOS)}"
                )
        return system

    def dataset_for(self, benchmark: str, mode: str = "performance") -> Path:
        """The dataset file a run of `mode` reads: the mode's own where the system names one, else the
        performance set."""
        return self.mode_datasets.get(benchmark, {}).get(mode, self.datasets[benchmark])

    def accuracy_file(self, benchmark: str, name: str) -> Path | None:
        """A file the benchmark's accuracy script reads beside its dataset (ACCURACY_FILES), or None."""
        return self.mode_datasets.get(benchmark, {}).get(name)

    def use_dataset(self, benchmark: str, path: Path) -> None:
        """Every run of `benchmark` on `path` (a user's traffic in place of the benchmark's sets)."""
        self.datasets[benchmark] = Path(path)
        self.mode_datasets.pop(benchmark, None)

    def engine_settings(self, scenario: str, benchmark: str | None = None) -> dict:
        """`engine`, then `benchmark_engine[benchmark]`, then `scenario_engine[scenario]`, then the
        benchmark's own `scenario_engine[scenario]`: each over the one before."""
        return {
            **self.engine,
            **self.benchmark_engine.get(benchmark, {}),
            **self.scenario_engine.get(scenario, {}),
            **self.benchmark_scenario_engine.get(benchmark, {}).get(scenario, {}),
        }

    def lay_over(self, scenario: str, settings: dict) -> None:
        """`settings` over every level of `scenario`'s engine settings, every benchmark's (a run's
        `--engine`): over the benchmark's own scenario settings too, which `scenario_engine` is under."""
        self.scenario_engine[scenario] = {**self.scenario_engine.get(scenario, {}), **settings}
        for per_scenario in self.benchmark_scenario_engine.values():
            if scenario in per_scenario:
                per_scenario[scenario] = {**per_scenario[scenario], **settings}

    def scenario_setting_keys(self, benchmark: str | None = None) -> set[str]:
        """The engine settings some scenario sets for `benchmark` (`scenario_engine`, and the
        benchmark's own per-scenario settings)."""
        levels = [*self.scenario_engine.values(), *self.benchmark_scenario_engine.get(benchmark, {}).values()]
        return {key for settings in levels for key in settings}

    def model_for(self, benchmark: str) -> Path:
        return self.models[benchmark]


def _datasets(raw: dict, path: Path) -> tuple[dict[str, Path], dict[str, dict[str, Path]]]:
    """(benchmark -> performance set, benchmark -> {other mode or accuracy file -> path}) from
    `saaf_harness.datasets`; SystemConfigError naming the key for a bad entry."""
    if not isinstance(raw, dict):
        raise SystemConfigError(f"{path}: saaf_harness.datasets must be an object of benchmark -> dataset file")
    datasets, modes = {}, {}
    for benchmark, value in raw.items():
        where = f"{path}: saaf_harness.datasets.{benchmark}"
        if isinstance(value, str):
            datasets[benchmark] = expand_path(value)
            continue
        if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
            raise SystemConfigError(f"{where} must be a file's path, or an object of mode -> file's path")
        known = (*DATASET_MODES, *ACCURACY_FILES)
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise SystemConfigError(f"{where}: unknown key(s) {unknown}; known: {list(known)}")
        if "performance" not in value:
            raise SystemConfigError(f"{where} names no 'performance' set (every mode it leaves out runs on it)")
        datasets[benchmark] = expand_path(value["performance"])
        modes[benchmark] = {k: expand_path(v) for k, v in value.items() if k != "performance"}
    return datasets, modes


def _object(value, where: str, what: str = "an object") -> dict:
    if not isinstance(value, dict):
        raise SystemConfigError(f"{where} must be {what}, got {value!r}")
    return value


def _settings(value, where: str) -> dict:
    """A copy of one level's engine settings, a `speculative_config.model` in it expanded as a
    model folder's path is (expand_path: `${SAAF_CACHE}`, `~`)."""
    settings = dict(_object(value, where, "an object of engine settings"))
    spec = settings.get("speculative_config")
    if isinstance(spec, dict) and isinstance(spec.get("model"), str) and spec["model"]:
        settings["speculative_config"] = {**spec, "model": str(expand_path(spec["model"]))}
    return settings


def _per_scenario(raw, where: str) -> dict[str, dict]:
    """scenario -> engine settings (`_settings` of each) from a "scenario_engine" object at `where`."""
    scenarios = _object(raw, where, "an object of scenario -> engine settings")
    return {scenario: _settings(value, f"{where}.{scenario}") for scenario, value in scenarios.items()}


def _benchmark_engine(raw, path: Path) -> tuple[dict[str, dict], dict[str, dict[str, dict]]]:
    """(benchmark -> settings, benchmark -> scenario -> settings) from `saaf_harness.benchmark_engine`,
    whose entry may hold its benchmark's per-scenario settings under "scenario_engine"."""
    where = f"{path}: saaf_harness.benchmark_engine"
    settings, per_scenario = {}, {}
    for benchmark, value in _object(raw, where, "an object of benchmark -> engine settings").items():
        own = _settings(value, f"{where}.{benchmark}")
        per_scenario[benchmark] = _per_scenario(own.pop("scenario_engine", {}), f"{where}.{benchmark}.scenario_engine")
        settings[benchmark] = own
    return settings, per_scenario


def saaf_cache() -> Path:
    """Where models, datasets and the C kernels' builds live: $SAAF_CACHE, by default
    ~/.cache/saaf-infer (the Makefile exports the same default to everything it runs)."""
    return Path(os.environ.get("SAAF_CACHE") or "~/.cache/saaf-infer").expanduser()


def expand_path(value: str) -> Path:
    return Path(os.path.expandvars(value.replace("${SAAF_CACHE}", str(saaf_cache())))).expanduser()

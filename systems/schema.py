"""The schema of systems/<system>.json: the MLPerf system description, and our `saaf_harness`
block in it (model folder, dataset files, engine settings, scenarios), read into `System`. A bad
file fails with its path and what is wrong.

`saaf_harness.datasets` names each benchmark's dataset file: one path for every run, or, for a
benchmark whose runs read several sets (gpt-oss-120b), an object naming the file of each:
`{"performance": P, "accuracy": A, "TEST07": T}` (a mode it leaves out runs on "performance"), and
the files its accuracy script reads beside them (`"lcb_problems"`: LiveCodeBench's problems)."""

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
    scenario_engine: dict[str, dict]  # per-scenario overrides of those (e.g. a smaller step budget for Server)
    accuracy_reference: Path | None  # a substituted model's recorded reference scores (its targets: 99%)
    scenarios: list[str]  # what `make submission` runs for each benchmark
    model_name: str | None  # open division: the substituted model, named in the tree and mapped to the benchmark
    demo: bool  # shortened runs: the checker warns about run length and dataset size instead of failing
    path: Path  # the file it was read from
    division: str = "closed"  # the description's "division"
    # Per-benchmark settings between `engine` and `scenario_engine` (a rig's split of replicas and
    # tensor-parallel ranks per model).
    benchmark_engine: dict[str, dict] = field(default_factory=dict)
    # The measurement report's settings (harness/ablation.py): samples, rates, proposers, numerics, price.
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
            system = System(
                name,
                models,
                datasets,
                dict(harness.get("engine", {})),
                dict(harness.get("scenario_engine", {})),
                root / reference if reference else None,
                list(harness.get("scenarios", ["Offline", "Server"])),
                harness.get("model_name"),
                bool(harness.get("demo", False)),
                path,
                raw.get("division", "closed"),
                dict(harness.get("benchmark_engine", {})),
                dict(harness.get("report", {})),
                mode_datasets,
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
        return {**self.engine, **self.benchmark_engine.get(benchmark, {}), **self.scenario_engine.get(scenario, {})}

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


def saaf_cache() -> Path:
    """Where models, datasets and the C kernels' builds live: $SAAF_CACHE, by default
    ~/.cache/saaf-infer (the Makefile exports the same default to everything it runs)."""
    return Path(os.environ.get("SAAF_CACHE") or "~/.cache/saaf-infer").expanduser()


def expand_path(value: str) -> Path:
    return Path(os.path.expandvars(value.replace("${SAAF_CACHE}", str(saaf_cache())))).expanduser()

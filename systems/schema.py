"""The schema of systems/<system>.json: the MLPerf system description, and our `saaf_harness`
block in it (model folder, dataset files, engine settings, scenarios), read into `System`. A bad
file fails with its path and what is wrong."""

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from systems.benchmarks import SCENARIOS

REPO = Path(__file__).resolve().parents[1]


class SystemConfigError(ValueError):
    pass


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
    datasets: dict[str, Path]  # benchmark -> dataset file
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
            datasets = {b: expand_path(p) for b, p in harness["datasets"].items()}
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

    def engine_settings(self, scenario: str, benchmark: str | None = None) -> dict:
        return {**self.engine, **self.benchmark_engine.get(benchmark, {}), **self.scenario_engine.get(scenario, {})}

    def model_for(self, benchmark: str) -> Path:
        return self.models[benchmark]


def saaf_cache() -> Path:
    """Where models, datasets and the C kernels' builds live: $SAAF_CACHE, by default
    ~/.cache/saaf-infer (the Makefile exports the same default to everything it runs)."""
    return Path(os.environ.get("SAAF_CACHE") or "~/.cache/saaf-infer").expanduser()


def expand_path(value: str) -> Path:
    return Path(os.path.expandvars(value.replace("${SAAF_CACHE}", str(saaf_cache())))).expanduser()

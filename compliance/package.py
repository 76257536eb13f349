"""Package a system's LoadGen runs (build/logs/<system>/<benchmark>/<Scenario>/<mode>/) into an
MLPerf v6.1 submission tree (mlperf-rules.md section 5):

    <root>/<division>/<submitter>/
      systems/<system>.json                 the system description, without our harness settings
      src/                                  the code that drives LoadGen (this repository's packages),
                                            and src/<benchmark or model>/README.md for each benchmark
      documentation/README.md               (+ <model>_reference_accuracy.json for a substituted model)
      model_mapping.json                    open division with substituted models: each name -> benchmark
      results/<system>/<benchmark or model>/<Scenario>/
        measurements.json, README.md, user.conf
        performance/run_1/mlperf_log_{summary,detail}.txt
        accuracy/accuracy.txt (its hash= line that of the whole accuracy log), mlperf_log_accuracy.json
                 (cut as the official truncation step cuts it), mlperf_log_{summary,detail}.txt
        TEST06/verify_accuracy.txt, TEST06/accuracy/mlperf_log_accuracy.json
        (gpt-oss-120b: TEST07/ and TEST09/ instead, each its verify file, the whole accuracy log in
        accuracy/ and the run's summary and detail logs in performance/run_1/)

Only complete runs are packaged (compliance/run_folder.py: a killed, failed or interrupted run's
folder, or one whose files changed since, is refused by name), each the run of its folder (its
detail log's mode, scenario and benchmark, compliance/run_identity.py, and the benchmark its run
record names), and accuracy.txt only with the accuracy log it was computed from (its hash= line).
Every run folder is checked before anything is written, so a refusal leaves the tree as it was;
every path written or deleted lies inside `--out`.

    python -m compliance.package --system cpu-demo --out build/submission
"""

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from accuracy.evaluate import accuracy_log_hash
from compliance import test06, test07, test09
from compliance.loadgen_logs import RUN_RECORD, SPEC_METRICS_FILE, read_detail_log
from compliance.run_folder import RunFolderError, check_inside, complete_run, sha256_of
from compliance.run_identity import identity_mismatches
from systems.benchmarks import BENCHMARKS
from systems.paths import run_logs, scenario_logs, scenario_settings, submission_dir
from systems.schema import REPO, System, SystemConfigError

# The official truncation step keeps the first and last 4 KiB of a results accuracy log.
VIEWABLE_BYTES = 4096
CUT_MARK = b"\n\n...\n\n"  # between the two kept ends
SRC_ITEMS = (
    "sut",
    "kernels",
    "harness",
    "accuracy",
    "compliance",
    "systems",
    "measurements",
    "Makefile",
    "pyproject.toml",
    "requirements.txt",
    "requirements-models.txt",
    "README.md",
)


# The runs of a benchmark's results: performance, accuracy and its compliance tests. A benchmark
# without TEST07 or TEST09 keeps the chain's original three (TEST06 included).
BASE_MODES = ("performance", "accuracy", "TEST06")
RUN_LOGS = ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json")


class PackagingError(RuntimeError):
    pass


def run_modes(benchmark: str) -> tuple[str, ...]:
    """The `python -m harness run --mode` values of a benchmark's runs, in the chain's order."""
    tests = BENCHMARKS[benchmark].compliance_tests
    if not {"TEST07", "TEST09"} & set(tests):
        return BASE_MODES
    return ("performance", "accuracy", *(test for test in ("TEST06", "TEST07", "TEST09") if test in tests))


def eos_token_ids(model_dir: Path) -> set[int]:
    config = json.loads((model_dir / "config.json").read_text())
    eos = config.get("eos_token_id")
    return set(eos) if isinstance(eos, list) else {eos}


def truncate_accuracy_log(src: Path, dst: Path) -> str:
    """Copy `src` to `dst` cut to its first and last 4 KiB; return the SHA-256 of the full file."""
    data = src.read_bytes()
    cut = data[:VIEWABLE_BYTES] + CUT_MARK + data[-VIEWABLE_BYTES:] if len(data) >= VIEWABLE_BYTES else data
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(cut)
    return hashlib.sha256(data).hexdigest()


def packaged_runs(benchmark: str) -> dict[str, tuple[str, ...]]:
    """The run folders a scenario's results are packaged from (each `--mode`), and the files each needs."""
    rules = BENCHMARKS[benchmark]
    runs = {
        "performance": ("mlperf_log_summary.txt", "mlperf_log_detail.txt"),
        "accuracy": ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "accuracy.txt", "mlperf_log_accuracy.json"),
    }
    if rules.test06:  # its detail log says which run it was; the tree keeps only its responses
        runs["TEST06"] = ("mlperf_log_detail.txt", "mlperf_log_accuracy.json")
    if "TEST07" in rules.compliance_tests:  # its run record names its dataset and model
        runs["TEST07"] = (*RUN_LOGS, RUN_RECORD)
    if "TEST09" in rules.compliance_tests:
        runs["TEST09"] = RUN_LOGS
    return runs


def recorded_benchmark(folder: Path) -> str | None:
    """The benchmark the harness's run record in `folder` names (None: no record, or none named)."""
    try:
        record = json.loads((folder / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record.get("benchmark") if isinstance(record, dict) else None


def check_run_identity(folder: Path, run: str, benchmark: str, scenario: str) -> None:
    """PackagingError naming `folder` and what its run was, unless its detail log shows the `run`
    (performance, accuracy, TEST0x) of `benchmark` in `scenario` and its run record, where there is
    one, names that benchmark: a run made for another folder must not be packaged as this one's."""
    values, _ = read_detail_log(folder / "mlperf_log_detail.txt")
    mismatches = identity_mismatches(values, run, scenario, BENCHMARKS[benchmark])
    recorded = recorded_benchmark(folder)
    if recorded not in (None, benchmark):
        mismatches.append(f"its {RUN_RECORD} names the benchmark {recorded!r}")
    if mismatches:
        raise PackagingError(
            f"{folder} holds no {scenario} {run} run of {benchmark}: {'; '.join(mismatches)}; run it again "
            f"(`python -m harness run` with --scenario {scenario} --mode {run})"
        )


def check_runs(benchmark: str, scenario: str, settings: Path, logs: Path) -> None:
    """Before anything is written: the scenario's measurements files are there, its runs are complete,
    unchanged and each the run of its folder, and its accuracy.txt was computed from the accuracy log
    beside it. PackagingError naming the file or folder."""
    for name in ("measurements.json", "README.md", "user.conf"):
        if not (settings / name).is_file():
            raise PackagingError(f"{settings / name} is missing: the system's measurements folder needs it")
    runs = packaged_runs(benchmark)
    try:
        for run, needs in runs.items():
            complete_run(logs / run, needs=needs)
    except RunFolderError as e:
        raise PackagingError(str(e)) from None
    for run in runs:
        check_run_identity(logs / run, run, benchmark, scenario)
    scored = accuracy_log_hash((logs / "accuracy" / "accuracy.txt").read_text())
    if scored != sha256_of(logs / "accuracy" / "mlperf_log_accuracy.json"):
        raise PackagingError(
            f"{logs / 'accuracy' / 'accuracy.txt'} was not computed from the accuracy log beside it "
            f"(its hash= line is {scored}): score the run again"
        )


def _copy(src: Path, dst: Path) -> None:
    if not src.is_file():
        raise PackagingError(f"{src} is missing: run `python -m harness run` for it first")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def package_scenario(system: System, benchmark: str, scenario: str, settings: Path, logs: Path, out: Path) -> list[str]:
    """Fill `out` (results/<system>/<dir>/<Scenario>) from the scenario's measurements folder and
    run logs; return the compliance tests' failures, each after its test's name."""
    _copy(settings / "measurements.json", out / "measurements.json")
    # The LoadGen settings the performance run was given (a calibrated copy where the chain
    # calibrated the load on this machine), and the README saying how they were chosen.
    run_conf = logs / "performance" / "user.conf"
    _copy(run_conf if run_conf.is_file() else settings / "user.conf", out / "user.conf")
    _copy(settings / "README.md", out / "README.md")
    machine = logs / "performance" / "machine.txt"
    if machine.is_file():
        with open(out / "README.md", "a") as f:
            f.write(f"\nRan on: {machine.read_text().strip()}.\n")
    calibration = load_calibration(logs)
    if calibration is not None:
        with open(out / "README.md", "a") as f:
            method = calibration.get("method", "the load calibration")  # the calibration names itself
            f.write(
                f"\n## The load of this run\n\nCalibrated on the machine that ran it ({method}, whose method its "
                f"docstring states): {calibration['summary']}. user.conf here is the committed one with that "
                "target_qps.\n"
            )
            if calibration.get("trials"):
                f.write(
                    f"\nThe capacity search's LoadGen runs on this machine, in order (their verdicts LoadGen's; "
                    f"{calibration['margin']}):\n\n"
                )
                f.writelines(f"- {t['qps']:.3f} QPS: {t['detail']}\n" for t in calibration["trials"])
    for name in ("mlperf_log_summary.txt", "mlperf_log_detail.txt"):
        _copy(logs / "performance" / name, out / "performance" / "run_1" / name)
        _copy(logs / "accuracy" / name, out / "accuracy" / name)
    _copy(logs / "accuracy" / "accuracy.txt", out / "accuracy" / "accuracy.txt")  # its hash= line (check_runs)
    truncate_accuracy_log(logs / "accuracy" / "mlperf_log_accuracy.json", out / "accuracy" / "mlperf_log_accuracy.json")
    tests = BENCHMARKS[benchmark].compliance_tests
    failures = []
    if BENCHMARKS[benchmark].test06:
        eos = eos_token_ids(system.model_for(benchmark))
        failures += [f"TEST06: {f}" for f in test06.write_result(logs / "TEST06", out, scenario, eos)]
    try:
        if "TEST07" in tests:
            command = test07.run_accuracy_command(logs / "TEST07")
            failures += [f"TEST07: {f}" for f in test07.write_result(logs / "TEST07", out, command)]
        if "TEST09" in tests:
            failures += [f"TEST09: {f}" for f in test09.write_result(logs / "TEST09", out)]
    except (test07.Test07Error, test09.Test09Error) as e:
        raise PackagingError(str(e)) from None
    return failures


def load_calibration(logs: Path) -> dict | None:
    """The scenario's calibration (calibration/calibration.json) from its log folder, if the chain ran one."""
    path = logs / "calibration" / "calibration.json"
    return json.loads(path.read_text()) if path.is_file() else None


def benchmark_readme(benchmark: str, name: str, system: System) -> str:
    """src/<name>/README.md: which code produced results/*/<name>/ and how to run it again."""
    model = f" with {name} substituted for its model (model_mapping.json)" if name != benchmark else ""
    modes = " | ".join(run_modes(benchmark))
    return (
        f"# {name}\n\nMLPerf benchmark `{benchmark}`{model}. The code is this src/ folder, shared by every "
        f"benchmark (harness/ drives LoadGen, sut/ is the engine, accuracy/ and compliance/ score and check "
        f"the runs); see src/README.md.\n\nReproduce one system's results (here `{system.name}`):\n\n```sh\n"
        f"make setup models data\n"
        f"python -m harness run --system {system.name} --benchmark {benchmark} --scenario SCENARIO --mode "
        f"{{{modes}}}\n"
        f"python -m compliance.package --system {system.name} --benchmarks {benchmark}\n"
        f"# or all of it at once: make submission SYSTEM={system.name} BENCHMARKS={benchmark}\n```\n"
    )


def speculation_notes(system: System, benchmarks: list[str], root: Path) -> str:
    """Which proposer each packaged run speculated with, from what its performance run recorded."""
    notes = []
    for benchmark in benchmarks:
        for scenario in system.scenarios:
            path = run_logs(root, system.name, benchmark, scenario, "performance") / SPEC_METRICS_FILE
            if path.is_file():
                spec = json.loads(path.read_text())
                notes.append(
                    f"{benchmark} {scenario}: speculative decoding with {spec['description']}, "
                    f"acceptance rate {spec['acceptance_rate'] or 0:.3f}"
                )
    return "; ".join(notes)


def package(
    system_name: str, out: Path, benchmarks: list[str] | None = None, root: Path = REPO
) -> tuple[Path, list[str]]:
    """Build the tree under `out` from `root`'s systems/, measurements/ and build/logs/ (`root` is
    the repository except in tests); return (the submitter folder, the compliance tests' failures).
    Packaging adds to a tree: another system's or benchmark's results and model_mapping.json entries
    stay; only the packaged benchmarks' results folders are replaced."""
    system = System.load(system_name, root)
    description = json.loads((root / "systems" / f"{system_name}.json").read_text())
    description.pop("saaf_harness")  # our harness settings, not part of the MLPerf description
    missing = [key for key in ("division", "submitter") if key not in description]
    if missing:
        raise PackagingError(f"{system.path}: the system description has no {missing}")
    org = Path(out) / description["division"] / description["submitter"]
    names = {benchmark: system.model_name or benchmark for benchmark in benchmarks or sorted(system.datasets)}
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        raise PackagingError(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
    without = sorted(set(names) - set(system.datasets))
    if without:
        raise PackagingError(f"system {system.name!r} has no dataset, hence no runs, for {without}")
    if len(set(names.values())) < len(names):
        raise PackagingError(
            f"system {system.name!r} substitutes one model_name {system.model_name!r} for the "
            f"benchmarks {sorted(names)}, whose results would share one folder: package them from "
            "one system each"
        )
    mapping_path = org / "model_mapping.json"
    mapping = json.loads(mapping_path.read_text()) if mapping_path.is_file() else {}
    for benchmark, name in names.items():
        if name != benchmark and mapping.get(name, benchmark) != benchmark:
            raise PackagingError(f"{mapping_path} maps {name!r} to {mapping[name]!r}, not to {benchmark!r}")
        if name != benchmark:
            mapping[name] = benchmark
    packaged = []  # (benchmark, name, scenario, its run logs), each checked before anything is written
    for benchmark, name in names.items():
        for scenario in system.scenarios:
            logs = scenario_logs(root, system.name, benchmark, scenario)
            calibration = load_calibration(logs)
            if calibration is None or calibration["target_qps"] is not None:  # None: this machine meets no load
                check_runs(benchmark, scenario, scenario_settings(root, system.name, benchmark, scenario), logs)
            packaged.append((benchmark, name, scenario, logs, calibration))
    speculation = speculation_notes(system, list(names), root)
    if speculation:
        description["sw_notes"] = "; ".join(filter(None, [description.get("sw_notes", ""), speculation]))
    for path in (org, org / "results" / system.name, *(org / "results" / system.name / n for n in names.values())):
        try:
            check_inside(path, out, "a folder of the tree")
        except RunFolderError as e:
            raise PackagingError(str(e)) from None
    (org / "systems").mkdir(parents=True, exist_ok=True)
    (org / "systems" / f"{system.name}.json").write_text(json.dumps(description, indent=2) + "\n")
    for item in SRC_ITEMS:
        src, dst = REPO / item, org / "src" / item
        if dst.is_dir():
            shutil.rmtree(dst)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    (org / "documentation").mkdir(exist_ok=True)
    (org / "documentation" / "README.md").write_text(
        "Reproduce with the code in src/: `make submission SYSTEM=<system>` (see src/README.md, and "
        "src/<benchmark>/README.md for each benchmark).\n"
    )
    if mapping:
        mapping_path.write_text(json.dumps(mapping, indent=2, sort_keys=True) + "\n")
    failures = []
    for benchmark, name in names.items():
        (org / "src" / name).mkdir(exist_ok=True)
        (org / "src" / name / "README.md").write_text(benchmark_readme(benchmark, name, system))
        if system.accuracy_reference:
            shutil.copy2(system.accuracy_reference, org / "documentation" / f"{name}_reference_accuracy.json")
        if (org / "results" / system.name / name).exists():
            shutil.rmtree(org / "results" / system.name / name)
    for benchmark, name, scenario, logs, calibration in packaged:
        results = org / "results" / system.name / name / scenario
        if calibration is not None and calibration["target_qps"] is None:  # this machine meets no load
            with open(org / "documentation" / "README.md", "a") as f:
                f.write(f"\n{name} {calibration['summary']}\n")  # "<Scenario>: left out: why"
            continue
        settings = scenario_settings(root, system.name, benchmark, scenario)
        failures += [f"{results}: {f}" for f in package_scenario(system, benchmark, scenario, settings, logs, results)]
    return org, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmarks", nargs="*")
    parser.add_argument("--out", type=Path, default=submission_dir(REPO))
    parser.add_argument(
        "--root", type=Path, default=REPO, help="the folder holding systems/, measurements/ and build/logs/"
    )
    args = parser.parse_args()
    try:
        org, failures = package(args.system, args.out, args.benchmarks, args.root)
    except (PackagingError, SystemConfigError) as e:
        sys.exit(f"error: package: {e}")
    for failure in failures:
        print(failure)
    print(f"package: {org}")


if __name__ == "__main__":
    main()

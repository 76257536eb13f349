"""The whole submission chain for one system (what `make submission` runs): for each benchmark and
scenario, the performance, accuracy and compliance runs (TEST06; TEST07 and TEST09 for gpt-oss-120b:
compliance.package.run_modes) through `python -m harness run` (harness/commands.py); then the tree
(compliance/package.py) and our checker (compliance/check.py) over it. Data flows one way: the chain
drives the harness's runs and its measurement, then compliance's packager and checker; compliance
builds and starts no harness command.

A latency scenario (Server, Interactive) is first calibrated on this machine
(harness.measure.calibrate: its capacity at the latency limits, found by LoadGen runs): its runs
take a share of the capacity found there, and a scenario no load can meet here is left out, with
the reason, in the chain's output and the tree's documentation. A demo system also leaves out
Interactive when its runs would take the chain past DEMO_BUDGET_MIN (Server covers the checker's
"one of Server and Interactive"). An Offline performance run that ends before its min_duration
(a machine faster than the committed target_qps assumes) is run again at the rate it measured
(`offline_rate`), and that scenario's other runs take the same user.conf; a latency scenario's
performance run that LoadGen finds INVALID runs again once at a lower rate (`latency_rerun`), where
the demo's budget allows. A demo's Interactive makes its highest VALID trial the performance run
instead (calibrate's `--promote-trial`, `promoted_trial`): its 460-query runs take minutes each.

    python -m harness.submission --system cpu-demo [--benchmarks llama3.1-8b]
"""

import argparse
import io
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from accuracy.datasets.reader import DatasetError, load_dataset
from accuracy.evaluate import TokenizerError, load_tokenizer
from compliance.check import check_tree
from compliance.loadgen_logs import STEPS_FILE, read_detail_log
from compliance.package import BASE_MODES, PackagingError, load_calibration, package, run_modes
from compliance.run_folder import FolderLock, RunFolderError, clear_build_folder, complete_run
from harness.commands import harness_command, root_args
from harness.measure.estimates import LATENCY_RERUN_SHARE, accuracy_and_test06_seconds, predicted_minutes
from systems.benchmarks import BENCHMARKS, loadgen_double, with_conf_value
from systems.paths import build_dir, committed_user_conf, logs_dir, scenario_logs, submission_dir
from systems.schema import REPO, System, SystemConfigError

MODES = BASE_MODES  # a benchmark's own: run_modes(benchmark)
LATENCY_SCENARIOS = ("Server", "Interactive")
# The demo's chain, its first run to its tree: with the set-up's 2 minutes within the 35 that issue 49
# gives a fresh clone's `make submission`, and room for Interactive's second 460-query trial after a
# failed first (measurements/README.md, run AQ: left out, that trial and its runs needing 11.0 min of 10.0).
DEMO_BUDGET_MIN = 32
START_SHARE = 0.8  # of Offline's samples/s: Server's first rate in the capacity search
# Of Server's capacity: Interactive's first rate. Its limits are tighter in both, and its engine
# settings (a smaller step budget, a lower TPOT target) serve less: at Server's capacity a 2-core
# Zen 4's Interactive trial had a p99 TTFT of 22 s against the 500 ms limit.
INTERACTIVE_START_SHARE = 0.5
# An Offline rerun's target_qps over the samples/s the short run measured. LoadGen issues one query
# of target_qps x min_duration x 1.1 samples (at least min_query_count), so at that rate a rerun
# lasts 1.65x min_duration; the engine is faster on a larger query (its batches stay full), hence
# the margin, and up to OFFLINE_RERUNS reruns, each from the last one's rate.
OFFLINE_RATE_MARGIN = 1.5
OFFLINE_RERUNS = 3
LATENCY_RERUNS = 1  # at estimates.LATENCY_RERUN_SHARE of the rate


class ChainError(RuntimeError):
    """A step of the chain failed; the message names it and why."""


def run_step(command: list[str]) -> None:
    """Run one harness command (`python -m ...`), its output shown as it comes. On failure, raise
    with the command and the child's own `error:` line (held back here, so the chain ends in one)."""
    child = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE)
    reason = last = None
    try:
        # newline="": lines split at \r too, and are passed on as written, so progress bars stay bars.
        for line in io.TextIOWrapper(child.stderr, errors="replace", newline=""):
            if line.startswith("error: "):
                reason = line.strip().removeprefix("error: ")
                continue
            sys.stderr.write(line)
            sys.stderr.flush()
            last = line.strip() or last
    except KeyboardInterrupt:
        try:  # a terminal's Ctrl-C reached the child too, which ends within a step
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a `kill -INT` of this process alone did not
            child.send_signal(signal.SIGINT)
            child.wait()
        raise
    if child.wait():
        raise ChainError(
            f"`python {' '.join(command[1:])}` failed: {reason or last or f'exit status {child.returncode}'}"
        )


def offline_rate(committed_conf: Path, loadgen_model: str, logs: Path) -> list[str] | None:
    """After an Offline performance run in `logs`/performance: None if it met LoadGen's min_duration;
    otherwise the `--user-conf` arguments of a rerun, whose user.conf (in `logs`/calibration, with
    calibration.json saying why, and the short run's logs moved beside it as short-run-N) is the
    committed one with target_qps at OFFLINE_RATE_MARGIN x the samples/s the run measured."""
    detail, _ = read_detail_log(logs / "performance" / "mlperf_log_detail.txt")
    if detail.get("result_min_duration_met", True):
        return None
    measured = detail["result_samples_per_second"]
    qps = loadgen_double(measured * OFFLINE_RATE_MARGIN, 3)  # LoadGen logs it back as calibration.json has it
    text = with_conf_value(committed_conf.read_text(), loadgen_model, "Offline", "target_qps", str(qps))
    calibration = logs / "calibration"
    calibration.mkdir(parents=True, exist_ok=True)
    short_run = calibration / f"short-run-{len(list(calibration.glob('short-run-*'))) + 1}"
    shutil.move(logs / "performance", short_run)
    (calibration / "user.conf").write_text(
        f"# target_qps set on this machine by harness.submission (calibration.json beside this file)\n{text}"
    )
    summary = (
        f"Offline: a performance run at target_qps {detail['effective_target_qps']} finished in "
        f"{detail['result_max_latency_ns'] / 1e9:.1f} s, under its min_duration of "
        f"{detail['effective_min_duration_ms'] / 1e3:.0f} s, at {measured:.3f} samples/s; run again at "
        f"target_qps {qps} ({OFFLINE_RATE_MARGIN} x that rate; its logs are in {short_run})"
    )
    (calibration / "calibration.json").write_text(
        json.dumps(
            {
                "scenario": "Offline",
                "target_qps": qps,
                "measured_samples_per_s": measured,
                "summary": summary,
                "method": "harness.submission's offline_rate",
            },
            indent=2,
        )
        + "\n"
    )
    return ["--user-conf", str(calibration / "user.conf")]


def latency_rerun(
    logs: Path, loadgen_model: str, fits=lambda conf: None, leave_out: bool = False
) -> tuple[list[str] | None, str | None]:
    """After a latency scenario's performance run in `logs`/performance: (None, None) if LoadGen found
    it VALID; otherwise the `--user-conf` arguments of a rerun at LATENCY_RERUN_SHARE of its rate (the
    calibrated user.conf in `logs`/calibration rewritten, calibration.json saying why, the INVALID
    run's logs moved beside it as invalid-run-N), and what happened, in words. `fits(conf_text)`: why
    a rerun would not fit the time left, or None. Where it would not, the INVALID run stays (None for
    the arguments) and calibration.json says so; or, with `leave_out` (a demo's Interactive, which
    Server covers), the scenario is left out as a calibration leaves out one that no load meets here:
    its INVALID run's logs moved beside the calibration, target_qps None, and the reason."""
    detail, _ = read_detail_log(logs / "performance" / "mlperf_log_detail.txt")
    if detail.get("result_validity") == "VALID":
        return None, None
    calibration = logs / "calibration"
    record = json.loads((calibration / "calibration.json").read_text())
    qps = loadgen_double(detail["effective_target_qps"] * LATENCY_RERUN_SHARE, 4)
    text = with_conf_value((calibration / "user.conf").read_text(), loadgen_model, "Server", "target_qps", str(qps))
    ttft = detail.get("result_first_token_99.00_percentile_latency_ns", 0) / 1e6
    tpot = detail.get("result_time_per_output_token_99.00_percentile_ns", 0) / 1e6
    said = (
        f"the performance run at {detail['effective_target_qps']} QPS was INVALID (p99 TTFT {ttft:.0f} ms, "
        f"TPOT {tpot:.1f} ms)"
    )
    overrun = fits(text)
    if overrun:
        said += f", and a rerun at {qps} QPS {overrun}"
    if overrun and not leave_out:
        record["summary"] += f"; {said}"
    else:
        invalid = calibration / f"invalid-run-{len(list(calibration.glob('invalid-run-*'))) + 1}"
        shutil.move(logs / "performance", invalid)
        if overrun:  # as a scenario no load meets here: nothing of it is packaged (compliance.package)
            record["target_qps"], record["reason"] = None, said
            said = f"left out: {said}; its logs are in {invalid}"
            record["summary"] = f"{logs.name}: {said} (its calibration: {record['summary']})"
        else:
            (calibration / "user.conf").write_text(text)
            record["target_qps"] = qps
            said += f": run again at {qps} QPS ({LATENCY_RERUN_SHARE:.0%} of it; its logs are in {invalid})"
            record["summary"] += f"; {said}"
    (calibration / "calibration.json").write_text(json.dumps(record, indent=2) + "\n")
    return (None if overrun else ["--user-conf", str(calibration / "user.conf")]), said


def past_budget(
    user_conf: str, loadgen_model: str, dataset_size: int, elapsed_min: float, performance: bool = True
) -> str | None:
    """How a demo chain's latency scenario at the target_qps of `user_conf` (`loadgen_model`'s Server
    settings) would overrun DEMO_BUDGET_MIN after `elapsed_min`, or None when it would not; without
    `performance`, its accuracy and TEST06 runs alone (a search's trial is its performance run)."""
    minutes = (
        predicted_minutes(user_conf, loadgen_model, dataset_size)
        if performance
        else accuracy_and_test06_seconds(user_conf, loadgen_model, dataset_size) / 60
    )
    if elapsed_min + minutes <= DEMO_BUDGET_MIN:
        return None
    return (
        f"its runs would take {minutes:.0f} min, past the demo's {DEMO_BUDGET_MIN}-min budget after "
        f"{elapsed_min:.0f} min (Server covers the checker's one of Server and Interactive)"
    )


def interactive_past_budget(
    committed_conf: str,
    loadgen_model: str,
    dataset_size: int,
    server: dict,
    limits_ms: tuple[float, float],
    elapsed_min: float,
) -> str | None:
    """Why a demo leaves out Interactive without calibrating it, or None. Its limits (`limits_ms`,
    TTFT and TPOT) are tighter than Server's in both, so it sustains at most Server's calibrated
    rate (`server`: Server's calibration): when its runs would overrun the budget even at that
    rate, calibrating it (minutes) would only add to that. The reason gives the step times Server's
    calibration measured, against Interactive's limits. `committed_conf`: Interactive's committed
    user.conf (its text), `loadgen_model`: Interactive's LoadGen model name."""
    conf = with_conf_value(committed_conf, loadgen_model, "Server", "target_qps", str(server["target_qps"]))
    overrun = past_budget(conf, loadgen_model, dataset_size, elapsed_min)
    return overrun and (
        f"Interactive: left out: its tighter limits allow at most Server's {server['target_qps']:.3f} "
        f"QPS, at which {overrun}; not calibrated (Server's calibration measured the longest prompt "
        f"alone at {server['ttft_floor_ms']:.0f} ms to its first token and a decode step at batch 1 "
        f"at {server['tpot_floor_ms']:.1f} ms, against Interactive's {limits_ms[0]:.0f} / "
        f"{limits_ms[1]:.0f} ms limits)"
    )


def _elapsed(system: System, start: float) -> str:
    minutes = (time.time() - start) / 60
    if not system.demo:
        return f"{minutes:.1f} min so far"
    return f"{minutes:.1f} min so far, {max(0.0, DEMO_BUDGET_MIN - minutes):.1f} left of the demo's {DEMO_BUDGET_MIN}"


def start_qps(logs: Path, scenario: str, server: dict | None) -> float | None:
    """The capacity search's first rate: for Server, START_SHARE of the samples/s Offline's
    performance run measured (a saturated engine's rate bounds what meets latency limits); for
    Interactive, INTERACTIVE_START_SHARE of Server's capacity; None (the committed target_qps)
    without them."""
    if scenario == "Interactive":
        capacity = server.get("capacity_qps") if server else None
        return capacity and INTERACTIVE_START_SHARE * capacity
    offline = logs.parent / "Offline" / "performance" / "mlperf_log_detail.txt"
    if not offline.is_file():
        return None
    detail, _ = read_detail_log(offline)
    return START_SHARE * detail["result_samples_per_second"] if "result_samples_per_second" in detail else None


def latest_steps(logs: Path, scenario: str) -> list[Path]:
    """The steps.json of the runs this chain made before `scenario`'s calibration that re-anchor its
    prediction on the machine as it is now: Server's trials and performance run, for Interactive.
    None for Server: Offline's big batches step unlike Server's (re-anchored on them, a chain's
    Server start went from 6.949 QPS, which passed, to 8.758, which failed: measurements/README.md)."""
    if scenario == "Server":
        return []
    server = logs.parent / "Server"
    found = [
        *sorted((server / "calibration" / "capacity").glob(f"*/{STEPS_FILE}")),
        server / "performance" / STEPS_FILE,
    ]
    return [path for path in found if path.is_file()]


def calibrate(system: System, benchmark: str, scenario: str, root: Path, logs: Path, start: float) -> list[str] | None:
    """Calibrate a latency scenario; return the `--user-conf` arguments for its runs, or None when
    it is left out (the reason printed and kept in its calibration.json)."""
    server = load_calibration(logs.parent / "Server")
    loadgen_model = BENCHMARKS[benchmark].loadgen_name(scenario)
    committed = committed_user_conf(root, system.name, benchmark, scenario)
    reason = None
    if (
        system.demo
        and scenario == "Interactive"
        and server is not None
        and server["target_qps"] is not None
        and committed.is_file()
    ):  # without it, harness.measure.calibrate below says what is missing
        reason = interactive_past_budget(
            committed.read_text(),
            loadgen_model,
            len(load_dataset(system.datasets[benchmark])),
            server,
            BENCHMARKS[benchmark].latency_limits_ms[scenario],
            (time.time() - start) / 60,
        )
    if reason is not None:
        (logs / "calibration").mkdir(parents=True, exist_ok=True)
        (logs / "calibration" / "calibration.json").write_text(
            json.dumps({"scenario": scenario, "target_qps": None, "reason": reason, "summary": reason}, indent=2) + "\n"
        )
        print(f"submission: {benchmark} {reason}", flush=True)
        return None
    budget = ["--budget-min", f"{DEMO_BUDGET_MIN - (time.time() - start) / 60:.2f}"] if system.demo else []
    first = start_qps(logs, scenario, server)
    command = ["-m", "harness.measure.calibrate", "--system", system.name, "--benchmark", benchmark]
    command += ["--scenario", scenario, "--predict", *(["--start-qps", f"{first:.4f}"] if first else [])]
    command += ["--reanchor-on", *map(str, latest_steps(logs, scenario))]
    command += ["--promote-trial"] if system.demo and scenario == "Interactive" else []
    command += [*budget, *root_args(root)]
    run_step([sys.executable, *command])
    calibration = load_calibration(logs)
    if calibration["target_qps"] is not None and system.demo and scenario == "Interactive":
        overrun = past_budget(
            (logs / "calibration" / "user.conf").read_text(),
            loadgen_model,
            len(load_dataset(system.datasets[benchmark])),
            (time.time() - start) / 60,
            performance=not calibration.get("promoted"),
        )
        if overrun:
            calibration["summary"] = (
                f"Interactive: left out: at its calibrated {calibration['target_qps']:.3f} QPS "
                f"{overrun}; {calibration['summary']}"
            )
            calibration["target_qps"] = None
            (logs / "calibration" / "calibration.json").write_text(json.dumps(calibration, indent=2) + "\n")
    if calibration["target_qps"] is None:
        print(f"submission: {benchmark} {calibration['summary']}", flush=True)
        return None
    return ["--user-conf", str(logs / "calibration" / "user.conf")]


def promoted_trial(logs: Path) -> str | None:
    """Where the scenario's calibration made its VALID trial at the calibrated rate the performance
    run (calibrate's `--promote-trial`), that trial's logs copied to `logs`/performance, a complete
    run there as it was in the search; and what was done, in words. None otherwise."""
    calibration = load_calibration(logs) or {}
    if not calibration.get("promoted"):
        return None
    trial = logs / "calibration" / calibration["promoted"]
    complete_run(trial)
    shutil.copytree(trial, logs / "performance")
    return f"the search's trial at {calibration['target_qps']} QPS, VALID, is the performance run (copied from {trial})"


def check_before_runs(system: System, benchmarks: list[str]) -> None:
    """What every run of the chain needs, before the first starts: each benchmark a known one with a
    dataset in the system, the dataset of each of its runs readable (gpt-oss-120b's accuracy and
    TEST07 sets beside its performance set), its model's tokenizer there (the accuracy runs score
    with it)."""
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise ChainError(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
    without = [b for b in benchmarks if b not in system.datasets]
    if without:
        raise ChainError(f"{system.path} names no dataset for {without}; it has {sorted(system.datasets)}")
    for benchmark in benchmarks:
        for path in dict.fromkeys(system.dataset_for(benchmark, mode) for mode in run_modes(benchmark)):
            load_dataset(path)
        load_tokenizer(system.model_for(benchmark))


def chain(system_name: str, benchmarks: list[str] | None, out: Path, root: Path) -> bool:
    """Every run, the tree and its check; True when the tree passes."""
    start = time.time()
    system = System.load(system_name, root)
    benchmarks = benchmarks or sorted(system.datasets)
    check_before_runs(system, benchmarks)
    build = build_dir(root)
    # One chain per system at a time: it clears and fills build/logs/<system>/.
    lock = logs_dir(root) / f".{system_name}.chain.lock"
    with FolderLock(lock, f"the submission chain of system {system_name!r}"):
        return _chain(system, benchmarks, out, root, build, start)


def _chain(system: System, benchmarks: list[str], out: Path, root: Path, build: Path, start: float) -> bool:
    system_name = system.name
    for benchmark in benchmarks:
        for scenario in system.scenarios:
            logs = scenario_logs(root, system_name, benchmark, scenario)
            clear_build_folder(logs, build)  # no run or calibration of an earlier chain stays
            user_conf = []
            if scenario in LATENCY_SCENARIOS:
                print(
                    f"submission: {system_name} {benchmark} {scenario} calibration ({_elapsed(system, start)})",
                    flush=True,
                )
                user_conf = calibrate(system, benchmark, scenario, root, logs, start)
                if user_conf is None:
                    continue
            for mode in run_modes(benchmark):
                print(
                    f"submission: {system_name} {benchmark} {scenario} {mode} ({_elapsed(system, start)})",
                    flush=True,
                )
                command = harness_command(system_name, benchmark, scenario, mode, root)
                promoted = promoted_trial(logs) if mode == "performance" else None
                if promoted:
                    print(f"submission: {benchmark} {scenario} performance: {promoted}", flush=True)
                else:
                    run_step(command + user_conf)
                for _ in range(OFFLINE_RERUNS if scenario == "Offline" and mode == "performance" else 0):
                    rerun = offline_rate(
                        committed_user_conf(root, system_name, benchmark, scenario),
                        BENCHMARKS[benchmark].loadgen_name(scenario),
                        logs,
                    )
                    if rerun is None:
                        break
                    user_conf = rerun
                    print(f"submission: {benchmark} {load_calibration(logs)['summary']}", flush=True)
                    run_step(command + user_conf)

                def demo_overrun(conf: str) -> str | None:  # a demo's rerun, and the runs after it, must fit
                    dataset_size = len(load_dataset(system.datasets[benchmark]))
                    minutes = (time.time() - start) / 60
                    loadgen_model = BENCHMARKS[benchmark].loadgen_name(scenario)
                    return past_budget(conf, loadgen_model, dataset_size, minutes) if system.demo else None

                leave_out = system.demo and scenario == "Interactive"  # Server covers the checker's one of the two
                for _ in range(LATENCY_RERUNS if scenario in LATENCY_SCENARIOS and mode == "performance" else 0):
                    loadgen_model = BENCHMARKS[benchmark].loadgen_name(scenario)
                    rerun, said = latency_rerun(logs, loadgen_model, demo_overrun, leave_out)
                    if said:
                        print(f"submission: {benchmark} {scenario}: {said}", flush=True)
                    if rerun is None:
                        break
                    user_conf = rerun
                    run_step(command + user_conf)
                if scenario in LATENCY_SCENARIOS and load_calibration(logs)["target_qps"] is None:
                    break  # left out after its performance run: no accuracy or compliance run of it
    org, test06_failures = package(system_name, out, benchmarks, root)
    report = check_tree(out, demo=system.demo)
    for line in report.warnings:
        print(f"WARNING {line}")
    for line in report.errors + test06_failures:
        print(f"ERROR {line}")
    passed = not report.errors and not test06_failures
    print(
        f"submission: tree {org} in {(time.time() - start) / 60:.1f} min; "
        f"check{' --demo' if system.demo else ''}: {'PASS' if passed else 'FAIL'} "
        f"({len(report.errors)} errors, {len(report.warnings)} warnings)"
    )
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmarks", nargs="*")
    parser.add_argument("--out", type=Path, default=submission_dir(REPO))
    parser.add_argument(
        "--root",
        type=Path,
        default=REPO,
        help="the folder holding systems/ and measurements/; logs go to its build/logs/",
    )
    args = parser.parse_args()
    try:
        passed = chain(args.system, args.benchmarks, args.out, args.root)
    except (SystemConfigError, DatasetError, PackagingError, ChainError, RunFolderError, TokenizerError) as e:
        sys.exit(f"error: submission: {e}")
    except KeyboardInterrupt:
        print("error: submission: interrupted (Ctrl-C); the tree was not built", file=sys.stderr)
        sys.exit(130)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()

"""The whole submission chain for one system (what `make submission` runs): for each benchmark and
scenario, the performance, accuracy and TEST06 runs through `python -m harness run`; then the
tree (compliance/package.py) and our checker (compliance/check.py) over it.

A latency scenario (Server, Interactive) is first calibrated on this machine (harness.calibrate):
its runs take the target_qps measured there, and a scenario no load can meet here is left out,
with the reason, in the chain's output and the tree's documentation. A demo system also leaves out
Interactive when its runs would take the chain past DEMO_BUDGET_MIN (Server covers the checker's
"one of Server and Interactive").

    python -m compliance.submission --system cpu-demo [--benchmarks llama3.1-8b]
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from compliance.audit import LATENCY_LIMITS_MS
from compliance.check import check_tree
from compliance.package import PackagingError, load_calibration, package
from harness.config import REPO, RunConfig, System

MODES = ("performance", "accuracy", "TEST06")
LATENCY_SCENARIOS = ("Server", "Interactive")
DEMO_BUDGET_MIN = 30
TEST06_QUERIES = 100  # compliance/TEST06.audit.config


def predicted_minutes(user_conf: str, dataset_size: int) -> float:
    """How long a latency scenario's three runs take at the target_qps of `user_conf` (its text): the
    performance run's min_query_count, the accuracy run's whole dataset and TEST06's queries, each
    arriving at that rate."""
    qps = float(re.search(r"\.target_qps\s*=\s*([\d.]+)", user_conf).group(1))
    queries = re.search(r"\.min_query_count\s*=\s*(\d+)", user_conf)
    return (int(queries.group(1)) if queries else dataset_size) / qps / 60 + (dataset_size + TEST06_QUERIES) / qps / 60


def past_budget(user_conf: str, dataset_size: int, elapsed_min: float) -> str | None:
    """How a demo chain's latency scenario at the target_qps of `user_conf` would overrun
    DEMO_BUDGET_MIN after `elapsed_min`, or None when it would not."""
    minutes = predicted_minutes(user_conf, dataset_size)
    if elapsed_min + minutes <= DEMO_BUDGET_MIN:
        return None
    return (f"its runs would take {minutes:.0f} min, past the demo's {DEMO_BUDGET_MIN}-min budget after "
            f"{elapsed_min:.0f} min (Server covers the checker's one of Server and Interactive)")


def interactive_past_budget(committed_conf: str, dataset_size: int, server: dict, limits_ms: tuple[float, float],
                            elapsed_min: float) -> str | None:
    """Why a demo leaves out Interactive without calibrating it, or None. Its limits (`limits_ms`,
    TTFT and TPOT) are tighter than Server's in both, so it sustains at most Server's calibrated
    rate (`server`: Server's calibration): when its runs would overrun the budget even at that
    rate, calibrating it (minutes) would only add to that. The reason gives the step times Server's
    calibration measured, against Interactive's limits."""
    conf = re.sub(r"\.target_qps\s*=\s*[\d.]+", f".target_qps = {server['target_qps']}", committed_conf)
    overrun = past_budget(conf, dataset_size, elapsed_min)
    return overrun and (f"Interactive: left out: its tighter limits allow at most Server's {server['target_qps']:.3f} "
                        f"QPS, at which {overrun}; not calibrated (Server's calibration measured the longest prompt "
                        f"alone at {server['ttft_floor_ms']:.0f} ms to its first token and a decode step at batch 1 "
                        f"at {server['tpot_floor_ms']:.1f} ms, against Interactive's {limits_ms[0]:.0f} / "
                        f"{limits_ms[1]:.0f} ms limits)")


def calibrate(system: System, benchmark: str, scenario: str, logs: Path, start: float) -> list[str] | None:
    """Calibrate a latency scenario; return the `--user-conf` arguments for its runs, or None when
    it is left out (the reason printed and kept in its calibration.json)."""
    from harness.dataset import load_cnn_eval

    server = load_calibration(logs.parent / "Server")
    reason = None
    if system.demo and scenario == "Interactive" and server is not None and server["target_qps"] is not None:
        cfg = RunConfig.resolve(system.name, benchmark, scenario, "performance")
        reason = interactive_past_budget(cfg.user_conf.read_text(), len(load_cnn_eval(system.datasets[benchmark])),
                                         server, LATENCY_LIMITS_MS[cfg.benchmark.loadgen_model][scenario],
                                         (time.time() - start) / 60)
    if reason is not None:
        (logs / "calibration").mkdir(parents=True, exist_ok=True)
        (logs / "calibration" / "calibration.json").write_text(
            json.dumps({"scenario": scenario, "target_qps": None, "reason": reason, "summary": reason}, indent=2) + "\n")
        print(f"submission: {benchmark} {reason}", flush=True)
        return None
    command = [sys.executable, "-m", "harness.calibrate", "--system", system.name, "--benchmark", benchmark,
               "--scenario", scenario]
    if subprocess.run(command, cwd=REPO).returncode:
        sys.exit(f"submission: `{' '.join(command[1:])}` failed; stopping")
    calibration = load_calibration(logs)
    if calibration["target_qps"] is not None and system.demo and scenario == "Interactive":
        overrun = past_budget((logs / "calibration" / "user.conf").read_text(),
                              len(load_cnn_eval(system.datasets[benchmark])), (time.time() - start) / 60)
        if overrun:
            calibration["summary"] = (f"Interactive: left out: at its calibrated {calibration['target_qps']:.3f} QPS "
                                      f"{overrun}; {calibration['summary']}")
            calibration["target_qps"] = None
            (logs / "calibration" / "calibration.json").write_text(json.dumps(calibration, indent=2) + "\n")
    if calibration["target_qps"] is None:
        print(f"submission: {benchmark} {calibration['summary']}", flush=True)
        return None
    return ["--user-conf", str(logs / "calibration" / "user.conf")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmarks", nargs="*")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "submission")
    args = parser.parse_args()
    start = time.time()
    system = System.load(args.system)
    benchmarks = args.benchmarks or sorted(system.datasets)
    for benchmark in benchmarks:
        for scenario in system.scenarios:
            logs = REPO / "build" / "logs" / args.system / benchmark / scenario
            shutil.rmtree(logs, ignore_errors=True)  # no run or calibration of an earlier chain stays
            user_conf = []
            if scenario in LATENCY_SCENARIOS:
                print(f"submission: {args.system} {benchmark} {scenario} calibration "
                      f"({(time.time() - start) / 60:.1f} min so far)", flush=True)
                user_conf = calibrate(system, benchmark, scenario, logs, start)
                if user_conf is None:
                    continue
            for mode in MODES:
                print(f"submission: {args.system} {benchmark} {scenario} {mode} "
                      f"({(time.time() - start) / 60:.1f} min so far)", flush=True)
                command = [sys.executable, "-m", "harness", "run", "--system", args.system, "--benchmark", benchmark,
                           "--scenario", scenario, "--mode", mode, *user_conf]
                if subprocess.run(command, cwd=REPO).returncode:
                    sys.exit(f"submission: `{' '.join(command[1:])}` failed; stopping")
    try:
        org, test06_failures = package(args.system, args.out, benchmarks)
    except PackagingError as e:
        sys.exit(f"submission: {e}")
    report = check_tree(args.out, demo=system.demo)
    for line in report.warnings:
        print(f"WARNING {line}")
    for line in report.errors + test06_failures:
        print(f"ERROR {line}")
    passed = not report.errors and not test06_failures
    print(f"submission: tree {org} in {(time.time() - start) / 60:.1f} min; "
          f"check{' --demo' if system.demo else ''}: {'PASS' if passed else 'FAIL'} "
          f"({len(report.errors)} errors, {len(report.warnings)} warnings)")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()

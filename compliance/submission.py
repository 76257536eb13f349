"""The whole submission chain for one system (what `make submission` runs): for each benchmark and
scenario, the performance, accuracy and TEST06 runs through `python -m harness run`; then the
tree (compliance/package.py) and our checker (compliance/check.py) over it.

    python -m compliance.submission --system cpu-demo [--benchmarks llama3.1-8b]
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

from compliance.check import check_tree
from compliance.package import PackagingError, package
from harness.config import REPO, System

MODES = ("performance", "accuracy", "TEST06")


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
            for mode in MODES:
                print(f"submission: {args.system} {benchmark} {scenario} {mode} "
                      f"({(time.time() - start) / 60:.1f} min so far)", flush=True)
                command = [sys.executable, "-m", "harness", "run", "--system", args.system, "--benchmark", benchmark,
                           "--scenario", scenario, "--mode", mode]
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

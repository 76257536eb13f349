"""`python -m harness run --system S --benchmark B --scenario X --mode performance|accuracy|TEST06`"""

import argparse
import sys
from pathlib import Path

from accuracy.dataset import DatasetError
from harness.config import MODES, SCENARIOS, HarnessConfigError, RunConfig
from systems.benchmarks import BENCHMARKS
from systems.schema import REPO


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness", description="Run a LoadGen test on the engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="one LoadGen run")
    run_parser.add_argument("--system", default="cpu-demo")
    run_parser.add_argument("--benchmark", default="llama3.1-8b", help=f"one of {sorted(BENCHMARKS)}")
    run_parser.add_argument("--scenario", default="Offline", help=f"one of {sorted(SCENARIOS)}")
    run_parser.add_argument("--mode", default="performance", help=f"one of {sorted(MODES)}")
    run_parser.add_argument("--user-conf", type=Path, help="LoadGen settings in place of the committed user.conf "
                            "(e.g. the one harness.calibrate wrote for this machine)")
    run_parser.add_argument("--root", type=Path, default=REPO,
                            help="the folder holding systems/ and measurements/; logs go to its build/logs/")
    args = parser.parse_args()
    from harness.run import run
    from sut import SaafError

    try:
        print(run(RunConfig.resolve(args.system, args.benchmark, args.scenario, args.mode, args.root,
                                          args.user_conf)))
    except (HarnessConfigError, DatasetError, SaafError) as e:  # a user's error: one line, no traceback
        sys.exit(f"error: harness: {e}")


if __name__ == "__main__":
    main()

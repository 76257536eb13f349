"""How a harness run is started as a process: `python -m harness run` for one run. The `make
submission` chain's runs (harness/submission.py) and the load calibration's trials
(harness/measure/calibrate.py) are all started this way."""

import sys
from pathlib import Path

from systems.schema import REPO


def root_args(root: Path) -> list[str]:
    """`--root` for a command of ours: none for the repository itself."""
    return [] if root == REPO else ["--root", str(root)]


def harness_command(system: str, benchmark: str, scenario: str, mode: str, root: Path, *args) -> list[str]:
    """`python -m harness run` for one run (extra `args` on its command line)."""
    command = ["-m", "harness", "run", "--system", system, "--benchmark", benchmark, "--scenario", scenario]
    return [sys.executable, *command, "--mode", mode, *root_args(root), *map(str, args)]

"""`python -m harness run --system S --benchmark B --scenario X --mode performance|accuracy|TEST06|TEST07|TEST09
[--config FILE.yaml] [--engine JSON] [--log-dir DIR]` (the compliance modes a benchmark's rules name:
TEST06 for the llama benchmarks and deepseek-r1, TEST07 and TEST09 for gpt-oss-120b)"""

import argparse
import json
import os
import sys
from pathlib import Path

from accuracy.accuracy_log import AccuracyLogError
from accuracy.datasets.reader import DatasetError
from accuracy.deepseek_r1 import DeepSeekR1AccuracyError
from accuracy.gpt_oss import GptOssAccuracyError
from compliance.run_folder import RunFolderError
from harness.config import MODES, SCENARIOS, HarnessConfigError, RunConfig
from systems.benchmarks import BENCHMARKS
from systems.schema import REPO


def engine_settings_file(path: Path) -> dict:
    """Engine settings from a YAML file (a mapping of setting names to values), or exit naming what
    is wrong with it; the settings themselves are checked with the system's."""
    import yaml

    try:
        settings = yaml.safe_load(path.read_text())
    except OSError as e:
        sys.exit(f"error: harness: --config {path}: cannot read it ({e.strerror})")
    except yaml.YAMLError as e:
        sys.exit(f"error: harness: --config {path}: not valid YAML ({e})")
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        sys.exit(
            f"error: harness: --config {path}: expected a mapping of engine settings, got {type(settings).__name__}"
        )
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness", description="Run a LoadGen test on the engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="one LoadGen run")
    run_parser.add_argument("--system", default="cpu-demo")
    run_parser.add_argument("--benchmark", default="llama3.1-8b", help=f"one of {sorted(BENCHMARKS)}")
    run_parser.add_argument("--scenario", default="Offline", help=f"one of {sorted(SCENARIOS)}")
    run_parser.add_argument("--mode", default="performance", help=f"one of {sorted(MODES)}")
    run_parser.add_argument(
        "--user-conf",
        type=Path,
        help="LoadGen settings in place of the committed user.conf "
        "(e.g. the one harness.measure.calibrate wrote for this machine)",
    )
    run_parser.add_argument(
        "--root",
        type=Path,
        default=REPO,
        help="the folder holding systems/ and measurements/; logs go to its build/logs/",
    )
    run_parser.add_argument(
        "--config",
        type=Path,
        help="engine settings over the system's for this run, from a YAML file (as vLLM's --config; "
        "JSON is YAML too); --engine's go over these",
    )
    run_parser.add_argument(
        "--engine",
        help="engine settings over the system's for this run, as JSON "
        """(e.g. '{"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}')""",
    )
    run_parser.add_argument("--log-dir", type=Path, help="the run's logs here instead of under build/logs/")
    run_parser.add_argument(
        "--dataset",
        type=Path,
        help="samples from this file (the benchmark's dataset format) in place of the system's: a user's "
        "traffic (python -m harness.measure.report --traffic converts it); never for a submission",
    )
    run_parser.add_argument(
        "--no-warmup", action="store_true", help="start LoadGen without the engine's warm-up (to measure what it saves)"
    )
    run_parser.add_argument(
        "--log-responses",
        action="store_true",
        help="log every response in the accuracy log in performance mode too (the report's runs)",
    )
    args = parser.parse_args()
    from harness.loadgen_sut import Interrupted
    from harness.run import RunFailed, run
    from sut import SaafError

    engine = None
    if args.config is not None:
        engine = engine_settings_file(args.config)
    if args.engine is not None:
        try:
            engine = {**(engine or {}), **json.loads(args.engine)}
        except json.JSONDecodeError as e:
            sys.exit(f"error: harness: --engine is not JSON: {e}")
        except TypeError:
            sys.exit("error: harness: --engine must be a JSON object of engine settings")
    try:
        cfg = RunConfig.resolve(
            args.system, args.benchmark, args.scenario, args.mode, args.root, args.user_conf, engine, args.log_dir
        )
        cfg.warmup, cfg.log_responses = not args.no_warmup, args.log_responses
        if args.dataset is not None:
            cfg.system.use_dataset(args.benchmark, args.dataset)
        print(run(cfg))
    except RunFailed as e:
        print(e.summary)
        sys.exit(f"error: harness: {e}")
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"error: harness: {e or 'interrupted (Ctrl-C)'}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # LoadGen's thread may still run its test, and the interpreter's exit would tear it down
        # under it (a segmentation fault): end the process here, as a SIGINT would, with 130.
        os._exit(130)
    except (
        HarnessConfigError,
        DatasetError,
        SaafError,
        RunFolderError,
        AccuracyLogError,
        GptOssAccuracyError,
        DeepSeekR1AccuracyError,
    ) as e:
        # a user's error (a scorer's included: the run is marked failed): one line
        sys.exit(f"error: harness: {e}")


if __name__ == "__main__":
    main()

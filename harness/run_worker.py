"""LoadGen runs on one engine that stays loaded: the report's runs of a configuration (harness/measure/ablation.py)
pay the model's load and warm-up once, not once per trial.

`python -m harness.run_worker --system S --benchmark B [--root R] [--engine JSON] [--dataset F]
[--log-responses]` loads the engine with the system's Server settings under --engine's, then reads one
run per line on stdin, a JSON object {"scenario", "user_conf", "log_dir"} (performance mode), runs it
(harness/run.py, a fresh block manager and scheduler each time) and answers with one JSON line on
stdout, {"summary": ...} or {"error": ...}; a run whose engine settings differ from the engine's is
refused. What else it prints goes to stderr. It ends when stdin does.

`RunWorker` is the other side: it starts the worker, sends runs, and raises HarnessConfigError
naming the run where a run fails or the worker dies (with the end of its log), never waiting on a
dead one."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from harness.config import HarnessConfigError, RunConfig
from systems.schema import REPO

ENGINE_SCENARIO = "Server"  # the engine is loaded with this scenario's settings (the report's)
LOG_TAIL = 2000  # characters of a dead worker's log in its error


class RunWorker:
    """A `python -m harness.run_worker` process: `run(scenario, user_conf, log_dir)` per LoadGen run,
    `close()` when done (or use it as a context manager). Its stderr goes to `log_path`."""

    def __init__(self, command: list[str], log_path: Path):
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)

    def run(self, scenario: str, user_conf: Path, log_dir: Path, what: str) -> str:
        """One run; its summary line. HarnessConfigError naming `what` if it failed or the worker died."""
        request = {"scenario": scenario, "user_conf": str(user_conf), "log_dir": str(log_dir)}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:  # the worker ended: its exit status and the end of its log say why
            code = self.proc.wait()
            tail = self.log_path.read_text()[-LOG_TAIL:].strip() if self.log_path.exists() else ""
            raise HarnessConfigError(f"{what} failed: the run worker ended (exit status {code}): {tail}")
        reply = json.loads(line)
        if "error" in reply:
            raise HarnessConfigError(f"{what} failed: {reply['error']}")
        return reply["summary"]

    def close(self) -> None:
        """End the worker (stdin's end asks it to) and wait for it; kill it if it does not end."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self) -> "RunWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def worker_command(system: str, benchmark: str, root: Path, engine: dict, extra: tuple = ()) -> list[str]:
    return [
        sys.executable,
        *("-m", "harness.run_worker", "--system", system, "--benchmark", benchmark, "--root", str(root)),
        *("--engine", json.dumps(engine), *map(str, extra)),
    ]


def serve(args, replies) -> None:
    from accuracy.datasets.reader import load_dataset
    from harness.run import RunFailed, load_engine, run

    def resolve(scenario: str, user_conf: Path | None, log_dir: Path | None) -> RunConfig:
        cfg = RunConfig.resolve(
            args.system,
            args.benchmark,
            scenario,
            "performance",
            args.root,
            user_conf,
            args.engine,
            log_dir,
            loadgen=user_conf is not None,
        )
        cfg.log_responses = args.log_responses
        if args.dataset is not None:
            cfg.system.datasets[args.benchmark] = args.dataset
        return cfg

    loaded = resolve(ENGINE_SCENARIO, None, None)
    settings = loaded.system.engine_settings(ENGINE_SCENARIO, args.benchmark)
    engine = load_engine(loaded, load_dataset(loaded.system.datasets[args.benchmark]))
    try:
        for line in sys.stdin:
            try:
                request = json.loads(line)
                cfg = resolve(request["scenario"], Path(request["user_conf"]), Path(request["log_dir"]))
                if cfg.system.engine_settings(cfg.scenario, args.benchmark) != settings:
                    raise HarnessConfigError(
                        f"a {cfg.scenario} run's engine settings differ from the worker's engine "
                        f"({ENGINE_SCENARIO}'s under --engine): start a worker for them"
                    )
                reply = {"summary": run(cfg, engine)}
            except RunFailed as e:
                reply = {"error": f"{e} ({e.summary})"}
            except (HarnessConfigError, ValueError, KeyError, TypeError) as e:
                reply = {"error": f"{type(e).__name__}: {e}"}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.run_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--root", type=Path, default=REPO)
    parser.add_argument("--engine", type=json.loads, help="engine settings over the system's, as JSON")
    parser.add_argument("--dataset", type=Path, help="samples from this file in place of the system's")
    parser.add_argument("--log-responses", action="store_true", help="every response in the accuracy log")
    args = parser.parse_args()
    # Replies on the real stdout; whatever else prints (warm-up, LoadGen, progress) goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from accuracy.datasets.reader import DatasetError
    from sut import SaafError

    try:
        serve(args, replies)
    except (HarnessConfigError, DatasetError, SaafError) as e:  # before the engine served: one line
        sys.exit(f"error: run_worker: {e}")


if __name__ == "__main__":
    main()

"""A user's traffic at its own arrival times, faster or slower: what LoadGen cannot do (its Server
scenario draws Poisson arrivals and follows no other schedule), for the report's capacity search
on a traffic sample that has arrival times (harness/measure/traffic.py).

    python -m harness.measure.replay --system S --benchmark B --dataset traffic.json --arrivals arrivals.json \
        --qps R --log-dir DIR [--engine JSON]

Request i (sample i of the dataset) is added to the engine at (a_i - a_0) x scale seconds after the
start, where the scale makes the sequence's mean rate R (its mean interval, span / (n - 1), over
1 / R): the same sequence, its bursts and lulls kept, stretched or squeezed. The engine steps in the
main thread (as under LoadGen: harness/loadgen_sut.py); a thread adds the requests on time. Each
request's first token and completion are timed from its scheduled arrival, as LoadGen times them,
into `replay.json` in a run folder (compliance/run_folder.py) with the harness's run.json;
harness/measure/run_logs.py reads it as it reads a LoadGen run, with LoadGen's percentile rule, and checks
the p99s against the benchmark's Server limits as LoadGen would.
"""

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from accuracy.datasets.reader import DatasetError, load_dataset
from compliance.run_folder import RunFolder, RunFolderError
from harness.config import HarnessConfigError, RunConfig
from harness.loadgen_sut import EngineLoop
from harness.measure.run_logs import REPLAY_LOG
from harness.run import check_token_ids, sampling_params, write_run_record
from systems.schema import REPO

LEAD_S = 0.2  # between the thread's start and the first arrival


def scaled_arrivals(arrivals_s: list[float], qps: float) -> list[float]:
    """Seconds from the start at which each request arrives for a mean rate of `qps`."""
    if len(arrivals_s) < 2 or arrivals_s[-1] <= arrivals_s[0]:
        raise ValueError("a replay needs at least two arrival times spanning some time")
    scale = (arrivals_s[-1] - arrivals_s[0]) / (len(arrivals_s) - 1) * qps
    return [(a - arrivals_s[0]) / scale for a in arrivals_s]


def replay(cfg: RunConfig, arrivals_s: list[float], qps: float) -> str:
    """Run the replay into cfg.log_dir; return its summary line."""
    dataset = load_dataset(cfg.system.datasets[cfg.benchmark.name])
    model = cfg.system.model_for(cfg.benchmark.name)
    check_token_ids(dataset, model)
    times = scaled_arrivals(arrivals_s, qps)
    folder = RunFolder(cfg.log_dir)
    folder.open({"system": cfg.system.name, "benchmark": cfg.benchmark.name, "scenario": "Server", "mode": "replay"})
    from sut import make_engine

    engine = make_engine(model, **cfg.system.engine_settings("Server", cfg.benchmark.name))
    try:
        params = sampling_params(cfg, dataset)
        engine.warmup()
        queries = [{"sample": i % len(dataset), "scheduled_ns": round(t * 1e9)} for i, t in enumerate(times)]
        lock, finished = threading.Lock(), [0]
        errors = []

        def on_finish(out) -> None:
            q = queries[out.request_id]
            q["latency_ns"] = time.perf_counter_ns() - start_ns - q["scheduled_ns"]
            q["tokens"] = list(out.token_ids)
            if out.error is not None:
                errors.append(f"request {out.request_id}: {out.error}")
            with lock:
                finished[0] += 1
                if finished[0] == len(queries):
                    loop.stop()

        stopped = threading.Event()  # a dead worker or a refused request: the run ends, nothing more is added

        def end(error: str) -> None:
            errors.append(error)
            stopped.set()
            loop.stop()

        loop = EngineLoop(engine, on_finish, on_fatal=lambda error: end(str(error)))
        start_ns = time.perf_counter_ns() + round(LEAD_S * 1e9)

        def first_token(i: int):
            def on_token(token: int) -> None:
                q = queries[i]
                if "ttft_ns" not in q:
                    q["ttft_ns"] = time.perf_counter_ns() - start_ns - q["scheduled_ns"]

            return on_token

        def issue() -> None:
            for i, q in enumerate(queries):
                if stopped.wait(max(0.0, (start_ns + q["scheduled_ns"] - time.perf_counter_ns()) / 1e9)):
                    return
                p = params[q["sample"]] if isinstance(params, list) else params
                try:
                    engine.add_request(dataset.input_ids[q["sample"]], p, request_id=i, on_token=first_token(i))
                except Exception as e:  # noqa: BLE001 - refused up front: the run ends with it, no hang
                    end(f"request {i} (sample {q['sample']}): {e}")
                    return
                loop.wake()

        thread = threading.Thread(target=issue, daemon=True)
        thread.start()
        loop.run()
        thread.join()
        write_run_record(cfg, engine, len(dataset))
    except BaseException as e:
        folder.fail(f"{type(e).__name__}: {e}")
        raise
    finally:
        engine.close()
    limits = cfg.benchmark.latency_limits_ms["Server"]
    if errors:
        folder.fail(f"{len(errors)} requests failed (the first: {errors[0]})")
        raise HarnessConfigError(f"{len(errors)} requests failed (the first: {errors[0]})")
    log = {"qps": qps, "limits_ms": list(limits), "arrivals_s": arrivals_s, "queries": queries}
    (cfg.log_dir / REPLAY_LOG).write_text(json.dumps(log) + "\n")
    summary = f"Server replay of {len(queries)} arrivals at {qps:.3f} q/s; logs in {cfg.log_dir}"
    folder.complete(summary)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.measure.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--root", type=Path, default=REPO)
    parser.add_argument("--dataset", type=Path, required=True, help="the traffic as a dataset file")
    parser.add_argument("--arrivals", type=Path, required=True, help="a JSON list of arrival times (seconds)")
    parser.add_argument("--qps", type=float, required=True, help="the mean rate to replay them at")
    parser.add_argument("--engine", help="engine settings over the system's, as JSON")
    parser.add_argument("--log-dir", type=Path, required=True)
    args = parser.parse_args()
    try:
        engine = json.loads(args.engine) if args.engine else None
        cfg = RunConfig.resolve(
            args.system, args.benchmark, "Server", "performance", args.root, None, engine, args.log_dir, loadgen=False
        )
        cfg.system.datasets[args.benchmark] = args.dataset
        print(replay(cfg, json.loads(args.arrivals.read_text()), args.qps))
    except (HarnessConfigError, DatasetError, RunFolderError, ValueError, OSError) as e:
        sys.exit(f"error: replay: {e}")


if __name__ == "__main__":
    main()

"""python -m harness.predict --system S --benchmark B --scenario X [--engine JSON]: the predicted
capacity of a configuration at its scenario's latency limits, with its band and the step-cost
model's fit error; the last line `predicted capacity: Q QPS (band LO-HI)`."""

import argparse
import json
import sys
from pathlib import Path

from accuracy.datasets.reader import DatasetError, load_dataset
from harness.config import HarnessConfigError, RunConfig
from harness.predict.predictor import (
    PredictError,
    output_lengths,
    predict,
    schedule_settings,
    simulated_engine,
    step_costs,
)
from harness.predict.simulate import Workload
from systems.schema import REPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--scenario", default="Server", choices=["Server", "Interactive"])
    parser.add_argument("--engine", type=json.loads, help="engine settings over the system's, as `harness run` takes")
    parser.add_argument("--ttft-ms", type=float, help="TTFT limit instead of the scenario's")
    parser.add_argument("--tpot-ms", type=float, help="TPOT limit instead of the scenario's")
    parser.add_argument(
        "--accuracy-log", type=Path, help="whose output lengths (default: the system's Offline accuracy run)"
    )
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    from sut import SaafError, make_engine

    engine = None
    try:
        cfg = RunConfig.resolve(
            args.system, args.benchmark, args.scenario, "performance", args.root, engine=args.engine
        )
        dataset = load_dataset(cfg.system.datasets[cfg.benchmark.name])
        log = args.accuracy_log or cfg.log_dir.parent.parent / "Offline" / "accuracy" / "mlperf_log_accuracy.json"
        workload = Workload(dataset.input_ids, output_lengths(log, len(dataset)))
        schedule = schedule_settings(cfg)
        limits = schedule["limits_ms"]
        schedule["limits_ms"] = (args.ttft_ms or limits[0], args.tpot_ms or limits[1])
        settings = cfg.system.engine_settings(args.scenario, cfg.benchmark.name)
        engine = make_engine(cfg.system.model_for(cfg.benchmark.name), **settings)
        costs = step_costs(engine, cfg, dataset.input_ids, settings, args.root)
        simulated = simulated_engine(engine, costs, cfg.benchmark.max_tokens("performance"))
    except (HarnessConfigError, DatasetError, PredictError, SaafError) as e:
        sys.exit(f"error: predict: {e}")
    finally:
        if engine is not None:
            engine.close()
    prediction = predict(simulated, workload, schedule)
    ttft, tpot = schedule["limits_ms"]
    print(f"{args.scenario} at TTFT {ttft:.0f} ms / TPOT {tpot:.0f} ms: {prediction.describe()}")
    if prediction.qps is None:
        sys.exit("predicted capacity: none (no rate meets the limits in simulation)")
    print(f"predicted capacity: {prediction.qps:.3f} QPS (band {prediction.low or 0:.3f}-{prediction.high or 0:.3f})")


if __name__ == "__main__":
    main()

"""python -m harness.predict --system S --benchmark B --scenario X [--engine JSON] [--configurations
JSON ...]: the predicted capacity of each configuration (the system's settings with `--engine`, then
each of `--configurations` over them) at its scenario's latency limits, with its band and the
step-cost model's fit error; the last line `predicted capacity: Q QPS (band LO-HI)`, for the first."""

import argparse
import json
import sys
from pathlib import Path

from accuracy.datasets.reader import DatasetError
from harness.config import HarnessConfigError
from harness.predict.predictor import PredictError, predict_configuration
from systems.schema import REPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--scenario", default="Server", choices=["Server", "Interactive"])
    parser.add_argument("--engine", type=json.loads, help="engine settings over the system's, as `harness run` takes")
    parser.add_argument(
        "--configurations", type=json.loads, nargs="*", default=[], help="more configurations: settings over --engine's"
    )
    parser.add_argument("--ttft-ms", type=float, help="TTFT limit instead of the scenario's")
    parser.add_argument("--tpot-ms", type=float, help="TPOT limit instead of the scenario's")
    parser.add_argument(
        "--accuracy-log", type=Path, help="whose output lengths (default: the system's Offline accuracy run)"
    )
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    from sut import SaafError

    predictions = []
    for overrides in [{}, *args.configurations]:
        if not isinstance(overrides, dict):
            sys.exit(f"error: predict: --configurations: each is a JSON object of engine settings, got {overrides!r}")
        merged = {**(args.engine or {}), **overrides} or None
        try:
            prediction = predict_configuration(
                args.system,
                args.benchmark,
                args.scenario,
                args.root,
                merged,
                args.accuracy_log,
                (args.ttft_ms, args.tpot_ms),
            )
        except (HarnessConfigError, DatasetError, PredictError, SaafError) as e:
            sys.exit(f"error: predict: {json.dumps(merged or {})}: {e}")
        print(f"{args.scenario} {json.dumps(merged or {})}: {prediction.describe()}", flush=True)
        predictions.append(prediction)
    first = predictions[0]
    if first.qps is None:
        sys.exit("predicted capacity: none (no rate meets the limits in simulation)")
    print(f"predicted capacity: {first.qps:.3f} QPS (band {first.low or 0:.3f}-{first.high or 0:.3f})")


if __name__ == "__main__":
    main()

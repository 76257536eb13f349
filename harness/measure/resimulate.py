"""A LoadGen run re-simulated: its queries at the times LoadGen scheduled them, with the samples it
drew, through the engine's own scheduler on the virtual clock (harness/predict/simulate.py), every
step costing what the run's own steps cost, in the order the run took them (its steps.json, against
a step-cost model fitted on those very steps: a simulated step that meets its real one costs that
step's time). What the simulation then misses is the simulator's own (its scheduling, routing and
handoffs, its p99 and early-stopping verdict); what a prediction misses beyond that is the step
costs' (a quiet profile's level, its spread, the machine's slow stretches). The same queries with
every step at the run's median ratio to the model show how much of the run's tail its slow
stretches made.

    python -m harness.measure.resimulate RUN_DIR... [--accuracy-log LOG] [--num-blocks N]

RUN_DIR: a single-engine Server or Interactive performance run's folder (`harness run`'s, or a
calibration trial's), with its steps.json. Output lengths come from the run's own responses where
it logged them (`--log-responses`), else from `--accuracy-log` (default: the system's Offline
accuracy run under --root). The KV pool is unbounded unless `--num-blocks` gives the engine's (the
run's folder does not record it; the demo's pool never binds at these rates).
"""

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from accuracy.datasets.reader import DatasetError, load_dataset
from compliance.loadgen_logs import STEPS_FILE
from harness.measure.run_logs import RunLogError, read_run
from harness.predict.predictor import PredictError, output_lengths
from harness.predict.simulate import Engine, Layout, Workload, latencies_ns, run
from harness.predict.step_costs import fit
from harness.predict.verdict import server_result
from sut.config.engine import EngineConfig
from sut.engine.profile import TERMS
from systems.benchmarks import BENCHMARKS
from systems.paths import run_logs
from systems.schema import REPO


class ResimulateError(ValueError):
    """What a run's folder lacks for a re-simulation (the message names it)."""


@dataclass
class Resimulated:
    loadgen: dict  # the run's detail log: its p99s and verdict
    in_order: dict  # server_result of the simulation with the run's own step costs in order
    at_median: dict  # the same with every step at the median ratio
    median_ratio: float
    fit_error: float  # median relative error of the model fitted on the run's steps

    def lines(self, name: str) -> list[str]:
        def said(result: dict) -> str:
            return (
                f"p99 TTFT {result['result_first_token_99.00_percentile_latency_ns'] / 1e6:.0f} ms, "
                f"TPOT {result['result_time_per_output_token_99.00_percentile_ns'] / 1e6:.1f} ms, "
                f"{result['result_validity']}"
            )

        return [
            f"{name}: LoadGen at {self.loadgen['effective_target_qps']} QPS: {said(self.loadgen)}",
            f"  simulated, its steps' costs in order: {said(self.in_order)}",
            f"  simulated, every step at their median ({self.median_ratio:.2f}x the fit; fit error median "
            f"{self.fit_error:.1%}): {said(self.at_median)}",
        ]


def resimulate(folder: Path, root: Path = REPO, accuracy_log: Path | None = None, num_blocks: int | None = None):
    """`folder`'s run re-simulated (the module's docstring says how)."""
    try:
        logs = read_run(folder)
    except RunLogError as e:
        raise ResimulateError(str(e)) from None
    if logs.scenario != "Server" or not logs.queries:
        raise ResimulateError(f"{folder}: not a Server or Interactive performance run (LoadGen's {logs.scenario!r})")
    steps_file = folder / STEPS_FILE
    if not steps_file.is_file():
        raise ResimulateError(f"{steps_file}: not found (a single-engine run logs its steps there)")
    record = logs.record
    missing = [key for key in ("engine", "dataset", "system", "benchmark") if key not in record]
    if missing:
        raise ResimulateError(f"{folder}: its run.json lacks {missing}")
    logged = json.loads(steps_file.read_text())
    shapes = [dict(zip(logged["columns"], row)) for row in logged["steps"]]
    seconds = [shape["seconds"] for shape in shapes]
    model = fit([{t: s[t] for t in TERMS} for s in shapes], seconds)
    ratios = [real / modelled for real, modelled in zip(seconds, map(model.seconds, shapes)) if modelled > 0]

    dataset = load_dataset(record["dataset"])
    if all(q.num_tokens is not None for q in logs.queries):
        lengths = {q.qsl_idx: q.num_tokens for q in logs.queries}
        answers = [lengths.get(i, 1) for i in range(len(dataset.input_ids))]
    else:
        log = accuracy_log or run_logs(root, record["system"], record["benchmark"], "Offline", "accuracy")
        answers = output_lengths(Path(log) / "mlperf_log_accuracy.json" if Path(log).is_dir() else log, len(dataset))
    workload = Workload(dataset.input_ids, answers)
    config = EngineConfig.from_kwargs(**record["engine"])
    if config.data_parallel_size > 1 or config.disaggregation is not None:
        raise ResimulateError(f"{folder}: a pool's run (its steps are logged in its workers' processes, not here)")
    max_tokens = BENCHMARKS[record["benchmark"]].max_tokens("performance")
    start = logs.queries[0].scheduled_s
    queries = sorted(logs.queries, key=lambda q: q.scheduled_s)
    arrivals = [q.scheduled_s - start for q in queries]
    samples = [q.qsl_idx for q in queries]
    if num_blocks is None:  # unbounded: every query's whole prompt and answer at once
        longest = max(len(p) for p in dataset.input_ids) + max_tokens
        num_blocks = len(queries) * -(-longest // config.block_size)
    limits = logs.detail["requested_server_ttft_latency"], logs.detail["requested_server_tpot_latency"]

    def simulated(cost_ratios: list[float]) -> dict:
        engine = Engine(config, num_blocks, model, max_tokens, 1.0, [], cost_ratios, True)
        ttft, tpot = latencies_ns(run(Layout([engine]), arrivals, samples, workload))
        return server_result(ttft, tpot, *limits)

    median = statistics.median(ratios)
    return Resimulated(logs.detail, simulated(ratios), simulated([median]), median, model.median_error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="LoadGen performance runs' folders")
    parser.add_argument("--accuracy-log", type=Path, help="whose output lengths, where a run logged no responses")
    parser.add_argument("--num-blocks", type=int, help="the engine's KV pool in blocks (default: unbounded)")
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    for folder in args.runs:
        try:
            result = resimulate(folder, args.root, args.accuracy_log, args.num_blocks)
        except (ResimulateError, DatasetError, PredictError, ValueError) as e:
            sys.exit(f"error: resimulate: {e}")
        print("\n".join(result.lines(str(folder))), flush=True)


if __name__ == "__main__":
    main()

"""The load a latency scenario (Server, Interactive) sustains on this machine, found before its runs
by LoadGen runs, so that `make submission` runs it close to what the machine meets (CPUs differ by
2x and more for this work, and MLPerf scores the highest rate that meets the limits).

    python -m harness.measure.calibrate --system cpu-demo --benchmark llama3.1-8b --scenario Server \
        [--predict] [--start-qps R] [--budget-min M]

1. Floors (in-process, no LoadGen): the time to first token of the dataset's longest prompt alone,
   and a decode step at batch 1. A scenario whose floors reach FLOOR_SHARE of its TTFT or TPOT
   limit cannot be met here: it is left out, and the reason says which floor and by how much.
2. Capacity (harness/measure/capacity.py): the highest target_qps whose LoadGen run, on LoadGen's own
   schedule, is VALID (the p99 limits under early stopping), one `harness run` per rate on the
   scenario's committed user.conf with only target_qps changed and the run shortened where that is
   sound. With `--predict` (the chain's) it starts at the low end of the capacity harness/predict
   simulates for this engine (with `--reanchor-on`, re-anchored on the steps of this machine's
   latest runs: the chain gives Server's for Interactive) and steps by its
   `predicted_grow`, and a failed trial sends it down to
   the capacity simulated again on the step costs that trial's own steps measured, where that is
   lower than the next step down, by one more step at most (ReanchoredTrials: a shared machine's
   speed moves by tens of percent within the hour); else from `--start-qps` (the chain gives a
   share of Offline's measured samples/s for Server, half of Server's capacity for Interactive) or
   the committed target_qps by GROW; up or down, then bisected to TOLERANCE, at most TRIALS runs,
   and none that would not fit `--budget-min` with the scenario's runs after it (and a rerun of
   its performance run).
3. The runs take RUN_SHARE of the capacity found: run-to-run spread at a fixed rate (the tree's
   README and measurements/README.md give the numbers this share comes from).

An earlier calibration rehearsed the run's hardest minute in-process, replaying LoadGen's
schedule without LoadGen. It did not predict the LoadGen run: on 2 Zen 3 cores the LoadGen runs'
slowest first tokens came out 1.4-1.9x their replays' in the same burst, and on a 2-core Xeon it
set Server at 11% of the highest rate with a VALID LoadGen run (issue 29). It is gone: a LoadGen
run at a rate is the only verdict on that rate.

The result goes to `<log dir>/calibration/` (calibration.json; user.conf, the committed one with
target_qps replaced; and each trial's run under capacity/), which `python -m harness run
--user-conf` and the packager then use, so the submission tree says what was run and why.
"""

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accuracy.datasets.reader import DatasetError, load_dataset
from compliance.loadgen_logs import STEPS_FILE
from harness.commands import harness_command
from harness.config import HarnessConfigError, RunConfig
from harness.measure.capacity import CapacityError, LoadGenTrials, Trial, search_capacity
from harness.measure.estimates import (
    LATENCY_RERUN_SHARE,
    accuracy_and_test06_seconds,
    performance_seconds,
    predicted_minutes,
)
from harness.predict.predictor import PredictError, Prediction, predict_engine
from systems.benchmarks import conf_value, loadgen_double, with_conf_value
from systems.schema import REPO

FLOOR_SHARE = 0.6  # a floor above this share of a limit leaves no room for queueing
GROW = 1.25  # the bracket's step up or down
# From a predicted start the bracket steps by 1 + twice the step-cost fit's median error, at least
# PREDICTED_GROW_MIN and at most GROW: a close prediction needs a small step (run AK spent a trial at
# 1.25x a start that passed), a rough one (a busy machine while profiling) a larger one to get anywhere.
PREDICTED_GROW_MIN = 1.1
TOLERANCE = 0.08  # the bracket's width at which the search stops (failed / passed - 1)
TRIALS = 6  # LoadGen runs at most
RUN_SHARE = 0.9  # of the capacity found: the rate the scenario's runs take
METHOD = "`python -m harness.measure.calibrate`"  # in calibration.json: what the packaged README names
MARGIN = (
    f"the runs take {RUN_SHARE:.0%} of the highest VALID rate, as a search's runs near the edge pass or fail by "
    "chance: measurements/README.md, 'At the capacity', gives the spread measured"
)
PROMOTED = (
    "the highest VALID trial is the performance run, at its rate: a demo's Interactive has no time for another "
    "460-query run after its search (harness/measure/calibrate.py find_capacity)"
)


@dataclass
class Calibration:
    scenario: str
    ttft_limit_ms: float
    tpot_limit_ms: float
    ttft_floor_ms: float  # the longest prompt alone
    tpot_floor_ms: float  # a decode step at batch 1
    capacity_qps: float | None = None  # the highest rate with a VALID LoadGen run
    failed_qps: float | None = None  # the lowest rate above it whose run was INVALID
    target_qps: float | None = None  # RUN_SHARE of capacity_qps: the runs' rate
    trials: list[dict] = field(default_factory=list)  # rate, passed, what LoadGen measured
    search: str = ""  # the search's account
    predicted_qps: float | None = None  # the capacity the simulation predicted before the search (harness/predict)
    # Where the search starts: the band's low end (every step costing the model's median error more),
    # a rate the prediction expects to pass; a failed first trial at overload costs most.
    predicted_start_qps: float | None = None
    predicted_grow: float | None = None  # the bracket's step from that start
    reanchored_qps: float | None = None  # the prediction re-anchored on earlier runs' steps
    promoted: str | None = None  # with --promote-trial: the VALID trial that is the performance run
    predicted: str = ""  # the prediction's account: its band and step costs, or why there is none
    reason: str = ""  # why the scenario is left out, when target_qps is None
    margin: str = MARGIN

    def floors(self) -> str:
        return (
            f"floors: TTFT {self.ttft_floor_ms:.0f} ms (longest prompt alone), TPOT {self.tpot_floor_ms:.1f} ms "
            f"(decode at batch 1); limits {self.ttft_limit_ms:.0f} / {self.tpot_limit_ms:.0f} ms"
        )

    def summary(self) -> str:
        if self.target_qps is None:
            return f"{self.scenario}: left out: {self.reason} ({self.floors()})"
        predicted = f"; predicted before the search: {self.predicted}" if self.predicted else ""
        share = (
            f"the capacity LoadGen runs found, its VALID trial there the performance run ({self.promoted})"
            if self.promoted
            else f"{RUN_SHARE:.0%} of the capacity LoadGen runs found"
        )
        return f"{self.scenario}: target_qps {self.target_qps:.3f}, {share}: {self.search}{predicted}; {self.floors()}"


def _floors(engine, prompts, params) -> tuple[float, float]:
    """The longest prompt alone: milliseconds to its first token, and the median between its next
    ones (a decode step at batch 1), from the times its tokens arrive (one engine or replicas)."""
    longest = max(prompts, key=len)
    arrived: list[float] = []
    start = time.perf_counter()
    engine.add_request(
        longest,
        dataclasses.replace(params, max_tokens=9, ignore_eos=True),
        request_id="floor-ttft",
        on_token=lambda _t: arrived.append(time.perf_counter()),
    )
    while engine.has_unfinished():
        engine.step()
    gaps = [b - a for a, b in zip(arrived, arrived[1:])]
    return (arrived[0] - start) * 1000, statistics.median(gaps) * 1000


def measure_floors(engine, prompts, params, scenario: str, ttft_limit_ms: float, tpot_limit_ms: float) -> Calibration:
    """Step 1: the floors, and the reason a scenario is left out where they rule it out."""
    engine.add_request(prompts[0][:16], params, request_id="warm-up")
    while engine.has_unfinished():
        engine.step()
    ttft_floor, tpot_floor = _floors(engine, prompts, params)
    cal = Calibration(scenario, ttft_limit_ms, tpot_limit_ms, ttft_floor, tpot_floor)
    if ttft_floor >= FLOOR_SHARE * ttft_limit_ms or tpot_floor >= FLOOR_SHARE * tpot_limit_ms:
        which = (
            f"the longest prompt alone takes {ttft_floor:.0f} ms to its first token"
            if ttft_floor >= FLOOR_SHARE * ttft_limit_ms
            else f"a decode step at batch 1 takes {tpot_floor:.1f} ms"
        )
        limit = ttft_limit_ms if ttft_floor >= FLOOR_SHARE * ttft_limit_ms else tpot_limit_ms
        cal.reason = (
            f"{which}, {FLOOR_SHARE:.0%} or more of the {limit:.0f} ms limit before any queueing, so no "
            "load meets the limits on this machine"
        )
    return cal


def find_capacity(
    cal: Calibration,
    trials: LoadGenTrials,
    start_qps: float,
    budget_s: float | None,
    dataset_size: int,
    promote: bool = False,
) -> None:
    """Steps 2 and 3 into `cal`: the search over `trials` from `start_qps`; with `budget_s`, no trial
    that would leave too little time for the scenario's runs at RUN_SHARE of its rate. With
    `promote` (a demo's Interactive, whose 460-query runs take minutes each on 2 cores), the highest
    VALID trial is the performance run, where it is one in all but its folder (the committed
    user.conf with target_qps alone changed): the runs take its rate, the search starts at
    RUN_SHARE of `start_qps` (a failed first trial leaves time for one more at most), and a trial
    need leave time only for the accuracy and TEST06 runs."""
    spent = time.perf_counter()
    promote = promote and full_run(trials, start_qps)  # a trial's other settings do not depend on its rate

    def affordable(qps: float) -> str | None:
        if budget_s is None:
            return None
        left = budget_s - (time.perf_counter() - spent)
        after = runs_seconds(trials, RUN_SHARE * qps, dataset_size)
        if promote:
            conf = with_conf_value(trials.conf_text, trials.loadgen_model, "Server", "target_qps", f"{qps:.4f}")
            after = accuracy_and_test06_seconds(conf, trials.loadgen_model, dataset_size)
        need = trials.seconds(qps) + after
        if need <= left:
            return None
        return (
            f"a run at {qps:.3f} QPS and the runs after it would take {need / 60:.1f} min of the {left / 60:.1f} left"
        )

    grow = cal.predicted_grow if cal.predicted_grow and cal.predicted_start_qps == start_qps else GROW
    if promote:  # a VALID first trial is the run: it starts with the margin a run takes below a capacity found
        start_qps = loadgen_double(RUN_SHARE * start_qps, 4)
    # A failed trial's re-anchored hint goes at most one step further down than the bracket would:
    # replayed in order, one slow stretch of a trial fails an Interactive run at any rate (run AO's
    # 1.576 QPS trial hinted 0.175 QPS, whose run would not fit the budget).
    found = search_capacity(trials, start_qps, TOLERANCE, TRIALS, grow, affordable=affordable, max_drop=grow**2)
    cal.trials = [t.record(trials.folder) for t in found.trials]
    cal.search = found.summary()
    cal.capacity_qps, cal.failed_qps = found.passed_qps, found.failed_qps
    if found.passed_qps is None:
        cal.reason = f"no LoadGen run met the limits: {found.summary()}"
    elif promote:
        cal.target_qps = found.passed_qps
        best = max((t for t in found.trials if t.passed), key=lambda t: t.qps)
        cal.promoted = str(best.logs.relative_to(trials.folder.parent)) if best.logs else None
        cal.margin = PROMOTED
    else:
        cal.target_qps = loadgen_double(RUN_SHARE * found.passed_qps, 4)  # as the user.conf and LoadGen's log have it


def full_run(trials: LoadGenTrials, qps: float) -> bool:
    """Whether a trial at `qps` runs exactly what the scenario's performance run at that rate does:
    the committed user.conf with target_qps alone changed (no shortening)."""

    def settings(text: str) -> list[str]:
        return sorted(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))

    rate = f"{loadgen_double(qps, 4):.4f}"
    committed = with_conf_value(trials.conf_text, trials.loadgen_model, "Server", "target_qps", rate)
    return settings(trials.conf(qps)) == settings(committed)


def predict_capacity(
    cal: Calibration, engine, cfg: RunConfig, dataset, root: Path, reanchor_on: list[Path] = ()
) -> Prediction | None:
    """Before the search, into `cal`: the capacity the engine's scheduler reaches in simulation
    (harness/predict) on step costs profiled on `engine`, the output lengths of the system's Offline
    accuracy run, and this run's LoadGen settings; or why there is none. With `reanchor_on` (the
    steps.json of this machine's latest runs), the search starts at the capacity simulated again
    with the steps costing what those runs' steps cost against the model, in their order (the
    machine as it is now, not as the quiet profile found it), where that is lower."""
    try:
        say = lambda line: print(f"calibrate {cfg.scenario}: {line}", flush=True)  # noqa: E731
        prediction = predict_engine(engine, cfg, dataset, root, log=say)
    except PredictError as e:
        cal.predicted = f"none ({e})"
        return None
    cal.predicted_qps = prediction.qps and loadgen_double(prediction.qps, 4)
    cal.predicted_start_qps = (prediction.low or prediction.qps) and loadgen_double(prediction.low or prediction.qps, 4)
    cal.predicted_grow = round(min(GROW, max(PREDICTED_GROW_MIN, 1 + 2 * prediction.costs.median_error)), 3)
    cal.predicted = prediction.describe()
    print(f"calibrate {cfg.scenario}: predicted capacity {cal.predicted}", flush=True)
    ratios, again = prediction.reanchored(reanchor_on)
    if again is not None:
        cal.reanchored_qps = loadgen_double(again, 4)
        # Never above the band's low end: a failed first trial at overload costs the most.
        cal.predicted_start_qps = min(cal.predicted_start_qps or again, cal.reanchored_qps)
        said = (
            f"re-anchored on the {len(ratios)} steps of this machine's latest runs ({statistics.median(ratios):.2f}x "
            f"the model's, median): {again:.3f} QPS"
        )
        cal.predicted += f"; {said}"
        print(f"calibrate {cfg.scenario}: {said}", flush=True)
    return prediction


@dataclass
class ReanchoredTrials:
    """The search's LoadGen trials, each failed one hinting the next rate down by the prediction
    re-anchored to the machine as the trial found it: the capacity simulated with the steps costing
    the model's times the trial's own steps' ratios to it (its steps.json), in their order."""

    trials: LoadGenTrials
    prediction: Prediction

    def __getattr__(self, name):  # the search's estimates (seconds, folder, ...) are the trials'
        return getattr(self.trials, name)

    def __call__(self, qps: float) -> Trial:
        trial = self.trials(qps)
        ratios, again = self.prediction.reanchored([trial.logs / STEPS_FILE] if trial.logs else [])
        if not ratios:
            return trial
        ratios = sorted(ratios)
        spread = f"p10 {ratios[len(ratios) // 10]:.2f}, p90 {ratios[9 * len(ratios) // 10]:.2f}"
        trial.detail += f"; its steps cost {statistics.median(ratios):.2f}x the step-cost model's ({spread})"
        if again is not None:
            trial.detail += f", at which the capacity predicted is {again:.3f} QPS"
            if not trial.passed:
                trial.hint_qps = again
        self.trials.log(f"capacity: {qps:.3f} QPS: {trial.detail.split('; ')[-1]}")
        return trial


def runs_seconds(trials: LoadGenTrials, qps: float, dataset_size: int) -> float:
    """The scenario's three runs at `qps` on its committed user.conf (the chain's estimate), and the
    one rerun of its performance run at LATENCY_RERUN_SHARE of that rate that the chain allows: a
    search that spends that time on one more trial up leaves an INVALID run no time to run again."""

    def conf(rate: float) -> str:
        return with_conf_value(trials.conf_text, trials.loadgen_model, "Server", "target_qps", f"{rate:.4f}")

    rerun = performance_seconds(conf(LATENCY_RERUN_SHARE * qps), trials.loadgen_model, dataset_size)
    return 60 * predicted_minutes(conf(qps), trials.loadgen_model, dataset_size) + rerun


def calibrated_user_conf(committed: Path, loadgen_model: str, target_qps: float) -> str:
    """The committed user.conf with the scenario's target_qps replaced, and a comment saying so."""
    rate = f"{loadgen_double(target_qps, 4):.4f}"
    text = with_conf_value(committed.read_text(), loadgen_model, "Server", "target_qps", rate)
    said = "# target_qps calibrated on this machine by harness.measure.calibrate (calibration.json beside this file)"
    return f"{said}\n{text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--scenario", default="Server", choices=["Server", "Interactive"])
    parser.add_argument(
        "--start-qps", type=float, help="the search's first rate where none is predicted (default: the committed one)"
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help="start the search at the capacity harness.predict predicts (profiles first)",
    )
    parser.add_argument(
        "--reanchor-on",
        type=Path,
        nargs="*",
        default=[],
        help="with --predict: steps.json of this machine's latest runs, to start at the prediction re-anchored on them",
    )
    parser.add_argument("--budget-min", type=float, help="minutes for the search and the scenario's runs after it")
    parser.add_argument(
        "--promote-trial", action="store_true", help="the highest VALID trial is the performance run (find_capacity)"
    )
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    from sut import SaafError, SamplingParams, make_engine

    try:
        cfg = RunConfig.resolve(args.system, args.benchmark, args.scenario, "performance", args.root)
        if args.scenario not in cfg.benchmark.latency_limits_ms:
            raise HarnessConfigError(f"{cfg.benchmark.name} has no {args.scenario} scenario (no TTFT/TPOT limits)")
        dataset = load_dataset(cfg.system.datasets[cfg.benchmark.name])
        engine = make_engine(
            cfg.system.model_for(cfg.benchmark.name), **cfg.system.engine_settings(args.scenario, cfg.benchmark.name)
        )
    except (HarnessConfigError, DatasetError, SaafError) as e:
        sys.exit(f"error: calibrate: {e}")
    params = SamplingParams(**cfg.benchmark.generation("performance"))
    ttft_limit, tpot_limit = cfg.benchmark.latency_limits_ms[args.scenario]
    try:
        cal = measure_floors(engine, dataset.input_ids, params, args.scenario, ttft_limit, tpot_limit)
        print(f"calibrate {args.scenario}: {cal.floors()}", flush=True)
        prediction = None
        if args.predict and not cal.reason:
            prediction = predict_capacity(cal, engine, cfg, dataset, args.root, args.reanchor_on)
    finally:
        engine.close()
    out = cfg.log_dir.parent / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    loadgen_model = cfg.benchmark.loadgen_name(args.scenario)
    shutil.rmtree(out / "capacity", ignore_errors=True)  # an earlier search's trials are not this one's
    if not cal.reason:
        committed = cfg.user_conf.read_text()
        trials = LoadGenTrials(
            committed,
            loadgen_model,
            out / "capacity",
            lambda conf, logs: harness_command(
                args.system,
                args.benchmark,
                args.scenario,
                "performance",
                args.root,
                "--user-conf",
                conf,
                "--log-dir",
                logs,
            ),
            log=lambda line: print(f"calibrate {args.scenario}: {line}", flush=True),
        )
        start = (
            cal.predicted_start_qps
            or args.start_qps
            or float(conf_value(committed, loadgen_model, "Server", "target_qps") or 1.0)
        )
        try:
            budget = None if args.budget_min is None else args.budget_min * 60
            if prediction is not None and prediction.qps is not None:
                trials = ReanchoredTrials(trials, prediction)
            find_capacity(cal, trials, start, budget, len(dataset), args.promote_trial)
        except CapacityError as e:
            sys.exit(f"error: calibrate: {e}")
    record = {**asdict(cal), "summary": cal.summary(), "method": METHOD}
    (out / "calibration.json").write_text(json.dumps(record, indent=2) + "\n")
    if cal.target_qps is not None:
        (out / "user.conf").write_text(calibrated_user_conf(cfg.user_conf, loadgen_model, cal.target_qps))
    elif (out / "user.conf").exists():
        (out / "user.conf").unlink()
    print(f"calibrate: {cal.summary()}; in {out}")


if __name__ == "__main__":
    main()

"""The capacity at the latency limits: the highest `target_qps` whose LoadGen run meets them under
MLPerf's rules, early stopping included (MLPerf's Server and Interactive score, Sarathi-Serve's
serving capacity), found by LoadGen runs on LoadGen's own schedule.

The search (`search_capacity`) tries rates by a run the caller supplies, which says whether that
rate passed: first a bracket (from a starting rate, up by `grow` while runs pass, down while they
fail), then bisection in ratio (the geometric mean of the bracket) until the bracket is within
`tolerance`, the runs allowed are spent, or the next run would not fit the time left. It assumes
what a queue does: a rate above one that fails fails too.

`LoadGenTrials` is that run: one `harness run` (or any command writing LoadGen's logs) per rate,
whose verdict is LoadGen's own `result_validity`. A trial is the scenario's user.conf with only
`target_qps` changed and its run shortened where that is sound: min_duration at most
TRIAL_MIN_DURATION_MS and min_query_count at most TRIAL_MIN_QUERIES, but never under
EARLY_STOPPING_QUERIES, early stopping's minimum for a p99. Fewer queries make early stopping
stricter, not looser: with n queries it allows fewer over the limit in proportion, so a rate that
passes a trial meets the p99 with at least the confidence the full run needs; what a shorter run
can miss is a queue that builds over minutes, one reason the runs then take a margin below the
rate found (harness/measure/calibrate.py's RUN_SHARE).

The report's trials (harness/measure/ablation.py) are shorter still, to search every configuration in its
budget: a set number of queries, each a different sample, judged by LoadGen's p99 check alone
(early stopping cannot pass under EARLY_STOPPING_QUERIES); a failed one hints the rate at which its
queries met the targets, where the search goes next on its way down (never more than MAX_DROP lower),
and the search retries its bracket's top once where it failed by a few queries (`retries`,
Trial.marginal), since one stall of the machine spoils a short trial.
"""

import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from compliance.loadgen_logs import read_detail_log
from harness.measure.estimates import performance_seconds
from systems.benchmarks import conf_value, loadgen_double, with_conf_value

TRIAL_MIN_DURATION_MS = 60_000
TRIAL_MIN_QUERIES = 1000  # at most (a rig's user.conf takes mlperf.conf's, far more)
# At least: with fewer, LoadGen's early stopping cannot pass a p99 at all ("would need at least N
# more queries"), whatever the latencies, and the run says nothing about its rate.
EARLY_STOPPING_QUERIES = 460
MAX_DROP = 4.0  # the most a failed run's hint lowers the next rate at once


class CapacityError(RuntimeError):
    """A trial's run failed (not: its rate did not pass); the message names it and why."""


@dataclass
class Trial:
    qps: float
    passed: bool
    detail: str = ""  # what the run measured, for the search's account
    # Where a failed run says more than "lower": the rate to try next on the way down (the report's
    # trials give the rate at which their queries met the targets), bounded by search_capacity.
    hint_qps: float | None = None
    # A failure by a few queries, which one stall of the machine can cause: search_capacity's
    # `retries` run such a rate again; a clear failure (most queries late) is not worth it.
    marginal: bool = False
    logs: Path | None = None  # the run's LoadGen logs, where it has them

    def record(self, base: Path | None = None) -> dict:
        """As JSON: rate, verdict, what it measured, and its logs (relative to `base` where given)."""
        out = {"qps": self.qps, "passed": self.passed, "detail": self.detail}
        if self.hint_qps is not None:
            out["hint_qps"] = self.hint_qps
        if self.marginal:
            out["marginal"] = True
        if self.logs is not None:
            out["logs"] = str(self.logs.relative_to(base) if base else self.logs)
        return out


@dataclass
class CapacitySearch:
    passed_qps: float | None = None  # the highest rate that passed: the capacity found
    failed_qps: float | None = None  # the lowest rate that failed above it: the bracket's top
    trials: list[Trial] = field(default_factory=list)
    stopped: str = ""  # why the search ended before its tolerance, where it did

    def summary(self) -> str:
        tried = ", ".join(f"{t.qps:.3f} {'pass' if t.passed else 'FAIL'}" for t in self.trials)
        stopped = f"; {self.stopped}" if self.stopped else ""
        if self.passed_qps is None:
            lowest = f"down to {self.failed_qps:.3f} QPS" if self.failed_qps is not None else "(none tried)"
            return f"no rate passed {lowest} (tried {tried}{stopped})"
        top = "no rate failed" if self.failed_qps is None else f"{self.failed_qps:.3f} failed"
        return f"capacity {self.passed_qps:.3f} QPS ({top}; tried {tried}{stopped})"


def search_capacity(
    run: Callable[[float], Trial],
    start_qps: float,
    tolerance: float = 0.05,
    max_runs: int = 10,
    grow: float = 2.0,
    min_qps: float = 1e-3,
    affordable: Callable[[float], str | None] = lambda qps: None,
    retries: int = 0,
    max_drop: float = MAX_DROP,
) -> CapacitySearch:
    """The highest rate `run` passes, to within `tolerance` (failed / passed - 1) where `max_runs`
    allow; `min_qps` ends a search down that never passes, `affordable(qps)` (why a run at that
    rate does not fit the time left, or None) any search before a run it cannot pay for. With
    `retries`, the bracket's top (the lowest rate that failed above one that passed), where its last
    run failed by a margin (Trial.marginal), is run again up to that many times before the search
    goes on below it: a rate passes when any of its runs does, as a rate at which a VALID run exists
    (a submitter reruns a run that a stall spoilt). A failed run's hint lowers the next rate by at
    most `max_drop`."""
    if start_qps <= 0 or grow <= 1 or tolerance <= 0 or max_runs < 1 or retries < 0 or max_drop < grow:
        raise ValueError(
            "search_capacity: start_qps > 0, grow > 1, tolerance > 0, max_runs >= 1, retries >= 0 and "
            "max_drop >= grow are needed"
        )
    found = CapacitySearch()

    def next_rate() -> float | None:
        """The next rate to run, or None where the search is done; sets found.stopped where it ends early."""
        if not found.trials:
            return start_qps
        last = found.trials[-1]
        if found.passed_qps is None:  # down while failing (at most max_drop at once where a run hints lower)
            qps = (
                last.qps / grow
                if last.hint_qps is None
                else max(min(last.hint_qps, last.qps / grow), last.qps / max_drop)
            )
            if qps < min_qps:
                found.stopped = f"the next rate, {qps:.4f} QPS, is under the lowest tried ({min_qps} QPS)"
                return None
            return qps
        if found.failed_qps is None:  # up while passing
            return found.passed_qps * grow
        top = [t for t in found.trials if t.qps == found.failed_qps]
        if len(top) <= retries and top[-1].marginal:
            return found.failed_qps
        if found.failed_qps / found.passed_qps - 1 > tolerance:  # bisect in ratio: the tolerance is a ratio
            return math.sqrt(found.passed_qps * found.failed_qps)
        return None

    while len(found.trials) < max_runs:
        qps = next_rate()
        if qps is None:
            break
        too_long = affordable(qps)
        if too_long:
            found.stopped = too_long
            break
        found.trials.append(run(qps))
        passing = [t.qps for t in found.trials if t.passed]
        found.passed_qps = max(passing, default=None)
        # Above the highest pass, the rates none of whose runs passed: the bracket's top is the lowest.
        failing = {t.qps for t in found.trials if found.passed_qps is None or t.qps > found.passed_qps}
        found.failed_qps = min(failing, default=None)
    narrowed = (
        found.passed_qps is not None
        and found.failed_qps is not None
        and found.failed_qps / found.passed_qps - 1 <= tolerance
    )
    if not found.stopped and not narrowed and len(found.trials) >= max_runs:
        found.stopped = f"the {max_runs} runs allowed were spent"
    return found


def why_failed(stderr: str) -> str:
    """A failed run's reason: its `error` lines, else the last lines it printed."""
    lines = stderr.splitlines()
    return " ".join([line for line in lines if line.startswith("error")] or lines[-3:])


def run_trial(command: list[str], what: str) -> None:
    """Run one trial's command; CapacityError naming `what` and why, where it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise CapacityError(f"{what} failed: {why_failed(done.stderr)}")


def trial_conf(
    conf_text: str,
    loadgen_model: str,
    qps: float,
    limits_ms: tuple[float, float] | None = None,
    queries: int | None = None,
) -> str:
    """The scenario's user.conf (its text) for a trial at `qps`: target_qps replaced, the run
    shortened (module doc), and where `limits_ms` (TTFT, TPOT) are given, those limits in place of
    the benchmark's (the report's other targets; never a submission's). With `queries` (the
    report's trials), exactly that many, each a different sample (LoadGen's equal issue), and no
    min_duration."""
    text = with_conf_value(conf_text, loadgen_model, "Server", "target_qps", f"{loadgen_double(qps, 4):.4f}")
    if queries is not None:
        for key, value in (
            ("min_duration", 0),
            ("min_query_count", queries),
            ("performance_sample_count_override", queries),
            ("sample_concatenate_permutation", 1),
        ):
            text = with_conf_value(text, loadgen_model, "Server", key, str(value))
    else:
        duration = int(conf_value(text, loadgen_model, "Server", "min_duration") or TRIAL_MIN_DURATION_MS)
        count = int(conf_value(text, loadgen_model, "Server", "min_query_count") or TRIAL_MIN_QUERIES)
        text = with_conf_value(text, loadgen_model, "Server", "min_duration", str(min(duration, TRIAL_MIN_DURATION_MS)))
        count = max(EARLY_STOPPING_QUERIES, min(count, TRIAL_MIN_QUERIES))
        text = with_conf_value(text, loadgen_model, "Server", "min_query_count", str(count))
    if limits_ms is not None:
        text = with_conf_value(text, loadgen_model, "Server", "ttft_latency", f"{limits_ms[0]:g}")
        text = with_conf_value(text, loadgen_model, "Server", "tpot_latency", f"{limits_ms[1]:g}")
    return text


def trial_from_detail(qps: float, detail: dict, percentiles_only: bool = False) -> Trial:
    """LoadGen's verdict on a run, and what it measured, as a Trial: its result_validity, or with
    `percentiles_only` (the report's short trials) its check of the p99s against the limits alone
    (result_perf_constraints_met), early stopping and the run's length aside."""
    verdict = detail.get("result_validity", "INVALID")
    why = []
    if not detail.get("result_perf_constraints_met", True):
        why.append("p99 over a limit")
    if not detail.get("early_stopping_met", True):
        why.append("early stopping not met")
    if not detail.get("result_min_queries_met", True):
        why.append("too few queries")
    if not detail.get("result_min_duration_met", True):
        why.append("under min_duration")
    ttft = detail.get("result_first_token_99.00_percentile_latency_ns", 0) / 1e6
    tpot = detail.get("result_time_per_output_token_99.00_percentile_ns", 0) / 1e6
    passed = bool(detail.get("result_perf_constraints_met")) if percentiles_only else verdict == "VALID"
    said = f"p99s {'within' if passed else 'over'} the limits" if percentiles_only else f"LoadGen {verdict}"
    if not percentiles_only and why:
        said += f" ({', '.join(why)})"
    return Trial(
        qps,
        passed,
        f"{said}: p99 TTFT {ttft:.0f} ms, p99 TPOT "
        f"{tpot:.1f} ms, {detail.get('result_query_count')} queries, "
        f"{detail.get('result_completed_samples_per_sec', 0):.3f} completed/s",
    )


@dataclass
class LoadGenTrials:
    """The search's run: a LoadGen Server run per rate, in `folder`/NN-QPS/ (its user.conf beside it
    as NN-QPS.conf), started by `command(user_conf, log_dir)` (or a subclass's `execute`), judged by
    LoadGen's result_validity."""

    conf_text: str  # the scenario's user.conf
    loadgen_model: str
    folder: Path
    command: Callable[[Path, Path], list[str]] | None = None
    limits_ms: tuple[float, float] | None = None  # other targets than the benchmark's (trial_conf)
    log: Callable[[str], None] = print
    # The report's trials: this many queries at a rate (trial_conf), judged by the p99s alone.
    queries: Callable[[float], int] | None = None

    def conf(self, qps: float) -> str:
        count = self.queries(qps) if self.queries is not None else None
        return trial_conf(self.conf_text, self.loadgen_model, qps, self.limits_ms, count)

    def seconds(self, qps: float) -> float:
        # trial_conf sets both lengths
        return performance_seconds(self.conf(qps), self.loadgen_model, TRIAL_MIN_QUERIES)

    def execute(self, conf: Path, logs: Path, what: str) -> None:
        """The trial's LoadGen run, CapacityError naming `what` where it fails: `command`'s process."""
        run_trial(self.command(conf, logs), what)

    def __call__(self, qps: float) -> Trial:
        qps = loadgen_double(qps, 4)  # the rate LoadGen runs and logs: the trial's, and the search's
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{len(list(self.folder.glob('*.conf'))) + 1:02d}-{qps:.3f}qps"
        conf, logs = self.folder / f"{name}.conf", self.folder / name
        conf.write_text(self.conf(qps))
        self.log(f"capacity: trying {qps:.3f} QPS (about {self.seconds(qps) / 60:.1f} min; logs in {logs})")
        self.execute(conf, logs, f"the run at {qps:.3f} QPS")
        detail, _ = read_detail_log(logs / "mlperf_log_detail.txt")
        trial = trial_from_detail(qps, detail, percentiles_only=self.queries is not None)
        trial.logs = logs
        self.log(f"capacity: {qps:.3f} QPS: {'pass' if trial.passed else 'FAIL'}: {trial.detail}")
        return trial

"""The load calibration (harness/measure/calibrate.py): a scenario whose floors rule it out is left out
naming the floor; otherwise the capacity search's LoadGen runs set the target (RUN_SHARE of the
highest VALID rate), within the time the chain gives it; end to end on the tiny system, every trial
is a LoadGen run whose verdict is LoadGen's; the calibrated user.conf differs from the committed one
in target_qps alone; and the chain's time estimates."""

import json
import math
import shutil
import subprocess
import sys

import pytest

from compliance.loadgen_logs import read_detail_log
from harness.config import check_user_conf
from harness.measure.calibrate import (
    GROW,
    PREDICTED_GROW_MIN,
    RUN_SHARE,
    TRIALS,
    Calibration,
    calibrated_user_conf,
    find_capacity,
    measure_floors,
)
from harness.measure.capacity import LoadGenTrials, Trial
from harness.measure.estimates import performance_seconds, predicted_minutes
from harness.submission import DEMO_BUDGET_MIN, interactive_past_budget, past_budget
from sut import LLMEngine, SamplingParams
from systems.benchmarks import loadgen_double, with_conf_value
from systems.schema import REPO
from tests.helpers import random_prompts
from tests.tiny_system import one_thread

PARAMS = SamplingParams(max_tokens=12, min_tokens=1)
SERVER_CONF = "llama3_1-8b.Server.target_qps = 1\nllama3_1-8b.Server.min_query_count = 460\n"


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(tiny_llama[0], num_kv_blocks=512, max_num_batched_tokens=256)


def test_a_scenario_below_its_floors_is_left_out_with_the_reason(engine):
    cal = measure_floors(engine, random_prompts([20, 40]), PARAMS, "Interactive", 0.01, 30)
    assert cal.target_qps is None and "the longest prompt alone takes" in cal.reason and "0 ms limit" in cal.reason
    assert cal.summary().startswith("Interactive: left out:")
    cal = measure_floors(engine, random_prompts([20, 40]), PARAMS, "Server", 20000, 1000)
    assert not cal.reason and cal.ttft_floor_ms > 0 and cal.tpot_floor_ms > 0
    assert not engine.has_unfinished()


class KnownCapacity(LoadGenTrials):
    """Trials whose verdict is known (a rate passes up to `capacity`), without LoadGen; each moves
    `clock` (what the calibration reads for the time spent) by the time its run would take."""

    def __init__(self, capacity: float, clock: list[float] | None = None):
        super().__init__(SERVER_CONF, "llama3_1-8b", REPO / "unused", lambda conf, logs: [], log=lambda line: None)
        self.capacity, self.clock = capacity, clock if clock is not None else [0.0]

    def __call__(self, qps: float) -> Trial:
        self.clock[0] += self.seconds(qps)
        return Trial(qps, qps <= self.capacity, "known")


def test_the_runs_take_their_share_of_the_capacity_found():
    cal = Calibration("Server", 2000, 100, 50.0, 10.0)
    find_capacity(cal, KnownCapacity(3.0), 1.0, None, 100)
    assert cal.capacity_qps <= 3.0 < cal.failed_qps
    assert cal.target_qps == loadgen_double(RUN_SHARE * cal.capacity_qps, 4)  # as its user.conf has it
    assert len(cal.trials) <= TRIALS and cal.trials[0] == {"qps": 1.0, "passed": True, "detail": "known"}
    assert (
        f"target_qps {cal.target_qps:.3f}" in cal.summary() and f"capacity {cal.capacity_qps:.3f} QPS" in cal.summary()
    )


def test_a_search_that_would_overrun_the_budget_stops_and_says_so(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("harness.measure.calibrate.time.perf_counter", lambda: clock[0])
    # 460 queries at 0.1 QPS alone take 77 minutes: no trial fits 10.
    cal = Calibration("Interactive", 500, 30, 50.0, 10.0)
    find_capacity(cal, KnownCapacity(0.05, clock), 0.1, 10 * 60, 100)
    assert cal.target_qps is None and not cal.trials
    assert "would take" in cal.reason and "min of the 10.0 left" in cal.reason
    # With time for some: it stops at the first that does not fit, and keeps what passed.
    cal = Calibration("Server", 2000, 100, 50.0, 10.0)
    find_capacity(cal, KnownCapacity(100.0, clock), 20.0, 5 * 60, 100)
    assert cal.capacity_qps is not None and 1 < len(cal.trials) < TRIALS and "would take" in cal.search
    assert clock[0] <= 5 * 60
    # The time left must also hold a rerun of the performance run, which the chain allows an INVALID
    # one: a trial with time for the three runs alone is not started.
    trials, rate = KnownCapacity(100.0, clock), 2.0
    conf = with_conf_value(SERVER_CONF, "llama3_1-8b", "Server", "target_qps", f"{RUN_SHARE * rate:.4f}")
    three_runs = trials.seconds(rate) + 60 * predicted_minutes(conf, "llama3_1-8b", 100)
    clock[0] = 0.0
    cal = Calibration("Server", 2000, 100, 50.0, 10.0)
    find_capacity(cal, trials, rate, three_runs + 1, 100)
    assert not cal.trials and "would take" in cal.reason
    cal = Calibration("Server", 2000, 100, 50.0, 10.0)
    rerun = with_conf_value(SERVER_CONF, "llama3_1-8b", "Server", "target_qps", f"{0.9 * RUN_SHARE * rate:.4f}")
    find_capacity(cal, trials, rate, three_runs + performance_seconds(rerun, "llama3_1-8b", 100) + 1, 100)
    assert cal.trials[0]["qps"] == rate


@pytest.mark.slow
def test_the_calibration_on_the_tiny_system_runs_loadgen_at_each_rate(chain, tmp_path):
    """`python -m harness.measure.calibrate` end to end: each trial a LoadGen run (its user.conf and
    logs in calibration/capacity/), the trials' verdicts LoadGen's, the run's user.conf at the target."""
    root = tmp_path / "repo"
    shutil.copytree(chain[0], root, ignore=shutil.ignore_patterns("submission"))
    stale = root / "build/logs/tiny/llama3.1-8b/Server/calibration/capacity/01-9.000qps.conf"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier search's trial\n")
    command = [sys.executable, "-m", "harness.measure.calibrate", "--system", "tiny", "--scenario", "Server"]
    done = subprocess.run(
        [*command, "--start-qps", "100", "--budget-min", "1.5", "--root", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=one_thread(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = root / "build" / "logs" / "tiny" / "llama3.1-8b" / "Server" / "calibration"
    cal = json.loads((out / "calibration.json").read_text())
    assert cal["capacity_qps"] >= 100 and cal["target_qps"] == loadgen_double(RUN_SHARE * cal["capacity_qps"], 4)
    for trial in cal["trials"]:
        logs = out / "capacity" / f"{cal['trials'].index(trial) + 1:02d}-{trial['qps']:.3f}qps"
        detail, _ = read_detail_log(logs / "mlperf_log_detail.txt")
        assert trial["passed"] == (detail["result_validity"] == "VALID")
        assert detail["effective_target_qps"] == trial["qps"]  # the rate as LoadGen logs it
    assert f"llama3_1-8b.Server.target_qps = {cal['target_qps']:.4f}\n" in (out / "user.conf").read_text()
    assert cal["summary"] in done.stdout
    assert cal["method"] == "`python -m harness.measure.calibrate`"  # the packaged README names it
    assert len(list((out / "capacity").glob("*.conf"))) == len(cal["trials"])  # the earlier search's are gone


def test_calibrated_user_conf_changes_only_target_qps(tmp_path):
    committed = tmp_path / "user.conf"
    committed.write_text(
        "# the demo\nllama3_1-8b-interactive.Server.target_qps = 0.2\n"
        "llama3_1-8b-interactive.Server.min_query_count = 460\n"
    )
    calibrated = calibrated_user_conf(committed, "llama3_1-8b-interactive", 0.73125)
    assert "llama3_1-8b-interactive.Server.target_qps = 0.7312\n" in calibrated
    assert calibrated.count("target_qps =") == 1 and "min_query_count = 460" in calibrated
    (tmp_path / "calibrated.conf").write_text(calibrated)
    check_user_conf(tmp_path / "calibrated.conf")
    assert "llama3_1-8b.Server.target_qps = 1.5000" in calibrated_user_conf(
        tmp_path / "calibrated.conf", "llama3_1-8b", 1.5
    )  # absent: added


def test_predicted_minutes_of_a_latency_scenario(tmp_path):
    from harness.measure.estimates import RUN_START_S

    conf = "llama3_1-8b.Server.target_qps = 0.5\nllama3_1-8b.Server.min_query_count = 460\n"
    model = "llama3_1-8b"
    # 460 + 200 + 100 queries at 0.5 QPS, and three runs' starts: 25.8 min
    assert predicted_minutes(conf, model, 200) == pytest.approx((460 + 200 + 100) / 0.5 / 60 + 3 * RUN_START_S / 60)
    assert past_budget(conf, model, 200, elapsed_min=DEMO_BUDGET_MIN - 26) is None
    assert past_budget(conf, model, 200, elapsed_min=DEMO_BUDGET_MIN - 25).startswith(
        f"its runs would take 26 min, past the demo's {DEMO_BUDGET_MIN}-min"
    )
    # A min_duration longer than the queries' arrivals sets the performance run's length.
    longer = conf.replace("target_qps = 0.5", "target_qps = 50") + "llama3_1-8b.Server.min_duration = 60000\n"
    assert predicted_minutes(longer, model, 200) == pytest.approx((60 + 300 / 50 + 3 * RUN_START_S) / 60)


def test_interactive_is_left_out_uncalibrated_when_even_servers_rate_overruns_the_budget():
    committed = (
        "llama3_1-8b-interactive.Server.target_qps = 0.2\nllama3_1-8b-interactive.Server.min_query_count = 460\n"
    )
    # (460 + 100 + 100) queries at 0.7 QPS: 15.7 min
    server = {"target_qps": 0.7, "ttft_floor_ms": 325.4, "tpot_floor_ms": 9.31}
    model = "llama3_1-8b-interactive"
    assert interactive_past_budget(committed, model, 100, server, (500, 30), elapsed_min=10) is None
    reason = interactive_past_budget(committed, model, 100, server, (500, 30), elapsed_min=23)
    assert reason.startswith("Interactive: left out:") and "Server's 0.700 QPS" in reason and "16 min" in reason
    assert "longest prompt alone at 325 ms" in reason and "batch 1 at 9.3 ms" in reason and "500 / 30 ms" in reason


def test_the_search_starts_from_offlines_rate_or_servers_capacity(tmp_path):
    from harness.submission import INTERACTIVE_START_SHARE, START_SHARE, start_qps

    logs = tmp_path / "llama3.1-8b"
    assert start_qps(logs / "Server", "Server", None) is None  # no Offline run: the committed target_qps
    (logs / "Offline" / "performance").mkdir(parents=True)
    entry = {"key": "result_samples_per_second", "value": 8.0, "metadata": {}}
    (logs / "Offline" / "performance" / "mlperf_log_detail.txt").write_text(f":::MLLOG {json.dumps(entry)}\n")
    assert start_qps(logs / "Server", "Server", None) == pytest.approx(START_SHARE * 8.0)
    assert start_qps(logs / "Interactive", "Interactive", {"capacity_qps": 5.5}) == INTERACTIVE_START_SHARE * 5.5
    assert start_qps(logs / "Interactive", "Interactive", None) is None


def test_with_predict_the_search_starts_at_the_predicted_capacity(chain, tmp_path):
    """`--predict`: the step costs profiled on the calibration's engine, the capacity simulated, and
    the first LoadGen trial run at its band's low end; calibration.json and its summary give the prediction
    beside what the trials found."""
    root = tmp_path / "repo"
    shutil.copytree(chain[0], root, ignore=shutil.ignore_patterns("submission"))
    command = [sys.executable, "-m", "harness.measure.calibrate", "--system", "tiny", "--scenario", "Server"]
    done = subprocess.run(
        [*command, "--predict", "--start-qps", "1", "--budget-min", "1.5", "--root", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=one_thread(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cal = json.loads((root / "build/logs/tiny/llama3.1-8b/Server/calibration/calibration.json").read_text())
    assert cal["predicted_qps"] > 1 and cal["trials"][0]["qps"] == cal["predicted_start_qps"] <= cal["predicted_qps"]
    assert "fit error median" in cal["predicted"] and "predicted capacity" in done.stdout
    assert f"predicted before the search: {cal['predicted']}" in cal["summary"]
    grow = cal["predicted_grow"]
    assert PREDICTED_GROW_MIN <= grow <= GROW
    assert grow == pytest.approx(
        min(GROW, max(PREDICTED_GROW_MIN, 1 + 2 * float(cal["predicted"].split("median ")[1].split("%")[0]) / 100)),
        abs=2e-3,
    )
    # Every trial's own steps re-anchor the prediction (harness/run.py's steps.json).
    assert all("its steps cost" in t["detail"] for t in cal["trials"])
    if len(cal["trials"]) > 1:  # from a prediction the bracket steps by predicted_grow, not GROW
        first, second = cal["trials"][:2]
        want = first["qps"] * grow
        if not first["passed"]:  # down: by the re-anchored prediction where it is lower (one more step at most)
            want = max(min(first.get("hint_qps", math.inf), first["qps"] / grow), first["qps"] / grow**2)
        assert second["qps"] == pytest.approx(want, rel=1e-3)


FULL_RUN_CONF = SERVER_CONF + "llama3_1-8b.Server.min_duration = 60000\n"


class KnownFullRuns(KnownCapacity):
    """KnownCapacity's trials on a user.conf that a trial runs unshortened, each with a logs folder."""

    def __init__(self, capacity, clock, folder):
        super().__init__(capacity, clock)
        self.conf_text, self.folder = FULL_RUN_CONF, folder

    def __call__(self, qps):
        trial = super().__call__(qps)
        trial.logs = self.folder / f"{qps:.3f}qps"
        return trial


def test_a_demo_interactive_search_makes_its_highest_valid_trial_the_performance_run(tmp_path, monkeypatch):
    """`--promote-trial`: the highest VALID trial, run on the committed user.conf with only
    target_qps changed, is the performance run at its rate; a trial then needs time for the
    accuracy and TEST06 runs alone, not for another performance run and its rerun."""
    clock = [0.0]
    monkeypatch.setattr("harness.measure.calibrate.time.perf_counter", lambda: clock[0])
    cal = Calibration("Interactive", 500, 30, 50.0, 10.0)
    find_capacity(cal, KnownFullRuns(3.0, clock, tmp_path / "capacity"), 2.0, None, 100, promote=True)
    assert cal.capacity_qps <= 3.0 < cal.failed_qps and cal.target_qps == cal.capacity_qps
    assert cal.trials[0]["qps"] == RUN_SHARE * 2.0  # a first trial that is the run takes the run's margin
    assert cal.promoted == f"capacity/{cal.capacity_qps:.3f}qps"
    assert "its VALID trial there the performance run" in cal.summary() and "performance run" in cal.margin
    # A trial that would shorten the run (here: no min_duration committed, a trial caps it) is no
    # performance run: the runs take RUN_SHARE as before.
    cal = Calibration("Interactive", 500, 30, 50.0, 10.0)
    find_capacity(cal, KnownCapacity(3.0), 1.0, None, 100, promote=True)
    assert cal.promoted is None and cal.target_qps == loadgen_double(RUN_SHARE * cal.capacity_qps, 4)
    # The time a first trial needs: itself and the accuracy and TEST06 runs at its rate (from a
    # start of rate / RUN_SHARE where it is the run).
    rate, trials = 1.8, KnownFullRuns(100.0, clock, tmp_path / "capacity")
    conf = with_conf_value(FULL_RUN_CONF, "llama3_1-8b", "Server", "target_qps", f"{rate:.4f}")
    just = trials.seconds(rate) + 60 * predicted_minutes(conf, "llama3_1-8b", 100)
    just -= performance_seconds(conf, "llama3_1-8b", 100)
    for promote, tried in ((True, True), (False, False)):
        clock[0] = 0.0
        cal = Calibration("Interactive", 500, 30, 50.0, 10.0)
        find_capacity(cal, trials, rate / RUN_SHARE if promote else rate, just + 1, 100, promote=promote)
        assert bool(cal.trials) == tried and (cal.trials[0]["qps"] == rate if tried else "would take" in cal.reason)

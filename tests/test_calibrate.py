"""The load calibration (harness/calibrate.py) on a tiny model: LoadGen's Server schedule is one
sequence scaled by 1/target_qps (what lets the calibration rehearse a run's hardest stretch); the
worst window is the one with the most prompt tokens; the replay answers every request it issues; a
feasible scenario gets a rehearsed target, an infeasible one is left out with the floor that rules
it out; the calibrated user.conf differs from the committed one in target_qps alone; and the
chain's time estimate."""

import json
import subprocess
import sys

import pytest

import harness.calibrate
from compliance.submission import interactive_past_budget, past_budget, predicted_minutes
from harness.calibrate import (
    BURST_SECONDS,
    MARGIN,
    PROBE_STEP,
    PROBES,
    REPLAYS,
    RUN_SHARE,
    TTFT_TAIL_SHARE,
    WINDOW_SECONDS,
    Probe,
    calibrate,
    calibrated_user_conf,
    poisson_arrivals,
    replay,
    worst_window,
)
from harness.config import check_user_conf
from sut import LLMEngine, SamplingParams
from systems.schema import REPO
from tests.helpers import random_prompts

PARAMS = SamplingParams(max_tokens=12, min_tokens=1)
SERVER_CONF = (
    "llama3_1-8b.Server.target_qps = 1\nllama3_1-8b.Server.min_query_count = 50\n"
    "llama3_1-8b.Server.performance_sample_count_override = 20\nllama3_1-8b.Server.min_duration = 0\n"
)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(tiny_llama[0], num_kv_blocks=512, max_num_batched_tokens=256)


def schedule_at(tmp_path, qps: float) -> list:
    """loadgen_schedule in a process of its own, with SCHEDULE_QPS set to `qps`."""
    conf = tmp_path / "user.conf"
    conf.write_text(SERVER_CONF)
    code = (
        f"import json, harness.calibrate as c; c.SCHEDULE_QPS = {qps!r}; "
        f"print(json.dumps(c.loadgen_schedule({str(conf)!r}, 'llama3_1-8b', 20)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_loadgens_schedule_scales_with_the_rate(tmp_path):
    fast, slow = schedule_at(tmp_path, 2000.0), schedule_at(tmp_path, 500.0)
    assert len(fast) == len(slow) == 50 and fast[0][0] == 0
    assert [i for _, i in fast] == [i for _, i in slow] and all(0 <= i < 20 for _, i in fast)
    assert [t for t, _ in fast] == sorted(t for t, _ in fast)
    gaps = [b[0] - a[0] for a, b in zip(fast, fast[1:])]
    assert 0.5 < sum(gaps) / len(gaps) < 2  # about one arrival per second at 1 QPS
    for (t_fast, _), (t_slow, _) in zip(fast, slow):
        assert t_fast == pytest.approx(t_slow, abs=0.01)  # the same times at 1 QPS


def test_worst_window_holds_the_densest_burst():
    prompts = [[1] * 10, [1] * 100]
    schedule = [(float(t), 0) for t in range(0, 200, 5)] + [(120.0 + k * 0.5, 1) for k in range(6)]
    schedule.sort()
    window = worst_window(schedule, prompts, qps=1.0)
    burst = [t for t, i in window if i == 1]
    assert len(burst) == 6 and burst[0] == pytest.approx(WINDOW_SECONDS[0])
    assert window[0][0] >= 0 and window[-1][0] <= sum(WINDOW_SECONDS) + 1e-9
    assert worst_window(schedule, prompts, qps=2.0)[0][0] >= 0  # the same arrivals, twice as fast
    assert BURST_SECONDS < WINDOW_SECONDS[1]


def test_replay_answers_every_arrival(engine):
    arrivals = poisson_arrivals(20, 1.0, 4)
    probe = replay(engine, random_prompts([20, 40, 10, 30]), PARAMS, 20, arrivals, 1.0)
    assert probe.requests == len(arrivals) > 5 and probe.completed == probe.requests
    assert 0 < probe.busy_share < 1 and 0 < probe.p99_ttft_ms <= probe.max_ttft_ms
    assert 0 < probe.p99_tpot_ms <= probe.max_tpot_ms
    assert not engine.has_unfinished()


def test_a_feasible_scenario_gets_a_rehearsed_target(engine):
    """On the real engine, with limits a loaded machine's slow steps still meet (the tiny model's
    first tokens take milliseconds): the rate that passed every replay, and the run's share of it."""
    schedule = poisson_arrivals(1.0, 400, 4, seed=3)
    cal = calibrate(
        engine,
        random_prompts([20, 40, 10, 30]),
        PARAMS,
        "Server",
        20000,
        1000,
        schedule,
        probe_seconds=1.0,
        log=lambda _line: None,
    )
    assert cal.ttft_floor_ms > 0 and cal.tpot_floor_ms > 0
    assert cal.target_qps == RUN_SHARE * cal.passed_qps and cal.capacity_qps > cal.passed_qps
    passed = cal.probes[-REPLAYS:]  # the first rate whose every replay met the limits
    assert all(p.qps == cal.passed_qps and p.meets(20000, 1000) for p in passed)
    assert all(p.qps > cal.passed_qps for p in cal.probes[1:-REPLAYS])
    assert cal.probes[-1].seconds == sum(WINDOW_SECONDS)
    assert f"target_qps {cal.target_qps:.3f}" in cal.summary()


def test_the_rate_steps_down_until_every_replay_of_it_passes(engine, monkeypatch):
    """The search itself, on replays whose slowest first token grows with the rate (no clock): each
    rate that fails a replay is replaced by PROBE_STEP of it, the first whose REPLAYS replays all
    pass is kept, and the runs take RUN_SHARE of it; with no such rate in PROBES tries, the scenario
    is left out naming the last one."""
    rehearsed, first = [], []

    def fake_replay(engine, prompts, params, qps, arrivals, seconds):
        if seconds != sum(WINDOW_SECONDS):  # the capacity probe: busy a quarter of the time
            first.append(MARGIN * qps / 0.25)  # so the first rate rehearsed
            return Probe(qps, seconds, 4, 4, 0.25, 10.0, 10.0, 5.0, 5.0)
        rehearsed.append(qps)
        slowest = 2000.0 * qps / first[-1]  # 2 s at the first rate, less in proportion below it
        return Probe(qps, seconds, 4, 4, 0.5, slowest, slowest, 5.0, 5.0)

    monkeypatch.setattr(harness.calibrate, "replay", fake_replay)
    prompts, schedule = random_prompts([20, 40, 10, 30]), poisson_arrivals(1.0, 400, 4, seed=3)
    cal = calibrate(engine, prompts, PARAMS, "Server", 2000, 100, schedule, probe_seconds=1.0, log=lambda _line: None)
    # A rate passes once 2000 ms x (rate / first) < TTFT_TAIL_SHARE x 2000 ms.
    steps = next(i for i in range(PROBES) if PROBE_STEP**i < TTFT_TAIL_SHARE)
    assert steps == 3
    want = [first[-1] * PROBE_STEP**i for i in range(steps)] + [first[-1] * PROBE_STEP**steps] * REPLAYS
    assert rehearsed == pytest.approx(want)
    assert cal.passed_qps == pytest.approx(want[-1]) and cal.target_qps == RUN_SHARE * cal.passed_qps
    rehearsed.clear()
    cal = calibrate(engine, prompts, PARAMS, "Server", 400, 100, schedule, probe_seconds=1.0, log=lambda _line: None)
    assert len(rehearsed) == PROBES and cal.target_qps is None and "no rate kept" in cal.reason


def test_a_scenario_below_its_floors_is_left_out_with_the_reason(engine):
    cal = calibrate(engine, random_prompts([20, 40]), PARAMS, "Interactive", 0.01, 30, [], log=lambda _line: None)
    assert cal.target_qps is None and not cal.probes
    assert "the longest prompt alone takes" in cal.reason and "0 ms limit" in cal.reason
    assert cal.summary().startswith("Interactive: left out:")


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
    conf = tmp_path / "user.conf"
    conf.write_text("llama3_1-8b.Server.target_qps = 0.5\nllama3_1-8b.Server.min_query_count = 460\n")
    assert predicted_minutes(conf.read_text(), 200) == pytest.approx((460 + 200 + 100) / 0.5 / 60)  # 25.3 min
    assert past_budget(conf.read_text(), 200, elapsed_min=4) is None
    assert past_budget(conf.read_text(), 200, elapsed_min=5).startswith(
        "its runs would take 25 min, past the demo's 30-min"
    )


def test_interactive_is_left_out_uncalibrated_when_even_servers_rate_overruns_the_budget():
    committed = (
        "llama3_1-8b-interactive.Server.target_qps = 0.2\nllama3_1-8b-interactive.Server.min_query_count = 460\n"
    )
    # (460 + 100 + 100) queries at 0.7 QPS: 15.7 min
    server = {"target_qps": 0.7, "ttft_floor_ms": 325.4, "tpot_floor_ms": 9.31}
    assert interactive_past_budget(committed, 100, server, (500, 30), elapsed_min=10) is None
    reason = interactive_past_budget(committed, 100, server, (500, 30), elapsed_min=23)
    assert reason.startswith("Interactive: left out:") and "Server's 0.700 QPS" in reason and "16 min" in reason
    assert "longest prompt alone at 325 ms" in reason and "batch 1 at 9.3 ms" in reason and "500 / 30 ms" in reason

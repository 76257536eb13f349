"""The load calibration (harness/calibrate.py) on a tiny model: the replay answers every request it
issues and measures latencies as LoadGen does; a feasible scenario gets a target rate checked by a
probe, an infeasible one is left out with the floor that rules it out; the calibrated user.conf
differs from the committed one in target_qps alone; and the chain's time estimate."""

import pytest

from compliance.submission import predicted_minutes
from harness.calibrate import calibrate, calibrated_user_conf, replay
from harness.config import check_user_conf
from sut import LLMEngine, SamplingParams

from conftest import random_prompts

PARAMS = SamplingParams(max_tokens=12, min_tokens=1)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(tiny_llama[0], num_kv_blocks=512, max_num_batched_tokens=256)


def test_replay_answers_every_arrival(engine):
    probe = replay(engine, random_prompts([20, 40, 10, 30]), PARAMS, qps=20, seconds=1.0)
    assert probe.requests > 5 and probe.completed == probe.requests
    assert 0 < probe.busy_share < 1 and 0 < probe.p99_ttft_ms <= probe.max_ttft_ms
    assert 0 < probe.p99_tpot_ms <= probe.max_tpot_ms
    assert not engine.has_unfinished()


def test_a_feasible_scenario_gets_a_checked_target(engine):
    cal = calibrate(engine, random_prompts([20, 40, 10, 30]), PARAMS, "Server", 2000, 100, probe_seconds=1.5,
                    log=lambda _line: None)
    assert cal.ttft_floor_ms > 0 and cal.tpot_floor_ms > 0
    assert cal.target_qps is not None and cal.capacity_qps > cal.target_qps
    assert cal.probes[-1].qps == pytest.approx(cal.target_qps) and cal.probes[-1].meets(2000, 100)
    assert f"target_qps {cal.target_qps:.3f}" in cal.summary()


def test_a_scenario_below_its_floors_is_left_out_with_the_reason(engine):
    cal = calibrate(engine, random_prompts([20, 40]), PARAMS, "Interactive", 0.01, 30, log=lambda _line: None)
    assert cal.target_qps is None and not cal.probes
    assert "the longest prompt alone takes" in cal.reason and "0 ms limit" in cal.reason
    assert cal.summary().startswith("Interactive: left out:")


def test_calibrated_user_conf_changes_only_target_qps(tmp_path):
    committed = tmp_path / "user.conf"
    committed.write_text("# the demo\nllama3_1-8b-interactive.Server.target_qps = 0.2\n"
                         "llama3_1-8b-interactive.Server.min_query_count = 460\n")
    calibrated = calibrated_user_conf(committed, "llama3_1-8b-interactive", 0.73125)
    assert "llama3_1-8b-interactive.Server.target_qps = 0.7312\n" in calibrated
    assert calibrated.count("target_qps =") == 1 and "min_query_count = 460" in calibrated
    (tmp_path / "calibrated.conf").write_text(calibrated)
    check_user_conf(tmp_path / "calibrated.conf")
    assert "llama3_1-8b.Server.target_qps = 1.5000" in calibrated_user_conf(
        tmp_path / "calibrated.conf", "llama3_1-8b", 1.5)  # absent: added


def test_predicted_minutes_of_a_latency_scenario(tmp_path):
    conf = tmp_path / "user.conf"
    conf.write_text("llama3_1-8b.Server.target_qps = 0.5\nllama3_1-8b.Server.min_query_count = 460\n")
    assert predicted_minutes(conf, 200) == pytest.approx((460 + 200 + 100) / 0.5 / 60)

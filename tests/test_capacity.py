"""The capacity search (harness/measure/capacity.py) on runs whose verdict is known: a rate passes when it is
at most the true capacity. It brackets up and down from its start, bisects to its tolerance, and
stops at its run budget."""

import pytest

from harness.measure.capacity import Trial, search_capacity


def runs_of_capacity(capacity: float):
    tried = []

    def run(qps: float) -> Trial:
        tried.append(qps)
        return Trial(qps, qps <= capacity, f"capacity {capacity}")

    return run, tried


@pytest.mark.parametrize("start", [0.01, 0.3, 1.0, 7.0, 500.0])
def test_the_capacity_is_found_to_the_tolerance_from_below_and_above(start):
    run, tried = runs_of_capacity(2.5)
    found = search_capacity(run, start, tolerance=0.05, max_runs=30)
    assert found.passed_qps <= 2.5 < found.failed_qps
    assert found.failed_qps / found.passed_qps - 1 <= 0.05
    assert tried == [t.qps for t in found.trials]
    assert all(t.passed == (t.qps <= 2.5) for t in found.trials)
    assert "capacity" in found.summary() and f"{found.passed_qps:.3f}" in found.summary()


def test_the_run_budget_ends_the_search_with_its_bracket():
    run, tried = runs_of_capacity(2.5)
    found = search_capacity(run, 0.01, tolerance=0.001, max_runs=6)
    # Doubling from 0.01 passes 2.5 only at the ninth run: six runs end with no rate failed yet.
    assert tried == [0.01 * 2**i for i in range(6)] and found.passed_qps == tried[-1] and found.failed_qps is None
    assert "no rate failed" in found.summary()
    found = search_capacity(run, 2.0, tolerance=0.001, max_runs=4)
    assert len(found.trials) == 4 and found.passed_qps <= 2.5 < found.failed_qps  # bracketed, not yet bisected fine


def test_a_system_that_never_passes_is_said_so():
    run, tried = runs_of_capacity(0.0)
    found = search_capacity(run, 1.0, max_runs=40, min_qps=0.01)
    assert found.passed_qps is None and found.failed_qps == min(tried) >= 0.01
    assert found.summary().startswith("no rate passed down to")


@pytest.mark.parametrize(
    "hint, expected",
    [
        (1.1, [8.0, 2.0, 1.1]),  # where the failed run's queries met the targets, at most MAX_DROP lower
        (7.9, [8.0, 6.4, 6.4 / 1.25]),  # a hint above rate / grow: the step down is kept
        (0.0, [8.0, 2.0, 0.5]),  # nothing met the targets: MAX_DROP lower
    ],
)
def test_a_failed_runs_hint_sets_the_next_rate_down_within_bounds(hint, expected):
    tried = []

    def run(qps: float) -> Trial:
        tried.append(qps)
        return Trial(qps, qps <= 1.2, hint_qps=None if qps <= 1.2 else hint)

    found = search_capacity(run, 8.0, tolerance=0.5, max_runs=3, grow=1.25)
    assert tried == pytest.approx(expected)
    assert found.trials[0].hint_qps == hint
    # The caller bounds the drop (calibrate: one step past the bracket's, grow squared).
    tried.clear()
    search_capacity(run, 8.0, tolerance=0.5, max_runs=2, grow=1.25, max_drop=1.25**2)
    assert tried == pytest.approx([8.0, max(min(hint, 8.0 / 1.25), 8.0 / 1.25**2)])
    with pytest.raises(ValueError, match="max_drop >= grow"):
        search_capacity(run, 8.0, grow=1.25, max_drop=1.1)


def test_a_retry_at_the_brackets_top_sees_past_one_stalled_run():
    # Capacity 2.5, but the first run at 2.0 fails (a stall): a rate passes when any of its runs does.
    tried = []

    def run(qps: float) -> Trial:
        tried.append(qps)
        return Trial(qps, qps <= 2.5 and tried != [2.0], marginal=True)

    found = search_capacity(run, 2.0, tolerance=0.1, max_runs=20, grow=1.25, retries=1)
    assert found.passed_qps <= 2.5 < found.failed_qps and found.failed_qps / found.passed_qps - 1 <= 0.1
    assert tried[:3] == [2.0, 1.6, 2.0]  # down past the stall, then its rate again: the bracket's top
    failed_above = [q for q in tried if q > 2.5]
    assert failed_above and all(tried.count(q) == 2 for q in failed_above)  # each marginal failure twice
    assert all(t.passed == (t.qps <= 2.5) for t in found.trials[1:])
    # Without retries the stall stands: the capacity stays under the stalled rate.
    tried.clear()
    found = search_capacity(run, 2.0, tolerance=0.1, max_runs=20, grow=1.25)
    assert found.passed_qps < 2.0 == found.failed_qps and tried.count(2.0) == 1


def test_retries_spend_the_run_budget_too():
    tried = []

    def run(qps: float) -> Trial:
        tried.append(qps)
        return Trial(qps, qps <= 2.5, marginal=True)

    found = search_capacity(run, 2.0, tolerance=0.01, max_runs=4, grow=1.25, retries=2)
    assert tried == [2.0, 2.5, 3.125, 3.125] and "4 runs allowed were spent" in found.stopped
    assert (found.passed_qps, found.failed_qps) == (2.5, 3.125)


def test_a_clear_failure_is_not_retried():
    run, tried = runs_of_capacity(2.5)  # its failures are not marginal
    found = search_capacity(run, 2.0, tolerance=0.1, max_runs=20, grow=1.25, retries=1)
    assert len(tried) == len(set(tried)) and found.passed_qps <= 2.5 < found.failed_qps


def test_bad_search_settings_are_refused():
    run, _ = runs_of_capacity(1.0)
    with pytest.raises(ValueError, match="start_qps > 0"):
        search_capacity(run, 0.0)
    with pytest.raises(ValueError, match="retries >= 0"):
        search_capacity(run, 1.0, retries=-1)


# The search on real LoadGen runs: a fake engine of known service time (tests/fake_queue_server.py,
# one request at a time for SERVICE_S each, first come first served: an M/D/1 queue under LoadGen's
# Poisson arrivals), TTFT limit TTFT_LIMIT_S, so its capacity at the limit can be computed.
SERVICE_S, TTFT_LIMIT_S = 0.010, 0.300
FAKE_CONF = """fake.Server.target_qps = 1
fake.Server.min_duration = 8000
fake.Server.min_query_count = 500
fake.Server.ttft_latency = 300
fake.Server.tpot_latency = 1000
fake.Server.use_token_latencies = 1
"""


def md1_capacity(service_s: float, limit_s: float, share_over: float = 0.01, arrivals: int = 400_000) -> float:
    """The arrival rate at which `share_over` of an M/D/1 queue's sojourn times (wait + service, the
    fake's TTFT) exceed `limit_s`: Lindley's recursion, wait_n = X_n - min(0, min_k<=n X_k) with X the
    running sum of (service - gap), over the same unit-rate exponential gaps at every rate tried."""
    import numpy as np

    gaps = np.random.default_rng(0).exponential(size=arrivals)

    def share(rate: float) -> float:
        walk = np.cumsum(service_s - gaps / rate)
        wait = walk - np.minimum(0.0, np.minimum.accumulate(walk))
        return float(np.mean(wait + service_s > limit_s))

    low, high = 0.1 / service_s, 1.0 / service_s
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (low, mid) if share(mid) > share_over else (mid, high)
    return low


def test_md1_capacity_matches_the_queue_at_light_load():
    # At a light load no wait exceeds the limit; at the service rate itself the queue never settles.
    capacity = md1_capacity(SERVICE_S, TTFT_LIMIT_S)
    assert 0.5 / SERVICE_S < capacity < 1.0 / SERVICE_S
    # p99 at 1% and 0.2% over: close together (a steep tail), so LoadGen's early stopping (which on
    # ~900 queries allows a couple over) moves the capacity by a few percent only.
    assert md1_capacity(SERVICE_S, TTFT_LIMIT_S, 0.002) / capacity > 0.95


@pytest.mark.slow
@pytest.mark.parametrize("start", [40.0, 150.0], ids=["from-below", "from-above"])
def test_the_search_on_loadgen_runs_finds_a_known_capacity(tmp_path, start):
    import sys
    from pathlib import Path

    from compliance.loadgen_logs import read_detail_log
    from harness.measure.capacity import LoadGenTrials

    server = Path(__file__).with_name("fake_queue_server.py")
    trials = LoadGenTrials(
        FAKE_CONF,
        "fake",
        tmp_path,
        lambda conf, logs: (
            [sys.executable, str(server), "--user-conf", str(conf), "--log-dir", str(logs)]
            + ["--service-ms", str(SERVICE_S * 1000)]
        ),
        log=lambda line: None,
    )
    found = search_capacity(trials, start, tolerance=0.08, max_runs=8, min_qps=10)
    capacity = md1_capacity(SERVICE_S, TTFT_LIMIT_S)
    assert found.passed_qps == pytest.approx(capacity, rel=0.10), found.summary()
    # Each trial's verdict is LoadGen's own, from its run's detail log; far from the capacity it is
    # the queue's (below: every first token in time; above: the queue grows without bound).
    folders = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == len(found.trials)
    for folder, trial in zip(folders, found.trials):
        detail, _ = read_detail_log(folder / "mlperf_log_detail.txt")
        assert trial.passed == (detail["result_validity"] == "VALID")
        assert detail["effective_target_qps"] == trial.qps  # the rate as LoadGen logs it
        if trial.qps < 0.8 * capacity or trial.qps > 1.2 * capacity:
            assert trial.passed == (trial.qps < capacity), trial.detail
    assert any(t.qps > found.passed_qps for t in found.trials if not t.passed)

"""The capacity search (harness/capacity.py) on runs whose verdict is known: a rate passes when it is
at most the true capacity. It brackets up and down from its start, bisects to its tolerance, and
stops at its run budget."""

import pytest

from harness.capacity import Trial, search_capacity


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


def test_bad_search_settings_are_refused():
    run, _ = runs_of_capacity(1.0)
    with pytest.raises(ValueError, match="start_qps > 0"):
        search_capacity(run, 0.0)

"""The capacity model (harness/predict): LoadGen's Server schedule to the nanosecond and its verdict
to the query, against a real LoadGen run's logs (tests/data/loadgen_interactive_run.json)."""

import json
from pathlib import Path

import pytest

from harness.predict.loadgen_schedule import mt19937, server_schedule
from harness.predict.verdict import min_passing_queries, odds, server_result

RUN = json.loads((Path(__file__).parent / "data" / "loadgen_interactive_run.json").read_text())


def test_mt19937_is_the_standard_one():
    """The C++ standard's check of std::mt19937: its 10000th output, default-seeded (5489), and
    a seed wider than 32 bits taken modulo 2^32 as libstdc++ takes it."""
    assert mt19937(5489).random_raw(10000)[-1] == 4123659995
    assert list(mt19937(5489 + 2**32).random_raw(3)) == list(mt19937(5489).random_raw(3))


def test_the_server_schedule_is_loadgens_to_the_nanosecond():
    """Every query's scheduled issue time in a LoadGen run's trace, and the detail log's generated
    query count and duration, from the run's rate, seed, min_duration and min_query_count."""
    times, duration = server_schedule(RUN["target_qps"], RUN["schedule_rng_seed"], RUN["min_duration_ms"], 460)
    assert len(times) == RUN["generated_query_count"] and duration == RUN["generated_query_duration_ns"]
    assert times == RUN["scheduled_ns"]
    # A longer run at the same rate issues until a query is scheduled past min_duration.
    long, _ = server_schedule(RUN["target_qps"], RUN["schedule_rng_seed"], 600_000, 460)
    assert long[:460] == times and long[-2] < 600e9 <= long[-1]


def test_the_verdict_is_loadgens_on_its_own_latencies():
    """The run's first-token latencies (3 of 460 over the 500 ms limit) give LoadGen's p99 and its
    early-stopping result: 541 more queries needed, so INVALID though the p99 is under the limit."""
    ttft = RUN["ttft_ns"]
    result = server_result(ttft, [1] * len(ttft), RUN["ttft_limit_ns"], 30_000_000)
    assert (
        result["result_first_token_99.00_percentile_latency_ns"]
        == RUN["result_first_token_99.00_percentile_latency_ns"]
    )
    over = sum(x > RUN["ttft_limit_ns"] for x in ttft)
    more = min_passing_queries(over) + over - len(ttft)
    assert f"Would need to run at least {more} more queries" in RUN["early_stopping_ttft_result"]
    assert result["early_stopping_met"] is False and result["result_validity"] == "INVALID"
    under = sorted(ttft)[:-over]
    assert (
        server_result(under * 2, [1] * 2 * len(under), RUN["ttft_limit_ns"], 30_000_000)["result_validity"] == "VALID"
    )


@pytest.mark.parametrize("t", [0, 1, 3, 10, 40])
def test_early_stopping_needs_the_fewest_queries_that_give_99_percent_confidence(t):
    """h is the least number of queries under the limit at which t over it still leave under 1%
    odds that the 99th percentile is over: one fewer does not (LoadGen's bracket never overshoots
    the least such h here)."""
    h = min_passing_queries(t)
    assert odds(h, t) < 0.01 <= odds(h - 1, t)
    assert min_passing_queries(0) == 459  # 0.99^459 < 0.01 <= 0.99^458

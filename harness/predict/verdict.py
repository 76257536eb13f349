"""LoadGen's verdict on a Server (or Interactive) run with token latencies, from the latencies a
simulated run gives (results.cc): the p99 TTFT and TPOT against their limits, and early stopping on
each, as LoadGen writes them into its detail log, so that a simulated run is read as a real one is.

Early stopping (early_stopping.cc): with t of n queries over a limit, the run passes when n >= h + t,
h the fewest queries under it that give 99% confidence that the 99th percentile is under it too.
LoadGen finds h by bisection in a bracket it extrapolates from t (min_h = 99 t + h0, max_h = h0 t +
h0 + 1, h0 the h for t = 0) and returns the bracket's floor where that already passes; the same here,
with the odds as a binomial tail (LoadGen: a regularized incomplete beta function, the same number)."""

import math

PERCENTILE = 0.99
CONFIDENCE = 0.99


def odds(h: int, t: int, p: float = PERCENTILE) -> float:
    """The chance that at most t of h + t queries are over the limit were the p-th percentile on it."""
    n, q = h + t, 1.0 - p
    terms = [
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(q) + (n - k) * math.log(p)
        for k in range(t + 1)
    ]
    top = max(terms)
    return math.exp(top) * sum(math.exp(x - top) for x in terms)


def min_passing_queries(t: int, p: float = PERCENTILE, c: float = CONFIDENCE) -> int:
    """LoadGen's h for t queries over the limit."""
    h0 = math.ceil(math.log(1 - c) / math.log(p))
    low, count = int(t * p / (1 - p) + h0), int(t * h0 + h0 + 1) - int(t * p / (1 - p) + h0)
    while count > 0:  # the first h in [low, low + count) whose odds are under 1 - c
        step = count // 2
        if odds(low + step, t, p) < 1 - c:
            count = step
        else:
            low, count = low + step + 1, count - step - 1
    return low


def early_stopping_met(latencies_ns: list[int], limit_ns: int) -> bool:
    over = sum(1 for x in latencies_ns if x > limit_ns)
    return len(latencies_ns) >= min_passing_queries(over) + over


def percentile(latencies_ns: list[int], p: float = PERCENTILE) -> int:
    """LoadGen's: the sorted latencies at index floor(n p)."""
    return sorted(latencies_ns)[int(len(latencies_ns) * p)]


def server_result(ttft_ns: list[int], tpot_ns: list[int], ttft_limit_ns: int, tpot_limit_ns: int) -> dict:
    """The detail log's verdict keys for a run whose queries had these latencies (one per query)."""
    p99_ttft, p99_tpot = percentile(ttft_ns), percentile(tpot_ns)
    early = early_stopping_met(tpot_ns, tpot_limit_ns) and early_stopping_met(ttft_ns, ttft_limit_ns)
    met = p99_ttft <= ttft_limit_ns and p99_tpot <= tpot_limit_ns
    valid = met and early
    return {
        "result_query_count": len(ttft_ns),
        "result_first_token_99.00_percentile_latency_ns": p99_ttft,
        "result_time_per_output_token_99.00_percentile_ns": p99_tpot,
        "result_perf_constraints_met": met,
        "early_stopping_met": early,
        "result_validity": "VALID" if valid else "INVALID",
    }

"""The capacity at the latency limits: the highest `target_qps` whose run meets them (MLPerf's
Server and Interactive score, Sarathi-Serve's serving capacity). A search over rates, each tried by
a run the caller supplies (a LoadGen run, in the end), which says whether that rate passed: first a
bracket (from a starting rate, up by `grow` while runs pass, down while they fail), then bisection
in ratio (the geometric mean of the bracket) until the bracket is within `tolerance` or the runs
allowed are spent. It assumes what a queue does: a rate above one that fails fails too.

This is the search alone (issue 29, part 1); the LoadGen runs it drives, and its use by
`make submission` and `make report`, come next.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Trial:
    qps: float
    passed: bool
    detail: str = ""  # what the run measured, for the search's account


@dataclass
class CapacitySearch:
    passed_qps: float | None = None  # the highest rate that passed: the capacity found
    failed_qps: float | None = None  # the lowest rate that failed above it: the bracket's top
    trials: list[Trial] = field(default_factory=list)

    def summary(self) -> str:
        tried = ", ".join(f"{t.qps:.3f} {'pass' if t.passed else 'FAIL'}" for t in self.trials)
        if self.passed_qps is None:
            return f"no rate passed down to {self.failed_qps:.3f} QPS (tried {tried})"
        top = "no rate failed" if self.failed_qps is None else f"{self.failed_qps:.3f} failed"
        return f"capacity {self.passed_qps:.3f} QPS ({top}; tried {tried})"


def search_capacity(
    run: Callable[[float], Trial],
    start_qps: float,
    tolerance: float = 0.05,
    max_runs: int = 10,
    grow: float = 2.0,
    min_qps: float = 1e-3,
) -> CapacitySearch:
    """The highest rate `run` passes, to within `tolerance` (failed / passed - 1) where `max_runs`
    allow; `min_qps` ends a search down that never passes."""
    if start_qps <= 0 or grow <= 1 or tolerance <= 0 or max_runs < 1:
        raise ValueError("search_capacity: start_qps > 0, grow > 1, tolerance > 0 and max_runs >= 1 are needed")
    found = CapacitySearch()

    def trial(qps: float) -> bool:
        result = run(qps)
        found.trials.append(result)
        if result.passed and (found.passed_qps is None or qps > found.passed_qps):
            found.passed_qps = qps
        if not result.passed and (found.failed_qps is None or qps < found.failed_qps):
            found.failed_qps = qps
        return result.passed

    qps = start_qps
    passed = trial(qps)
    # Bracket: up while passing, down while failing.
    while len(found.trials) < max_runs and (found.passed_qps is None or found.failed_qps is None):
        qps = qps * grow if passed else qps / grow
        if qps < min_qps:
            break
        passed = trial(qps)
    # Bisect in ratio: rates span orders of magnitude, and the tolerance is a ratio.
    while (
        len(found.trials) < max_runs
        and found.passed_qps is not None
        and found.failed_qps is not None
        and found.failed_qps / found.passed_qps - 1 > tolerance
    ):
        trial(math.sqrt(found.passed_qps * found.failed_qps))
    return found

"""The time the scheduler, its policies and the engine read: the machine's, or a virtual one that a
simulation moves by each step's predicted cost (harness/predict), so that the same scheduling code
runs in both."""

import time


class Clock:
    """Seconds on the machine's monotonic high-resolution clock (time.perf_counter)."""

    def now(self) -> float:
        return time.perf_counter()


class VirtualClock(Clock):
    """Seconds that pass only when told: `advance` by a step's cost, `advance_to` an arrival."""

    def __init__(self, start: float = 0.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a virtual clock does not go back (advance by {seconds} s)")
        self.t += seconds

    def advance_to(self, t: float) -> None:
        """To `t`, or nowhere if it is already past it."""
        self.t = max(self.t, t)


MACHINE = Clock()

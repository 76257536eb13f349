"""What an engine step costs on this machine, as a sum of terms a reader can check: a fixed cost
per step (the weights read once), per prompt token computed (a GEMM row), per decoding token (a row
of the decode kernels, a draft counting as one) and per (new token, cached token) pair attended, as
DistServe and Vidur model a step, prefill and decode apart. Fitted by least squares on relative
error to real steps of the engine (`profile`), its fit error printed."""

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

TERMS = ("step", "prefill_token", "decode_token", "attention")
UNITS = {"step": "step", "prefill_token": "prompt token", "decode_token": "decode token", "attention": "pair"}


def step_shape(batch) -> dict[str, float]:
    """The terms of a ScheduledBatch, before the scheduler updates its sequences: each row computes
    `n` tokens after `c` already cached, attending to c + 1 .. c + n tokens."""
    rows = list(zip(batch.seqs, batch.num_new_tokens, batch.is_prefill))
    return {
        "step": 1.0,
        "prefill_token": float(sum(n for _, n, prefill in rows if prefill)),
        "decode_token": float(sum(n for _, n, prefill in rows if not prefill)),
        "attention": sum(n * (s.num_computed_tokens + (n + 1) / 2) for s, n, _ in rows),
    }


@dataclass
class StepCostModel:
    seconds_per: dict[str, float]  # seconds per unit of each term
    median_error: float  # of the fit, relative, over the profiled steps
    p90_error: float
    steps: int  # how many it was fitted on
    context: dict = field(default_factory=dict)  # machine, commit, settings: what it holds for
    profiled: list = field(default_factory=list)  # the steps it was fitted on: TERMS' values, then seconds

    def seconds(self, shape: dict[str, float], scale: float = 1.0) -> float:
        return scale * sum(self.seconds_per[t] * shape[t] for t in TERMS)

    def describe(self) -> str:
        terms = ", ".join(f"{self.seconds_per[t] * 1e6:.4g} us/{UNITS[t]}" for t in TERMS)
        return f"{terms}; fit error median {self.median_error:.1%}, p90 {self.p90_error:.1%} over {self.steps} steps"

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @staticmethod
    def load(path: Path) -> "StepCostModel":
        return StepCostModel(**json.loads(path.read_text()))


def fit(shapes: list[dict[str, float]], seconds: list[float], context: dict | None = None) -> StepCostModel:
    """Least squares on relative error, no term negative (a term that would be is dropped and the
    rest fitted again: a cost cannot be negative)."""
    if len(shapes) < len(TERMS):
        raise ValueError(f"fitting {len(TERMS)} terms needs at least as many steps, got {len(shapes)}")
    x = np.array([[s[t] for t in TERMS] for s in shapes])
    y = np.array(seconds)
    kept = list(range(len(TERMS)))
    while True:
        weighted = x[:, kept] / y[:, None]  # each step's error relative to its time
        coef, *_ = np.linalg.lstsq(weighted, np.ones(len(y)), rcond=None)
        if (coef >= 0).all() or len(kept) == 1:
            break
        kept.pop(int(np.argmin(coef)))
    per = dict.fromkeys(TERMS, 0.0)
    for i, c in zip(kept, coef):
        per[TERMS[i]] = float(max(c, 0.0))
    predicted = x @ np.array([per[t] for t in TERMS])
    error = np.abs(predicted - y) / y
    profiled = [[*row, t] for row, t in zip(x.tolist(), seconds)]
    median, p90 = float(np.median(error)), float(np.percentile(error, 90))
    return StepCostModel(per, median, p90, len(y), dict(context or {}), profiled)


def profile(engine, prompts: list[list[int]], budget_s: float = 120.0) -> tuple[list[dict], list[float]]:
    """Real steps of `engine` (idle; warmed up here first) and what each cost: groups of the dataset's prompts
    submitted together at batch sizes 1, 2, 4, .. max_num_seqs (prefill chunks, then decodes at that
    batch as contexts grow), then prompts arriving one per step beside running decodes (mixed
    steps), until `budget_s` is spent. The engine is reset after."""
    from sut import SamplingParams

    engine.warmup()
    shapes, seconds = [], []
    record = engine.scheduler.record_step

    def recorded(batch, took):
        shapes.append(step_shape(batch))
        seconds.append(took)
        record(batch, took)

    engine.scheduler.record_step = recorded
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    start, next_prompt = time.perf_counter(), 0

    def take(n):
        nonlocal next_prompt
        chosen = [prompts[(next_prompt + i) % len(prompts)] for i in range(n)]
        next_prompt += n
        return chosen

    batch_sizes, b = [], 1
    while b < engine.config.max_num_seqs:
        batch_sizes.append(b)
        b *= 2
    batch_sizes.append(engine.config.max_num_seqs)
    try:
        for b in batch_sizes:
            if time.perf_counter() - start > budget_s / 2 and b > 1:
                break
            for p in take(b):
                engine.add_request(p, params)
            while engine.has_unfinished():
                engine.step()
        staggered = take(min(engine.config.max_num_seqs, 32))
        while (staggered or engine.has_unfinished()) and time.perf_counter() - start < budget_s:
            if staggered:
                engine.add_request(staggered.pop(), params)
            engine.step()
        while engine.has_unfinished():
            engine.step()
    finally:
        engine.scheduler.record_step = record
    engine.reset()
    return shapes, seconds


def machine_context(settings: dict, commit: str) -> dict:
    """What a saved model holds for: this machine (its CPU, cores, SIMD flags and kernel level, and
    GPUs), the code, the engine settings."""
    from sut import machine_description

    return {"machine": machine_description(), "commit": commit, "settings": settings, "terms": list(TERMS)}

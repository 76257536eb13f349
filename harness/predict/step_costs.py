"""What an engine step costs on this machine, as a sum of terms a reader can check (sut/engine/profile.py
TERMS: per step, prompt token, decoding token, draft token proposed and (new token, cached token)
pair attended), as DistServe and Vidur model a step, prefill and decode apart. Fitted by least
squares on relative error to real steps of the engine (sut/engine/profile.py `profile_steps`), its
fit error printed."""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sut.engine.profile import TERMS

UNITS = {
    "step": "step",
    "prefill_token": "prompt token",
    "decode_token": "decode token",
    "draft_token": "draft token",
    "attention": "pair",
}


@dataclass
class StepCostModel:
    seconds_per: dict[str, float]  # seconds per unit of each term
    median_error: float  # of the fit, relative, over the profiled steps
    p90_error: float
    steps: int  # how many it was fitted on
    context: dict = field(default_factory=dict)  # machine, commit, settings: what it holds for
    profiled: list = field(default_factory=list)  # the steps it was fitted on: TERMS' values, then seconds
    # Speculation's, measured on the profile's prompts: position j's draft accepted when those before it were.
    acceptance: list = field(default_factory=list)
    transfer_s_per_block: float = 0.0  # a disaggregated pool's handoff, prefill to decode worker, per KV block

    def seconds(self, shape: dict[str, float], scale: float = 1.0) -> float:
        return scale * sum(self.seconds_per.get(t, 0.0) * shape.get(t, 0.0) for t in TERMS)

    def describe(self) -> str:
        shown = [t for t in TERMS if self.seconds_per.get(t) or t != "draft_token"]
        terms = ", ".join(f"{self.seconds_per.get(t, 0.0) * 1e6:.4g} us/{UNITS[t]}" for t in shown)
        if self.acceptance:
            terms += ", drafts accepted " + "/".join(f"{a:.2f}" for a in self.acceptance)
        if self.transfer_s_per_block:
            terms += f", handoff {self.transfer_s_per_block * 1e3:.3g} ms/block"
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


def step_ratios(steps_file: Path, costs: StepCostModel) -> list[float]:
    """A run's engine steps (harness/run.py's steps.json) against `costs`: each step's real seconds
    over what the model says it costs; none where the run logged none (a pool's steps are in its
    processes)."""
    if not steps_file.is_file():
        return []
    logged = json.loads(steps_file.read_text())
    columns = logged["columns"]
    ratios = []
    for row in logged["steps"]:
        values = dict(zip(columns, row))
        modelled = costs.seconds(values)
        if modelled > 0:
            ratios.append(values["seconds"] / modelled)
    return ratios


def machine_context(settings: dict, commit: str) -> dict:
    """What a saved model holds for: this machine (its CPU, cores, SIMD flags and kernel level, and
    GPUs), the code, the engine settings."""
    from sut import machine_description

    return {"machine": machine_description(), "commit": commit, "settings": settings, "terms": list(TERMS)}

"""accuracy.txt as the reference scripts print it, and the check of a result against the
per-benchmark accuracy targets the v6.1 submission checker enforces (kept in systems/benchmarks.py)."""

import numpy as np

from accuracy.rouge import rouge_scores
from systems.benchmarks import BENCHMARKS


def summarization_accuracy(predictions: list[str], references: list[str], token_counts: list[int]) -> dict:
    """The reference's result dict: ROUGE, gen_len, gen_num, and (as llama2-70b adds them)
    gen_tok_len, the generated tokens including EOS, and tokens_per_sample."""
    result = rouge_scores(predictions, references)
    result["gen_tok_len"] = int(sum(token_counts))
    result["tokens_per_sample"] = round(result["gen_tok_len"] / result["gen_num"], 1)
    return result


def format_accuracy_txt(result: dict) -> str:
    """The script's stdout: a blank line, 'Results', a blank line, the dict. Values are cast to
    plain int/float so the dict prints as numbers, never as np.float64(...)."""
    plain = {k: int(v) if isinstance(v, (int, np.integer)) else float(v) for k, v in result.items()}
    return f"\nResults\n\n{plain}\n"


def targets_for(benchmark: str) -> dict[str, tuple[float, float | None]]:
    """metric -> (lowest allowed, highest allowed or None)."""
    if benchmark not in BENCHMARKS:
        raise KeyError(f"no accuracy targets for benchmark {benchmark!r}; known: {sorted(BENCHMARKS)}")
    return BENCHMARKS[benchmark].targets()


def reference_targets(reference: dict) -> dict[str, tuple[float, float | None]]:
    """A substituted model's targets, the llama3.1-8b way: 99% of each ROUGE score its own
    reference implementation got, and gen_len within 90-110% of the reference's."""
    targets = {k: (reference[k] * 0.99, None) for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
    targets["gen_len"] = (reference["gen_len"] * 0.9, reference["gen_len"] * 1.1)
    return targets


def check_targets(targets: dict[str, tuple[float, float | None]], result: dict) -> list[str]:
    """One line per metric that misses its target; empty when all are met."""
    failures = []
    for metric, (low, high) in targets.items():
        if metric not in result:
            failures.append(f"{metric}: missing from the result")
            continue
        value = float(result[metric])
        if value < low or (high is not None and value > high):
            bound = f">= {low:.4f}" if high is None else f"in [{low:.4f}, {high:.4f}]"
            failures.append(f"{metric} = {value} is not {bound}")
    return failures

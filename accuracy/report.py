"""accuracy.txt as the reference scripts print it, and the check of a result against the
per-benchmark accuracy targets the v6.1 submission checker enforces (kept in systems/benchmarks.py)."""

import numpy as np

from accuracy.rouge import rouge_scores
from systems.benchmarks import BENCHMARKS, ENTRIES, AccuracyTarget


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


def reference_targets(reference: dict, benchmark: str = "llama3.1-8b") -> dict[str, tuple[float, float | None]]:
    """A substituted model's targets: each of the benchmark's metrics at the benchmark's own shares of
    the score its own reference implementation got (llama3.1-8b: 99% of each ROUGE score, gen_len
    within 90-110%; gpt-oss-120b: 99% of exact_match, tokens_per_sample at most 110%). KeyError
    naming the metric the reference lacks."""
    rules = next((b for b in ENTRIES if b.name == benchmark), None)
    if rules is None:
        raise KeyError(f"no accuracy targets for benchmark {benchmark!r}; known: {sorted(BENCHMARKS)}")
    missing = [metric for metric in rules.accuracy if metric not in reference]
    if missing:
        raise KeyError(f"the accuracy reference has no {missing} score, which {benchmark}'s targets need")
    return {
        metric: AccuracyTarget(reference[metric], target.low, target.high).bounds()
        for metric, target in rules.accuracy.items()
    }


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

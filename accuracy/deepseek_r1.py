"""DeepSeek-R1's accuracy script, re-implemented offline: what the MLPerf reference
`language/deepseek-r1/eval_accuracy.py` computes from an accuracy log, with MATH answers graded by
accuracy/math_grade.py (PRM800K's grader) and LiveCodeBench's tests run in the sandbox of
accuracy/code_sandbox.py, instead of through the reference's two git submodules.

1. The log's entries are taken once per qsl_idx (the first one; later ones are dropped, as the
   reference drops them), their data decoded as little-endian int32 token ids and detokenized with the
   model folder's tokenizer, special tokens skipped.
2. Each sample is graded by the first sub-dataset name its `dataset` contains (lower-cased, in the
   reference's order):
   - gpqa: the last "ANSWER: X" / "FINAL ANSWER: (X)" (any case), X in A-D, must be the ground truth;
   - mmlu_pro: the same with A-J, else the last letter A-J standing alone;
   - math500: the last \\boxed{...} (braces matched), graded by PRM800K's grade_answer;
   - aime: the last \\boxed{digits}, else the last "Answer: digits"; an integer 0-999 equal to the truth;
   - livecodebench: the first ```python block, which must pass every test of the LiveCodeBench problem
     whose question_id is the ground truth.
3. exact_match is the percentage of samples right, over every sample scored (one without an answer is
   wrong); tokens_per_sample the mean number of token ids logged per sample. They are printed, as the
   reference prints them, as `{'exact_match': ..., 'tokens_per_sample': ..., 'num-samples': ...}` after
   a "Results" line: the line the submission checker's patterns read (v6.1 target: exact_match at
   least 99% of 81.3582, tokens_per_sample within 90-110% of 3886.2274; systems/benchmarks.py).

The reference reads LiveCodeBench's problems through its submodule (code_generation_lite, which it
downloads); here they come from those JSON-lines files on disk (--lcb-problems), as for gpt-oss-120b.
Run `python -m accuracy.deepseek_r1 --help` for the command line."""

import argparse
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from accuracy.code_sandbox import CodeTests, SandboxLimits, run_code_jobs
from accuracy.math_grade import SympyJudge, grade_answer
from accuracy.scorer_inputs import logged_responses, plain_cell, read_frame

# The reference's graders, in the order it tries them: a dataset name is graded by the first of these
# it contains (so "mmlu_pro" never reaches a grader of "mmlu", which it has none of).
SUBSETS = ("gpqa", "mmlu_pro", "math500", "aime", "livecodebench")
# The letters each multiple-choice subset's answers range over.
CHOICES = {"gpqa": "ABCD", "mmlu_pro": "ABCDEFGHIJ"}


class DeepSeekR1AccuracyError(ValueError):
    """Bad input to the scorer: a dataset, a sample or a LiveCodeBench problem it cannot grade."""


# ---------------------------------------------------------------------------------------------------
# Parsing the answers


def _clean(text) -> str:
    return "" if _missing(text) else str(text).strip()


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType"


def _stated_choice(last: str) -> re.Pattern:
    """ "ANSWER" or "FINAL ANSWER" as words, an optional ":" or "=", and one letter A..`last`, maybe
    in parentheses, that begins no word; any case."""
    return re.compile(
        r"\b(?:ANSWER|FINAL\s*ANSWER)\b\s*[:=]?\s*"
        rf"\(?\s*([A-{last}])\s*\)?"
        r"(?:\s*$|[^A-Za-z])",
        re.IGNORECASE,
    )


STATED = {letters[-1]: _stated_choice(letters[-1]) for letters in CHOICES.values()}


def parse_choice(text, last: str = "D") -> str | None:
    """The letter chosen, A..`last` (upper case): the last stated answer in the whole output; for A-J
    (MMLU-Pro), failing that, the last letter A-J standing alone (either case, as the reference)."""
    text = _clean(text)
    if not text:
        return None
    if text[:2] in ("['", '["') and text[-2:] in ("']", '"]'):  # a list's repr around the answer
        text = text[2:-2].strip()
    text = text.replace("\\n", "\n").replace("\\'", "'")  # an output that went through repr()
    pattern = STATED.get(last) or _stated_choice(last)
    stated = pattern.findall(text)
    if stated:
        return stated[-1].upper()
    if last == "J":
        alone = re.findall(r"\b([A-J])\b", text, re.IGNORECASE)
        if alone:
            return alone[-1].upper()
    return None


def parse_boxed(text) -> str | None:
    """What the last `\\boxed{` holds, up to its matching brace, stripped; None when there is none or
    it is never closed."""
    text = _clean(text)
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    begin = start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i].strip()
            depth -= 1
    return None


def parse_aime(text) -> int | None:
    """The last `\\boxed{digits}`, or where there is none the last `Answer: digits` (not running into a
    decimal point); None unless it is an integer 0-999."""
    text = _clean(text)
    found = re.findall(r"\\boxed{\s*(\d+)\s*}", text) or re.findall(r"Answer:\s*(\d+)(?!\.)\b", text, re.IGNORECASE)
    if not found:
        return None
    value = int(found[-1])
    return value if 0 <= value <= 999 else None


def parse_code(text) -> str | None:
    """The first ```python block's code, stripped."""
    found = re.search(r"```python(.*?)```", _clean(text), re.DOTALL)
    return found.group(1).strip() if found else None


# ---------------------------------------------------------------------------------------------------
# Grading


class Sample(NamedTuple):
    qsl_idx: int
    text: str  # the decoded response, special tokens skipped
    tokens: int  # how many token ids were logged for it


def subset_of(dataset_name, where: str) -> str:
    """The grader (one of SUBSETS) for a sample's `dataset` value."""
    if _missing(dataset_name) or not str(dataset_name).strip():
        raise DeepSeekR1AccuracyError(f"{where}: field 'dataset' is empty")
    name = str(dataset_name).lower()
    for subset in SUBSETS:
        if subset in name:
            return subset
    raise DeepSeekR1AccuracyError(
        f"{where}: unknown dataset {dataset_name!r}: its name contains none of {', '.join(SUBSETS)}"
    )


def _same_integer(answer: int, truth) -> bool:
    try:
        return answer == int(truth)
    except (TypeError, ValueError, OverflowError):
        return False


def score_samples(
    samples: Sequence[Sample],
    records: Sequence[Mapping],
    *,
    lcb_problems: Mapping[str, CodeTests] | None = None,
    limits: SandboxLimits | None = None,
    math_timeout: float = 10.0,
    missing_problem_wrong: bool = False,
    source: str = "dataset",
) -> dict:
    """The reference's result for decoded responses: `records[qsl_idx]` holds the sample's `dataset`
    and `ground_truth` (for LiveCodeBench the question_id of a problem in `lcb_problems`). A problem
    not in `lcb_problems` is an error, or with `missing_problem_wrong` a wrong answer (the reference
    scores a question_id its LiveCodeBench release lacks as wrong)."""
    graded, code_jobs, math_jobs = [], [], []
    for sample in samples:
        where = f"{source}: sample {sample.qsl_idx}"
        record = _record(records, sample.qsl_idx, where)
        subset = subset_of(record["dataset"], where)
        truth = record["ground_truth"]
        result = {
            "qsl_idx": sample.qsl_idx,
            "dataset": str(record["dataset"]),
            "correct": False,
            "tokens": sample.tokens,
        }
        graded.append(result)
        if subset == "livecodebench":
            answer = parse_code(sample.text)
        elif subset == "math500":
            answer = parse_boxed(sample.text)
        elif subset == "aime":
            answer = parse_aime(sample.text)
        else:
            answer = parse_choice(sample.text, CHOICES[subset][-1])
        result["extracted"] = answer if not isinstance(answer, str) else answer[:200]
        if answer is None:
            result["detail"] = "no answer in the output" if subset != "livecodebench" else "no code in the output"
            continue
        if _missing(truth) or str(truth) == "":
            result["detail"] = "no ground truth"
            continue
        if subset == "livecodebench":
            problem = (lcb_problems or {}).get(str(truth))
            if not answer:
                result["detail"] = "an empty code block"
            elif problem is not None:
                code_jobs.append((result, answer, problem))
            elif missing_problem_wrong:
                result["detail"] = f"no LiveCodeBench problem {truth!r}: counted wrong"
            else:
                raise DeepSeekR1AccuracyError(
                    f"{where}: no LiveCodeBench problem {truth!r}"
                    + ("" if lcb_problems else " (give LiveCodeBench's problems with --lcb-problems)")
                )
        elif subset == "math500":
            if answer:
                math_jobs.append((result, answer, str(truth)))
            else:
                result["detail"] = "an empty \\boxed{}"
        elif subset == "aime":
            result["correct"] = _same_integer(answer, truth)
        else:
            result["correct"] = answer in CHOICES[subset] and answer == str(truth).upper()
        if subset in ("aime", *CHOICES):
            result["detail"] = "correct" if result["correct"] else f"wrong: {answer} (expected {truth})"
    timeouts = _grade_math(math_jobs, math_timeout)
    run_code_jobs(code_jobs, limits or SandboxLimits())
    summary = _summary(graded)
    summary["math_timeouts"] = timeouts
    return summary


def _record(records: Sequence[Mapping], qsl_idx: int, where: str) -> Mapping:
    if not 0 <= qsl_idx < len(records):
        raise DeepSeekR1AccuracyError(f"{where}: qsl_idx outside the dataset's {len(records)} samples")
    record = records[qsl_idx]
    for name in ("dataset", "ground_truth"):
        if name not in record:
            raise DeepSeekR1AccuracyError(f"{where}: no {name!r} field")
    return record


def _grade_math(jobs: list, timeout: float) -> int:
    """Grade the math500 answers, sympy in a guarded child process; return how many of sympy's
    comparisons ran out of time (each counted as not equal)."""
    if not jobs:
        return 0
    with SympyJudge(timeout=timeout) as judge:
        for result, answer, truth in jobs:
            result["correct"] = grade_answer(answer, truth, judge)
            result["detail"] = "correct" if result["correct"] else f"wrong: {answer[:80]} (expected {truth[:80]})"
        return judge.timeouts


def _summary(graded: list[dict]) -> dict:
    per_dataset = {}
    for result in graded:
        counts = per_dataset.setdefault(result["dataset"], {"correct": 0, "total": 0, "answered": 0})
        counts["total"] += 1
        counts["correct"] += bool(result["correct"])
        counts["answered"] += result["extracted"] is not None
    for counts in per_dataset.values():
        counts["accuracy"] = 100.0 * counts["correct"] / counts["total"]
    correct = sum(bool(r["correct"]) for r in graded)
    return {
        "exact_match": 100.0 * correct / len(graded) if graded else 0.0,
        "tokens_per_sample": sum(r["tokens"] for r in graded) / len(graded) if graded else 0.0,
        "num_samples": len(graded),
        "total_correct": correct,
        "per_dataset": dict(sorted(per_dataset.items())),
        "samples": graded,
    }


def results_line(result: dict) -> dict:
    """The reference's printed result, plain numbers (never np.float64(...), which the checker's
    patterns would not read)."""
    return {
        "exact_match": float(result["exact_match"]),
        "tokens_per_sample": float(result["tokens_per_sample"]),
        "num-samples": int(result["num_samples"]),
    }


def format_report(result: dict) -> str:
    """The printed result: a line per sub-dataset, then, as the reference ends, "Results" and the dict
    the submission checker reads."""
    lines = [f"{'dataset':24} {'correct':>8} {'total':>8} {'answered':>9} {'accuracy':>9}"]
    for name, c in result["per_dataset"].items():
        lines.append(f"{name:24} {c['correct']:8d} {c['total']:8d} {c['answered']:9d} {c['accuracy']:8.2f}%")
    lines.append(f"{'all':24} {result['total_correct']:8d} {result['num_samples']:8d}")
    if result.get("duplicates_dropped"):
        lines.append(
            f"{result['duplicates_dropped']} repeated log entries of a qsl_idx were not scored (the first counts)"
        )
    if result.get("math_timeouts"):
        lines.append(f"{result['math_timeouts']} math500 comparisons ran out of time in sympy and count as not equal")
    lines.append(f"mean output tokens per sample: {result['tokens_per_sample']:.4f}")
    lines += ["", "Results", "", str(results_line(result))]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Files: the dataset, the accuracy log, the tokenizer


def load_records(path: str | Path) -> list[dict]:
    """qsl_idx -> {"dataset", "ground_truth"}, from the reference's pickled DataFrame
    (mlperf_deepseek_r1_dataset_4388_fp8_eval.pkl) or the parquet that accuracy.datasets.deepseek_r1 writes
    from it. The reference also takes the ground truth from a `gt_output` column."""
    path = Path(path)
    if not path.is_file():
        raise DeepSeekR1AccuracyError(f"{path}: dataset file not found")
    frame = read_frame(path, DeepSeekR1AccuracyError)
    truth = "ground_truth" if "ground_truth" in frame.columns else "gt_output"
    missing = [name for name in ("dataset", truth) if name not in frame.columns]
    if missing:
        raise DeepSeekR1AccuracyError(
            f"{path}: the dataset has no column {' or '.join(map(repr, missing))} "
            f"(its columns: {', '.join(map(str, frame.columns))})"
        )
    if not len(frame):
        raise DeepSeekR1AccuracyError(f"{path}: the dataset has no samples")
    return [{"dataset": plain_cell(d), "ground_truth": plain_cell(t)} for d, t in zip(frame["dataset"], frame[truth])]


def dataset_subsets(path: str | Path) -> set[str]:
    """The graders a dataset file's samples need (checked before a run that will be scored)."""
    return {subset_of(r["dataset"], f"{path}: sample {i}") for i, r in enumerate(load_records(path))}


def evaluate(
    log_path: str | Path,
    dataset_path: str | Path,
    tokenizer_dir: str | Path,
    *,
    lcb_problems: str | Path | Mapping[str, CodeTests] | None = None,
    limits: SandboxLimits | None = None,
    math_timeout: float = 10.0,
    missing_problem_wrong: bool = False,
) -> dict:
    """Score an accuracy log: score_samples()'s result for its responses, each qsl_idx once (the first
    entry), decoded with the local tokenizer, special tokens skipped."""
    records = load_records(dataset_path)
    responses, lcb_problems, dropped = logged_responses(
        log_path, dataset_path, records, tokenizer_dir, lcb_problems, skip_special_tokens=True
    )
    samples = [Sample(*response) for response in responses]
    result = score_samples(
        samples,
        records,
        lcb_problems=lcb_problems,
        limits=limits,
        math_timeout=math_timeout,
        missing_problem_wrong=missing_problem_wrong,
        source=str(dataset_path),
    )
    result["duplicates_dropped"] = dropped
    return result


def write_accuracy_txt(
    log_path: str | Path, dataset_path: str | Path, tokenizer_dir: str | Path, out: str | Path, **options
) -> dict:
    """Score the log (evaluate's `options`) and write accuracy.txt: the printed report, then the
    `hash=` line of the log it was computed from, as the official truncation step leaves it. Returns
    the result with the checker's numbers beside it."""
    data = Path(log_path).read_bytes()
    result = evaluate(log_path, dataset_path, tokenizer_dir, **options)
    Path(out).write_text(format_report(result) + f"hash={hashlib.sha256(data).hexdigest()}\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m accuracy.deepseek_r1",
        description="Score a deepseek-r1 accuracy log as the MLPerf reference's eval_accuracy.py does, offline.",
    )
    # The second spellings are the reference's and gpt_oss's, so that their command lines work here.
    parser.add_argument(
        "--mlperf-accuracy-file", "--mlperf-log", "--input-file", required=True, help="mlperf_log_accuracy.json"
    )
    parser.add_argument(
        "--dataset",
        "--dataset-file",
        required=True,
        help="mlperf_deepseek_r1_dataset_4388_fp8_eval.pkl, "
        "or the parquet python -m accuracy.datasets.deepseek_r1 wrote",
    )
    parser.add_argument("--tokenizer", required=True, help="the model folder (its tokenizer files)")
    parser.add_argument("--output-file", help="write the printed result here (accuracy.txt), with the log's hash= line")
    parser.add_argument("--output-json", help="write the whole result, every sample's verdict, as JSON here")
    parser.add_argument(
        "--lcb-problems",
        help="LiveCodeBench's code_generation_lite problems (test*.jsonl, a file or their folder); needed "
        "when the log has livecodebench samples",
    )
    parser.add_argument(
        "--lcb-missing-wrong",
        action="store_true",
        help="count a livecodebench sample whose problem is not in --lcb-problems as wrong (the reference's "
        "way) instead of stopping with an error",
    )
    defaults = SandboxLimits()
    parser.add_argument("--lcb-timeout", type=float, default=defaults.timeout, help="seconds per test (60)")
    parser.add_argument("--lcb-workers", "--num-lcb-workers", type=int, default=defaults.workers)
    parser.add_argument("--lcb-memory-mb", type=int, default=defaults.memory_mb, help="per test process")
    parser.add_argument(
        "--math-timeout", type=float, default=10.0, help="seconds sympy may take to compare two math500 answers"
    )
    args = parser.parse_args(argv)
    limits = SandboxLimits(timeout=args.lcb_timeout, memory_mb=args.lcb_memory_mb, workers=args.lcb_workers)
    options = {
        "lcb_problems": args.lcb_problems,
        "limits": limits,
        "math_timeout": args.math_timeout,
        "missing_problem_wrong": args.lcb_missing_wrong,
    }
    try:
        if args.output_file:
            out = Path(args.output_file)
            out.parent.mkdir(parents=True, exist_ok=True)
            result = write_accuracy_txt(args.mlperf_accuracy_file, args.dataset, args.tokenizer, out, **options)
        else:
            result = evaluate(args.mlperf_accuracy_file, args.dataset, args.tokenizer, **options)
    except (ValueError, OSError) as e:  # our input errors are ValueErrors, each naming its file
        raise SystemExit(f"error: deepseek_r1: {e}") from None
    print(format_report(result), end="", flush=True)
    if args.output_json:
        out = Path(args.output_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()

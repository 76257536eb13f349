"""gpt-oss-120b's accuracy script, re-implemented offline: the rules of the MLPerf reference
`language/gpt-oss-120b/eval_mlperf_accuracy.py` and the parsers of its `eval_accuracy.py`, with
LiveCodeBench's tests run in a sandboxed subprocess (accuracy/code_sandbox.py) instead of through the
`lcb_runner` submodule.

1. Each logged response (little-endian int32 token ids) is decoded with the model folder's tokenizer,
   special tokens kept, so that the harmony markers (`<|channel|>final<|message|>`) survive.
2. Each sample is graded by the family its `dataset` name contains (the first match, in the
   reference's order): gpqa (a letter A-D), aime (an integer 0-999), livecodebench (the code must
   pass every public and private test of the problem whose question_id is the sample's
   ground_truth), and mmlu (A-J), which the accuracy set does not use.
3. The score weights each sub-dataset by how many times its prompts repeat in the set:
   exact_match = sum(correct_d / repeats_d) / sum(total_d / repeats_d) x 100, and it is printed as
   `'exact_match': N` on its own line, the form the submission checker and TEST07 read.

The reference's LiveCodeBench tests come from the Hugging Face `livecodebench/code_generation_lite`
set (version release_v6), which it downloads; here they are read from those JSON-lines files on disk
(--lcb-problems). Run `python -m accuracy.gpt_oss --help` for the command line."""

import argparse
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from accuracy.code_sandbox import CodeTests, SandboxLimits, run_code_jobs
from accuracy.scorer_inputs import logged_responses, plain_cell, read_frame

# How many times each sub-dataset's prompts repeat in the accuracy set (aime25 30 x 8, gpqa_diamond
# 198 x 5, livecodebench_v6 1055 x 3): keyed by the lower-cased dataset name, any other name counts once.
REPEATS = {"aime25": 8, "gpqa_diamond": 5, "livecodebench_v6": 3}

# The grader for a dataset name is the first of these keys found inside it, so "mmlu_pro" must come
# before "mmlu". math500 needs PRM800K's symbolic grader, which is not reimplemented (gpt-oss has none).
FAMILIES = (
    ("gpqa", "gpqa"),
    ("mmlu_pro", "mmlu"),
    ("math500", None),
    ("aime", "aime"),
    ("livecodebench", "livecodebench"),
    ("mmlu", "mmlu"),
)


class GptOssAccuracyError(ValueError):
    """Bad input to the scorer: a dataset, a sample or a LiveCodeBench problem it cannot grade."""


# ---------------------------------------------------------------------------------------------------
# Parsing the answers


# The final channel's text, up to <|return|> (the token that ends a final message) or the end of the
# output. Whatever the model wrote between "final" and <|message|> (a stray token, a digit) is allowed,
# as long as it holds no "<". An <|end|> is not a stop: the reference does not treat it as one.
FINAL_SECTION = re.compile(r"<\|channel\|>final[^<]*<\|message\|>(.*?)(?:<\|return\|>|$)", re.DOTALL)


def _clean(text) -> str:
    return "" if text is None else str(text).strip()


def final_section(text: str) -> str:
    """The first final-channel message, stripped; the whole (stripped) text when there is none."""
    text = _clean(text)
    match = FINAL_SECTION.search(text)
    return match.group(1).strip() if match else text


def parse_aime(text: str) -> int | None:
    """The last `\\boxed{digits}` anywhere in the output (analysis channel included: the reference
    searches the whole text), else the last `Answer: digits`; None unless it is 0-999."""
    text = _clean(text)
    boxed = re.findall(r"\\boxed{\s*(\d+)\s*}", text)
    # "Answer: 12.5" is no integer answer: the digits may not run into a decimal point
    found = boxed or re.findall(r"Answer:\s*(\d+)(?!\.)\b", text, re.IGNORECASE)
    if not found:
        return None
    value = int(found[-1])
    return value if 0 <= value <= 999 else None


def parse_choice(text: str, last: str = "D") -> str | None:
    """The letter chosen, A..`last`, in the reference's order of trust: a letter opening the final
    section, then the first "Answer: X" in it, then the last "ANSWER: X" / "FINAL ANSWER: X" anywhere in
    the output; for A-J (MMLU) finally the last standalone letter of the final section."""
    text = _clean(text)
    if not text:
        return None
    final = re.sub(r"\*\*([^*]+)\*\*", r"\1", final_section(text))  # **B** counts as B
    if final.startswith(("['", '["')) and final.endswith(("']", '"]')):  # a list's repr around the answer
        final = final[2:-2].strip()
    final = _unescape(final)
    letters = f"A-{last}"
    # The letters match either case (re.IGNORECASE), so a final that opens with "a) ..." answers A.
    opening = re.match(rf"^[^a-zA-Z]*([{letters}])(?:[^a-zA-Z]|$)", final.strip(), re.IGNORECASE)
    if opening:
        return opening.group(1).upper()
    stated = re.search(rf"\b(?:Answer|ANSWER)\s*[:.]?\s*([{letters}])\b", final, re.IGNORECASE)
    if stated:
        return stated.group(1).upper()
    anywhere = re.findall(
        rf"\b(?:ANSWER|FINAL\s*ANSWER)\b\s*[:=]?\s*(?:\(?\s*([{letters}])\s*\)?)(?:\s*$|[^A-Za-z])",
        _unescape(text),
        re.IGNORECASE,
    )
    if anywhere:
        return anywhere[-1].upper()
    if last == "J":
        alone = re.findall(rf"\b([{letters}])\b", final, re.IGNORECASE)
        if alone:
            return alone[-1].upper()
    return None


def _unescape(text: str) -> str:
    # outputs that went through a repr() carry literal "\n" and "\'"
    return text.replace("\\n", "\n").replace("\\'", "'")


def parse_code(text: str) -> str | None:
    """The program the answer gives: the last ```python block of the final section, else its last plain
    ``` block; failing those (or with no final channel), the same two searches over the whole output."""
    text = _clean(text)
    if not text:
        return None
    final = final_section(text)
    if final != text:
        code = _last_code_block(final)
        if code is not None:
            return code
    return _last_code_block(text)


def _last_code_block(text: str) -> str | None:
    tagged = re.findall(r"```python(.*?)```", text, re.DOTALL)
    if tagged:
        return tagged[-1].strip()
    plain = re.findall(r"```(.*?)```", text, re.DOTALL)
    if plain:
        return re.sub(r"^(?:python|py)\s*\n", "", plain[-1].strip(), flags=re.IGNORECASE)
    return None


# ---------------------------------------------------------------------------------------------------
# Scoring


class Sample(NamedTuple):
    qsl_idx: int
    text: str  # the decoded response, special tokens included
    tokens: int | None = None  # how many tokens it was


def family_of(dataset_name, where: str) -> tuple[str, str]:
    """(lower-cased dataset name, grader family) for a sample's `dataset` value."""
    if _missing(dataset_name) or not dataset_name:
        raise GptOssAccuracyError(f"{where}: field 'dataset' is empty")
    name = str(dataset_name).lower()
    for key, family in FAMILIES:
        if key in name:
            if family is None:
                raise GptOssAccuracyError(
                    f"{where}: dataset {dataset_name!r} is graded with PRM800K's math grader, which is not "
                    "reimplemented here (gpt-oss-120b's accuracy set has no math500)"
                )
            return name, family
    known = ", ".join(key for key, family in FAMILIES if family)
    raise GptOssAccuracyError(f"{where}: unknown dataset {dataset_name!r}: its name contains none of {known}")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def score(
    texts_by_qsl: Mapping[int, str],
    records: Sequence[Mapping],
    *,
    lcb_problems: Mapping[str, CodeTests] | None = None,
    limits: SandboxLimits | None = None,
    tokens_by_qsl: Mapping[int, int] | None = None,
    source: str = "dataset",
) -> dict:
    """The reference's result for decoded responses: `records[qsl_idx]` holds the sample's `dataset`
    and `ground_truth` (for LiveCodeBench the question_id of a problem in `lcb_problems`)."""
    tokens_by_qsl = tokens_by_qsl or {}
    samples = [Sample(int(q), text, tokens_by_qsl.get(q)) for q, text in texts_by_qsl.items()]
    return score_samples(samples, records, lcb_problems=lcb_problems, limits=limits, source=source)


def score_samples(
    samples: Sequence[Sample],
    records: Sequence[Mapping],
    *,
    lcb_problems: Mapping[str, CodeTests] | None = None,
    limits: SandboxLimits | None = None,
    source: str = "dataset",
) -> dict:
    """As score(), for a list of samples in which a qsl_idx may repeat (each one counts)."""
    graded, code_jobs = [], []
    for sample in samples:
        where = f"{source}: sample {sample.qsl_idx}"
        record = _record(records, sample.qsl_idx, where)
        name, family = family_of(record["dataset"], where)
        truth = record["ground_truth"]
        result = {"qsl_idx": sample.qsl_idx, "dataset": name, "correct": False, "tokens": sample.tokens}
        if family == "livecodebench":
            code = parse_code(sample.text)
            result["extracted"] = None if code is None else code[:200]
            if code is None:
                result["detail"] = "no code in the output"
            elif _missing(truth):
                result["detail"] = "no ground truth"
            else:
                problem = (lcb_problems or {}).get(str(truth))
                if problem is None:
                    raise GptOssAccuracyError(
                        f"{where}: no LiveCodeBench problem {truth!r}"
                        + ("" if lcb_problems else " (give the release_v6 problems with --lcb-problems)")
                    )
                code_jobs.append((result, code, problem))
        else:
            result.update(_grade_answer(family, sample.text, truth))
        graded.append(result)
    run_code_jobs(code_jobs, limits or SandboxLimits())
    return _summary(graded)


def _record(records: Sequence[Mapping], qsl_idx: int, where: str) -> Mapping:
    if not 0 <= qsl_idx < len(records):
        raise GptOssAccuracyError(f"{where}: qsl_idx outside the dataset's {len(records)} samples")
    record = records[qsl_idx]
    for name in ("dataset", "ground_truth"):
        if name not in record:
            raise GptOssAccuracyError(f"{where}: no {name!r} field")
    return record


def _grade_answer(family: str, text: str, truth) -> dict:
    if family == "aime":
        answer = parse_aime(text)
        right = answer is not None and not _missing(truth) and _same_integer(answer, truth)
    else:
        answer = parse_choice(text, "D" if family == "gpqa" else "J")
        options = "ABCD" if family == "gpqa" else "ABCDEFGHIJ"
        right = answer is not None and not _missing(truth) and answer in options and answer == str(truth).upper()
    if answer is None:
        detail = "no answer in the output"
    elif _missing(truth):
        detail = "no ground truth"
    else:
        detail = "correct" if right else f"wrong: {answer} (expected {truth})"
    return {"correct": right, "extracted": answer, "detail": detail}


def _same_integer(answer: int, truth) -> bool:
    try:
        return answer == int(truth)
    except (TypeError, ValueError):
        return False


def _summary(graded: list[dict]) -> dict:
    per_dataset = {}
    for result in graded:
        counts = per_dataset.setdefault(result["dataset"], {"correct": 0, "total": 0})
        counts["total"] += 1
        counts["correct"] += bool(result["correct"])
    for name, counts in per_dataset.items():
        repeats = REPEATS.get(name, 1)
        counts.update(
            accuracy=100.0 * counts["correct"] / counts["total"],
            repeats=repeats,
            component_score=counts["correct"] / repeats,
            max_component_score=counts["total"] / repeats,
        )
    final = sum(c["component_score"] for c in per_dataset.values())
    best = sum(c["max_component_score"] for c in per_dataset.values())
    correct = sum(c["correct"] for c in per_dataset.values())
    tokens = [r["tokens"] for r in graded if r["tokens"] is not None]
    return {
        "exact_match": 100.0 * final / best if best else 0.0,
        "final_score": final,
        "max_score": best,
        "total_samples": len(graded),
        "total_correct": correct,
        "overall_accuracy": 100.0 * correct / len(graded) if graded else 0.0,
        "tokens_per_sample": sum(tokens) / len(tokens) if tokens else None,
        "dataset_repeats": dict(REPEATS),
        "per_dataset": dict(sorted(per_dataset.items())),
        "samples": graded,
    }


def format_report(result: dict) -> str:
    """The printed result: a table per sub-dataset, the weighted sum, and last the line the MLPerf
    checker and TEST07's run_verification.py read (`'exact_match': N`, three decimals as the reference)."""
    lines = [f"{'dataset':24} {'correct':>8} {'total':>8} {'repeats':>8} {'score':>10} {'accuracy':>9}"]
    for name, c in result["per_dataset"].items():
        lines.append(
            f"{name:24} {c['correct']:8d} {c['total']:8d} {c['repeats']:8d} "
            f"{c['component_score']:10.2f} {c['accuracy']:8.2f}%"
        )
    lines.append(
        f"raw accuracy {result['overall_accuracy']:.2f}% ({result['total_correct']}/{result['total_samples']}); "
        f"weighted score {result['final_score']:.2f} of {result['max_score']:.2f}"
    )
    if result.get("duplicates_dropped"):
        lines.append(f"{result['duplicates_dropped']} repeated log entries of a qsl_idx were not scored")
    if result["tokens_per_sample"] is not None:
        lines.append(f"mean output tokens per sample: {result['tokens_per_sample']:.1f}")
    lines.append(f"\n'exact_match': {result['exact_match']:.3f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Files: the dataset, the accuracy log, the tokenizer


def load_records(path: str | Path) -> list[dict]:
    """qsl_idx -> {"dataset", "ground_truth"}, from the reference's parquet or pickled DataFrame."""
    path = Path(path)
    if not path.is_file():
        raise GptOssAccuracyError(f"{path}: dataset file not found")
    frame = read_frame(path, GptOssAccuracyError)
    missing = [name for name in ("dataset", "ground_truth") if name not in frame.columns]
    if missing:
        raise GptOssAccuracyError(
            f"{path}: the dataset has no column {' or '.join(map(repr, missing))} "
            f"(its columns: {', '.join(map(str, frame.columns))})"
        )
    if not len(frame):
        raise GptOssAccuracyError(f"{path}: the dataset has no samples")
    return [
        {"dataset": plain_cell(name), "ground_truth": plain_cell(truth)}
        for name, truth in zip(frame["dataset"], frame["ground_truth"])
    ]


def evaluate(
    log_path: str | Path,
    dataset_path: str | Path,
    tokenizer_dir: str | Path,
    *,
    lcb_problems: str | Path | Mapping[str, CodeTests] | None = None,
    limits: SandboxLimits | None = None,
    every_entry: bool = False,
) -> dict:
    """Score an accuracy log: score()'s result for its responses, decoded with the local tokenizer.
    Entries are taken once per qsl_idx (the first); `every_entry` scores each entry of the log, as the
    reference does (a LoadGen accuracy log, and TEST07's, hold each sample once: the two agree there)."""
    records = load_records(dataset_path)
    responses, lcb_problems, dropped = logged_responses(
        log_path, dataset_path, records, tokenizer_dir, lcb_problems, skip_special_tokens=False, every_entry=every_entry
    )
    samples = [Sample(*response) for response in responses]
    result = score_samples(samples, records, lcb_problems=lcb_problems, limits=limits, source=str(dataset_path))
    result["duplicates_dropped"] = dropped
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The second spellings are the reference script's, so that its command lines work unchanged.
    parser.add_argument("--mlperf-accuracy-file", "--mlperf-log", required=True, help="mlperf_log_accuracy.json")
    parser.add_argument("--dataset", "--reference-data", required=True, help="the reference's .parquet or .pkl")
    parser.add_argument("--tokenizer", required=True, help="the model folder (its tokenizer files)")
    parser.add_argument("--output", "--output-file", help="write the result as JSON here")
    parser.add_argument(
        "--lcb-problems",
        help="LiveCodeBench code_generation_lite release_v6 (test*.jsonl, a file or their folder); "
        "needed when the log has livecodebench samples",
    )
    defaults = SandboxLimits()
    parser.add_argument("--lcb-timeout", type=float, default=defaults.timeout, help="seconds per test (60)")
    parser.add_argument("--lcb-workers", "--num-lcb-workers", type=int, default=defaults.workers)
    parser.add_argument("--lcb-memory-mb", type=int, default=defaults.memory_mb, help="per test process")
    parser.add_argument(
        "--every-entry",
        action="store_true",
        help="score every log entry, a repeated qsl_idx as often as it appears (the reference's way)",
    )
    args = parser.parse_args(argv)
    limits = SandboxLimits(timeout=args.lcb_timeout, memory_mb=args.lcb_memory_mb, workers=args.lcb_workers)
    try:
        result = evaluate(
            args.mlperf_accuracy_file,
            args.dataset,
            args.tokenizer,
            lcb_problems=args.lcb_problems,
            limits=limits,
            every_entry=args.every_entry,
        )
    except (ValueError, OSError) as e:  # our input errors are ValueErrors, each naming its file
        raise SystemExit(f"error: gpt_oss: {e}") from None
    print(format_report(result), flush=True)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

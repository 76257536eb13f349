"""deepseek-r1's accuracy script (accuracy/deepseek_r1.py), its MATH grader (accuracy/math_grade.py)
and its dataset reader (accuracy/datasets/deepseek_r1.py), on hand-built outputs with known answers: each
sub-dataset's parser right and wrong, PRM800K's equivalences (fractions, \\text{}, degrees, units,
intervals, sympy), the guarded sympy child, the score by hand, a repeated qsl_idx, the command line end
to end on a log, a pickle and SmolLM2's tokenizer, and the reader's errors."""

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from accuracy import deepseek_r1
from accuracy.accuracy_log import AccuracyLogError
from accuracy.code_sandbox import CodeTests, SandboxLimits
from accuracy.datasets import deepseek_r1 as reader
from accuracy.datasets.reader import DatasetError, load_dataset
from accuracy.deepseek_r1 import (
    DeepSeekR1AccuracyError,
    Sample,
    evaluate,
    format_report,
    parse_aime,
    parse_boxed,
    parse_choice,
    parse_code,
    score_samples,
)
from accuracy.math_grade import SympyJudge, grade_answer, normalize, normalize_mathd
from compliance.check import ACCURACY_PATTERNS
from harness.config import HarnessConfigError
from systems.benchmarks import BENCHMARKS
from tests.helpers import SMOLLM2_DIR

REPO = Path(__file__).resolve().parents[1]
FAST = SandboxLimits(timeout=5, grace=5, workers=2)
# The official checker's patterns for deepseek-r1 (tools/submission/submission_checker/constants.py
# ACC_PATTERN), matched against each line of accuracy.txt.
CHECKER = {
    "exact_match": r".*'exact_match':\s([\d.]+).*",
    "tokens_per_sample": r".*'tokens_per_sample':\s([\d.]+).*",
}


# ---- parsers ----


@pytest.mark.parametrize(
    "text, letter",
    [
        ("So the FINAL ANSWER: (C)", "C"),
        ("Answer: B", "B"),
        ("answer = d", "D"),  # either case
        ("ANSWER:(a)\nthat is all", "A"),
        ("Answer: A ... on reflection, FINAL ANSWER: B.", "B"),  # the last one counts
        ("Answer: Carbon", None),  # a letter beginning a word is no answer
        ("Answer: E", None),  # GPQA has A-D only
        ("The answer is B", None),  # GPQA has no fallback
        ("['Answer: C']", "C"),  # a list's repr around the output
        ("First line\\nAnswer: D", "D"),  # an output that went through repr()
        ("", None),
        (None, None),
    ],
)
def test_parse_gpqa(text, letter):
    assert parse_choice(text, "D") == letter


@pytest.mark.parametrize(
    "text, letter",
    [
        ("Answer: (J)", "J"),
        ("FINAL ANSWER: H", "H"),
        ("Of the ten options I pick H here.", "H"),  # the fallback: the last letter standing alone
        ("I think it is a trick, so C or maybe D", "D"),
        ("this is a guess", "A"),  # as the reference: the fallback matches either case
        ("Answer: K", None),  # K is no option, and no letter A-J stands alone
    ],
)
def test_parse_mmlu_pro_falls_back_to_a_standalone_letter(text, letter):
    assert parse_choice(text, "J") == letter


@pytest.mark.parametrize(
    "text, inside",
    [
        (r"so \boxed{\frac{\sqrt{3}}{2}}.", r"\frac{\sqrt{3}}{2}"),  # nested braces
        (r"\boxed{1} then \boxed{ 2 }", "2"),  # the last one, stripped
        (r"\boxed{\text{(C)}}", r"\text{(C)}"),
        (r"\boxed{3} and \boxed{4", None),  # the last one is never closed: no answer
        (r"\boxed{}", ""),
        ("the answer is 3", None),
    ],
)
def test_parse_boxed(text, inside):
    assert parse_boxed(text) == inside


@pytest.mark.parametrize(
    "text, answer",
    [
        (r"\boxed{204}", 204),
        (r"\boxed{ 7 }", 7),
        (r"\boxed{12} ... \boxed{70}", 70),
        (r"\boxed{7}, so Answer: 9", 7),  # a boxed answer comes before "Answer:"
        ("answer:   33", 33),
        ("Answer: 12.5", None),
        (r"\boxed{1000}", None),  # AIME answers are 0-999
        (r"\boxed{1000} Answer: 5", None),  # and a boxed one out of range does not fall back
        (r"\boxed{x+1}", None),
    ],
)
def test_parse_aime(text, answer):
    assert parse_aime(text) == answer


def test_parse_code_takes_the_first_python_block():
    assert parse_code("```python\nprint(1)\n```\nor\n```python\nprint(2)\n```") == "print(1)"
    assert parse_code("```\nprint(1)\n```") is None
    assert parse_code("no code") is None


# ---- PRM800K's grader ----


@pytest.mark.parametrize(
    "truth, given, right",
    [
        (r"\frac{1}{2}", r"\frac{1}{2}", True),
        (r"\frac{1}{2}", "0.5", True),
        (r"\frac{1}{2}", "1/2", True),
        (r"\frac{1}{2}", r"\frac12", True),
        (r"\frac{1}{2}", r"\dfrac{1}{2}", True),
        (r"\frac{1}{2}", "0.50", True),  # sympy: 1/2 - 0.50 is 0
        ("0.5", r"\frac{1}{2}", True),
        (r"\frac{1}{2}", "2/4", False),  # an unreduced fraction is wrong
        (r"\frac{1}{2}", r"\frac{2}{4}", False),
        (r"\frac{1}{2}", r"\frac{1}{3}", False),
        (r"\text{(C)}", "(C)", True),
        ("(C)", r"\text{(C)}", True),
        (r"\text{Monday}", "monday", True),
        (r"\text{east}", r"\text{west}", False),
        (r"30^\circ", "30", True),
        ("30", r"30^{\circ}", True),
        ("30", "30 degrees", True),
        ("5", r"5\text{ cm}", True),
        (r"10\%", "10", True),
        (r"\$5", "5", True),
        ("x=3", "3", True),
        ("1000", "1,000", True),
        ("3", "3.0", True),
        ("3", "4", False),
        ("2", r"\sqrt{4}", False),  # an integer only as an integer
        (r"(-\infty, 3)", r"(-\infty,3)", True),
        (r"(-\infty, 3)", r"(-\infty,3]", False),  # the brackets must agree
        (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),  # sympy
        (r"2\sqrt{3}", r"\sqrt{12}", True),
        ("x^2+2x+1", "(x+1)^2", True),
        (r"\pi", "3.14159", False),
        (r"\frac{3}{2}", r"1\frac{1}{2}", True),  # a mixed number
        (r"\frac{3}{2}", "1.5", True),
    ],
)
def test_grade_answer(truth, given, right):
    assert grade_answer(given, truth) is right


def test_normalizations():
    assert normalize_mathd(r"\text{ 7 }") == "7"
    assert normalize_mathd(r"\left( 1, \dfrac12 \right)") == r"(1,\frac{1}{2})"
    assert normalize_mathd(r"3\sqrt") == r"3\sqrt"  # a rewrite that fails leaves the answer as it was
    assert normalize(r"\frac{1}{2}") == "1/2" and normalize("2 million") == "2*10^6"
    assert normalize("7 3/4") == "7+3/4" and normalize(r"\text{East}") == "east"


@pytest.mark.slow
def test_sympy_runs_in_a_child_that_is_replaced_when_out_of_time():
    with SympyJudge(timeout=1.0) as judge:
        assert judge("(x+1)**2-(x**2+2*x+1)") and not judge("(1)-(2)")
        child = judge._proc.pid
        started = time.monotonic()
        # no "^" and one letter: the grader hands it to sympy, which would compute 9**387420489
        assert grade_answer("9**9**9", "x", judge) is False
        assert time.monotonic() - started < 10 and judge.timeouts == 1
        assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
        assert judge(r"(1/2)-(0.5)")  # a new child answers the next question


# ---- the score ----


def lcb_problem_rows() -> list[dict]:
    stdin = [
        {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
        {"input": "4 5", "output": "9", "testtype": "stdin"},
    ]
    return [
        {
            "question_id": "abc301_a",
            "public_test_cases": json.dumps(stdin[:1]),
            "private_test_cases": json.dumps(stdin[1:]),
            "metadata": "{}",
        }
    ]


ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
# (dataset, ground truth, response, right): 7 of 11 right
CASES = [
    ("gpqa", "C", "The dipole cancels. FINAL ANSWER: (C)", True),
    ("gpqa", "B", "Answer: A", False),
    ("mmlu_pro", "J", "Answer: (J)", True),
    ("mmlu_pro", "H", "Of the ten options I pick H here.", True),  # the fallback letter
    ("math500", "0.5", r"Halving: \boxed{\frac{1}{2}}", True),
    ("math500", "(C)", r"So \boxed{\text{(C)}}", True),
    ("math500", r"\frac{1}{2}", r"\boxed{2/4}", False),
    ("aime", "204", r"Thus \boxed{204}.", True),
    ("aime", "1000", r"\boxed{1000}", False),  # out of 0-999
    ("livecodebench", "abc301_a", f"Here it is:\n{ADD}", True),
    ("livecodebench", "abc301_a", "I cannot solve it.", False),
]


def test_score_by_hand():
    records = [{"dataset": d, "ground_truth": t} for d, t, _, _ in CASES]
    samples = [Sample(i, text, 10 + i) for i, (_, _, text, _) in enumerate(CASES)]
    problems = {"abc301_a": CodeTests(["1 2\n", "4 5"], ["3\n", "9"])}
    result = score_samples(samples, records, lcb_problems=problems, limits=FAST)
    assert [s["correct"] for s in result["samples"]] == [right for *_, right in CASES]
    assert result["exact_match"] == pytest.approx(100 * 7 / 11) == pytest.approx(63.63636363636363)
    assert result["tokens_per_sample"] == pytest.approx(sum(10 + i for i in range(11)) / 11)
    assert result["per_dataset"]["math500"] == {"correct": 2, "total": 3, "answered": 3, "accuracy": 200 / 3}
    assert result["per_dataset"]["aime"]["answered"] == 1  # 1000 is no AIME answer
    assert result["samples"][10]["detail"] == "no code in the output"
    assert result["samples"][9]["detail"] == "passed 2 tests"


def test_unknown_dataset_and_missing_problem_are_errors_naming_the_sample():
    with pytest.raises(DeepSeekR1AccuracyError, match="sample 0: unknown dataset 'mmlu'"):
        score_samples([Sample(0, "Answer: A", 1)], [{"dataset": "mmlu", "ground_truth": "A"}])
    code = [Sample(0, ADD, 1)]
    lcb = [{"dataset": "livecodebench", "ground_truth": "gone"}]
    with pytest.raises(DeepSeekR1AccuracyError, match="sample 0: no LiveCodeBench problem 'gone'.*--lcb-problems"):
        score_samples(code, lcb)
    counted = score_samples(code, lcb, missing_problem_wrong=True)  # the reference's way
    assert counted["exact_match"] == 0 and "counted wrong" in counted["samples"][0]["detail"]


def test_missing_ground_truth_is_wrong():
    result = score_samples([Sample(0, r"\boxed{5}", 1)], [{"dataset": "aime", "ground_truth": None}])
    assert result["exact_match"] == 0 and result["samples"][0]["detail"] == "no ground truth"


# ---- files and the command line, end to end ----


@pytest.fixture(scope="module")
def tokenizer_dir():
    if not (SMOLLM2_DIR / "tokenizer.json").is_file():
        pytest.fail(f"SmolLM2 is not converted at {SMOLLM2_DIR}: run `make models` (make test does it)")
    return SMOLLM2_DIR


def write_log(path: Path, tokenizer_dir: Path, responses: list[tuple[int, str]]) -> list[int]:
    """mlperf_log_accuracy.json for (qsl_idx, text) responses as the SUT logs them: the text's ids
    and the model's end-of-turn token, little-endian int32 in hex. Returns the token counts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    entries, lengths = [], []
    for seq_id, (qsl_idx, text) in enumerate(responses):
        ids = tokenizer.encode(text, add_special_tokens=False) + [eos]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
        data = np.asarray(ids, "<i4").tobytes().hex().upper()
        entries.append({"seq_id": seq_id, "qsl_idx": qsl_idx, "data": data, "token_count": len(ids)})
        lengths.append(len(ids))
    path.write_text(json.dumps(entries))
    return lengths


def reference_frame(rows: list[tuple[str, str]], prompts: list[str] | None = None) -> pd.DataFrame:
    """A table shaped as mlperf_deepseek_r1_dataset_4388_fp8_eval.pkl: (dataset, ground truth) rows."""
    prompts = prompts or [f"Question {i}: answer it." for i in range(len(rows))]
    return pd.DataFrame(
        {
            "text_input": prompts,
            "ground_truth": [t for _, t in rows],
            "dataset": [d for d, _ in rows],
            "question": [p.split(":")[0] for p in prompts],
        }
    )


@pytest.fixture()
def run_files(tmp_path, tokenizer_dir):
    """The pickle, the problems, and a log of CASES with two repeats of a qsl_idx (dropped: the first
    entry counts, as the reference takes it)."""
    reference_frame([(d, t) for d, t, _, _ in CASES]).to_pickle(tmp_path / "ds.pkl")
    (tmp_path / "lcb").mkdir()
    (tmp_path / "lcb" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lcb_problem_rows()))
    responses = [(i, text) for i, (_, _, text, _) in enumerate(CASES)]
    repeats = [(1, "FINAL ANSWER: B"), (0, "Answer: A")]  # would turn 1 right and 0 wrong
    lengths = write_log(tmp_path / "mlperf_log_accuracy.json", tokenizer_dir, responses + repeats)
    return tmp_path, lengths[: len(CASES)]


def test_evaluate_takes_each_qsl_idx_once(run_files, tokenizer_dir):
    folder, lengths = run_files
    result = evaluate(
        folder / "mlperf_log_accuracy.json", folder / "ds.pkl", tokenizer_dir, lcb_problems=folder / "lcb", limits=FAST
    )
    assert result["duplicates_dropped"] == 2 and result["num_samples"] == 11
    assert result["exact_match"] == pytest.approx(100 * 7 / 11)
    assert result["tokens_per_sample"] == pytest.approx(sum(lengths) / 11)  # the kept entries' ids, EOS included


@pytest.mark.slow
def test_cli_end_to_end_prints_what_the_checker_reads(run_files, tokenizer_dir):
    folder, lengths = run_files
    command = [sys.executable, "-m", "accuracy.deepseek_r1", "--mlperf-accuracy-file"]
    command += [str(folder / "mlperf_log_accuracy.json"), "--dataset", str(folder / "ds.pkl")]
    command += ["--tokenizer", str(tokenizer_dir), "--lcb-problems", str(folder / "lcb"), "--lcb-timeout", "5"]
    command += ["--output-file", str(folder / "out" / "accuracy.txt"), "--output-json", str(folder / "result.json")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout
    tokens = sum(lengths) / 11
    last = printed.rstrip().splitlines()[-1]
    assert last == str({"exact_match": 100 * 7 / 11, "tokens_per_sample": tokens, "num-samples": 11})
    assert printed.rstrip().splitlines()[-3] == "Results"
    for metric, pattern in CHECKER.items():
        [line] = [x for x in printed.splitlines() if re.match(pattern, x)]
        assert float(re.match(pattern, line).group(1)) == pytest.approx(
            100 * 7 / 11 if metric == "exact_match" else tokens
        )
    assert re.search(r"^math500\s+2\s+3\s+3\s+66.67%$", printed, re.MULTILINE)
    assert re.search(r"^all\s+7\s+11$", printed, re.MULTILINE)
    assert "2 repeated log entries of a qsl_idx were not scored" in printed
    accuracy_txt = (folder / "out" / "accuracy.txt").read_text()
    log_hash = hashlib.sha256((folder / "mlperf_log_accuracy.json").read_bytes()).hexdigest()
    assert accuracy_txt == printed + f"hash={log_hash}\n"
    # and our own checker reads the same numbers (compliance/check.py)
    assert float(re.search(ACCURACY_PATTERNS["exact_match"], accuracy_txt).group(1)) == pytest.approx(100 * 7 / 11)
    samples = json.loads((folder / "result.json").read_text())["samples"]
    assert [s["correct"] for s in samples] == [right for *_, right in CASES]


def test_cli_missing_column_exits_with_the_file_and_column(tmp_path):
    pd.DataFrame({"dataset": ["aime"], "answer": ["1"]}).to_pickle(tmp_path / "d.pkl")
    (tmp_path / "log.json").write_text("[]")
    command = [sys.executable, "-m", "accuracy.deepseek_r1", "--input-file", str(tmp_path / "log.json")]
    command += ["--dataset-file", str(tmp_path / "d.pkl"), "--tokenizer", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert re.search(r"error: deepseek_r1: .*d.pkl: the dataset has no column 'gt_output'", done.stderr)


def test_log_sample_outside_the_dataset_is_an_error(tmp_path, tokenizer_dir):
    reference_frame([("aime", "1")]).to_pickle(tmp_path / "d.pkl")
    write_log(tmp_path / "log.json", tokenizer_dir, [(3, "x")])
    with pytest.raises(AccuracyLogError, match=r"log.json: qsl_idx 3 is outside the dataset .*d.pkl of 1 samples"):
        evaluate(tmp_path / "log.json", tmp_path / "d.pkl", tokenizer_dir)


# ---- the dataset reader ----


def test_convert_tokenizes_with_the_chat_template(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    rows = [("aime", 204.0), ("gpqa", "C"), ("math500", r"\frac{1}{2}")]  # a float truth, as a pickle may hold
    reference_frame(rows).to_pickle(tmp_path / "ds.pkl")
    out = tmp_path / "parquet" / "ds.parquet"
    summary = reader.convert(tmp_path / "ds.pkl", tokenizer_dir, out, trust_pickle=True)
    assert summary.startswith(f"wrote 3 samples to {out} from {tmp_path / 'ds.pkl'} (SHA-256 ")
    dataset = load_dataset(out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Question 1: answer it."}], add_generation_prompt=True, return_dict=False
    )
    assert dataset.input_ids[1] == expected
    assert tokenizer.decode(expected).endswith(
        "<|im_start|>user\nQuestion 1: answer it.<|im_end|>\n<|im_start|>assistant\n"
    )
    table = pd.read_parquet(out)
    assert list(table["ground_truth"]) == ["204", "C", r"\frac{1}{2}"] and list(table["dataset"]) == [
        "aime",
        "gpqa",
        "math500",
    ]
    # the accuracy script reads the converted table as it reads the pickle
    assert deepseek_r1.load_records(out) == [
        {"dataset": d, "ground_truth": t} for d, t in zip(table["dataset"], table["ground_truth"])
    ]


def test_convert_errors_name_the_file_and_the_row(tmp_path, tokenizer_dir):
    out = tmp_path / "out.parquet"
    with pytest.raises(DatasetError, match="nothing.pkl: deepseek-r1 dataset pickle not found"):
        reader.convert(tmp_path / "nothing.pkl", tokenizer_dir, out, trust_pickle=True)
    frame = reference_frame([("aime", "1"), ("gpqa", "A")])
    frame.to_pickle(tmp_path / "ds.pkl")
    with pytest.raises(DatasetError, match="no official SHA-256 is published.*--trust-pickle"):
        reader.convert(tmp_path / "ds.pkl", tokenizer_dir, out)
    frame.drop(columns=["dataset"]).to_pickle(tmp_path / "no-dataset.pkl")
    with pytest.raises(DatasetError, match="no-dataset.pkl: the DataFrame has no 'dataset' column"):
        reader.convert(tmp_path / "no-dataset.pkl", tokenizer_dir, out, trust_pickle=True)
    frame.assign(text_input=["Question?", "   "]).to_pickle(tmp_path / "empty.pkl")
    with pytest.raises(DatasetError, match="empty.pkl: row 1 field 'text_input' is empty"):
        reader.convert(tmp_path / "empty.pkl", tokenizer_dir, out, trust_pickle=True)
    frame.assign(text_input=["Question?", " word" * 3200]).to_pickle(tmp_path / "long.pkl")
    with pytest.raises(
        DatasetError,
        match=r"long.pkl: row 1: its prompt is \d+ tokens with the chat template, over 3140, deepseek-r1's "
        r"maximum input length \(3136 tokens and 4 for the template\)",
    ):
        reader.convert(tmp_path / "long.pkl", tokenizer_dir, out, trust_pickle=True)
    assert not out.exists()
    with pytest.raises(DatasetError, match="has no tokenizer"):
        reader.convert(tmp_path / "ds.pkl", tmp_path, out, trust_pickle=True)


def test_the_harness_refuses_a_prompt_over_the_limit_and_checks_scoring(tmp_path):
    from accuracy.datasets.reader import Dataset
    from harness.run import check_input_lengths, check_scoring

    cfg = SimpleNamespace(benchmark=BENCHMARKS["deepseek-r1"])
    check_input_lengths(cfg, Dataset(tmp_path / "d.parquet", [[1] * 3140, [1] * 5], [None, None]))
    with pytest.raises(HarnessConfigError, match=r"d.parquet: sample 1 is 3141 tokens, over deepseek-r1's maximum"):
        check_input_lengths(cfg, Dataset(tmp_path / "d.parquet", [[1] * 5, [1] * 3141], [None, None]))
    pd.DataFrame(
        {"tok_input": [[1, 2]] * 2, "dataset": ["math500", "livecodebench"], "ground_truth": ["1", "q"]}
    ).to_parquet(tmp_path / "d.parquet")
    no_problems = SimpleNamespace(accuracy_file=lambda benchmark, name: None)
    cfg = SimpleNamespace(benchmark=BENCHMARKS["deepseek-r1"], dataset=tmp_path / "d.parquet", system=no_problems)
    with pytest.raises(
        HarnessConfigError, match="LiveCodeBench's problems .* saaf_harness.datasets.deepseek-r1.lcb_problems"
    ):
        check_scoring(cfg, None)
    pd.DataFrame({"tok_input": [[1, 2]], "dataset": ["trivia"], "ground_truth": ["1"]}).to_parquet(
        tmp_path / "d.parquet"
    )
    with pytest.raises(HarnessConfigError, match="sample 0: unknown dataset 'trivia'"):
        check_scoring(cfg, None)


def test_the_harness_scores_a_run_into_accuracy_txt(run_files, tokenizer_dir):
    from harness.run import score

    folder, lengths = run_files
    system = SimpleNamespace(
        accuracy_file=lambda benchmark, name: folder / "lcb", model_for=lambda benchmark: tokenizer_dir
    )
    cfg = SimpleNamespace(benchmark=BENCHMARKS["deepseek-r1"], dataset=folder / "ds.pkl", system=system, log_dir=folder)
    result, words = score(cfg, None)
    assert result["exact_match"] == pytest.approx(100 * 7 / 11)
    assert words == f"exact_match {100 * 7 / 11}, tokens_per_sample {sum(lengths) / 11}"
    text = (folder / "accuracy.txt").read_text()
    assert (
        text.splitlines()[-1]
        == f"hash={hashlib.sha256((folder / 'mlperf_log_accuracy.json').read_bytes()).hexdigest()}"
    )
    assert "'num-samples': 11}" in format_report(result)

"""gpt-oss-120b's accuracy script (accuracy/gpt_oss.py) on hand-built outputs with known answers: the
harmony final-channel extraction, the AIME / GPQA / code parsers, LiveCodeBench code run in the sandbox
of accuracy/code_sandbox.py (passing, failing, looping), the repeat-weighted score, and the command
line on a log, a parquet and a tokenizer made here."""

import base64
import json
import pickle
import re
import subprocess
import sys
import time
import zlib
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accuracy import code_sandbox
from accuracy.accuracy_log import AccuracyLogError
from accuracy.code_sandbox import CodeTests, LiveCodeBenchError, SandboxLimits, load_lcb_problems, run_code
from accuracy.gpt_oss import (
    GptOssAccuracyError,
    evaluate,
    final_section,
    main,
    parse_aime,
    parse_choice,
    parse_code,
    score,
)

REPO = Path(__file__).resolve().parents[1]
HARMONY = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"]
FAST = SandboxLimits(timeout=5, grace=5, workers=4)


def harmony(final: str, analysis: str = "Let me think.") -> str:
    """A gpt-oss response as the tokenizer decodes it: reasoning, then the final answer."""
    return (
        f"<|channel|>analysis<|message|>{analysis}<|end|><|start|>assistant<|channel|>final<|message|>{final}<|return|>"
    )


# ---- the final channel ----


def test_final_section_is_the_final_message_after_the_analysis():
    assert final_section(harmony("The answer is 42.", analysis="maybe 41")) == "The answer is 42."


def test_final_section_runs_to_the_end_without_a_return_token():
    assert final_section("<|channel|>final<|message|>  cut off mid-sent") == "cut off mid-sent"


@pytest.mark.parametrize("junk", [" 明", "537", " json"])
def test_final_section_tolerates_junk_between_final_and_message(junk):
    assert final_section(f"<|channel|>final{junk}<|message|>B<|return|>") == "B"


def test_junk_holding_a_tag_is_no_final_channel():
    text = "<|channel|>final<|constrain|><|message|>B<|return|>"
    assert final_section(text) == text


def test_without_a_final_channel_the_whole_stripped_text_is_kept():
    text = "<|channel|>analysis<|message|>still thinking... Answer: C<|end|>"
    assert final_section(f"  {text}\n") == text


def test_end_token_does_not_close_the_final_section():
    # the reference stops only at <|return|> (or the end): a final message ends with <|return|>
    assert final_section("<|channel|>final<|message|>B<|end|>tail") == "B<|end|>tail"


def test_the_first_final_message_counts():
    assert final_section(harmony("first") + harmony("second")) == "first"


# ---- answers ----


@pytest.mark.parametrize(
    "text, answer",
    [
        (harmony(r"So the total is \boxed{70}."), 70),
        (harmony(r"\boxed{ 7 }"), 7),
        (harmony(r"It is \boxed{70}", analysis=r"first try \boxed{12}"), 70),  # the last one wins
        (harmony("I could not finish.", analysis=r"\boxed{12}"), 12),  # the whole output is searched
        (harmony("Answer: 204"), 204),
        (harmony("answer:   33"), 33),
        (harmony(r"\boxed{7}, so Answer: 9"), 7),  # a boxed answer comes before "Answer:"
        (harmony("Answer: 12.5"), None),
        (harmony(r"\boxed{1000}"), None),  # AIME answers are 0-999
        (harmony(r"\boxed{x+1}"), None),
        (harmony("The answer is 70."), None),
        ("", None),
    ],
)
def test_parse_aime(text, answer):
    assert parse_aime(text) == answer


@pytest.mark.parametrize(
    "text, letter",
    [
        (harmony("B"), "B"),
        (harmony("**C**"), "C"),
        (harmony("(d) because the dipole cancels"), "D"),  # either case
        (harmony("['B']"), "B"),
        (harmony("The dipole cancels.\n\nAnswer: A"), "A"),
        (harmony("**Answer: C**"), "C"),
        # nothing in the final section: the last FINAL ANSWER anywhere
        (harmony("I am fairly sure of it.", analysis="so FINAL ANSWER: D"), "D"),
        (harmony("The answer is B"), None),
        (harmony("E"), None),  # not an option of four
        ("A nice problem; the answer is C", "A"),  # no final channel: a leading "A " is taken (as the reference)
        ("", None),
    ],
)
def test_parse_gpqa_letter(text, letter):
    assert parse_choice(text, "D") == letter


def test_parse_mmlu_letter_falls_back_to_a_standalone_letter():
    assert parse_choice(harmony("so, we pick (H)."), "J") == "H"
    assert parse_choice(harmony("E"), "J") == "E"


def test_parse_code_prefers_the_final_section():
    text = harmony("Here:\n```python\nprint(2)\n```", analysis="draft\n```python\nprint(1)\n```")
    assert parse_code(text) == "print(2)"


def test_parse_code_falls_back_to_the_whole_output():
    assert parse_code(harmony("no code here", analysis="```python\nprint(1)\n```")) == "print(1)"
    assert parse_code("```py\nprint(3)\n``` and ```python\nprint(4)\n```") == "print(4)"
    assert parse_code("```py\nprint(3)\n```") == "print(3)"  # a plain block loses its language tag
    assert parse_code(harmony("I cannot solve it.")) is None


# ---- LiveCodeBench in the sandbox ----

SUM = CodeTests(["1 2\n", "10 -4\n"], ["3\n", "6"])  # stdin -> stdout


def test_stdin_program_passes_and_fails():
    assert run_code("a, b = map(int, input().split())\nprint(a + b)", SUM, FAST).passed
    wrong = run_code("a, b = map(int, input().split())\nprint(a - b)", SUM, FAST)
    assert not wrong.passed and "test 0: wrong answer" in wrong.detail


def test_stdout_is_compared_by_line_and_by_number():
    tests = CodeTests([""], ["1\n2.50 3\n"])
    assert run_code("print(1.0)\nprint('  2.5 3  ')", tests, FAST).passed  # numbers compare as decimals
    assert not run_code("print(1)", tests, FAST).passed  # a line short
    assert not run_code("print(1)\nprint('2.5 three')", tests, FAST).passed  # words compare as text
    # the program's __main__ block runs, and LiveCodeBench's stdlib imports are in place (no `import math`)
    assert run_code("if __name__ == '__main__':\n    print(gcd(4, 2) - 1)\n    print('2.50 3')", tests, FAST).passed


def test_functional_problem_calls_the_solution_method():
    tests = CodeTests(["[1, 2]\n3", "[]\n0"], ["[1, 2, 3]", "[0]"], fn_name="push")
    good = "class Solution:\n    def push(self, xs: List[int], x: int) -> List[int]:\n        return (*xs, x)"
    assert run_code(good, tests, FAST).passed  # a tuple for a list is right
    assert not run_code(good.replace("(*xs, x)", "xs"), tests, FAST).passed
    assert run_code(good.replace("push", "pop"), tests, FAST).detail == "no function 'push'"


@pytest.mark.slow
def test_loops_are_stopped_and_counted_wrong(tmp_path):
    """Four LiveCodeBench answers, run in parallel under a 0.5 s test limit: one right, one wrong, one that
    loops (stopped by the per-test timer) and one that loops with the timer ignored (killed, with its
    process group, when the problem's whole allowance of (0.5 + 1) x 1 + 1.5 = 3 s runs out)."""
    pid_file = tmp_path / "looper.pid"
    stubborn = (
        "import os, signal\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        f"fd = os.open({str(pid_file)!r}, os.O_WRONLY | os.O_CREAT)\n"
        "os.write(fd, str(os.getpid()).encode())\n"
        "os.close(fd)\n"
        "while True:\n    pass\n"
    )
    answers = {
        0: "a, b = map(int, input().split())\nprint(a + b)",
        1: "print(0)",
        2: "while True:\n    pass",
        3: stubborn,
    }
    texts = {q: harmony(f"```python\n{code}\n```") for q, code in answers.items()}
    records = [{"dataset": "livecodebench_v6", "ground_truth": "sum"}] * 4
    one_test = CodeTests(["1 2\n"], ["3"])
    started = time.monotonic()
    result = score(texts, records, lcb_problems={"sum": one_test}, limits=SandboxLimits(0.5, 1.5, workers=4))
    elapsed = time.monotonic() - started
    samples = {s["qsl_idx"]: s for s in result["samples"]}
    assert [samples[q]["correct"] for q in range(4)] == [True, False, False, False]
    assert samples[2]["detail"] == "test 0: time limit exceeded"
    assert samples[3]["detail"] == "killed: still running after 3 s"
    assert elapsed < 20  # never hangs: 3 s plus process start-up on a busy machine
    looper = int(pid_file.read_text())
    assert not Path(f"/proc/{looper}").exists()  # killed and reaped
    assert result["per_dataset"]["livecodebench_v6"]["correct"] == 1


def test_sandbox_blocks_new_processes_and_huge_memory(monkeypatch):
    assert "NoneType" in run_code("import os\nos.fork()\nprint(3)", SUM, FAST).detail
    assert "NoneType" in run_code("import posix\nposix.fork()\nprint(3)", SUM, FAST).detail
    # a process limit (which the kernel applies to users other than root) leaves threads working
    monkeypatch.setattr(code_sandbox, "_process_allowance", lambda: 4096)
    threads = "import threading\nt = threading.Thread(target=lambda: print(3))\nt.start()\nt.join()"
    assert run_code(threads, CodeTests([""], ["3"]), FAST).passed
    assert "MemoryError" in run_code("x = [0] * (10 ** 10)", SUM, SandboxLimits(5, 5, memory_mb=512)).detail


def test_sandbox_does_not_inherit_the_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    tests = CodeTests([""], ["None"])
    assert run_code("import os\nprint(os.environ.get('SECRET_TOKEN'))", tests, FAST).passed


# ---- the score ----


def test_weighted_score_of_a_mixed_set_by_hand():
    """aime25 1 of 2 right (repeats 8), gpqa_diamond 2 of 3 (repeats 5), livecodebench_v6 1 of 3
    (repeats 3): (1/8 + 2/5 + 1/3) / (2/8 + 3/5 + 3/3) = 0.858333 / 1.85 = 46.396%."""
    records = [
        {"dataset": "aime25", "ground_truth": "70"},
        {"dataset": "aime25", "ground_truth": 70},
        {"dataset": "gpqa_diamond", "ground_truth": "B"},
        {"dataset": "gpqa_diamond", "ground_truth": "c"},
        {"dataset": "gpqa_diamond", "ground_truth": "A"},
        {"dataset": "livecodebench_v6", "ground_truth": "sum"},
        {"dataset": "livecodebench_v6", "ground_truth": "sum"},
        {"dataset": "livecodebench_v6", "ground_truth": "sum"},
    ]
    texts = {
        0: harmony(r"\boxed{70}"),
        1: harmony("Answer: 71"),
        2: harmony("B"),
        3: harmony("Answer: C"),
        4: harmony("The answer is A"),
        5: harmony("```python\nprint(sum(map(int, input().split())))\n```"),
        6: harmony("```python\nprint(-1)\n```"),
        7: harmony("I give up."),
    }
    result = score(texts, records, lcb_problems={"sum": SUM}, limits=FAST, tokens_by_qsl=dict.fromkeys(texts, 10))
    expected = 100 * (1 / 8 + 2 / 5 + 1 / 3) / (2 / 8 + 3 / 5 + 3 / 3)
    assert result["exact_match"] == pytest.approx(expected) and round(expected, 3) == 46.396
    assert result["per_dataset"]["gpqa_diamond"] == {
        "correct": 2,
        "total": 3,
        "accuracy": pytest.approx(200 / 3),
        "repeats": 5,
        "component_score": 0.4,
        "max_component_score": 0.6,
    }
    assert result["total_correct"] == 4 and result["tokens_per_sample"] == 10
    assert [s["correct"] for s in result["samples"]] == [True, False, True, True, False, True, False, False]


def test_a_dataset_outside_the_repeat_table_counts_once():
    result = score({0: harmony("B")}, [{"dataset": "GPQA_main", "ground_truth": "B"}])
    assert result["per_dataset"]["gpqa_main"]["repeats"] == 1 and result["exact_match"] == 100


# ---- bad input ----


def test_unknown_sub_dataset_is_an_error_naming_the_sample():
    records = [{"dataset": "gpqa_diamond", "ground_truth": "B"}, {"dataset": "mystery_qa", "ground_truth": "B"}]
    with pytest.raises(GptOssAccuracyError, match=r"sample 1: unknown dataset 'mystery_qa'"):
        score({0: "B", 1: "B"}, records)
    with pytest.raises(GptOssAccuracyError, match="PRM800K"):
        score({0: "x"}, [{"dataset": "math500", "ground_truth": "1"}])
    with pytest.raises(GptOssAccuracyError, match="sample 0: field 'dataset' is empty"):
        score({0: "x"}, [{"dataset": None, "ground_truth": "1"}])


def test_missing_livecodebench_problem_is_an_error():
    records = [{"dataset": "livecodebench_v6", "ground_truth": "q9"}]
    with pytest.raises(GptOssAccuracyError, match=r"sample 0: no LiveCodeBench problem 'q9' \(give"):
        score({0: "```python\nprint(1)\n```"}, records)


def test_private_tests_are_a_pickled_string_and_nothing_else(tmp_path):
    evil = base64.b64encode(zlib.compress(pickle.dumps(Decimal(1)))).decode()
    rows = [{"question_id": "q1", "public_test_cases": "[]", "private_test_cases": evil, "metadata": "{}"}]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(LiveCodeBenchError, match=r"test.jsonl: line 1 \(question_id q1\): field 'private_test_cases'"):
        load_lcb_problems(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LiveCodeBenchError, match=r"empty: no \*.jsonl files"):
        load_lcb_problems(tmp_path / "empty")


# ---- the command line, end to end ----


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer (lossless, as gpt-oss's own) with the harmony tokens, saved as a
    transformers folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=HARMONY,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["analysis final assistant the answer is Answer: boxed print input split"], trainer)
    folder = tmp_path_factory.mktemp("harmony-tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=HARMONY).save_pretrained(folder)
    return folder


def write_log(path: Path, tokenizer_dir: Path, responses: list[tuple[int, str]]) -> list[int]:
    """mlperf_log_accuracy.json for (qsl_idx, text) responses, ids as LoadGen logs them (int32 LE hex)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    entries, lengths = [], []
    for seq_id, (qsl_idx, text) in enumerate(responses):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        data = np.asarray(ids, "<i4").tobytes().hex().upper()
        entries.append({"seq_id": seq_id, "qsl_idx": qsl_idx, "data": data, "token_count": len(ids)})
        lengths.append(len(ids))
    path.write_text(json.dumps(entries))
    return lengths


def packed(tests: list[dict]) -> str:
    """Private tests as code_generation_lite stores them: JSON, pickled, zlib-compressed, base64."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


CASES = [  # (dataset, ground_truth, response): 1 of 2 aime25, 2 of 3 gpqa_diamond, 1 of 3 livecodebench_v6
    ("aime25", "70", harmony(r"\boxed{70}", analysis=r"maybe \boxed{12}")),
    ("aime25", "70", harmony("Answer: 71")),
    ("gpqa_diamond", "B", harmony("B")),
    ("gpqa_diamond", "C", harmony("**Answer: C**")),
    ("gpqa_diamond", "A", harmony("The answer is A")),
    (
        "livecodebench_v6",
        "lcb_sum",
        harmony("```python\nimport sys\nprint(sum(map(int, sys.stdin.read().split())))\n```"),
    ),
    (
        "livecodebench_v6",
        "lcb_add",
        harmony("```python\nclass Solution:\n    def add(self, a, b):\n        return a - b\n```"),
    ),
    ("livecodebench_v6", "lcb_sum", harmony("No idea.")),
]


@pytest.fixture()
def run_files(tmp_path, tokenizer_dir):
    frame = pd.DataFrame(
        {
            "input_tokens": [[200006, 17, 18]] * len(CASES),
            "num_tokens": [3] * len(CASES),
            "text_input": ["question"] * len(CASES),
            "original_messages": ['[{"role": "user", "content": "question"}]'] * len(CASES),
            "ground_truth": [truth for _, truth, _ in CASES],
            "dataset": [name for name, _, _ in CASES],
        }
    )
    frame.to_parquet(tmp_path / "acc_eval.parquet")
    stdin_case = {"input": "4 5\n", "output": "9\n", "testtype": "stdin"}
    problems = [
        {
            "question_id": "lcb_sum",
            "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
            "private_test_cases": packed([stdin_case, {**stdin_case, "input": "-1 1", "output": "0"}]),
            "metadata": "{}",
        },
        {
            "question_id": "lcb_add",
            "public_test_cases": json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"}]),
            "private_test_cases": "[]",
            "metadata": json.dumps({"func_name": "add"}),
        },
        {"question_id": "unused", "public_test_cases": "not json", "private_test_cases": "[]", "metadata": "{}"},
    ]
    (tmp_path / "test6.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    lengths = write_log(tmp_path / "mlperf_log_accuracy.json", tokenizer_dir, list(enumerate(t for _, _, t in CASES)))
    return tmp_path, lengths


def cli_args(folder: Path, tokenizer_dir: Path) -> list[str]:
    return [
        "--mlperf-accuracy-file",
        str(folder / "mlperf_log_accuracy.json"),
        "--dataset",
        str(folder / "acc_eval.parquet"),
        "--tokenizer",
        str(tokenizer_dir),
        "--lcb-problems",
        str(folder),
        "--lcb-timeout",
        "5",
        "--lcb-workers",
        "2",
    ]


def test_cli_prints_exact_match_as_the_checker_reads_it(run_files, tokenizer_dir, capsys):
    folder, lengths = run_files
    main([*cli_args(folder, tokenizer_dir), "--output", str(folder / "out" / "result.json")])
    printed = capsys.readouterr().out
    assert printed.count("'exact_match'") == 1 and printed.rstrip().endswith("'exact_match': 46.396")
    # the submission checker matches each line; TEST07's run_verification.py searches the whole output
    [line] = [x for x in printed.splitlines() if re.match(r".*'exact_match':\s([\d.]+).*", x)]
    assert line == "'exact_match': 46.396"
    assert re.search(r"'exact_match':\s*([\d.]+)", printed).group(1) == "46.396"
    assert re.search(r"^livecodebench_v6\s+1\s+3\s+3\s+0.33\s+33.33%$", printed, re.MULTILINE)
    result = json.loads((folder / "out" / "result.json").read_text())
    assert result["exact_match"] == pytest.approx(100 * (1 / 8 + 2 / 5 + 1 / 3) / 1.85)
    assert result["tokens_per_sample"] == pytest.approx(sum(lengths) / len(lengths))
    details = [s["detail"] for s in result["samples"]]
    assert (
        details[5] == "passed 3 tests"
        and details[6] == "test 0: wrong answer"
        and details[7] == "no code in the output"
    )


def test_a_repeated_qsl_idx_counts_once_unless_every_entry(tmp_path, tokenizer_dir):
    records = pd.DataFrame({"dataset": ["gpqa_diamond"] * 2, "ground_truth": ["B", "B"]})
    records.to_pickle(tmp_path / "data.pkl")
    log = tmp_path / "log.json"
    write_log(log, tokenizer_dir, [(1, harmony("B")), (0, harmony("B")), (1, harmony("A"))])
    once = evaluate(log, tmp_path / "data.pkl", tokenizer_dir)
    assert (once["total_samples"], once["total_correct"], once["duplicates_dropped"]) == (2, 2, 1)
    every = evaluate(log, tmp_path / "data.pkl", tokenizer_dir, every_entry=True)
    assert (every["total_samples"], every["total_correct"]) == (3, 2)


def test_log_sample_outside_the_dataset_is_an_error(tmp_path, tokenizer_dir):
    pd.DataFrame({"dataset": ["aime25"], "ground_truth": ["1"]}).to_parquet(tmp_path / "d.parquet")
    write_log(tmp_path / "log.json", tokenizer_dir, [(3, "x")])
    with pytest.raises(AccuracyLogError, match=r"log.json: qsl_idx 3 is outside the dataset .*d.parquet of 1 samples"):
        evaluate(tmp_path / "log.json", tmp_path / "d.parquet", tokenizer_dir)


def test_cli_missing_dataset_column_exits_with_the_file_and_column(tmp_path):
    pd.DataFrame({"dataset": ["aime25"], "answer": ["1"]}).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "log.json").write_text("[]")
    command = [sys.executable, "-m", "accuracy.gpt_oss", "--mlperf-log", str(tmp_path / "log.json")]
    command += ["--reference-data", str(tmp_path / "d.parquet"), "--tokenizer", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert re.search(r"error: gpt_oss: .*d.parquet: the dataset has no column 'ground_truth'", done.stderr)

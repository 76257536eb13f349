"""gpt-oss-120b's accuracy script, re-implemented offline: the rules of the MLPerf reference
`language/gpt-oss-120b/eval_mlperf_accuracy.py` and the parsers of its `eval_accuracy.py`, with
LiveCodeBench's tests run here in a sandboxed subprocess instead of through the `lcb_runner` submodule.

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
import ast
import base64
import contextlib
import io
import json
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import types
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NamedTuple
from unittest import mock

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

REPO_ROOT = Path(__file__).resolve().parents[1]


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
# LiveCodeBench problems and the sandbox that runs their tests


@dataclass(frozen=True)
class CodeTests:
    """One LiveCodeBench problem's tests, public then private, as LiveCodeBench runs them. With a
    `fn_name` (LeetCode problems) each input is one JSON value per line, the call's arguments, and each
    output the JSON value it must return; without, each is the text on stdin and the expected stdout."""

    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None


@dataclass(frozen=True)
class SandboxLimits:
    # LiveCodeBench's per-test time limit in the reference (eval_accuracy.py passes timeout=60)
    timeout: float = 60.0
    # and the whole problem gets (timeout + 1) x tests + grace seconds before its process is killed
    grace: float = 5.0
    memory_mb: int = 4096
    workers: int = field(default_factory=lambda: min(64, os.cpu_count() or 1))


class CodeResult(NamedTuple):
    passed: bool
    detail: str


class _StringsOnly(pickle.Unpickler):
    """The private tests are a pickled JSON string: plain data, so no class may be loaded from them."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def problem_tests(row: Mapping, where: str = "problem") -> CodeTests:
    """The tests of one row of livecodebench/code_generation_lite: `public_test_cases` (a JSON list of
    {input, output, testtype}), `private_test_cases` (the same, or that JSON pickled, zlib-compressed
    and base64-encoded) and `metadata` (JSON, whose `func_name` names the function under test)."""
    tests = []
    for name in ("public_test_cases", "private_test_cases"):
        value = row.get(name)
        if value is None:
            raise GptOssAccuracyError(f"{where}: no {name!r} field")
        try:
            cases = _test_cases(value)
            tests += [(str(case["input"]), str(case["output"])) for case in cases]
        except Exception as e:  # noqa: BLE001 - json, base64, zlib and pickle each raise their own
            raise GptOssAccuracyError(f"{where}: field {name!r} is not a list of test cases ({e!r})") from None
    metadata = row.get("metadata") or "{}"
    try:
        metadata = json.loads(metadata) if isinstance(metadata, str) else dict(metadata)
    except (ValueError, TypeError) as e:
        raise GptOssAccuracyError(f"{where}: field 'metadata' is not a JSON object ({e})") from None
    return CodeTests([i for i, _ in tests], [o for _, o in tests], metadata.get("func_name"))


def _test_cases(value) -> list:
    if not isinstance(value, str):
        return list(value)
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        packed = zlib.decompress(base64.b64decode(value.encode()))
        return json.loads(_StringsOnly(io.BytesIO(packed)).load())


def load_lcb_problems(path: str | Path, wanted: set[str] | None = None) -> dict[str, CodeTests]:
    """question_id -> CodeTests, from a JSON-lines file of livecodebench/code_generation_lite (its
    release_v6 is test.jsonl ... test6.jsonl) or a folder of them. `wanted`: keep only these problems
    (their private tests can take gigabytes)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise GptOssAccuracyError(f"{path}: no *.jsonl files of LiveCodeBench problems in this folder")
    elif path.is_file():
        files = [path]
    else:
        raise GptOssAccuracyError(f"{path}: LiveCodeBench problems not found")
    problems = {}
    for file in files:
        with file.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                where = f"{file}: line {number}"
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise GptOssAccuracyError(f"{where}: not a JSON object ({e})") from None
                if not isinstance(row, dict) or not isinstance(row.get("question_id"), str):
                    raise GptOssAccuracyError(f"{where}: not a problem with a 'question_id'")
                qid = row["question_id"]
                if wanted is None or qid in wanted:
                    problems[qid] = problem_tests(row, f"{where} (question_id {qid})")
    return problems


def run_code(code: str, tests: CodeTests, limits: SandboxLimits | None = None) -> CodeResult:
    """Whether `code` passes every test, judged as LiveCodeBench judges it, in a fresh Python process:
    its own temporary folder and process group, a bare environment, limits on memory, CPU time, file
    size and processes, and the job and verdict passed through pipes. A test over the time limit fails;
    a process still running after the problem's whole allowance is killed with its group, and fails."""
    limits = limits or SandboxLimits()
    wall = (limits.timeout + 1) * len(tests.inputs) + limits.grace
    job = {
        "repo": str(REPO_ROOT),
        "code": code,
        "inputs": tests.inputs,
        "outputs": tests.outputs,
        "fn_name": tests.fn_name,
        "timeout": limits.timeout,
        "memory_bytes": limits.memory_mb << 20,
        "cpu_seconds": math.ceil(wall) + 1,
        "nproc": _process_allowance(),
    }
    boot = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import accuracy.gpt_oss as g; g._sandbox_main()"
    with tempfile.TemporaryDirectory(prefix="lcb-sandbox-") as folder:
        env = {"PATH": os.defpath, "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        command = [sys.executable, "-I", "-B", "-c", boot]  # -I: no PYTHON* variables, no user site
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=folder,
            env=env,
            start_new_session=True,  # its own process group, which is killed whole
        )
        with proc:
            try:
                verdict, _ = proc.communicate(json.dumps(job).encode(), timeout=wall)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                return CodeResult(False, f"killed: still running after {wall:g} s")
            finally:
                _kill_group(proc)  # anything it left behind in its group
    try:
        report = json.loads(verdict)
        return CodeResult(bool(report["passed"]), str(report["detail"]))
    except (ValueError, KeyError, TypeError):
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        return CodeResult(False, f"the test process ended with {how} and no verdict")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _process_allowance() -> int | None:
    """RLIMIT_NPROC for a sandbox: it counts every process and thread of the user, so the user's count
    now plus room for a program's threads. None for root, whom the kernel does not hold to it, and
    where there is no /proc to count in."""
    if os.geteuid() == 0 or not os.path.isdir("/proc"):
        return None
    uid, tasks = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    tasks += len(os.listdir(f"/proc/{entry.name}/task"))
    return tasks + 256


# ---- inside the sandbox: what LiveCodeBench's testing_util does, run in the child process ----

# What LiveCodeBench puts in front of every program: its stdlib star-imports, then the modules
# themselves (so that e.g. `datetime` ends as the module), and a deep recursion limit.
_PRELUDE_MODULES = (
    "string re datetime collections heapq bisect copy math random statistics itertools functools operator io sys json"
).split()
PRELUDE = (
    "".join(f"from {name} import *\n" for name in [*_PRELUDE_MODULES, "builtins", "typing"])
    + "".join(f"import {name}\n" for name in _PRELUDE_MODULES)
    + "sys.setrecursionlimit(50000)\n"
)


class _TimeLimit(Exception):
    """Raised by the timer in the program under test, which may catch it, as it can LiveCodeBench's."""


def _on_alarm(signum, frame):
    raise _TimeLimit


@contextlib.contextmanager
def _time_limit(seconds: float):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _sandbox_main() -> None:
    """The child's entry: read the job from stdin, lock the process down, run the tests, and write the
    verdict as JSON to the stdout pipe, which nothing else reaches (the program's fds 0-2 are /dev/null)."""
    job = json.loads(sys.stdin.buffer.read())
    sys.path.remove(job["repo"])
    verdict_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _limit_resources(job)
    sys.set_int_max_str_digits(50000)  # as LiveCodeBench's evaluation module sets it
    signal.signal(signal.SIGALRM, _on_alarm)
    _disable_escapes()
    try:
        if job["fn_name"] is None:
            passed, detail = _run_stdin_tests(job["code"], job["inputs"], job["outputs"], job["timeout"])
        else:
            passed, detail = _run_call_tests(job["code"], job["fn_name"], job["inputs"], job["outputs"], job["timeout"])
    except BaseException as e:  # noqa: BLE001 - whatever the program did, the verdict is written
        passed, detail = False, f"error while testing: {e!r}"[:500]
    data = json.dumps({"passed": passed, "detail": detail}).encode()
    while data:
        data = data[os.write(verdict_fd, data) :]
    os._exit(0)  # skip interpreter teardown, which the program's leftovers could still hang


def _limit_resources(job: dict) -> None:
    import resource

    limits = [
        (resource.RLIMIT_AS, job["memory_bytes"]),
        (resource.RLIMIT_CPU, job["cpu_seconds"]),
        (resource.RLIMIT_FSIZE, 64 << 20),
        (resource.RLIMIT_CORE, 0),
    ]
    if job["nproc"] is not None:
        limits.append((resource.RLIMIT_NPROC, job["nproc"]))
    for kind, value in limits:
        _, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))


def _disable_escapes() -> None:
    """What LiveCodeBench's reliability_guard takes away (no new processes, no deleting or renaming
    files, no moving about), plus posix_spawn; the limits set before it cannot be raised again."""
    import builtins
    import posix
    import shutil

    for name in (
        "kill killpg system fork forkpty posix_spawn posix_spawnp putenv remove removedirs rmdir fchdir setuid "
        "rename renames truncate replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir"
    ).split():
        setattr(os, name, None)
        if hasattr(posix, name):  # where os takes them from: `posix.fork()` would bypass os.fork = None
            setattr(posix, name, None)
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, None)
    subprocess.Popen = None
    builtins.quit = None
    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def _load_program(source: str, timeout: float):
    """Execute `source` as a module (within the time limit); LeetCode's `class Solution` is instantiated."""
    module = types.ModuleType("tmp_sol")
    with _time_limit(timeout):
        exec(compile(source, "<solution>", "exec"), module.__dict__)
        return module.Solution() if "class Solution" in source else module


def _run_call_tests(code: str, fn_name: str, inputs: list[str], outputs: list[str], timeout: float):
    try:
        program = _load_program(PRELUDE + "\n\n" + code, timeout)
    except BaseException as e:  # noqa: BLE001 - a program that does not load fails, whatever it raised
        return False, f"does not load: {e!r}"[:500]
    method = getattr(program, fn_name, None)
    if method is None:
        return False, f"no function {fn_name!r}"
    args = [[json.loads(line) for line in text.split("\n")] for text in inputs]
    for n, (arguments, text) in enumerate(zip(args, outputs)):
        expected = json.loads(text)
        try:
            with _time_limit(timeout):
                got = method(*arguments)
            if isinstance(got, tuple):  # a tuple for a list is no wrong answer
                got = list(got)
            right = bool(got == expected)
        except _TimeLimit:
            return False, f"test {n}: time limit exceeded"
        except BaseException as e:  # noqa: BLE001
            return False, f"test {n}: runtime error {e!r}"[:500]
        if not right:
            return False, f"test {n}: wrong answer"
    return True, f"passed {len(inputs)} tests"


def _run_stdin_tests(code: str, inputs: list[str], outputs: list[str], timeout: float):
    # The program runs as one function, called once per test: its top-level code goes in the function,
    # its imports in front, after the prelude. A trailing `if __name__ == '__main__':` block is unwrapped,
    # since inside that function __name__ is no longer "__main__".
    try:
        program = _load_program(_as_function(_unwrap_main(code)), timeout)
    except BaseException as e:  # noqa: BLE001
        return False, f"does not load: {e!r}"[:500]
    main = getattr(program, "wrapped_function", None)
    if main is None:
        return False, "no program to run"
    for n, (text, expected) in enumerate(zip(inputs, outputs)):
        printed = io.StringIO()
        try:
            with _time_limit(timeout), _fake_stdin(text), contextlib.redirect_stdout(printed):
                with contextlib.suppress(SystemExit):
                    main()
        except _TimeLimit:
            return False, f"test {n}: time limit exceeded"
        except BaseException as e:  # noqa: BLE001
            return False, f"test {n}: runtime error {e!r}"[:500]
        wrong = _compare_output(printed.getvalue(), expected)
        if wrong:
            return False, f"test {n}: wrong answer ({wrong})"
    return True, f"passed {len(inputs)} tests"


def _unwrap_main(code: str) -> str:
    try:
        body = ast.parse(code).body
        last = body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            return ast.unparse(body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:  # noqa: BLE001 - code that does not parse is left to fail when it runs
        pass
    return code


def _as_function(code: str) -> str:
    try:
        body = ast.parse(code).body
    except Exception:  # noqa: BLE001 - as LiveCodeBench: run it as given, and let it fail
        return code
    imports = [stmt for stmt in body if isinstance(stmt, (ast.Import, ast.ImportFrom))]
    function = ast.parse("def wrapped_function():\n    pass").body[0]
    function.body = [stmt for stmt in body if not isinstance(stmt, (ast.Import, ast.ImportFrom))]
    return PRELUDE + "\n" + ast.unparse(ast.Module(imports, [])) + "\n" + ast.unparse(function)


class _LcbStdin:
    """stdin as LiveCodeBench's tests present it, quirks included, since they decide its verdicts:
    read() and readline() as usual, readlines() without the newlines, buffer.readline() always the first
    line, and no iteration (`for line in sys.stdin` raises TypeError)."""

    def __init__(self, text: str):
        self._text = text
        self._stream = io.StringIO(text)
        self.buffer = _LcbStdinBuffer(text.encode())

    def read(self, *args):
        return self._text

    def readline(self, *args):
        return self._stream.readline(*args)

    def readlines(self, *args):
        return self._text.split("\n")

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _LcbStdinBuffer:
    def __init__(self, data: bytes):
        self._data = data

    def read(self, *args):
        return self._data

    def readline(self, *args):
        return self._data.split(b"\n")[0] + b"\n"


@contextlib.contextmanager
def _fake_stdin(text: str):
    import builtins

    saved = sys.stdin, builtins.open
    sys.stdin, builtins.open = _LcbStdin(text), mock.mock_open(read_data=text)  # open(0) reads the input too
    try:
        yield
    finally:
        sys.stdin, builtins.open = saved


def _compare_output(printed: str, expected: str) -> str | None:
    """None when the output is right: line by line (stripped, blank ends ignored), each line the same
    text or the same numbers (compared as decimals, so 1.0 equals 1); else what differs."""
    got, want = _stripped_lines(printed), _stripped_lines(expected)
    if len(got) != len(want):
        return f"{len(got)} lines, expected {len(want)}"
    for n, (line, wanted) in enumerate(zip(got, want)):
        if line == wanted:
            continue
        numbers = _decimals(line)
        if numbers is None or numbers != _decimals(wanted):
            return f"line {n}: {line[:50]!r} != {wanted[:50]!r}"
    return None


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(word) for word in line.split()]
    except (InvalidOperation, ValueError):
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


def run_code_jobs(jobs: list, limits: SandboxLimits) -> None:
    """Each job's (result, code, problem): its code run against the problem's tests, a few at a time;
    the result's `correct` and `detail` set."""
    if not jobs:
        return
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=max(1, limits.workers)) as pool:
        futures = [pool.submit(run_code, code, problem, limits) for _, code, problem in jobs]
        for (result, _, _), future in zip(jobs, tqdm(futures, desc="livecodebench tests", disable=None)):
            result["correct"], result["detail"] = future.result()


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
    frame = read_frame(path)
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


def read_frame(path: Path, error: type[Exception] = GptOssAccuracyError):
    """The pandas table in a parquet or pickle file (by its suffix; else parquet, then pickle, as the
    references read them); `error` naming the file and what each reader said where none gives one."""
    import pandas as pd

    def parquet():
        return pd.read_parquet(path)

    def pickled():
        with path.open("rb") as f:
            return pickle.load(f)

    if path.suffix == ".parquet":
        readers = [parquet]
    elif path.suffix in (".pkl", ".pickle"):
        readers = [pickled]
    else:
        readers = [parquet, pickled]  # as the reference: parquet first, then pickle
    errors = []
    for read in readers:
        try:
            frame = read()
        except Exception as e:  # noqa: BLE001 - pyarrow and pickle share no error base
            errors.append(f"{type(e).__name__}: {e}")
            continue
        if isinstance(frame, pd.DataFrame):
            return frame
        errors.append(f"holds a {type(frame).__name__}, not a table")
    raise error(f"{path}: not a parquet or pickled pandas table ({'; '.join(errors)})")


def plain_cell(value):
    """A table cell as a plain Python value; None where it is missing (None, NaN, pandas NA)."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if _missing(value) or type(value).__name__ == "NAType":
        return None
    return value


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


def logged_responses(
    log_path: str | Path,
    dataset_path: str | Path,
    records: list[dict],
    tokenizer_dir: str | Path,
    lcb_problems: str | Path | Mapping[str, CodeTests] | None,
    *,
    skip_special_tokens: bool,
    every_entry: bool = False,
) -> tuple[list[tuple[int, str, int]], Mapping[str, CodeTests] | None, int]:
    """An accuracy log's responses to the dataset's `records` (gpt-oss's and DeepSeek-R1's): each
    qsl_idx once, its first entry (`every_entry`: every entry), as (qsl_idx, text decoded with the
    local tokenizer, tokens logged); the LiveCodeBench problems they need (read from `lcb_problems`
    where it is a folder, else as given); and how many entries were left out."""
    from accuracy.accuracy_log import AccuracyLogError, read_accuracy_entries
    from accuracy.evaluate import load_tokenizer

    entries = read_accuracy_entries(log_path)
    if not entries:
        raise AccuracyLogError(f"{log_path}: the accuracy log holds no responses")
    kept, seen = [], set()
    for entry in entries:
        qsl_idx = entry["qsl_idx"]
        if not 0 <= qsl_idx < len(records):
            raise AccuracyLogError(
                f"{log_path}: qsl_idx {qsl_idx} is outside the dataset {dataset_path} of {len(records)} samples"
            )
        if every_entry or qsl_idx not in seen:
            kept.append(entry)
        seen.add(qsl_idx)
    if isinstance(lcb_problems, (str, Path)):
        wanted = {
            str(records[e["qsl_idx"]]["ground_truth"])
            for e in kept
            if "livecodebench" in str(records[e["qsl_idx"]]["dataset"]).lower()
        }
        lcb_problems = load_lcb_problems(lcb_problems, wanted) if wanted else {}
    tokenizer = load_tokenizer(Path(tokenizer_dir))
    texts = tokenizer.batch_decode([e["data"] for e in kept], skip_special_tokens=skip_special_tokens)
    responses = [(e["qsl_idx"], text, len(e["data"])) for e, text in zip(kept, texts)]
    return responses, lcb_problems, len(entries) - len(kept)


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

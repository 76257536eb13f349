"""LiveCodeBench's problems and the sandbox that runs their tests, as the MLPerf references' accuracy
scripts grade a code answer (through LiveCodeBench's `lcb_runner`): gpt-oss-120b's
(accuracy/gpt_oss.py) and DeepSeek-R1's (accuracy/deepseek_r1.py) both score their livecodebench
samples here.

- The problems: rows of the Hugging Face `livecodebench/code_generation_lite` set (release_v6),
  read from its JSON-lines files on disk (`load_lcb_problems`), each problem's public and private
  tests (`CodeTests`).
- The sandbox: a program is run against every test of its problem in a fresh Python process
  (`run_code`; many at a time, `run_code_jobs`), locked down as LiveCodeBench's reliability_guard
  does it, with limits on memory, CPU time, file size and processes (`SandboxLimits`), and judged as
  LiveCodeBench's testing_util judges it."""

import ast
import base64
import contextlib
import io
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import types
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import NamedTuple
from unittest import mock

from accuracy.datasets.reader import DatasetError

REPO_ROOT = Path(__file__).resolve().parents[1]


class LiveCodeBenchError(DatasetError):
    """A LiveCodeBench problems file, or a problem in it, that cannot be read (a DatasetError, naming
    the file, the line and the field)."""


# ---- LiveCodeBench's problems ----


@dataclass(frozen=True)
class CodeTests:
    """One LiveCodeBench problem's tests, public then private, as LiveCodeBench runs them. With a
    `fn_name` (LeetCode problems) each input is one JSON value per line, the call's arguments, and each
    output the JSON value it must return; without, each is the text on stdin and the expected stdout."""

    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None


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
            raise LiveCodeBenchError(f"{where}: no {name!r} field")
        try:
            cases = _test_cases(value)
            tests += [(str(case["input"]), str(case["output"])) for case in cases]
        except Exception as e:  # noqa: BLE001 - json, base64, zlib and pickle each raise their own
            raise LiveCodeBenchError(f"{where}: field {name!r} is not a list of test cases ({e!r})") from None
    metadata = row.get("metadata") or "{}"
    try:
        metadata = json.loads(metadata) if isinstance(metadata, str) else dict(metadata)
    except (ValueError, TypeError) as e:
        raise LiveCodeBenchError(f"{where}: field 'metadata' is not a JSON object ({e})") from None
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
            raise LiveCodeBenchError(f"{path}: no *.jsonl files of LiveCodeBench problems in this folder")
    elif path.is_file():
        files = [path]
    else:
        raise LiveCodeBenchError(f"{path}: LiveCodeBench problems not found")
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
                    raise LiveCodeBenchError(f"{where}: not a JSON object ({e})") from None
                if not isinstance(row, dict) or not isinstance(row.get("question_id"), str):
                    raise LiveCodeBenchError(f"{where}: not a problem with a 'question_id'")
                qid = row["question_id"]
                if wanted is None or qid in wanted:
                    problems[qid] = problem_tests(row, f"{where} (question_id {qid})")
    return problems


# ---- the parent: one child process per program, killed with its group where it overruns ----


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
    boot = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import accuracy.code_sandbox as s; s._sandbox_main()"
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

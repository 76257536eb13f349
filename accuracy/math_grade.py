"""MATH answers graded as PRM800K's grader grades them (openai/prm800k `grading/grader.py`
`grade_answer`, which the DeepSeek-R1 reference runs for its math500 samples), re-implemented here so
that nothing is fetched or installed from a git submodule. The rules, in the order the grader applies
them:

1. Both answers normalized as the MATH dataset's own checker normalizes them (`normalize_mathd`:
   `\\text{...}` unwrapped, `\\left`/`\\right`, degrees, `\\$`, `\\%` and units after `\\text{ `
   dropped, `\\frac12` and `1/2` and `0.5` written `\\frac{1}{2}`, `x = ` prefixes cut): equal is right.
2. Both normalized the grader's own way (`normalize`: units, words for powers of ten, LaTeX turned
   into plain text by pylatexenc, spaces and braces gone, lower case, integers written plainly): equal
   is right; an empty answer is wrong.
3. Otherwise the two are split into the elements of a tuple or interval (the brackets must agree) and
   compared element by element: two fractions must be written the same (an unreduced fraction is
   wrong), an integer only matches an integer written the same, and anything else is right when
   sympy simplifies the difference to 0. An expression with more than two unknown letters, or powers
   that could take sympy forever (`^{`, `^(`, `^12`, `^2^`), is never handed to sympy.

sympy's parser evaluates the text it is given as Python, and simplifying can run for ever or fill
memory (`9**9**9`), so `SympyJudge` runs that step in a child process with a bare environment, a
memory limit and a time limit per comparison: one over its time is wrong, and the child is replaced."""

import contextlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 30.0  # a new SympyJudge child's allowance for importing sympy, on top of its first question's

# ---------------------------------------------------------------------------------------------------
# 1. The MATH dataset's normalization


def normalize_mathd(answer: str | None) -> str | None:
    """An answer as the MATH checker compares it; the answer itself (stripped, `\\text{}` removed)
    where one of its rewrites fails on odd input (a `\\sqrt` at the very end, two unit texts)."""
    if answer is None:
        return None
    answer = answer.strip()
    whole = _text_only(answer)
    if whole is not None:
        answer = whole.strip()
    try:
        return _mathd_rewrite(answer)
    except (IndexError, ValueError):
        return answer


def _text_only(answer: str) -> str | None:
    # `^\\text\{(.+?)\}$`: the lazy group still has to reach the last "}" (at the end or before a
    # final newline), so it is the text between the opening "\text{" and the last "}".
    match = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
    return match.group("text") if match else None


def _mathd_rewrite(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:  # units, written after the number
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("more than one unit text")
        s = parts[0]
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s.startswith("."):
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 3" or "k=3": the value
        s = sides[1]
    s = _braced_sqrt(s)
    s = s.replace(" ", "")
    s = _braced_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_as_frac(s)


def _braced_sqrt(s: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}` (one character); IndexError for a `\\sqrt` that ends the text."""
    head, *rest = s.split("\\sqrt")
    out = [head]
    for part in rest:
        out.append("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:]))
    return "".join(out)


def _braced_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; the text unchanged when a
    `\\frac` is followed by fewer than two characters; IndexError for one that ends the text."""
    head, *rest = s.split("\\frac")
    out = [head]
    for part in rest:
        out.append("\\frac")
        if part[0] == "{":
            out.append(part)
            continue
        if len(part) < 2:
            return s
        numerator, second, tail = part[0], part[1], part[2:]
        out.append("{" + numerator + "}" + (second + tail if second == "{" else "{" + second + "}" + tail))
    return "".join(out)


def _slash_as_frac(s: str) -> str:
    """`3/4` -> `\\frac{3}{4}`, only for two integers written plainly."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        top, bottom = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{top}}}{{{bottom}}}" if s == f"{top}/{bottom}" else s


# ---------------------------------------------------------------------------------------------------
# 2. The grader's own normalization

UNITS = ("degree cm centimeter meter mile second minute hour day week month year foot feet inch yard").split()
TUPLE_BRACKETS = "()[]"


def normalize(expr: str | None) -> str | None:
    """An answer as PRM800K's grader compares it after the MATH normalization failed to match."""
    if expr is None:
        return None
    whole = _text_only(expr)
    if whole is not None:
        expr = whole
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(word, power)
    for unit in UNITS:
        expr = re.sub(rf"{unit}(es)?(s)? *(\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _close_to_int(float(expr)):
        expr = str(round(float(expr)))
    if "\\" in expr:
        expr = latex_as_text(expr)
    expr = re.sub(r"- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)  # a mixed number: 7 3/4 -> 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _text_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def latex_as_text(expr: str) -> str:
    """LaTeX as plain text sympy can read: pylatexenc's text, with its symbols spelled out; `expr`
    unchanged where pylatexenc fails on it, as in the grader."""
    from pylatexenc.latex2text import LatexNodes2Text  # a missing package is an error, never a silent miss

    # it logs a warning for every macro it cannot fill in (a `\\frac1`), and carries on as the grader does
    logging.getLogger("pylatexenc").setLevel(logging.ERROR)
    prepared = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    prepared = prepared.replace("\\frac", " \\frac")  # so that a mixed number 2\frac{1}{2} keeps its space
    try:
        text = LatexNodes2Text().latex_to_text(prepared)
    except Exception:  # noqa: BLE001 - whatever pylatexenc raises, the text stays as written
        return expr
    for symbol, word in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        text = text.replace(symbol, word)
    return text.strip()


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _close_to_int(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _text_is_int(text: str) -> bool:
    try:
        return _close_to_int(float(_drop_thousands_commas(text)))
    except ValueError:
        return False


def _drop_thousands_commas(expr: str) -> str:
    """1,000,000 -> 1000000, leaving the commas of a tuple (1,2) alone."""
    pattern = re.compile(r"(\d),(\d\d\d)($|\D)")
    while True:
        changed = pattern.sub(r"\1\2\3", expr)
        if changed == expr:
            return expr
        expr = changed


def _is_fraction(expr: str) -> bool:
    return re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr) is not None


def _elements(expr: str) -> list[str]:
    """The elements of a tuple or interval `(a,b)` / `[a,b)` (no brackets inside), else [expr]."""
    expr = _drop_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in TUPLE_BRACKETS
        and expr[-1] in TUPLE_BRACKETS
        and not any(c in inner for c in TUPLE_BRACKETS)
    ):
        return [part.strip() for part in inner.split(",")]
    return [expr]


# ---------------------------------------------------------------------------------------------------
# 3. sympy


def sympy_allowed(expr: str) -> bool:
    """Whether the grader lets sympy try `expr`: at most two unknown letters, and none of the powers
    it could hang on."""
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return re.search(r"\^[0-9]+\^", expr) is None and re.search(r"\^[0-9][0-9]+", expr) is None


def sympy_zero(expr: str) -> bool:
    """Whether sympy reads `expr` (with ^ for powers and implicit multiplication) and simplifies it to
    0; False where it cannot read it. In this process: use SympyJudge for text a model wrote."""
    import sympy
    from sympy.parsing import sympy_parser

    transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
    try:
        return bool(
            sympy.simplify(sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)) == 0
        )
    except Exception:  # noqa: BLE001 - as the grader: whatever sympy raises, the two are not equal
        return False


def grade_answer(given: str | None, truth: str | None, is_zero: Callable[[str], bool] | None = None) -> bool:
    """PRM800K's verdict on a given answer against the ground truth. `is_zero(expr)`: whether sympy
    simplifies `expr` to 0 (sympy_zero in this process, or a SympyJudge)."""
    if given is None or truth is None:
        return False
    if normalize_mathd(truth) == normalize_mathd(given):
        return True
    truth_n, given_n = normalize(truth), normalize(given)
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_parts, given_parts = _elements(truth_n), _elements(given_n)
    if len(truth_parts) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False  # an interval's brackets must agree
    if len(truth_parts) != len(given_parts):
        return False
    is_zero = is_zero or sympy_zero
    for want, got in zip(truth_parts, given_parts):
        if _is_fraction(want) and _is_fraction(got):
            right = want == got  # an unreduced fraction is no answer
        elif _text_is_int(want) != _text_is_int(got):
            right = False  # an integer only as an integer
        else:
            difference = f"({want})-({got})"
            right = sympy_allowed(difference) and is_zero(difference)
        if not right:
            return False
    return True


class SympyJudge:
    """sympy_zero in a child process: a bare environment, its own process group, at most `memory_mb`
    of memory, and `timeout` seconds a question; a question over its time (or one that kills the
    child) is answered False, and a new child takes the next. Use as a context manager, or close()."""

    def __init__(self, timeout: float = 10.0, memory_mb: int = 4096):
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.timeouts = 0  # questions that ran out of time
        self._proc: subprocess.Popen | None = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self._pending = b""
        self._fresh = True  # a new child: its first question also waits for sympy's import

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __call__(self, expr: str) -> bool:
        proc = self._proc or self._start()
        try:
            proc.stdin.write(json.dumps(expr).encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._stop()
            return False
        answer = self._read_line(proc)
        if answer is None:  # out of time, or the child died
            self._stop()
            return False
        return answer == b"1"

    def _start(self) -> subprocess.Popen:
        self._folder = tempfile.TemporaryDirectory(prefix="sympy-judge-")
        folder = self._folder.name
        boot = (
            f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); "
            f"from accuracy.math_grade import _judge_main; _judge_main({self.memory_mb << 20})"
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=folder,
            env={"PATH": os.defpath, "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"},
            start_new_session=True,
        )
        self._pending, self._fresh = b"", True
        return self._proc

    def _read_line(self, proc: subprocess.Popen) -> bytes | None:
        """The child's next answer line, or None when none comes within the time limit (sympy's
        import in a new child counts against its first question, so that gets 30 s more)."""
        deadline = time.monotonic() + self.timeout + (STARTUP_S if self._fresh else 0.0)
        fd = proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.timeouts += 1
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    return None
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        self._fresh = False
        return line.strip()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            proc.wait()
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def close(self) -> None:
        self._stop()


def _judge_main(memory_bytes: int) -> None:
    """The child: one JSON string a line on stdin, "1" or "0" a line on stdout."""
    import resource

    for kind, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CORE, 0)):
        _, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            verdict = sympy_zero(json.loads(line))
        except BaseException:  # noqa: BLE001 - MemoryError, RecursionError: not equal
            verdict = False
        out.write(b"1\n" if verdict else b"0\n")
        out.flush()

"""TEST07 for gpt-oss-120b: accuracy in performance mode. A performance run under
compliance/TEST07.audit.config logs every response on the 990-sample GPQA compliance set; the
benchmark's accuracy script then scores that log, and the run passes if the `'exact_match': N` it
prints reaches the audit config's threshold (60.698). The result is written as the official
verification script (compliance/TEST07/run_verification.py) writes it: `TEST07/verify_accuracy.txt`
(the script's output, then a summary ending in "TEST PASS" or "TEST FAIL"), the accuracy log in
`TEST07/accuracy/` and the run's summary and detail logs in `TEST07/performance/run_1/`.

    python -m compliance.test07 --logs RUN_DIR --out RESULTS_SCENARIO_DIR \\
        --accuracy-script "python -m accuracy.gpt_oss --mlperf-accuracy-file {accuracy_log} --dataset D --tokenizer M"

As in the official script, `{accuracy_log}` in the command becomes the log's path and the command
runs in a shell (so other braces are written doubled).
"""

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from compliance.audit_config import AUDIT_CONFIGS, AuditConfigError, config_differences, read_audit_config
from compliance.loadgen_logs import RUN_RECORD
from systems.schema import REPO

AUDIT_CONFIG = AUDIT_CONFIGS["TEST07"]
# compliance/TEST07/gpt-oss-120b/audit.config in mlcommons/inference.
OFFICIAL_SETTINGS = {
    "mode": "2",
    "accuracy_log_rng_seed": "720381539243781796",
    "accuracy_log_sampling_target": "990",
    "min_query_count": "990",
    "min_duration": "0",
    "performance_issue_unique": "1",
    "sample_concatenate_permutation": "0",
    "test07_accuracy_threshold": "60.698",
}
THRESHOLD = float(OFFICIAL_SETTINGS["test07_accuracy_threshold"])
SAMPLES = 990  # the GPQA compliance set, each sample issued once
SCORE_PATTERN = r"'exact_match':\s*([\d.]+)"  # the official script's default --score-pattern
RULE = "=" * 80
SUMMARY_TITLE = "TEST07 Verification Summary"
FILES = ("verify_accuracy.txt", "accuracy/mlperf_log_accuracy.json")
PERFORMANCE_LOGS = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")


class Test07Error(RuntimeError):
    """TEST07 cannot be verified (no accuracy log, no threshold); the message says why."""


def audit_threshold(config: Path = AUDIT_CONFIG) -> float:
    """The `test07_accuracy_threshold` of an audit.config, as the official script reads it."""
    try:
        value = read_audit_config(config).get("test07_accuracy_threshold")
    except (OSError, AuditConfigError) as e:
        raise Test07Error(str(e)) from None
    if value is None:
        raise Test07Error(f"{config}: no test07_accuracy_threshold")
    return float(value)


def accuracy_command(dataset: Path, model: Path) -> str:
    """The gpt-oss accuracy script's command, with `{accuracy_log}` left for the verification."""
    words = [sys.executable, "-m", "accuracy.gpt_oss", "--mlperf-accuracy-file", "{accuracy_log}"]
    words += ["--dataset", str(dataset), "--tokenizer", str(model)]
    return " ".join(w if w == "{accuracy_log}" else shlex.quote(w).replace("{", "{{").replace("}", "}}") for w in words)


def run_accuracy_command(run_dir: Path) -> str:
    """The accuracy command for a TEST07 run, from its run record: the dataset it ran (the GPQA
    compliance set) and its model (the tokenizer)."""
    record_path = Path(run_dir) / RUN_RECORD
    try:
        record = json.loads(record_path.read_text())
        return accuracy_command(Path(record["dataset"]), Path(record["model"]))
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise Test07Error(f"{record_path}: no run record naming the run's dataset and model ({e!r})") from None


def run_script(command: str, accuracy_log: Path) -> tuple[str, int]:
    """(its output, stdout and stderr together as the official script keeps them; its exit status)."""
    done = subprocess.run(
        command.format(accuracy_log=accuracy_log),
        shell=True,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    return done.stdout, done.returncode


def score_of(output: str) -> float | None:
    match = re.search(SCORE_PATTERN, output)
    return float(match.group(1)) if match else None


def verify_text(output: str, threshold: float) -> tuple[str, float | None, bool]:
    """(verify_accuracy.txt as the official script writes it, the score, whether it passes)."""
    score = score_of(output)
    passed = score is not None and score >= threshold
    lines = [RULE, SUMMARY_TITLE, RULE]
    if score is None:
        lines += ["Error: Could not parse accuracy score", "TEST FAIL"]
    else:
        lines += [
            f"Accuracy score: {score}",
            f"Accuracy threshold: {threshold}",
            f"Accuracy check pass: {passed}",
            "TEST PASS" if passed else "TEST FAIL",
        ]
    return output + "\n" + "\n".join(lines) + "\n", score, passed


def write_result(run_dir: Path, out_dir: Path, command: str, config: Path = AUDIT_CONFIG) -> list[str]:
    """Score `run_dir`'s accuracy log with `command`; write `out_dir/TEST07/`; return the failures
    (none when it passes)."""
    run_dir = Path(run_dir).resolve()
    log = run_dir / "mlperf_log_accuracy.json"
    if not log.is_file():
        raise Test07Error(f"{log}: accuracy log not found")
    threshold = audit_threshold(config)
    output, status = run_script(command, log)
    text, score, passed = verify_text(output, threshold)
    target = Path(out_dir) / "TEST07"
    (target / "accuracy").mkdir(parents=True, exist_ok=True)
    (target / "performance" / "run_1").mkdir(parents=True, exist_ok=True)
    (target / "verify_accuracy.txt").write_text(text)
    shutil.copy2(log, target / "accuracy" / log.name)
    for name in PERFORMANCE_LOGS:
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, target / "performance" / "run_1" / name)
    failures = config_differences(config, OFFICIAL_SETTINGS)
    if score is None:
        failures.append(f"the accuracy script printed no score matching {SCORE_PATTERN} (exit status {status})")
    elif not passed:
        failures.append(f"exact_match {score} is below the threshold {threshold}")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, required=True, help="the TEST07 run's log folder")
    parser.add_argument("--out", type=Path, required=True, help="results/<system>/<benchmark>/<Scenario>")
    parser.add_argument(
        "--accuracy-script",
        help="the accuracy command, {accuracy_log} standing for the log (default: accuracy.gpt_oss on the "
        "dataset and model of the run's run.json)",
    )
    parser.add_argument("--audit-config", type=Path, default=AUDIT_CONFIG)
    args = parser.parse_args()
    try:
        command = args.accuracy_script or run_accuracy_command(args.logs)
        failures = write_result(args.logs, args.out, command, args.audit_config)
    except Test07Error as e:
        raise SystemExit(f"error: test07: {e}")
    print((args.out / "TEST07" / "verify_accuracy.txt").read_text(), end="")
    for failure in failures:
        print(f"TEST07: {failure}")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()

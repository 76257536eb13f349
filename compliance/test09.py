"""TEST09 for gpt-oss-120b: output length in performance mode. A performance run under
compliance/TEST09.audit.config logs every response on the 6396-sample performance set; each
response's length is counted from its bytes (little-endian int32 token ids, not the `token_count`
the SUT reported), and the run passes if the mean over all logged responses lies within the audit
config's bounds [1150.38, 1406.02] (the reference's 1278.2 tokens, less and plus 10%). The result
is written as the official verification script (compliance/TEST09/run_verification.py) writes it:
`TEST09/verify_output_len.txt` ending in "TEST PASS" or "TEST FAIL", the accuracy log in
`TEST09/accuracy/` and the run's summary and detail logs in `TEST09/performance/run_1/`.

    python -m compliance.test09 --logs RUN_DIR --out RESULTS_SCENARIO_DIR
"""

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from compliance.audit_config import AUDIT_CONFIGS, AuditConfigError, config_differences, read_audit_config

AUDIT_CONFIG = AUDIT_CONFIGS["TEST09"]
# compliance/TEST09/gpt-oss-120b/audit.config in mlcommons/inference.
OFFICIAL_SETTINGS = {
    "mode": "2",
    "accuracy_log_rng_seed": "720381539243781796",
    "accuracy_log_sampling_target": "10000",
    "min_query_count": "6396",
    "min_duration": "0",
    "performance_issue_unique": "1",
    "sample_concatenate_permutation": "0",
    "test09_min_output_tokens": "1150.38",
    "test09_max_output_tokens": "1406.02",
}
BOUNDS = (float(OFFICIAL_SETTINGS["test09_min_output_tokens"]), float(OFFICIAL_SETTINGS["test09_max_output_tokens"]))
TOKEN_BYTES = 4  # int32 token ids
RULE, THIN_RULE = "=" * 80, "-" * 40
TITLE = "TEST09: Verify Output Token Length in Performance Mode"
FILES = ("verify_output_len.txt", "accuracy/mlperf_log_accuracy.json")
PERFORMANCE_LOGS = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")


class Test09Error(RuntimeError):
    """TEST09 cannot be verified (no accuracy log, no entries, no bounds); the message says why."""


@dataclass
class Responses:
    """What a LoadGen accuracy log holds, per entry in log order, counted as the official TEST09
    script counts: whole 4-byte ids of `data`, 0 for an entry without data or with data that is not
    hex. `problems`: such entries, and responses whose length is not the n_tokens reported."""

    lengths: list[int]
    qsl_idx: list
    problems: list[str]


def read_responses(path: Path) -> Responses:
    try:
        raw = json.loads(Path(path).read_bytes())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Test09Error(f"{path}: not a LoadGen accuracy log ({e})") from None
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise Test09Error(f"{path}: not a LoadGen accuracy log (a JSON list of responses)")
    lengths, qsl_idx, problems = [], [], []
    for n, entry in enumerate(raw):
        hex_data = entry.get("data") or ""
        where = f"entry {n} (qsl_idx {entry.get('qsl_idx')})"
        try:
            size = len(bytes.fromhex(hex_data.strip())) if isinstance(hex_data, str) else None
        except ValueError:
            size = None
        if size is None:
            problems.append(f"{where}: its data is not hex")
        elif size % TOKEN_BYTES:
            problems.append(f"{where}: its data has {size} bytes, not a whole number of int32 token ids")
        count = (size or 0) // TOKEN_BYTES
        if size is not None and entry.get("token_count") != count:
            problems.append(f"{where}: the response has {count} tokens but n_tokens was {entry.get('token_count')}")
        lengths.append(count)
        qsl_idx.append(entry.get("qsl_idx"))
    return Responses(lengths, qsl_idx, problems)


def audit_bounds(config: Path = AUDIT_CONFIG) -> tuple[float, float]:
    """The `test09_min_output_tokens` and `test09_max_output_tokens` of an audit.config."""
    try:
        settings = read_audit_config(config)
    except (OSError, AuditConfigError) as e:
        raise Test09Error(str(e)) from None
    missing = [k for k in ("test09_min_output_tokens", "test09_max_output_tokens") if k not in settings]
    if missing:
        raise Test09Error(f"{config}: no {' or '.join(missing)}")
    return float(settings["test09_min_output_tokens"]), float(settings["test09_max_output_tokens"])


def mean_length(lengths: list[int]) -> float:
    return sum(lengths) / len(lengths)


def verify_text(lengths: list[int], low: float, high: float) -> tuple[str, bool]:
    """(verify_output_len.txt as the official script writes it, whether the mean is in bounds)."""
    mean = mean_length(lengths)
    std_dev = (sum((x - mean) ** 2 for x in lengths) / len(lengths)) ** 0.5  # as the official script
    low_pass, high_pass = mean >= low, mean <= high
    lines = [
        RULE,
        TITLE,
        RULE,
        "",
        "Output Token Length Statistics",
        THIN_RULE,
        f"Total samples: {len(lengths)}",
        f"Mean output tokens: {mean:.2f}",
        f"Min output tokens: {min(lengths)}",
        f"Max output tokens: {max(lengths)}",
        f"Std deviation: {std_dev:.2f}",
        "",
        RULE,
        "Verification Results",
        RULE,
        f"Mean output tokens: {mean:.2f}",
        f"Min threshold: {low}",
        f"Max threshold: {high}",
        f"Min check pass: {low_pass}",
        f"Max check pass: {high_pass}",
        "",
        "TEST PASS" if low_pass and high_pass else "TEST FAIL",
    ]
    return "\n".join(lines) + "\n", low_pass and high_pass


def write_result(run_dir: Path, out_dir: Path, config: Path = AUDIT_CONFIG) -> list[str]:
    """Count `run_dir`'s logged responses; write `out_dir/TEST09/`; return the failures (none when
    it passes)."""
    run_dir = Path(run_dir)
    log = run_dir / "mlperf_log_accuracy.json"
    if not log.is_file():
        raise Test09Error(f"{log}: accuracy log not found")
    low, high = audit_bounds(config)
    responses = read_responses(log)
    if not responses.lengths:
        raise Test09Error(f"{log}: no responses were logged")
    text, passed = verify_text(responses.lengths, low, high)
    target = Path(out_dir) / "TEST09"
    (target / "accuracy").mkdir(parents=True, exist_ok=True)
    (target / "performance" / "run_1").mkdir(parents=True, exist_ok=True)
    (target / "verify_output_len.txt").write_text(text)
    shutil.copy2(log, target / "accuracy" / log.name)
    for name in PERFORMANCE_LOGS:
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, target / "performance" / "run_1" / name)
    failures = config_differences(config, OFFICIAL_SETTINGS) + responses.problems
    if not passed:
        failures.append(
            f"the mean output length {mean_length(responses.lengths):.2f} tokens over {len(responses.lengths)} "
            f"responses is outside [{low}, {high}]"
        )
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, required=True, help="the TEST09 run's log folder")
    parser.add_argument("--out", type=Path, required=True, help="results/<system>/<benchmark>/<Scenario>")
    parser.add_argument("--audit-config", type=Path, default=AUDIT_CONFIG)
    args = parser.parse_args()
    try:
        failures = write_result(args.logs, args.out, args.audit_config)
    except Test09Error as e:
        raise SystemExit(f"error: test09: {e}")
    print((args.out / "TEST09" / "verify_output_len.txt").read_text(), end="")
    for failure in failures:
        print(f"TEST09: {failure}")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()

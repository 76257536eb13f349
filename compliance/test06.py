"""TEST06 for the LLM benchmarks: a performance run with the audit settings below logs 100
samples' responses; we then verify, per sample, that (non-Offline) the first-token response is
the start of the full response, that the response ends in at most one EOS, and that its length
equals the n_tokens reported to LoadGen. The result is written as the official verification script
writes it: `TEST06/verify_accuracy.txt`, with the accuracy log copied to `TEST06/accuracy/`.

    python -m compliance.test06 --logs RUN_DIR --out RESULTS_SCENARIO_DIR --scenario Server --eos-id 2
"""

import argparse
import shutil
from pathlib import Path

from accuracy.accuracy_log import AccuracyLogError, read_accuracy_entries

AUDIT_CONFIG = Path(__file__).with_name("TEST06.audit.config")


def check_first_token(samples: list[dict]) -> str | None:
    for s in samples:
        first = s.get("token_data")
        if first is None:
            return f"qsl_idx {s['qsl_idx']}: no first-token response (token_data) was logged"
        if s["data"][: len(first)] != first:
            return (
                f"qsl_idx {s['qsl_idx']}: first-token response {first} is not the start of the response {s['data'][:8]}"
            )
    return None


def check_eos(samples: list[dict], eos_ids: set[int]) -> str | None:
    for s in samples:
        data = s["data"]
        if len(data) >= 2 and data[-1] in eos_ids and data[-2] in eos_ids:
            return f"qsl_idx {s['qsl_idx']}: the response ends in more than one EOS token ({data[-2]}, {data[-1]})"
    return None


def check_length(samples: list[dict]) -> str | None:
    for s in samples:
        if s["token_count"] is None or len(s["data"]) != int(s["token_count"]):
            return f"qsl_idx {s['qsl_idx']}: response has {len(s['data'])} tokens but n_tokens was {s['token_count']}"
    return None


def verify(accuracy_log: Path, scenario: str, eos_ids: set[int]) -> tuple[str, list[str]]:
    """`(verify_accuracy.txt text, failure messages)`."""
    samples = read_accuracy_entries(accuracy_log)
    failures = [] if samples else [f"{accuracy_log}: no samples were logged"]
    first = None if scenario == "Offline" else check_first_token(samples)
    eos, length = check_eos(samples, eos_ids), check_length(samples)
    failures += [f for f in (first, eos, length) if f]
    lines = [
        f"First token check pass: {'Skipped' if scenario == 'Offline' else first is None}",
        f"EOS check pass: {eos is None}",
        f"Sample length check pass: {length is None}",
        "TEST06 verification " + ("complete" if not failures else "failed"),
    ]
    return "\n".join(lines) + "\n", failures


def write_result(run_dir: Path, out_dir: Path, scenario: str, eos_ids: set[int]) -> list[str]:
    """Verify `run_dir`'s accuracy log; write `out_dir/TEST06/`; return the failures."""
    log = Path(run_dir) / "mlperf_log_accuracy.json"
    text, failures = verify(log, scenario, eos_ids)
    target = Path(out_dir) / "TEST06"
    (target / "accuracy").mkdir(parents=True, exist_ok=True)
    (target / "verify_accuracy.txt").write_text(text)
    shutil.copy2(log, target / "accuracy" / log.name)
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, required=True, help="the TEST06 run's log folder")
    parser.add_argument("--out", type=Path, required=True, help="results/<system>/<benchmark>/<Scenario>")
    parser.add_argument("--scenario", required=True, choices=["Offline", "Server", "Interactive", "SingleStream"])
    parser.add_argument("--eos-id", type=int, nargs="+", required=True, help="the model's EOS token id(s)")
    args = parser.parse_args()
    try:
        failures = write_result(args.logs, args.out, args.scenario, set(args.eos_id))
    except AccuracyLogError as e:
        raise SystemExit(f"error: test06: {e}")
    print((args.out / "TEST06" / "verify_accuracy.txt").read_text(), end="")
    for failure in failures:
        print(f"TEST06: {failure}")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()

"""The compliance tests' audit.config files, and the check that a run was made under one.

LoadGen applies an audit.config over mlperf.conf and user.conf, reading it with the model name "*"
(loadgen.cc StartTest), so each of its lines is `*.*.<setting> = <value>`. The TEST07 and TEST09
files also hold the thresholds their verification reads (`test07_*`, `test09_*`), which LoadGen
ignores. A run's detail log shows the settings LoadGen took (`effective_*`, and `requested_*` where
LoadGen rewrites the effective value), so the check reads them there.
"""

from decimal import Decimal, InvalidOperation
from pathlib import Path

HERE = Path(__file__).parent
# The file each compliance mode's run gives LoadGen.
AUDIT_CONFIGS = {test: HERE / f"{test}.audit.config" for test in ("TEST06", "TEST07", "TEST09")}
KEY_PREFIX = "*.*."

# How a run's mlperf_log_detail.txt shows each LoadGen setting an audit.config may set. Offline
# LoadGen sets the effective min_query_count to 1 (one query), hence the requested one.
DETAIL_KEYS = {
    "mode": "effective_test_mode",
    "accuracy_log_rng_seed": "effective_accuracy_log_rng_seed",
    "accuracy_log_sampling_target": "effective_accuracy_log_sampling_target",
    "min_query_count": "requested_min_query_count",
    "min_duration": "effective_min_duration_ms",
    "performance_issue_unique": "effective_performance_issue_unique",
    "sample_concatenate_permutation": "effective_sample_concatenate_permutation",
}
TEST_MODES = {"0": "SubmissionRun", "1": "AccuracyOnly", "2": "PerformanceOnly", "3": "FindPeakPerformance"}
FLAGS = {"performance_issue_unique", "sample_concatenate_permutation"}


class AuditConfigError(ValueError):
    pass


def read_audit_config(path: Path) -> dict[str, str]:
    """setting -> value, from the `*.*.<setting> = <value>` lines (blank lines and `#` comments
    skipped). AuditConfigError, naming the line, for anything else or a setting given twice."""
    settings = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        key, sep, value = (part.strip() for part in text.partition("="))
        if not sep or not key.startswith(KEY_PREFIX) or "." in key[len(KEY_PREFIX) :] or not value:
            raise AuditConfigError(f"{path}:{n}: expected '{KEY_PREFIX}<setting> = <value>', got {line!r}")
        setting = key[len(KEY_PREFIX) :]
        if setting in settings:
            raise AuditConfigError(f"{path}:{n}: {setting} is set twice")
        settings[setting] = value
    return settings


def _number(value: str) -> Decimal | None:
    try:
        return Decimal(value)
    except InvalidOperation:
        return None


def config_differences(path: Path, official: dict[str, str]) -> list[str]:
    """How the audit.config at `path` differs from the official settings (setting -> value, values
    compared as numbers): each setting missing, added or changed, named."""
    try:
        settings = read_audit_config(path)
    except (OSError, AuditConfigError) as e:
        return [str(e)]
    differences = [f"{path}: {s} is missing (officially {v})" for s, v in official.items() if s not in settings]
    differences += [f"{path}: {s} = {settings[s]} is not an official setting" for s in settings if s not in official]
    for setting, value in official.items():
        mine = settings.get(setting)
        if mine is not None and (_number(mine) is None or _number(mine) != _number(value)):
            differences.append(f"{path}: {setting} = {mine}, officially {value}")
    return differences


def run_setting_differences(values: dict, official: dict[str, str]) -> list[str]:
    """How a run's detail-log values (compliance.loadgen_logs.read_detail_log) show it was not made
    under the official audit settings: each LoadGen setting whose logged value differs, named."""
    differences = []
    for setting, value in official.items():
        key = DETAIL_KEYS.get(setting)
        if key is None:  # a threshold, read by the verification
            continue
        if setting == "mode":
            expected = TEST_MODES.get(value, value)
        elif setting in FLAGS:
            expected = value != "0"
        else:
            expected = int(value)
        got = values.get(key)
        if got != expected or isinstance(got, bool) != isinstance(expected, bool):
            differences.append(
                f"{key} is {got!r}, not {expected!r}: the run was not made under the official "
                f"audit.config ({setting} = {value})"
            )
    return differences

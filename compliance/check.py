"""Our submission checker: the official v6.1 checks that apply to the LLM benchmarks (structure,
required and allowed scenarios per system type, system fields, seeds, minimum duration and sample
counts, accuracy-run coverage, LoadGen errors, accuracy patterns and targets, TTFT/TPOT limits,
TEST06, TEST07, TEST09), plus our own: equal-issue mode, src/<benchmark>/README.md, the latency and
validity audit (compliance/audit.py), every detail log's run that of its folder (its test mode,
scenario and benchmark: compliance/run_identity.py), and the compliance runs checked again from their
logs (TEST06's responses, TEST07's samples, TEST09's mean length, the audit settings each run was
made under). Every failure names the file and the rule.

    python -m compliance.check TREE [--demo]

TREE holds `closed/` and/or `open/`, as the official checker's `--input`. `--demo` turns only the
rules that the CPU demo knowingly shortens (minimum duration, sample and dataset counts, equal-issue
mode) into warnings. Exit status 0 only when the tree passes.
"""

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from accuracy.accuracy_log import AccuracyLogError, read_accuracy_entries
from accuracy.evaluate import accuracy_log_hash
from accuracy.report import reference_targets
from compliance import test06, test07, test09
from compliance.audit import audit_values
from compliance.audit_config import run_setting_differences
from compliance.loadgen_logs import read_detail_log
from compliance.package import CUT_MARK, VIEWABLE_BYTES
from compliance.run_identity import identity_mismatches
from systems.benchmarks import BENCHMARKS, Benchmark

SEEDS_V61 = {
    "effective_qsl_rng_seed": 2085463073848966840,
    "effective_sample_index_rng_seed": 2747215439041700203,
    "effective_schedule_rng_seed": 16159082839903944936,
}
MIN_DURATION_MS = 600_000
SCENARIO_DIRS = {"Offline", "Server", "Interactive", "SingleStream", "MultiStream"}
# Accuracy-pattern regexes as the official checker matches accuracy.txt (mlperf-rules.md section 3;
# its patterns begin with ".*", so they match anywhere in a line).
ACCURACY_PATTERNS = {
    "rouge1": r"'rouge1':\s+'?([\d.]+)",
    "rouge2": r"'rouge2':\s+'?([\d.]+)",
    "rougeL": r"'rougeL':\s+'?([\d.]+)",
    "rougeLsum": r"'rougeLsum':\s+'?([\d.]+)",
    "gen_len": r"'gen_len':\s([\d.]+)",
    "tokens_per_sample": r"'tokens_per_sample':\s([\d.]+)",
    "exact_match": r"'exact_match':\s([\d.]+)",
}
MAX_ACCURACY_LOG_BYTES = 10 * 1024
SYSTEM_REQUIRED_FIELDS = [
    "division",
    "submitter",
    "status",
    "system_name",
    "number_of_nodes",
    "host_processor_model_name",
    "host_processors_per_node",
    "host_processor_core_count",
    "host_memory_capacity",
    "host_storage_capacity",
    "host_storage_type",
    "accelerators_per_node",
    "accelerator_model_name",
    "accelerator_memory_capacity",
    "framework",
    "operating_system",
    "system_type",
    "other_software_stack",
    "host_processor_frequency",
    "host_processor_caches",
    "host_memory_configuration",
    "host_processor_interconnect",
    "host_networking",
    "host_networking_topology",
    "accelerator_frequency",
    "accelerator_host_interconnect",
    "accelerator_interconnect",
    "accelerator_interconnect_topology",
    "accelerator_memory_configuration",
    "accelerator_on-chip_memories",
    "cooling",
    "hw_notes",
    "sw_notes",
    "host_network_card_count",
    "system_type_detail",
]
SYSTEM_NONEMPTY_FIELDS = [
    "division",
    "submitter",
    "system_type",
    "status",
    "system_name",
    "number_of_nodes",
    "host_processor_model_name",
    "host_processors_per_node",
    "host_processor_core_count",
    "host_memory_capacity",
    "host_memory_configuration",
    "host_storage_capacity",
    "host_storage_type",
    "host_networking",
    "host_network_card_count",
    "host_networking_topology",
    "accelerators_per_node",
    "accelerator_model_name",
    "accelerator_memory_capacity",
    "accelerator_host_interconnect",
    "accelerator_memory_configuration",
    "accelerator_interconnect",
    "cooling",
    "framework",
    "operating_system",
    "other_software_stack",
]
MEASUREMENTS_FIELDS = [
    "input_data_types",
    "retraining",
    "starting_weights_filename",
    "weight_data_types",
    "weight_transformations",
]
SCENARIO_FILES = [
    "measurements.json",
    "README.md",
    "user.conf",
    "performance/run_1/mlperf_log_summary.txt",
    "performance/run_1/mlperf_log_detail.txt",
    "accuracy/accuracy.txt",
    "accuracy/mlperf_log_accuracy.json",
    "accuracy/mlperf_log_summary.txt",
    "accuracy/mlperf_log_detail.txt",
]
TEST06_FILES = ["TEST06/verify_accuracy.txt", "TEST06/accuracy/mlperf_log_accuracy.json"]
# TEST07 and TEST09 (gpt-oss-120b): as the official verification scripts lay them out.
RUN_1_FILES = ["performance/run_1/mlperf_log_summary.txt", "performance/run_1/mlperf_log_detail.txt"]
COMPLIANCE_FILES = {
    "TEST06": TEST06_FILES,
    "TEST07": [f"TEST07/{name}" for name in (*test07.FILES, *RUN_1_FILES)],
    "TEST09": [f"TEST09/{name}" for name in (*test09.FILES, *RUN_1_FILES)],
}
TEST06_PASS_LINES = {
    "First token check pass": ("True", "Skipped"),
    "EOS check pass": ("True",),
    "Sample length check pass": ("True",),
}


@dataclass
class Report:
    demo: bool
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def fail(self, path: Path, rule: str, message: str, demo_shortened: bool = False) -> None:
        line = f"{path}: [{rule}] {message}"
        (self.warnings if demo_shortened and self.demo else self.errors).append(line)


def _read_json(path: Path, report: Report, rule: str):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        report.fail(path, rule, f"cannot read JSON ({e})")
        return None


def check_system(path: Path, division: str, submitter: str, report: Report) -> dict | None:
    """Check one systems/<id>.json; return its contents (None if it cannot be read)."""
    desc = _read_json(path, report, "system")
    if desc is None:
        return None
    for key in SYSTEM_REQUIRED_FIELDS:
        if key not in desc:
            report.fail(path, "system", f"required field {key!r} is missing")
    for key in SYSTEM_NONEMPTY_FIELDS:
        # As the official checker: any falsy value is empty, so a count of 0 must be written "0".
        if key in desc and (not desc[key] or str(desc[key]).strip() == ""):
            report.fail(path, "system", f"required field {key!r} is empty")
    if str(desc.get("status", "")).lower() not in ("available", "preview", "rdi"):
        report.fail(path, "system", f"status {desc.get('status')!r} is not available, preview or rdi")
    if desc.get("system_type") not in ("datacenter", "edge", "datacenter,edge", "edge,datacenter"):
        report.fail(path, "system", f"system_type {desc.get('system_type')!r} is not datacenter or edge")
    if desc.get("division") != division:
        report.fail(path, "system", f"division {desc.get('division')!r} contradicts the path's division {division!r}")
    if desc.get("submitter") != submitter:
        report.fail(path, "system", f"submitter {desc.get('submitter')!r} contradicts the path's {submitter!r}")
    if division == "closed" and desc.get("is_network"):
        report.fail(path, "system", "is_network must be false in the closed division")
    return desc


def check_performance(scenario_dir: Path, rules: Benchmark, scenario: str, report: Report) -> None:
    log = scenario_dir / "performance" / "run_1" / "mlperf_log_detail.txt"
    values, errors = read_detail_log(log)
    _check_common_log(log, values, rules, scenario, "performance", report)
    if values.get("effective_min_duration_ms", 0) < MIN_DURATION_MS:
        report.fail(
            log,
            "min-duration",
            f"effective_min_duration_ms {values.get('effective_min_duration_ms')} is below {MIN_DURATION_MS}",
            demo_shortened=True,
        )
    if scenario == "Offline" and values.get("effective_samples_per_query", 0) < rules.dataset_size:
        report.fail(
            log,
            "sample-count",
            f"effective_samples_per_query {values.get('effective_samples_per_query')} "
            f"is below the dataset size {rules.dataset_size}",
            demo_shortened=True,
        )
    if scenario in ("Server", "Interactive"):
        if not values.get("early_stopping_met"):
            report.fail(log, "early-stopping", "early_stopping_met is false")
        if values.get("effective_target_latency_ns", 0) > 20_000_000_000:
            report.fail(log, "target-latency", "effective_target_latency_ns is above 20 s")
    # The official checker tests this only for v4.1 (Config.requires_equal_issue), and there with the
    # condition inverted; mlperf.conf turns it on for every LLM, and only TEST06's audit.config off.
    if rules.equal_issue and not values.get("effective_sample_concatenate_permutation"):
        report.fail(
            log,
            "equal-issue",
            f"effective_sample_concatenate_permutation is "
            f"{values.get('effective_sample_concatenate_permutation')}; mlperf.conf sets "
            f"{rules.loadgen_model}.*.sample_concatenate_permutation = 1 (equal-issue mode)",
            demo_shortened=True,
        )
    for failure in audit_values(values, errors, rules, scenario):
        report.fail(log, "latency-validity-audit", failure)


def _check_run_log(log: Path, values: dict, rules: Benchmark, scenario: str, run: str, report: Report) -> None:
    """Any run's detail log: LoadGen's v6.1 seeds, and the run of its folder (`run`: performance,
    accuracy, TEST0x) in `scenario` of the benchmark, as far as the log shows (run_identity.py)."""
    for key, seed in SEEDS_V61.items():
        if values.get(key) != seed:
            report.fail(log, "seeds", f"{key} is {values.get(key)}, not the v6.1 seed {seed}")
    for mismatch in identity_mismatches(values, run, scenario, rules):
        report.fail(log, "run-identity", f"{mismatch}: the log is not of this folder's {run} run")


def _check_common_log(log: Path, values: dict, rules: Benchmark, scenario: str, run: str, report: Report) -> None:
    _check_run_log(log, values, rules, scenario, run, report)
    if values.get("effective_performance_sample_count", 0) < rules.dataset_size:
        report.fail(
            log,
            "sample-count",
            f"effective_performance_sample_count "
            f"{values.get('effective_performance_sample_count')} is below the dataset size "
            f"{rules.dataset_size}",
            demo_shortened=True,
        )


def check_accuracy(scenario_dir: Path, rules: Benchmark, scenario: str, targets: dict, report: Report) -> None:
    acc_dir = scenario_dir / "accuracy"
    log = acc_dir / "mlperf_log_detail.txt"
    values, errors = read_detail_log(log)
    _check_common_log(log, values, rules, scenario, "accuracy", report)
    for error in errors:
        report.fail(log, "loadgen-errors", f"LoadGen logged an error: {error}")
    # As the official AccuracyCheck.dataset_check: the samples the run covered, which an
    # accuracy_sample_count_override shortens; qsl_reported_total_count only when that is not logged.
    key = (
        "effective_accuracy_sample_count" if "effective_accuracy_sample_count" in values else "qsl_reported_total_count"
    )
    if values.get(key) != rules.accuracy_dataset_size:  # gpt-oss-120b: its accuracy set's 4395
        report.fail(
            log,
            "dataset-size",
            f"{key} {values.get(key)} is not the dataset size {rules.accuracy_dataset_size}: "
            "the accuracy run does not cover the whole dataset",
            demo_shortened=True,
        )
    size = (acc_dir / "mlperf_log_accuracy.json").stat().st_size
    if size > MAX_ACCURACY_LOG_BYTES:
        report.fail(
            acc_dir / "mlperf_log_accuracy.json",
            "accuracy-log-size",
            f"{size} bytes; truncate it to at most {MAX_ACCURACY_LOG_BYTES}",
        )
    text_path = acc_dir / "accuracy.txt"
    text = text_path.read_text()
    if "np.float" in text or "np.int" in text:
        report.fail(
            text_path,
            "accuracy-pattern",
            "numbers print as numpy reprs (np.float64(...)); the checker's regexes cannot read them",
        )
    if not re.search(r"^hash=[\w\d]+$", text, re.MULTILINE):
        report.fail(text_path, "accuracy-hash", "no hash= line")
    check_scored_log(acc_dir, text, values.get(key), report)
    for metric, (low, high) in targets.items():
        match = re.search(ACCURACY_PATTERNS[metric], text)
        if match is None:
            report.fail(text_path, "accuracy-pattern", f"{metric} not found")
            continue
        value = float(match.group(1))
        if value < low or (high is not None and value > high):
            bound = f">= {low:.4f}" if high is None else f"in [{low:.4f}, {high:.4f}]"
            report.fail(text_path, "accuracy-target", f"{metric} = {value} is not {bound}")


def check_scored_log(acc_dir: Path, text: str, samples, report: Report) -> None:
    """accuracy.txt against the accuracy log beside it, as far as the tree allows: a log kept whole
    must be the one hashed in accuracy.txt, and a cut one must have a LoadGen log's two ends; the
    samples scored (gen_num) must be those the accuracy run covered (`samples`, from its detail log).
    A score left from another run beside a killed run's log fails here."""
    path = acc_dir / "mlperf_log_accuracy.json"
    data = path.read_bytes()
    head, mark, tail = data.partition(CUT_MARK)
    if mark and len(head) == VIEWABLE_BYTES and len(tail) == VIEWABLE_BYTES:  # the packager's cut
        if not (head.lstrip().startswith(b"[") and tail.rstrip().endswith(b"]")):
            report.fail(path, "accuracy-log", "its kept ends are not those of a LoadGen accuracy log (a JSON list)")
    else:
        scored = accuracy_log_hash(text)
        if scored is not None and scored != hashlib.sha256(data).hexdigest():
            report.fail(
                path, "accuracy-log", f"not the log accuracy.txt was computed from (its hash= line is {scored})"
            )
        try:
            read_accuracy_entries(path, data=data)
        except AccuracyLogError as e:
            report.fail(path, "accuracy-log", f"not a LoadGen accuracy log: {e}")
    match = re.search(r"'gen_num':\s(\d+)", text)
    if match and samples is not None and int(match.group(1)) != samples:
        report.fail(
            acc_dir / "accuracy.txt",
            "accuracy-coverage",
            f"scores {match.group(1)} samples (gen_num), and the "
            f"accuracy run covered {samples}: the score is not of this run",
        )


def check_test06(scenario_dir: Path, rules: Benchmark, scenario: str, report: Report) -> None:
    verify_path = scenario_dir / "TEST06" / "verify_accuracy.txt"
    lines = dict(line.split(": ", 1) for line in verify_path.read_text().splitlines() if ": " in line)
    for key, passing in TEST06_PASS_LINES.items():
        if lines.get(key) not in passing:
            report.fail(verify_path, "TEST06", f"{key!r} is {lines.get(key)!r}")
    if scenario != "Offline" and lines.get("First token check pass") == "Skipped":
        report.fail(verify_path, "TEST06", f"the first-token check was skipped in {scenario}")
    # The official TEST06 folder holds no detail log: the packager checked its run's (check_runs).
    # Verify the logged responses again rather than trust the text.
    log = scenario_dir / "TEST06" / "accuracy" / "mlperf_log_accuracy.json"
    try:
        _, failures = test06.verify(log, scenario, set(rules.eos_token_ids))
    except AccuracyLogError as e:
        failures = [str(e)]
    for failure in failures:
        report.fail(log, "TEST06", failure)


def _check_test_run(test_dir: Path, test: str, official: dict, rules: Benchmark, scenario: str, report: Report) -> None:
    """A TEST07/TEST09 run's detail log: made under the official audit settings, with the v6.1 seeds,
    the run of its folder, without a LoadGen error."""
    log = test_dir / "performance" / "run_1" / "mlperf_log_detail.txt"
    values, errors = read_detail_log(log)
    # Its mode is its run's identity, checked with every detail log's (_check_run_log).
    settings = {setting: value for setting, value in official.items() if setting != "mode"}
    for failure in run_setting_differences(values, settings):
        report.fail(log, test, failure)
    _check_run_log(log, values, rules, scenario, test, report)
    for error in errors:
        report.fail(log, "loadgen-errors", f"LoadGen logged an error: {error}")


def _logged_responses(test_dir: Path, test: str, report: Report) -> test09.Responses | None:
    """The whole accuracy log of a TEST07/TEST09 folder, each response counted as TEST09 counts;
    None (the failure reported) when it is cut or unreadable: the checks below need every response."""
    log = test_dir / "accuracy" / "mlperf_log_accuracy.json"
    data = log.read_bytes()
    head, mark, tail = data.partition(CUT_MARK)
    if mark and len(head) == VIEWABLE_BYTES and len(tail) == VIEWABLE_BYTES:
        report.fail(log, test, "cut to its two ends: the checks need every logged response (check before truncating)")
        return None
    try:
        return test09.read_responses(log)
    except test09.Test09Error as e:
        report.fail(log, test, str(e))
        return None


def check_test07(scenario_dir: Path, rules: Benchmark, scenario: str, report: Report) -> None:
    """TEST07: verify_accuracy.txt passes at the official threshold with the score its accuracy
    script printed, and the run logged each of the compliance set's samples under the official
    audit settings. (The score itself needs the dataset and tokenizer: `python -m compliance.test07`
    computes it again.)"""
    test_dir = scenario_dir / "TEST07"
    verify_path = test_dir / "verify_accuracy.txt"
    text = verify_path.read_text(errors="replace")
    output, _, summary = text.rpartition(test07.SUMMARY_TITLE)  # the script's output, then the summary
    lines = [line.strip() for line in summary.splitlines()]
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    printed = test07.score_of(output)
    if "TEST PASS" not in lines or "TEST FAIL" in lines or fields.get("Accuracy check pass") != "True":
        report.fail(verify_path, "TEST07", "does not say 'Accuracy check pass: True' and 'TEST PASS'")
    if fields.get("Accuracy threshold") != str(test07.THRESHOLD):
        report.fail(
            verify_path,
            "TEST07",
            f"threshold {fields.get('Accuracy threshold')!r} is not the official {test07.THRESHOLD} "
            "(compliance/TEST07/gpt-oss-120b/audit.config)",
        )
    try:
        score = float(fields["Accuracy score"])
    except (KeyError, ValueError):
        report.fail(verify_path, "TEST07", "no 'Accuracy score' line")
    else:
        if not score >= test07.THRESHOLD:
            report.fail(verify_path, "TEST07", f"exact_match {score} is below the threshold {test07.THRESHOLD}")
        if printed != score:
            report.fail(
                verify_path,
                "TEST07",
                f"the accuracy script's output says 'exact_match': {printed}, the summary {score}",
            )
    responses = _logged_responses(test_dir, "TEST07", report)
    if responses is not None:
        unique = len(set(responses.qsl_idx))
        if unique != test07.SAMPLES:
            report.fail(
                test_dir / "accuracy" / "mlperf_log_accuracy.json",
                "TEST07",
                f"logs {unique} distinct samples, not the compliance set's {test07.SAMPLES}",
                demo_shortened=True,
            )
        for problem in responses.problems:
            report.fail(test_dir / "accuracy" / "mlperf_log_accuracy.json", "TEST07", problem)
    _check_test_run(test_dir, "TEST07", test07.OFFICIAL_SETTINGS, rules, scenario, report)


def check_test09(scenario_dir: Path, rules: Benchmark, scenario: str, report: Report) -> None:
    """TEST09: the mean output length counted again from the logged responses' bytes lies within
    the official bounds, verify_output_len.txt says so with the same numbers, every sample of the
    dataset was logged, and the run was made under the official audit settings."""
    test_dir = scenario_dir / "TEST09"
    verify_path = test_dir / "verify_output_len.txt"
    lines = [line.strip() for line in verify_path.read_text(errors="replace").splitlines()]
    if "TEST PASS" not in lines or "TEST FAIL" in lines:
        report.fail(verify_path, "TEST09", "does not say 'TEST PASS'")
    responses = _logged_responses(test_dir, "TEST09", report)
    if responses is None:
        _check_test_run(test_dir, "TEST09", test09.OFFICIAL_SETTINGS, rules, scenario, report)
        return
    log = test_dir / "accuracy" / "mlperf_log_accuracy.json"
    if not responses.lengths:
        report.fail(log, "TEST09", "no responses were logged")
    else:
        low, high = test09.BOUNDS
        expected, _ = test09.verify_text(responses.lengths, low, high)
        mean = test09.mean_length(responses.lengths)
        if not low <= mean <= high:
            report.fail(
                log,
                "TEST09",
                f"the mean output length, counted from the logged responses, is {mean:.2f} tokens, "
                f"outside [{low}, {high}]",
            )
        if lines != [line.strip() for line in expected.splitlines()]:
            report.fail(
                verify_path,
                "TEST09",
                "is not what the logged responses give at the official bounds "
                f"(mean {mean:.2f} over {len(responses.lengths)} responses, thresholds {low} and {high})",
            )
    unique = len(set(responses.qsl_idx))
    if unique != rules.dataset_size:
        report.fail(
            log,
            "TEST09",
            f"logs {unique} distinct samples, not the dataset's {rules.dataset_size}",
            demo_shortened=True,
        )
    for problem in responses.problems:
        report.fail(log, "TEST09", problem)
    _check_test_run(test_dir, "TEST09", test09.OFFICIAL_SETTINGS, rules, scenario, report)


def check_scenario(scenario_dir: Path, rules: Benchmark, targets: dict, report: Report) -> None:
    scenario = scenario_dir.name
    required = SCENARIO_FILES + [name for test in rules.compliance_tests for name in COMPLIANCE_FILES.get(test, [])]
    missing = [name for name in required if not (scenario_dir / name).is_file()]
    for name in missing:
        report.fail(scenario_dir / name, "required-file", "missing")
    for name in ("README.md", "user.conf"):
        if name not in missing and (scenario_dir / name).stat().st_size == 0:
            report.fail(scenario_dir / name, "required-file", "empty")
    if "measurements.json" not in missing:
        measurements = _read_json(scenario_dir / "measurements.json", report, "measurements")
        for key in MEASUREMENTS_FIELDS:
            if measurements is not None and not measurements.get(key):
                report.fail(scenario_dir / "measurements.json", "measurements", f"field {key!r} missing or empty")
    if not any(name.startswith("performance/") for name in missing):
        check_performance(scenario_dir, rules, scenario, report)
    if not any(name.startswith("accuracy/") for name in missing):
        check_accuracy(scenario_dir, rules, scenario, targets, report)
    if rules.test06 and not any(name.startswith("TEST06/") for name in missing):
        check_test06(scenario_dir, rules, scenario, report)
    for test, check in (("TEST07", check_test07), ("TEST09", check_test09)):
        if test in rules.compliance_tests and not any(name.startswith(f"{test}/") for name in missing):
            check(scenario_dir, rules, scenario, report)


def allowed_scenarios(rules: Benchmark, system_type: str) -> tuple[frozenset, frozenset] | None:
    """(required, optional) scenarios of a benchmark on a system of `system_type`; None when that
    type of system cannot submit the benchmark."""
    kinds = [rules.scenarios[kind] for kind in str(system_type).split(",") if kind in rules.scenarios]
    if not kinds:
        return None
    return frozenset().union(*(r for r, _ in kinds)), frozenset().union(*(o for _, o in kinds))


def check_scenario_set(
    bench_dir: Path, benchmark: str, rules: Benchmark, system_type: str, scenarios: set, report: Report
) -> None:
    allowed = allowed_scenarios(rules, system_type)
    if allowed is None:  # the official checker has no scenario list for it and stops with a TypeError
        report.fail(
            bench_dir,
            "system-type",
            f"{benchmark} is not a benchmark of a {system_type!r} system; it "
            f"needs a system_type of {' or '.join(sorted(rules.scenarios))}",
        )
        return
    required, optional = allowed
    one_of = optional if {"Server", "Interactive"} <= optional else frozenset()
    if not (required <= scenarios and (not one_of or one_of & scenarios)):
        report.fail(
            bench_dir,
            "required-scenarios",
            f"has {sorted(scenarios)}; {benchmark} needs "
            f"{sorted(required)}" + (f" and one of {sorted(one_of)}" if one_of else ""),
        )
    for scenario in sorted((scenarios & SCENARIO_DIRS) - required - optional):
        report.fail(
            bench_dir / scenario,
            "allowed-scenarios",
            f"{benchmark} on a {system_type!r} system allows only {sorted(required | optional)}",
        )


def check_submitter(org: Path, division: str, report: Report) -> int:
    """Check one `<division>/<submitter>` folder; return how many scenario results it holds."""
    if not (org / "src").is_dir():
        report.fail(org / "src", "structure", "the src/ folder with the code that drives LoadGen is missing")
    mapping = {}
    if division == "open" and (org / "model_mapping.json").is_file():
        mapping = _read_json(org / "model_mapping.json", report, "model-mapping") or {}
    results = 0
    for system_dir in sorted(p for p in (org / "results").glob("*") if p.is_dir()):
        system_json = org / "systems" / f"{system_dir.name}.json"
        desc = None
        if not system_json.is_file():
            report.fail(system_json, "system", "missing system description for the results folder")
        else:
            desc = check_system(system_json, division, org.name, report)
        for bench_dir in sorted(p for p in system_dir.iterdir() if p.is_dir()):
            benchmark = mapping.get(bench_dir.name, bench_dir.name)
            if benchmark not in BENCHMARKS:
                report.fail(
                    bench_dir,
                    "benchmark",
                    f"unknown benchmark {benchmark!r}; known: {sorted(BENCHMARKS)}"
                    + ("; an open-division model needs model_mapping.json" if division == "open" else ""),
                )
                continue
            readme = org / "src" / bench_dir.name / "README.md"
            if not readme.is_file() or readme.stat().st_size == 0:
                report.fail(
                    readme,
                    "structure",
                    "missing or empty: src/<benchmark>/ holds each benchmark's README, "
                    "as in the official sample tree (the official checker asks only for src/)",
                )
            scenarios = {p.name for p in bench_dir.iterdir() if p.is_dir()}
            for unknown in sorted(scenarios - SCENARIO_DIRS):
                report.fail(bench_dir / unknown, "structure", "not a scenario folder")
            rules = BENCHMARKS[benchmark]
            targets = rules.targets()
            if desc is not None:
                check_scenario_set(bench_dir, benchmark, rules, desc.get("system_type"), scenarios, report)
            reference_path = org / "documentation" / f"{bench_dir.name}_reference_accuracy.json"
            reference = (
                _read_json(reference_path, report, "accuracy-reference")
                if division == "open" and reference_path.is_file()
                else None
            )
            if reference is not None:
                # A substituted model: 99% of its own reference scores, and its own EOS tokens.
                targets = reference_targets(reference["scores"], benchmark)
                rules = replace(rules, eos_token_ids=frozenset(reference.get("eos_token_ids", rules.eos_token_ids)))
            for scenario in sorted(scenarios & SCENARIO_DIRS):
                check_scenario(bench_dir / scenario, rules, targets, report)
                results += 1
    return results


def check_tree(root: Path, demo: bool = False) -> Report:
    report = Report(demo)
    orgs = [
        (division, org)
        for division in ("closed", "open")
        for org in sorted((root / division).glob("*"))
        if org.is_dir()
    ]
    if not orgs:
        report.fail(root, "structure", "no closed/<submitter> or open/<submitter> folder")
    results = sum(check_submitter(org, division, report) for division, org in orgs)
    if orgs and not results:
        report.fail(root, "structure", "no results/<system>/<benchmark>/<Scenario> folders")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="the submission root holding closed/ and/or open/")
    parser.add_argument("--demo", action="store_true", help="the demo's shortened runs warn instead of fail")
    args = parser.parse_args()
    if not args.tree.is_dir():
        sys.exit(f"error: check: {args.tree} is not a folder (the submission root holding closed/ and/or open/)")
    report = check_tree(args.tree, args.demo)
    for line in report.warnings:
        print(f"WARNING {line}")
    for line in report.errors:
        print(f"ERROR {line}")
    verdict = "passes" if not report.errors else f"has {len(report.errors)} errors"
    print(f"check: {args.tree} {verdict} ({len(report.warnings)} warnings{', demo rules' if args.demo else ''})")
    sys.exit(0 if not report.errors else 1)


if __name__ == "__main__":
    main()

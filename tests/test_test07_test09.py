"""gpt-oss-120b's compliance tests TEST07 (accuracy in performance mode) and TEST09 (output length
in performance mode): our audit.config files hold the official settings, and LoadGen (real runs of
a stand-in SUT, in a subprocess) takes them; the verifications (compliance/test07.py, test09.py)
pass and fail as the official scripts do and write the same files; the packager writes the folders
and the checker catches each planted defect by name.

Set MLPERF_INFERENCE to a checkout (or the git directory) of mlcommons/inference to also run its
run_verification.py scripts on the same logs and compare their files with ours."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from compliance import check, package, test07, test09
from compliance.audit_config import (
    AUDIT_CONFIGS,
    config_differences,
    read_audit_config,
    run_setting_differences,
)
from compliance.loadgen_logs import MLLOG_MARKER, read_detail_log
from compliance.run_folder import RunFolder
from harness import submission
from systems.benchmarks import BENCHMARKS, ENTRIES
from tests.helpers import set_detail_values
from tests.tiny_system import reseal

# The official files' settings (v61-models.md section 3c; mlcommons/inference
# compliance/TEST07/gpt-oss-120b/audit.config and compliance/TEST09/gpt-oss-120b/audit.config).
OFFICIAL = {
    "TEST07": {
        "*.*.mode": "2",
        "*.*.accuracy_log_rng_seed": "720381539243781796",
        "*.*.accuracy_log_sampling_target": "990",
        "*.*.min_query_count": "990",
        "*.*.min_duration": "0",
        "*.*.performance_issue_unique": "1",
        "*.*.sample_concatenate_permutation": "0",
        "*.*.test07_accuracy_threshold": "60.698",
    },
    "TEST09": {
        "*.*.mode": "2",
        "*.*.accuracy_log_rng_seed": "720381539243781796",
        "*.*.accuracy_log_sampling_target": "10000",
        "*.*.min_query_count": "6396",
        "*.*.min_duration": "0",
        "*.*.performance_issue_unique": "1",
        "*.*.sample_concatenate_permutation": "0",
        "*.*.test09_min_output_tokens": "1150.38",
        "*.*.test09_max_output_tokens": "1406.02",
    },
}
TEST09_SAMPLES = 64  # a short performance set: the registry's dataset size is set to it below
TEST09_LENGTHS = [1100 + (i % 8) * 50 for i in range(TEST09_SAMPLES)]  # mean 1275

# A stand-in SUT under LoadGen: response i has lengths[i] int32 tokens. mlperf.conf sets gpt-oss's
# performance_sample_count_override to 6396; with performance_issue_unique a smaller QSL needs its
# own (LoadGen 6.0.17 crashes otherwise), as a TEST07 run on the 990-sample set does.
RUNNER = """
import array, json, sys
import mlperf_loadgen as lg

audit, outdir, lengths_file = sys.argv[1:4]
lengths = json.load(open(lengths_file))
kept = []

def issue(queries):
    responses = []
    for q in queries:
        ids = array.array("i", [(q.index * 7 + k) % 1000 + 1 for k in range(lengths[q.index])])
        kept.append(ids)
        responses.append(lg.QuerySampleResponse(q.id, ids.buffer_info()[0], 4 * len(ids), len(ids)))
    lg.QuerySamplesComplete(responses)

conf = outdir + "/user.conf"
with open(conf, "w") as f:
    f.write("gpt-oss-120b.Offline.target_qps = 1000\\n")
    f.write(f"gpt-oss-120b.*.performance_sample_count_override = {len(lengths)}\\n")
settings = lg.TestSettings()
settings.FromConfig(conf, "gpt-oss-120b", "Offline")
settings.scenario = lg.TestScenario.Offline
settings.mode = lg.TestMode.PerformanceOnly
log = lg.LogSettings()
log.log_output.outdir = outdir
log.log_output.copy_summary_to_stdout = False
sut = lg.ConstructSUT(issue, lambda: None)
qsl = lg.ConstructQSL(len(lengths), len(lengths), lambda s: None, lambda s: None)
lg.StartTestWithLogSettings(sut, qsl, settings, log, audit)
lg.DestroyQSL(qsl)
lg.DestroySUT(sut)
"""

# A stand-in accuracy script: the official interface (the log's path where {accuracy_log} is) and
# output (`'exact_match': N`, as the gpt-oss script prints its result dict).
STAND_IN = """
import json, sys
log = sys.argv[sys.argv.index("--mlperf-accuracy-file") + 1]
entries = json.load(open(log))
print(f"Evaluated {len(entries)} responses")
if "--no-score" in sys.argv:
    print("no score: the dataset did not load")
else:
    score = float(sys.argv[sys.argv.index("--score") + 1])
    print({"exact_match": score, "tokens_per_sample": 5.5, "num-samples": len(entries)})
"""


def loadgen_run(folder: Path, audit: Path, lengths: list[int]) -> Path:
    """A sealed run folder (as `python -m harness run` leaves one) of a LoadGen performance run
    under `audit`, with a run record naming a dataset and model."""
    run = RunFolder(folder)
    run.open({"mode": "test"})
    lengths_file = folder.parent / f"{folder.name}.lengths.json"
    lengths_file.write_text(json.dumps(lengths))
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(audit), str(folder), str(lengths_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    (folder / "run.json").write_text(json.dumps({"dataset": "/data/gpqa {990}.parquet", "model": "/models/gpt-oss"}))
    run.complete("done")
    return folder


def write_log(path: Path, responses: list[list[int]], token_counts: list[int] | None = None) -> Path:
    """A LoadGen accuracy log: entry i answers qsl_idx i with the int32 ids responses[i]."""
    counts = token_counts or [len(r) for r in responses]
    entries = [
        {
            "seq_id": i,
            "qsl_idx": i,
            "data": b"".join(t.to_bytes(4, "little", signed=True) for t in r).hex().upper(),
            "token_count": n,
        }
        for i, (r, n) in enumerate(zip(responses, counts))
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real LoadGen runs: TEST07 on 990 samples, TEST07 under an audit.config with a tampered seed,
    TEST09 on TEST09_SAMPLES samples of TEST09_LENGTHS tokens."""
    root = tmp_path_factory.mktemp("runs")
    tampered = root / "tampered.audit.config"
    tampered.write_text(AUDIT_CONFIGS["TEST07"].read_text().replace("720381539243781796", "1"))
    return {
        "TEST07": loadgen_run(root / "TEST07", AUDIT_CONFIGS["TEST07"], [3 + i % 5 for i in range(990)]),
        "tampered": loadgen_run(root / "tampered", tampered, [3 + i % 5 for i in range(990)]),
        "TEST09": loadgen_run(root / "TEST09", AUDIT_CONFIGS["TEST09"], TEST09_LENGTHS),
    }


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "stand_in.py"
    path.write_text(STAND_IN)

    def command(*args: str) -> str:
        return f"{sys.executable} {path} --mlperf-accuracy-file {{accuracy_log}} " + " ".join(args)

    return command


@pytest.fixture
def gpt_oss(monkeypatch):
    """gpt-oss-120b's registry entry with its performance set cut to TEST09_SAMPLES samples."""
    entry = next(b for b in ENTRIES if b.name == "gpt-oss-120b")
    rules = replace(entry, dataset_size=TEST09_SAMPLES)
    monkeypatch.setitem(BENCHMARKS, rules.name, rules)
    return rules


def run_dir_copy(run: Path, tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(run, copy)
    return copy


# ---------------------------------------------------------------- the audit configs


@pytest.mark.parametrize("test", ["TEST07", "TEST09"])
def test_our_audit_configs_hold_exactly_the_official_settings(test):
    lines = [
        line.split("=", 1)
        for line in AUDIT_CONFIGS[test].read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {key.strip(): value.strip() for key, value in lines} == OFFICIAL[test]
    assert len(lines) == len(OFFICIAL[test])
    module = {"TEST07": test07, "TEST09": test09}[test]
    assert {f"*.*.{k}": v for k, v in module.OFFICIAL_SETTINGS.items()} == OFFICIAL[test]
    assert read_audit_config(AUDIT_CONFIGS[test]) == module.OFFICIAL_SETTINGS
    assert config_differences(AUDIT_CONFIGS[test], module.OFFICIAL_SETTINGS) == []
    assert test07.THRESHOLD == 60.698 and test09.BOUNDS == (1150.38, 1406.02)


def test_a_tampered_audit_config_is_named(tmp_path):
    path = tmp_path / "audit.config"
    text = AUDIT_CONFIGS["TEST07"].read_text()
    path.write_text(text.replace("test07_accuracy_threshold = 60.698", "test07_accuracy_threshold = 50"))
    assert config_differences(path, test07.OFFICIAL_SETTINGS) == [
        f"{path}: test07_accuracy_threshold = 50, officially 60.698"
    ]
    path.write_text(text.replace("*.*.performance_issue_unique = 1\n", "") + "*.*.min_duration = 5\n")
    differences = config_differences(path, test07.OFFICIAL_SETTINGS)
    assert any("set twice" in d for d in differences), differences
    path.write_text(text.replace("*.*.performance_issue_unique = 1\n", "*.*.max_query_count = 5\n"))
    assert config_differences(path, test07.OFFICIAL_SETTINGS) == [
        f"{path}: performance_issue_unique is missing (officially 1)",
        f"{path}: max_query_count = 5 is not an official setting",
    ]


def test_loadgen_runs_under_our_audit_configs_log_every_sample_once(runs):
    for test, module, samples in (("TEST07", test07, 990), ("TEST09", test09, TEST09_SAMPLES)):
        values, errors = read_detail_log(runs[test] / "mlperf_log_detail.txt")
        assert errors == []
        assert run_setting_differences(values, module.OFFICIAL_SETTINGS) == []
        responses = test09.read_responses(runs[test] / "mlperf_log_accuracy.json")
        assert sorted(responses.qsl_idx) == list(range(samples)) and responses.problems == []
    values, _ = read_detail_log(runs["tampered"] / "mlperf_log_detail.txt")
    assert run_setting_differences(values, test07.OFFICIAL_SETTINGS) == [
        "effective_accuracy_log_rng_seed is 1, not 720381539243781796: the run was not made under the "
        "official audit.config (accuracy_log_rng_seed = 720381539243781796)"
    ]


# ---------------------------------------------------------------- TEST07


def summary07(score, passed) -> str:
    rule = "=" * 80
    return (
        f"\n{rule}\nTEST07 Verification Summary\n{rule}\nAccuracy score: {score}\nAccuracy threshold: 60.698\n"
        f"Accuracy check pass: {passed}\n{'TEST PASS' if passed else 'TEST FAIL'}\n"
    )


def test_test07_passes_at_the_threshold_and_writes_the_official_layout(runs, stand_in, tmp_path):
    out = tmp_path / "Offline"
    assert test07.write_result(runs["TEST07"], out, stand_in("--score 62.1212")) == []
    assert (out / "TEST07" / "verify_accuracy.txt").read_text() == (
        "Evaluated 990 responses\n{'exact_match': 62.1212, 'tokens_per_sample': 5.5, 'num-samples': 990}\n"
        + summary07(62.1212, True)
    )
    for name in (
        "accuracy/mlperf_log_accuracy.json",
        "performance/run_1/mlperf_log_summary.txt",
        "performance/run_1/mlperf_log_detail.txt",
    ):
        source = runs["TEST07"] / Path(name).name
        assert (out / "TEST07" / name).read_bytes() == source.read_bytes()
    assert test07.write_result(runs["TEST07"], tmp_path / "at", stand_in("--score 60.698")) == []


def test_test07_fails_below_the_threshold_or_without_a_score(runs, stand_in, tmp_path):
    failures = test07.write_result(runs["TEST07"], tmp_path / "low", stand_in("--score 60.697"))
    assert failures == ["exact_match 60.697 is below the threshold 60.698"]
    assert (tmp_path / "low" / "TEST07" / "verify_accuracy.txt").read_text().endswith(summary07(60.697, False))
    failures = test07.write_result(runs["TEST07"], tmp_path / "none", stand_in("--no-score"))
    assert failures == [r"the accuracy script printed no score matching 'exact_match':\s*([\d.]+) (exit status 0)"]
    rule = "=" * 80
    assert (tmp_path / "none" / "TEST07" / "verify_accuracy.txt").read_text() == (
        "Evaluated 990 responses\nno score: the dataset did not load\n\n"
        f"{rule}\nTEST07 Verification Summary\n{rule}\nError: Could not parse accuracy score\nTEST FAIL\n"
    )


def test_test07_reads_its_threshold_from_the_audit_config_and_names_a_tampered_one(runs, stand_in, tmp_path):
    config = tmp_path / "audit.config"
    config.write_text(AUDIT_CONFIGS["TEST07"].read_text().replace("= 60.698", "= 50"))
    failures = test07.write_result(runs["TEST07"], tmp_path / "out", stand_in("--score 55"), config)
    assert failures == [f"{config}: test07_accuracy_threshold = 50, officially 60.698"]
    assert (
        "Accuracy threshold: 50.0\nAccuracy check pass: True\nTEST PASS"
        in (tmp_path / "out" / "TEST07" / "verify_accuracy.txt").read_text()
    )


def test_test07_command_takes_the_run_records_dataset_and_model(runs):
    command = test07.run_accuracy_command(runs["TEST07"])
    log = Path("/runs/a b/mlperf_log_accuracy.json")
    assert command.format(accuracy_log=log).split(" ", 1)[1] == (
        "-m accuracy.gpt_oss --mlperf-accuracy-file /runs/a b/mlperf_log_accuracy.json "
        "--dataset '/data/gpqa {990}.parquet' --tokenizer /models/gpt-oss"
    )


def test_test07_cli(runs, stand_in, tmp_path):
    base = [sys.executable, "-m", "compliance.test07", "--logs", str(runs["TEST07"])]
    done = subprocess.run(
        [*base, "--out", str(tmp_path / "a"), "--accuracy-script", stand_in("--score 70")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.endswith(summary07(70.0, True)), done.stderr
    done = subprocess.run(
        [*base, "--out", str(tmp_path / "b"), "--accuracy-script", stand_in("--score 7")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "TEST07: exact_match 7.0 is below the threshold 60.698" in done.stdout
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compliance.test07",
            "--logs",
            str(tmp_path),
            "--out",
            str(tmp_path),
            "--accuracy-script",
            "true",
        ],
        capture_output=True,
        text=True,
    )
    assert (
        done.returncode == 1 and done.stderr.startswith("error: test07: ") and "accuracy log not found" in done.stderr
    )


# ---------------------------------------------------------------- TEST09


def verify09(lengths, passed_low=True, passed_high=True) -> str:
    mean = sum(lengths) / len(lengths)
    std = (sum((x - mean) ** 2 for x in lengths) / len(lengths)) ** 0.5
    rule = "=" * 80
    return (
        f"{rule}\nTEST09: Verify Output Token Length in Performance Mode\n{rule}\n\n"
        f"Output Token Length Statistics\n{'-' * 40}\nTotal samples: {len(lengths)}\n"
        f"Mean output tokens: {mean:.2f}\nMin output tokens: {min(lengths)}\nMax output tokens: {max(lengths)}\n"
        f"Std deviation: {std:.2f}\n\n{rule}\nVerification Results\n{rule}\nMean output tokens: {mean:.2f}\n"
        f"Min threshold: 1150.38\nMax threshold: 1406.02\nMin check pass: {passed_low}\n"
        f"Max check pass: {passed_high}\n\n{'TEST PASS' if passed_low and passed_high else 'TEST FAIL'}\n"
    )


def test_test09_passes_within_the_bounds_and_writes_the_official_layout(runs, tmp_path):
    out = tmp_path / "Offline"
    assert test09.write_result(runs["TEST09"], out) == []
    text = (out / "TEST09" / "verify_output_len.txt").read_text()
    assert text == verify09(TEST09_LENGTHS) and "Mean output tokens: 1275.00\n" in text
    for name in (
        "accuracy/mlperf_log_accuracy.json",
        "performance/run_1/mlperf_log_summary.txt",
        "performance/run_1/mlperf_log_detail.txt",
    ):
        assert (out / "TEST09" / name).read_bytes() == (runs["TEST09"] / Path(name).name).read_bytes()


@pytest.mark.parametrize(
    "lengths, low, high",
    [([1150] * 31 + [1151] * 19, True, True), ([1150] * 10, False, True), ([1406] * 9 + [1407], True, False)],
)
def test_test09_bounds_are_inclusive_on_the_mean(tmp_path, lengths, low, high):
    write_log(tmp_path / "run" / "mlperf_log_accuracy.json", [[5] * n for n in lengths])
    failures = test09.write_result(tmp_path / "run", tmp_path / "out")
    assert (tmp_path / "out" / "TEST09" / "verify_output_len.txt").read_text() == verify09(lengths, low, high)
    assert bool(failures) == (not (low and high))


@pytest.mark.parametrize("lengths", [[900, 1000, 1100, 1200], [1500, 1400, 1450, 1300]], ids=["short", "long"])
def test_test09_fails_outside_the_bounds(tmp_path, lengths):
    write_log(tmp_path / "run" / "mlperf_log_accuracy.json", [[7] * n for n in lengths])
    failures = test09.write_result(tmp_path / "run", tmp_path / "out")
    mean = sum(lengths) / len(lengths)
    assert failures == [f"the mean output length {mean:.2f} tokens over 4 responses is outside [1150.38, 1406.02]"]
    assert (tmp_path / "out" / "TEST09" / "verify_output_len.txt").read_text().endswith("\nTEST FAIL\n")


def test_test09_counts_the_data_bytes_not_token_count(tmp_path):
    # Short responses reported to LoadGen as ~1278 tokens: the mean is the bytes', and the lie is named.
    write_log(tmp_path / "run" / "mlperf_log_accuracy.json", [[3] * 100] * 4, token_counts=[1278] * 4)
    failures = test09.write_result(tmp_path / "run", tmp_path / "out")
    assert (tmp_path / "out" / "TEST09" / "verify_output_len.txt").read_text() == verify09([100] * 4, False)
    assert failures[:1] == ["entry 0 (qsl_idx 0): the response has 100 tokens but n_tokens was 1278"]
    assert failures[-1] == "the mean output length 100.00 tokens over 4 responses is outside [1150.38, 1406.02]"
    # Long-enough responses reported short still pass the length (counted from the bytes), with the lie named.
    write_log(tmp_path / "run2" / "mlperf_log_accuracy.json", [[3] * 1300] * 4, token_counts=[10] * 4)
    failures = test09.write_result(tmp_path / "run2", tmp_path / "out2")
    assert (tmp_path / "out2" / "TEST09" / "verify_output_len.txt").read_text().endswith("\nTEST PASS\n")
    assert len(failures) == 4 and all("n_tokens was 10" in f for f in failures)


def test_test09_counts_bad_entries_as_the_official_script_does(tmp_path):
    log = write_log(tmp_path / "run" / "mlperf_log_accuracy.json", [[1] * 1300] * 3)
    entries = json.loads(log.read_text())
    entries[1]["data"] = "zz"  # not hex: 0 tokens
    entries[2]["data"] += "AB"  # a stray byte: whole ids only
    log.write_text(json.dumps(entries))
    responses = test09.read_responses(log)
    assert responses.lengths == [1300, 0, 1300]
    assert responses.problems == [
        "entry 1 (qsl_idx 1): its data is not hex",
        "entry 2 (qsl_idx 2): its data has 5201 bytes, not a whole number of int32 token ids",
    ]


def test_test09_cli(runs, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "compliance.test09", "--logs", str(runs["TEST09"]), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout == verify09(TEST09_LENGTHS), done.stderr
    write_log(tmp_path / "empty" / "mlperf_log_accuracy.json", [])
    done = subprocess.run(
        [sys.executable, "-m", "compliance.test09", "--logs", str(tmp_path / "empty"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and done.stderr.strip().endswith("no responses were logged")


# ---------------------------------------------------------------- packager, chain and checker


def stand_in_detail_log(mode: str) -> str:
    """A stand-in Offline run's detail log: only the entries that say which run it is."""
    test_mode = {"performance": "PerformanceOnly", "accuracy": "AccuracyOnly"}[mode]
    entries = {"effective_scenario": "Offline", "effective_test_mode": test_mode}
    return "".join(f"{MLLOG_MARKER} {json.dumps({'key': k, 'value': v, 'metadata': {}})}\n" for k, v in entries.items())


def logs_folder(tmp_path: Path, runs: dict, test07_run: Path | None = None) -> tuple[Path, Path]:
    """(a scenario's measurements folder, its build/logs folder) with stand-in performance and
    accuracy runs and the real TEST07 and TEST09 runs."""
    settings = tmp_path / "measurements"
    settings.mkdir()
    for name, text in (("measurements.json", "{}"), ("README.md", "gpt-oss\n"), ("user.conf", "# none\n")):
        (settings / name).write_text(text)
    logs = tmp_path / "logs"
    for mode in ("performance", "accuracy"):
        (logs / mode).mkdir(parents=True, exist_ok=True)
        for name in ("mlperf_log_summary.txt", "mlperf_log_accuracy.json", "accuracy.txt"):
            (logs / mode / name).write_text("[]" if name.endswith(".json") else f"{mode} {name}\n")
        (logs / mode / "mlperf_log_detail.txt").write_text(stand_in_detail_log(mode))
    shutil.copytree(test07_run or runs["TEST07"], logs / "TEST07")
    shutil.copytree(runs["TEST09"], logs / "TEST09")
    return settings, logs


def sealed_logs_folder(tmp_path: Path, runs: dict) -> tuple[Path, Path]:
    """logs_folder's, its stand-in runs sealed as complete, each accuracy.txt of the log beside it."""
    settings, logs = logs_folder(tmp_path, runs)
    for mode in ("performance", "accuracy"):
        files = {p.name: p.read_bytes() for p in (logs / mode).iterdir()}
        files["accuracy.txt"] = f"hash={hashlib.sha256(files['mlperf_log_accuracy.json']).hexdigest()}\n".encode()
        run = RunFolder(logs / mode)
        run.open({})
        for name, data in files.items():
            (logs / mode / name).write_bytes(data)
        run.complete("done")
    return settings, logs


def packaged(tmp_path: Path, runs: dict, stand_in, score: str = "62.5") -> Path:
    """A results/<system>/gpt-oss-120b/Offline folder as the packager fills it (no TEST06 here, so
    no system is asked for its EOS ids)."""
    settings, logs = logs_folder(tmp_path, runs)
    scenario_dir = tmp_path / "results" / "gpt-oss-120b" / "Offline"
    # The accuracy command comes from the TEST07 run's run.json (the test below): here the stand-in's.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(test07, "run_accuracy_command", lambda run_dir: stand_in(f"--score {score}"))
        failures = package.package_scenario(None, "gpt-oss-120b", "Offline", settings, logs, scenario_dir)
    assert failures == (
        [] if float(score) >= 60.698 else [f"TEST07: exact_match {score} is below the threshold 60.698"]
    )
    return scenario_dir


def errors_of(scenario_dir: Path, rules, demo: bool = False) -> check.Report:
    report = check.Report(demo)
    check.check_test07(scenario_dir, rules, scenario_dir.name, report)
    check.check_test09(scenario_dir, rules, scenario_dir.name, report)
    return report


def test_the_chain_runs_test07_and_test09_for_gpt_oss_and_the_others_as_before(gpt_oss):
    assert package.run_modes("gpt-oss-120b") == ("performance", "accuracy", "TEST07", "TEST09")
    for name in ("llama3.1-8b", "llama3.1-8b-edge", "llama2-70b-99.9"):
        assert package.run_modes(name) == submission.MODES == ("performance", "accuracy", "TEST06")
    readme = package.benchmark_readme("gpt-oss-120b", "gpt-oss-120b", type("S", (), {"name": "sys"})())
    assert "--mode {performance | accuracy | TEST07 | TEST09}" in readme


def test_packaged_folders_pass_our_checker(gpt_oss, runs, stand_in, tmp_path):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    for test, name in (("TEST07", "verify_accuracy.txt"), ("TEST09", "verify_output_len.txt")):
        for path in (
            name,
            "accuracy/mlperf_log_accuracy.json",
            "performance/run_1/mlperf_log_detail.txt",
            "performance/run_1/mlperf_log_summary.txt",
        ):
            assert (scenario_dir / test / path).is_file()
        assert "TEST PASS" in (scenario_dir / test / name).read_text()  # the official checker's test
    report = errors_of(scenario_dir, gpt_oss)
    assert report.errors == [] and report.warnings == []


def test_the_packager_needs_complete_test07_and_test09_runs(gpt_oss, runs, tmp_path):
    settings, logs = sealed_logs_folder(tmp_path, runs)
    package.check_runs("gpt-oss-120b", "Offline", settings, logs)
    (logs / "TEST09" / "mlperf_log_accuracy.json").write_text("[]")
    with pytest.raises(package.PackagingError, match=r"TEST09/mlperf_log_accuracy.json: changed since its run"):
        package.check_runs("gpt-oss-120b", "Offline", settings, logs)
    shutil.rmtree(logs / "TEST09")
    with pytest.raises(package.PackagingError, match=r"TEST09: no such run folder"):
        package.check_runs("gpt-oss-120b", "Offline", settings, logs)


# (its values planted in a TEST07 or TEST09 run's detail log, the mismatch named)
OTHER_RUNS = {
    "accuracy mode": (
        {"effective_test_mode": "AccuracyOnly"},
        "effective_test_mode is 'AccuracyOnly', not 'PerformanceOnly'",
    ),
    "Server scenario": ({"effective_scenario": "Server"}, "effective_scenario is 'Server', not 'Offline'"),
}


@pytest.mark.parametrize("test", ["TEST07", "TEST09"])
@pytest.mark.parametrize("other", sorted(OTHER_RUNS))
def test_the_packager_refuses_a_test_run_of_another_mode_or_scenario(gpt_oss, runs, tmp_path, test, other):
    """TEST07 and TEST09 runs are performance runs (their audit.config's mode = 2) of their folder's scenario."""
    settings, logs = sealed_logs_folder(tmp_path, runs)
    values, mismatch = OTHER_RUNS[other]
    set_detail_values(logs / test / "mlperf_log_detail.txt", values)
    reseal(logs / test)
    refusal = rf"^{re.escape(str(logs / test))} holds no Offline {test} run of gpt-oss-120b: {mismatch}; run it again"
    with pytest.raises(package.PackagingError, match=refusal):
        package.check_runs("gpt-oss-120b", "Offline", settings, logs)


@pytest.mark.parametrize("test", ["TEST07", "TEST09"])
@pytest.mark.parametrize("other", sorted(OTHER_RUNS))
def test_checker_names_a_test_run_of_another_mode_or_scenario_once(gpt_oss, runs, stand_in, tmp_path, test, other):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    detail = scenario_dir / test / "performance" / "run_1" / "mlperf_log_detail.txt"
    values, mismatch = OTHER_RUNS[other]
    set_detail_values(detail, values)
    assert errors_of(scenario_dir, gpt_oss).errors == [
        f"{detail}: [run-identity] {mismatch}: the log is not of this folder's {test} run"
    ]


@pytest.mark.parametrize("test, name", [("TEST07", "verify_accuracy.txt"), ("TEST09", "verify_output_len.txt")])
def test_checker_catches_a_missing_verify_file(gpt_oss, runs, stand_in, tmp_path, test, name):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    (scenario_dir / test / name).unlink()
    report = check.Report(False)
    check.check_scenario(scenario_dir, gpt_oss, gpt_oss.targets(), report)
    assert f"{scenario_dir / test / name}: [required-file] missing" in report.errors
    assert not [e for e in report.errors if "[TEST07]" in e or "[TEST09]" in e]


def test_checker_recomputes_test09s_mean_behind_a_passing_verify_file(gpt_oss, runs, stand_in, tmp_path):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    log = scenario_dir / "TEST09" / "accuracy" / "mlperf_log_accuracy.json"
    short = [n - 300 for n in TEST09_LENGTHS]  # mean 975
    write_log(log, [[1] * n for n in short])
    errors = errors_of(scenario_dir, gpt_oss).errors
    assert errors == [
        f"{log}: [TEST09] the mean output length, counted from the logged responses, is 975.00 tokens, outside "
        "[1150.38, 1406.02]",
        f"{scenario_dir / 'TEST09' / 'verify_output_len.txt'}: [TEST09] is not what the logged responses give at "
        "the official bounds (mean 975.00 over 64 responses, thresholds 1150.38 and 1406.02)",
    ]
    # Responses as long as before but reported to LoadGen longer: the lie is named.
    write_log(log, [[1] * n for n in TEST09_LENGTHS], token_counts=[n + 1 for n in TEST09_LENGTHS])
    errors = errors_of(scenario_dir, gpt_oss).errors
    assert len(errors) == TEST09_SAMPLES and "the response has 1100 tokens but n_tokens was 1101" in errors[0]


def test_checker_catches_edited_test09_numbers_and_a_cut_log(gpt_oss, runs, stand_in, tmp_path):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    verify = scenario_dir / "TEST09" / "verify_output_len.txt"
    verify.write_text(verify.read_text().replace("Max threshold: 1406.02", "Max threshold: 2000"))
    errors = errors_of(scenario_dir, gpt_oss).errors
    assert len(errors) == 1 and errors[0].startswith(f"{verify}: [TEST09] is not what the logged responses give")
    log = scenario_dir / "TEST09" / "accuracy" / "mlperf_log_accuracy.json"
    package.truncate_accuracy_log(runs["TEST09"] / "mlperf_log_accuracy.json", log)
    assert errors_of(scenario_dir, gpt_oss).errors == [
        f"{log}: [TEST09] cut to its two ends: the checks need every logged response (check before truncating)"
    ]


def test_checker_catches_test09_coverage_outside_the_demo(gpt_oss, runs, stand_in, tmp_path, monkeypatch):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    rules = replace(gpt_oss, dataset_size=6396)
    log = scenario_dir / "TEST09" / "accuracy" / "mlperf_log_accuracy.json"
    message = f"{log}: [TEST09] logs 64 distinct samples, not the dataset's 6396"
    assert errors_of(scenario_dir, rules).errors == [message]
    demo = errors_of(scenario_dir, rules, demo=True)
    assert demo.errors == [] and demo.warnings == [message]


def test_checker_catches_a_test07_score_below_the_threshold_or_edited(gpt_oss, runs, stand_in, tmp_path):
    scenario_dir = packaged(tmp_path, runs, stand_in, score="60.5")
    verify = scenario_dir / "TEST07" / "verify_accuracy.txt"
    assert errors_of(scenario_dir, gpt_oss).errors == [
        f"{verify}: [TEST07] does not say 'Accuracy check pass: True' and 'TEST PASS'",
        f"{verify}: [TEST07] exact_match 60.5 is below the threshold 60.698",
    ]
    # The summary edited to pass, the script's output left: caught.
    verify.write_text(verify.read_text().replace(summary07(60.5, False), summary07(61.5, True)))
    assert errors_of(scenario_dir, gpt_oss).errors == [
        f"{verify}: [TEST07] the accuracy script's output says 'exact_match': 60.5, the summary 61.5"
    ]


def test_checker_catches_a_test07_verified_at_a_tampered_threshold(gpt_oss, runs, stand_in, tmp_path):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    config = tmp_path / "audit.config"
    config.write_text(AUDIT_CONFIGS["TEST07"].read_text().replace("= 60.698", "= 50"))
    test07.write_result(runs["TEST07"], scenario_dir, stand_in("--score 55"), config)
    verify = scenario_dir / "TEST07" / "verify_accuracy.txt"
    assert "TEST PASS" in verify.read_text()
    assert errors_of(scenario_dir, gpt_oss).errors == [
        f"{verify}: [TEST07] threshold '50.0' is not the official 60.698 (compliance/TEST07/gpt-oss-120b/audit.config)",
        f"{verify}: [TEST07] exact_match 55.0 is below the threshold 60.698",
    ]


def test_checker_catches_a_test07_run_under_a_tampered_audit_config(gpt_oss, runs, stand_in, tmp_path):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    assert test07.write_result(runs["tampered"], scenario_dir, stand_in("--score 62.5")) == []
    detail = scenario_dir / "TEST07" / "performance" / "run_1" / "mlperf_log_detail.txt"
    assert errors_of(scenario_dir, gpt_oss).errors == [
        f"{detail}: [TEST07] effective_accuracy_log_rng_seed is 1, not 720381539243781796: the run was not made "
        "under the official audit.config (accuracy_log_rng_seed = 720381539243781796)"
    ]


def test_checker_catches_a_test07_log_missing_samples(gpt_oss, runs, stand_in, tmp_path):
    scenario_dir = packaged(tmp_path, runs, stand_in)
    log = scenario_dir / "TEST07" / "accuracy" / "mlperf_log_accuracy.json"
    entries = json.loads(log.read_text())
    log.write_text(json.dumps(entries[:500] + entries[:490]))  # 990 entries, 500 samples
    assert errors_of(scenario_dir, gpt_oss).errors == [
        f"{log}: [TEST07] logs 500 distinct samples, not the compliance set's 990"
    ]


# ---------------------------------------------------------------- the official scripts


def official_script(test: str, tmp_path: Path) -> Path:
    source = Path(os.environ["MLPERF_INFERENCE"])
    path = tmp_path / f"{test}_run_verification.py"
    if (source / "compliance" / test / "run_verification.py").is_file():
        shutil.copy(source / "compliance" / test / "run_verification.py", path)
    else:  # a git directory
        done = subprocess.run(
            ["git", "--git-dir", str(source), "show", f"HEAD:compliance/{test}/run_verification.py"],
            capture_output=True,
            text=True,
            check=True,
        )
        path.write_text(done.stdout)
    return path


@pytest.mark.skipif("MLPERF_INFERENCE" not in os.environ, reason="MLPERF_INFERENCE (mlcommons/inference) not set")
@pytest.mark.parametrize("score", ["62.1212", "60.698", "60.697", "none"])
def test_test07_writes_what_the_official_script_writes(runs, stand_in, tmp_path, score):
    script = official_script("TEST07", tmp_path)
    command = stand_in("--no-score" if score == "none" else f"--score {score}")
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(
        [
            sys.executable,
            script,
            "-c",
            runs["TEST07"],
            "-o",
            tmp_path / "official",
            "--accuracy-script",
            command,
            "--audit-config",
            AUDIT_CONFIGS["TEST07"],
        ],
        cwd=work,
        capture_output=True,
        check=True,
    )
    test07.write_result(runs["TEST07"], tmp_path / "ours", command)
    assert_same_tree(tmp_path / "official", tmp_path / "ours")


@pytest.mark.skipif("MLPERF_INFERENCE" not in os.environ, reason="MLPERF_INFERENCE (mlcommons/inference) not set")
@pytest.mark.parametrize("case", ["run", "short", "long", "lying", "bad-entries"])
def test_test09_writes_what_the_official_script_writes(runs, tmp_path, case):
    script = official_script("TEST09", tmp_path)
    run = runs["TEST09"]
    if case != "run":
        run = tmp_path / "run"
        lengths = {"short": [900, 1000, 1100], "long": [1500, 1400], "lying": [100] * 3, "bad-entries": [1300] * 3}
        log = write_log(run / "mlperf_log_accuracy.json", [[2] * n for n in lengths[case]], [1278] * len(lengths[case]))
        if case == "bad-entries":
            entries = json.loads(log.read_text())
            entries[1]["data"], entries[2]["data"] = "zz", entries[2]["data"] + "AB"
            log.write_text(json.dumps(entries))
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(
        [sys.executable, script, "-c", run, "-o", tmp_path / "official", "--audit-config", AUDIT_CONFIGS["TEST09"]],
        cwd=work,
        capture_output=True,
    )
    test09.write_result(run, tmp_path / "ours")
    assert_same_tree(tmp_path / "official", tmp_path / "ours")


def assert_same_tree(official: Path, ours: Path) -> None:
    files = sorted(p.relative_to(official) for p in official.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file())
    assert files
    for name in files:
        assert (official / name).read_bytes() == (ours / name).read_bytes(), name

"""Every detail log's run is the run of its folder (compliance/run_identity.py): a log run in another
LoadGen mode, scenario or benchmark, planted in a copy of the tiny chain's tree (tests/tiny_system.py)
or of its run folders, is named by the checker and refused by the packager before it writes anything.
(gpt-oss-120b's TEST07 and TEST09 folders: tests/test_test07_test09.py.)"""

import json
import re
import shutil

import pytest

from compliance.check import check_tree
from compliance.package import PackagingError, package
from compliance.run_identity import expected_test_mode
from harness.config import MODES
from systems.benchmarks import BENCHMARKS
from tests.helpers import set_detail_values
from tests.tiny_system import reseal

RESULTS = "open/TestOrg/results/tiny/tiny-llama"
LOGS = "build/logs/tiny/llama3.1-8b"
# TTFT/TPOT limits in ns as LoadGen logs them: llama3.1-8b's Interactive ones, and llama2-70b's Server ones.
INTERACTIVE_8B = {"requested_server_ttft_latency": 500_000_000, "requested_server_tpot_latency": 30_000_000}
SERVER_70B = {"requested_server_ttft_latency": 2_000_000_000, "requested_server_tpot_latency": 200_000_000}

# (scenario, run folder, the values planted in its detail log, the mismatch named)
PLANTED = {
    "performance run in accuracy mode": (
        "Offline",
        "performance",
        {"effective_test_mode": "AccuracyOnly"},
        r"effective_test_mode is 'AccuracyOnly', not 'PerformanceOnly'",
    ),
    "accuracy run in performance mode": (
        "Server",
        "accuracy",
        {"effective_test_mode": "PerformanceOnly"},
        r"effective_test_mode is 'PerformanceOnly', not 'AccuracyOnly'",
    ),
    "TEST06 run in accuracy mode": (
        "Server",
        "TEST06",
        {"effective_test_mode": "AccuracyOnly"},
        r"effective_test_mode is 'AccuracyOnly', not 'PerformanceOnly'",
    ),
    "Offline run in the Server folder": (
        "Server",
        "accuracy",
        {"effective_scenario": "Offline"},
        r"effective_scenario is 'Offline', not 'Server'",
    ),
    "Server run in the Offline folder": (
        "Offline",
        "TEST06",
        {"effective_scenario": "Server"},
        r"effective_scenario is 'Server', not 'Offline'",
    ),
    "Interactive run in the Server folder": (
        "Server",
        "accuracy",
        INTERACTIVE_8B,
        r"LoadGen ran with TTFT/TPOT limits 500/30 ms, not the Server limits 2000/100 ms of llama3.1-8b",
    ),
    "another benchmark's run": (
        "Server",
        "accuracy",
        SERVER_70B,
        r"LoadGen ran with TTFT/TPOT limits 2000/200 ms, not the Server limits 2000/100 ms of llama3.1-8b",
    ),
}
# The official TEST06 folder holds no detail log: only the packager sees its run's.
IN_THE_TREE = {name: planted for name, planted in PLANTED.items() if planted[1] != "TEST06"}


def test_each_folders_mode_is_the_one_the_harness_gives_loadgen():
    """The expected modes come from the facts the runs are made with: the harness's --mode (compliance
    tests: their audit.config's mode = 2), so TEST06, TEST07 and TEST09 are performance runs."""
    assert {mode: expected_test_mode(mode) for mode in MODES} == {mode: MODES[mode].name for mode in MODES}
    assert {expected_test_mode(test) for test in ("TEST06", "TEST07", "TEST09")} == {"PerformanceOnly"}


def test_the_limits_tell_each_benchmark_and_scenario_apart():
    """What makes the logged TTFT/TPOT limits a trace of the benchmark and of Server or Interactive."""
    limits = [rules.latency_limits_ms[s] for rules in BENCHMARKS.values() for s in rules.latency_limits_ms]
    assert len(limits) >= 8 and len(set(limits)) == len(limits)


@pytest.mark.parametrize("defect", sorted(IN_THE_TREE))
def test_the_checker_names_a_log_of_another_run(chain, tmp_path, defect):
    _, tree, _ = chain
    copy = tmp_path / "submission"
    shutil.copytree(tree, copy)
    scenario, run, values, mismatch = IN_THE_TREE[defect]
    log = f"{scenario}/{run}/{'run_1/' if run == 'performance' else ''}mlperf_log_detail.txt"
    set_detail_values(copy / RESULTS / log, values)
    errors = check_tree(copy, demo=True).errors
    message = rf"{re.escape(log)}: \[run-identity\] {mismatch}: the log is not of this folder's {run} run$"
    assert any(re.search(message, e) for e in errors), (defect, errors)


def _repo_copy(chain, tmp_path):
    root, _, _ = chain
    copy_root = tmp_path / "repo"
    shutil.copytree(root, copy_root, ignore=shutil.ignore_patterns("submission"))
    return copy_root


@pytest.mark.parametrize("defect", sorted(PLANTED))
def test_the_packager_refuses_a_log_of_another_run_before_writing(chain, tmp_path, defect):
    copy_root, out = _repo_copy(chain, tmp_path), tmp_path / "submission"
    scenario, run, values, mismatch = PLANTED[defect]
    folder = copy_root / LOGS / scenario / run
    set_detail_values(folder / "mlperf_log_detail.txt", values)
    reseal(folder)  # as if the run had logged it: the run-folder check passes, this one must not
    refusal = rf"^{re.escape(str(folder))} holds no {scenario} {run} run of llama3\.1-8b: {mismatch}; run it again"
    with pytest.raises(PackagingError, match=refusal):
        package("tiny", out, root=copy_root)
    assert not out.exists()


def test_the_packager_refuses_a_run_recorded_for_another_benchmark(chain, tmp_path):
    """An Offline log names no benchmark; the harness's run record beside it does."""
    copy_root, out = _repo_copy(chain, tmp_path), tmp_path / "submission"
    folder = copy_root / LOGS / "Offline" / "accuracy"
    record = json.loads((folder / "run.json").read_text())
    assert record["benchmark"] == "llama3.1-8b"
    (folder / "run.json").write_text(json.dumps({**record, "benchmark": "llama2-70b-99.9"}))
    reseal(folder)
    refusal = r"Offline accuracy run of llama3\.1-8b: its run\.json names the benchmark 'llama2-70b-99\.9'; run it"
    with pytest.raises(PackagingError, match=refusal):
        package("tiny", out, root=copy_root)
    assert not out.exists()


def test_the_chains_runs_are_each_their_folders(chain, tmp_path):
    """The good chain packages again, and its tree has no run-identity failure."""
    copy_root, out = _repo_copy(chain, tmp_path), tmp_path / "submission"
    _, failures = package("tiny", out, root=copy_root)
    assert failures == []
    assert not [e for e in check_tree(out, demo=True).errors if "[run-identity]" in e]

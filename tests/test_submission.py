"""The submission chain on a tiny model, through the same functions `python -m harness run` and
`make submission` call: Offline and Server performance, accuracy and TEST06 runs (Server with 480
queries, enough for early stopping), the packaged tree, and our checker: the good tree passes, and
each planted defect is caught with a message naming it."""

import json
import math
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from compliance.check import check_tree
from compliance.loadgen_logs import MLLOG_MARKER, read_detail_log
from compliance.package import PackagingError, package
from systems.benchmarks import loadgen_double
from systems.schema import REPO
from tests.helpers import process_alive
from tests.tiny_system import NUM_SAMPLES, USER_CONF, harness_run, reseal, start_run


def test_cli_runs_are_valid_and_accurate(chain):
    root, _, verdicts = chain
    for scenario in ("Offline", "Server"):
        assert verdicts[scenario, "performance"].startswith(f"{scenario} performance: VALID"), verdicts
        assert verdicts[scenario, "accuracy"].startswith(f"{scenario} accuracy: PASS"), verdicts
    detail = (root / "build/logs/tiny/llama3.1-8b/Server/performance/mlperf_log_detail.txt").read_text()
    assert re.search(r'"key": "result_validity", "value": "VALID"', detail)
    assert int(re.search(r'"key": "generated_query_count", "value": (\d+)', detail).group(1)) >= 460


def test_good_tree_passes_the_checker(chain):
    _, tree, _ = chain
    report = check_tree(tree, demo=True)
    assert report.errors == []
    # Without --demo only the rules the demo knowingly shortens fail.
    strict = check_tree(tree, demo=False)
    assert strict.errors and all(re.search(r"\[(min-duration|sample-count|dataset-size)\]", e) for e in strict.errors)
    assert any("effective_accuracy_sample_count 24 is not the dataset size 13368" in e for e in strict.errors)
    assert len(strict.errors) == len(report.warnings)
    org = tree / "open" / "TestOrg"
    assert json.loads((org / "model_mapping.json").read_text()) == {"tiny-llama": "llama3.1-8b"}
    scenario = org / "results" / "tiny" / "tiny-llama" / "Server"
    assert (scenario / "TEST06" / "verify_accuracy.txt").read_text() == (
        "First token check pass: True\nEOS check pass: True\nSample length check pass: True\n"
        "TEST06 verification complete\n"
    )
    assert (scenario / "accuracy" / "mlperf_log_accuracy.json").stat().st_size <= 10240
    assert re.search(r"^hash=[0-9a-f]{64}$", (scenario / "accuracy" / "accuracy.txt").read_text(), re.MULTILINE)
    assert "saaf_harness" not in json.loads((org / "systems" / "tiny.json").read_text())
    assert (
        "python -m harness run --system tiny --benchmark llama3.1-8b" in (org / "src/tiny-llama/README.md").read_text()
    )


def _set_detail_value(path, key, value):
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith(MLLOG_MARKER):
            entry = json.loads(line[len(MLLOG_MARKER) :])
            if entry["key"] == key:
                entry["value"] = value
                line = MLLOG_MARKER + " " + json.dumps(entry)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def _edit_test06_log(scenario_dir, edit):
    path = scenario_dir / "TEST06" / "accuracy" / "mlperf_log_accuracy.json"
    entries = json.loads(path.read_text())
    edit(entries[0])
    path.write_text(json.dumps(entries))


def _int32_hex(ids):
    return "".join(i.to_bytes(4, "little").hex().upper() for i in ids)


def _wrong_first_token(entry):
    entry["token_data"] = _int32_hex([int.from_bytes(bytes.fromhex(entry["token_data"]), "little") ^ 1])


def _two_trailing_eos(entry):
    entry["data"] += _int32_hex([2, 2])
    entry["token_count"] += 2


def _n_tokens_off_by_one(entry):
    entry["token_count"] += 1


def _prepend_detail_entry(path, key, value):
    """A second entry for `key`, logged before LoadGen's own one."""
    lines = path.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(MLLOG_MARKER))
    entry = dict(json.loads(lines[first][len(MLLOG_MARKER) :]), key=key, value=value)
    lines.insert(first, MLLOG_MARKER + " " + json.dumps(entry))
    path.write_text("\n".join(lines) + "\n")


def _append_detail_entry(path, key, value, is_error=False):
    entry = {
        "key": key,
        "value": value,
        "time_ms": 0,
        "namespace": "mlperf::logging",
        "event_type": "POINT_IN_TIME",
        "metadata": {"is_error": is_error, "is_warning": False, "file": "x.cc", "line_no": 1, "pid": 1, "tid": 1},
    }
    with open(path, "a") as f:
        f.write(MLLOG_MARKER + " " + json.dumps(entry) + "\n")


def _edit_text(path, old, new):
    text = path.read_text()
    assert re.search(old, text), (old, text)
    path.write_text(re.sub(old, new, text, count=1))


def _edit_system(path, **fields):
    system = json.loads(path.read_text())
    system.update(fields)
    path.write_text(json.dumps(system))


S = "results/tiny/tiny-llama/Server"
O = "results/tiny/tiny-llama/Offline"
DEFECTS = {
    "missing required file": (
        lambda org: (org / S / "user.conf").unlink(),
        r"Server/user.conf: \[required-file\] missing",
    ),
    "missing required scenario": (
        lambda org: shutil.rmtree(org / S),
        r"\[required-scenarios\] has \['Offline'\]; llama3.1-8b needs \['Offline'\] and one of",
    ),
    "wrong seed": (
        lambda org: _set_detail_value(
            org / O / "performance/run_1/mlperf_log_detail.txt", "effective_qsl_rng_seed", 12345
        ),
        r"\[seeds\] effective_qsl_rng_seed is 12345, not the v6.1 seed",
    ),
    "INVALID run": (
        lambda org: _set_detail_value(
            org / S / "performance/run_1/mlperf_log_detail.txt", "result_validity", "INVALID"
        ),
        r"\[latency-validity-audit\] LoadGen result is INVALID, not VALID",
    ),
    "p99 TPOT above the limit": (
        lambda org: _set_detail_value(
            org / S / "performance/run_1/mlperf_log_detail.txt",
            "result_time_per_output_token_99.00_percentile_ns",
            150_000_000,
        ),
        r"p99 TPOT 150.0 ms is not below the Server limit of 100 ms",
    ),
    "Interactive measured against Server limits": (
        lambda org: (org / S).rename(org / S.replace("Server", "Interactive")),
        r"not the Interactive limits 500/30 ms",
    ),
    "first-token mismatch": (
        lambda org: _edit_test06_log(org / S, _wrong_first_token),
        r"\[TEST06\] qsl_idx \d+: first-token response .* is not the start of the response",
    ),
    "two trailing EOS": (
        lambda org: _edit_test06_log(org / S, _two_trailing_eos),
        r"\[TEST06\] qsl_idx \d+: the response ends in more than one EOS token",
    ),
    "n_tokens off by one": (
        lambda org: _edit_test06_log(org / O, _n_tokens_off_by_one),
        r"\[TEST06\] qsl_idx \d+: response has (\d+) tokens but n_tokens was (\d+)",
    ),
    "accuracy under target": (
        lambda org: _edit_text(org / O / "accuracy/accuracy.txt", r"'rouge1': [\d.]+", "'rouge1': 50.0"),
        r"\[accuracy-target\] rouge1 = 50.0 is not >= 79.2000",
    ),
    "np.float64 in accuracy.txt": (
        lambda org: _edit_text(org / O / "accuracy/accuracy.txt", r"'rouge2': ([\d.]+)", r"'rouge2': np.float64(\1)"),
        r"accuracy.txt: \[accuracy-pattern\] numbers print as numpy reprs",
    ),
    "empty required system field": (
        lambda org: _edit_system(org / "systems/tiny.json", cooling=""),
        r"tiny.json: \[system\] required field 'cooling' is empty",
    ),
    "a count of 0 as a number": (
        lambda org: _edit_system(org / "systems/tiny.json", accelerators_per_node=0),
        r"tiny.json: \[system\] required field 'accelerators_per_node' is empty",
    ),
    "division contradicted by the system file": (
        lambda org: _edit_system(org / "systems/tiny.json", division="closed"),
        r"\[system\] division 'closed' contradicts the path's division 'open'",
    ),
    "datacenter benchmark on an edge system": (
        lambda org: _edit_system(org / "systems/tiny.json", system_type="edge"),
        r"results/tiny/tiny-llama: \[system-type\] llama3.1-8b is not a benchmark of a 'edge' system; it needs a "
        r"system_type of datacenter",
    ),
    "edge benchmark on a datacenter system": (
        lambda org: (org / "model_mapping.json").write_text(json.dumps({"tiny-llama": "llama3.1-8b-edge"})),
        r"results/tiny/tiny-llama: \[system-type\] llama3.1-8b-edge is not a benchmark of a 'datacenter' system; "
        r"it needs a system_type of edge",
    ),
    "a scenario the benchmark does not allow": (
        lambda org: shutil.copytree(org / O, org / O.replace("Offline", "SingleStream")),
        r"tiny-llama/SingleStream: \[allowed-scenarios\] llama3.1-8b on a 'datacenter' system allows only "
        r"\['Interactive', 'Offline', 'Server'\]",
    ),
    "a repeated key: the first entry counts": (
        lambda org: _prepend_detail_entry(
            org / O / "performance/run_1/mlperf_log_detail.txt", "effective_sample_index_rng_seed", 777
        ),
        r"Offline/performance/run_1/mlperf_log_detail.txt: \[seeds\] effective_sample_index_rng_seed is 777",
    ),
    "a LoadGen error logged after the results": (
        lambda org: _append_detail_entry(
            org / O / "accuracy/mlperf_log_detail.txt",
            "error_runtime",
            "Number of tokens need to be greater than 1",
            is_error=True,
        ),
        r"Offline/accuracy/mlperf_log_detail.txt: \[loadgen-errors\] LoadGen logged an error: error_runtime: "
        r"Number of tokens need to be greater than 1",
    ),
    "no per-benchmark README in src/": (
        lambda org: (org / "src/tiny-llama/README.md").unlink(),
        r"src/tiny-llama/README.md: \[structure\] missing or empty",
    ),
}
# Rules the demo knowingly shortens: errors without --demo, warnings with it.
DEMO_SHORTENED_DEFECTS = {
    "shortened accuracy run": (
        lambda org: _set_detail_value(
            org / O / "accuracy/mlperf_log_detail.txt", "effective_accuracy_sample_count", 10
        ),
        r"Offline/accuracy/mlperf_log_detail.txt: \[dataset-size\] effective_accuracy_sample_count 10 is not the "
        r"dataset size 13368",
    ),
    "equal-issue mode off": (
        lambda org: _set_detail_value(
            org / S / "performance/run_1/mlperf_log_detail.txt", "effective_sample_concatenate_permutation", False
        ),
        r"Server/performance/run_1/mlperf_log_detail.txt: \[equal-issue\] effective_sample_concatenate_permutation is "
        r"False; mlperf.conf sets llama3_1-8b.\*.sample_concatenate_permutation = 1",
    ),
}
# Changes after which the tree still passes.
GOOD_VARIANTS = {
    "a datacenter,edge system": lambda org: _edit_system(org / "systems/tiny.json", system_type="datacenter,edge"),
    "a later repeat of a key": lambda org: _append_detail_entry(
        org / O / "performance/run_1/mlperf_log_detail.txt", "result_validity", "INVALID"
    ),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_planted_defect_is_caught_and_named(chain, tmp_path, defect):
    _, tree, _ = chain
    copy = tmp_path / "submission"
    shutil.copytree(tree, copy)
    plant, message = DEFECTS[defect]
    plant(copy / "open" / "TestOrg")
    errors = check_tree(copy, demo=True).errors
    assert any(re.search(message, e) for e in errors), (defect, errors)


@pytest.mark.parametrize("defect", sorted(DEMO_SHORTENED_DEFECTS))
def test_each_demo_shortened_defect_is_an_error_outside_the_demo(chain, tmp_path, defect):
    _, tree, _ = chain
    copy = tmp_path / "submission"
    shutil.copytree(tree, copy)
    plant, message = DEMO_SHORTENED_DEFECTS[defect]
    assert not any(re.search(message, e) for e in check_tree(copy, demo=False).errors)
    plant(copy / "open" / "TestOrg")
    demo, strict = check_tree(copy, demo=True), check_tree(copy, demo=False)
    assert not any(re.search(message, e) for e in demo.errors), (defect, demo.errors)
    assert any(re.search(message, w) for w in demo.warnings), (defect, demo.warnings)
    assert any(re.search(message, e) for e in strict.errors), (defect, strict.errors)


@pytest.mark.parametrize("variant", sorted(GOOD_VARIANTS))
def test_good_variants_pass(chain, tmp_path, variant):
    _, tree, _ = chain
    copy = tmp_path / "submission"
    shutil.copytree(tree, copy)
    GOOD_VARIANTS[variant](copy / "open" / "TestOrg")
    assert check_tree(copy, demo=True).errors == []


def test_detail_log_reads_as_the_official_parser(tmp_path):
    log = tmp_path / "mlperf_log_detail.txt"
    for key, value, is_error in [
        ("result_validity", "VALID", False),
        ("error_runtime", "a", True),
        ("result_validity", "INVALID", False),
        ("error_runtime", "b", True),
    ]:
        _append_detail_entry(log, key, value, is_error)
    values, errors = read_detail_log(log)
    assert values == {"result_validity": "VALID", "error_runtime": "a"}
    assert errors == ["error_runtime: a", "error_runtime: b"]


def test_packaging_another_system_keeps_the_tree(chain, tmp_path):
    """A second system, with its own substituted model for the same benchmark, packaged into the
    same tree: both results folders, both model_mapping.json entries and both src READMEs stay."""
    root, tree, _ = chain
    copy_root, copy = tmp_path / "repo", tmp_path / "submission"
    shutil.copytree(root, copy_root, ignore=shutil.ignore_patterns("submission"))
    shutil.copytree(tree, copy)
    system = json.loads((copy_root / "systems/tiny.json").read_text())
    system["saaf_harness"]["model_name"] = "tiny-llama-2"
    (copy_root / "systems/tiny2.json").write_text(json.dumps(system))
    shutil.copytree(copy_root / "measurements/tiny", copy_root / "measurements/tiny2")
    shutil.copytree(copy_root / "build/logs/tiny", copy_root / "build/logs/tiny2")
    org, failures = package("tiny2", copy, root=copy_root)
    assert not failures
    assert json.loads((org / "model_mapping.json").read_text()) == {
        "tiny-llama": "llama3.1-8b",
        "tiny-llama-2": "llama3.1-8b",
    }
    for system_name, name in (("tiny", "tiny-llama"), ("tiny2", "tiny-llama-2")):
        assert (org / "results" / system_name / name / "Server" / "accuracy" / "accuracy.txt").is_file()
        assert (org / "src" / name / "README.md").is_file()
    assert check_tree(copy, demo=True).errors == []
    # One substituted model_name for two benchmarks would put both in one results folder.
    system["saaf_harness"]["datasets"]["llama2-70b-99.9"] = system["saaf_harness"]["datasets"]["llama3.1-8b"]
    (copy_root / "systems/tiny3.json").write_text(json.dumps(system))
    with pytest.raises(PackagingError, match="one model_name 'tiny-llama-2' for the benchmarks"):
        package("tiny3", copy, root=copy_root)


def test_packaging_takes_the_runs_user_conf_and_notes_a_left_out_scenario(chain, tmp_path):
    """Where the chain calibrated a scenario, the tree holds the user.conf its runs were given and
    the README says how the load was chosen; a scenario the calibration left out has no results
    and the documentation says why."""
    root, _, _ = chain
    copy_root, copy = tmp_path / "repo", tmp_path / "submission"
    shutil.copytree(root, copy_root, ignore=shutil.ignore_patterns("submission"))
    logs = copy_root / "build/logs/tiny/llama3.1-8b"
    run_conf = (logs / "Server/performance/user.conf").read_text()
    assert run_conf == USER_CONF  # harness run keeps a copy of what it was given
    (logs / "Server/performance/user.conf").write_text(run_conf.replace("target_qps = 100", "target_qps = 77.5"))
    reseal(logs / "Server/performance")  # as if the run had been given that user.conf
    (logs / "Server/calibration").mkdir()
    (logs / "Server/calibration/calibration.json").write_text(
        json.dumps(
            {
                "target_qps": 77.5,
                "summary": "Server: target_qps 77.500 (measured)",
                "trials": [{"qps": 86.1, "passed": True, "detail": "LoadGen VALID: p99 TTFT 9 ms"}],
                "margin": "the runs take 90%",
            }
        )
    )
    (logs / "Interactive/calibration").mkdir(parents=True)
    (logs / "Interactive/calibration/calibration.json").write_text(
        json.dumps({"target_qps": None, "summary": "Interactive: left out: too slow here"})
    )
    system = json.loads((copy_root / "systems/tiny.json").read_text())
    system["saaf_harness"]["scenarios"] = ["Offline", "Server", "Interactive"]
    (copy_root / "systems/tiny.json").write_text(json.dumps(system))
    org, failures = package("tiny", copy, root=copy_root)
    assert not failures
    server = org / "results/tiny/tiny-llama/Server"
    assert "target_qps = 77.5" in (server / "user.conf").read_text()
    readme = (server / "README.md").read_text()
    assert "Server: target_qps 77.500 (measured)" in readme
    assert "the runs take 90%" in readme and "- 86.100 QPS: LoadGen VALID: p99 TTFT 9 ms\n" in readme
    assert not (org / "results/tiny/tiny-llama/Interactive").exists()
    assert "tiny-llama Interactive: left out: too slow here\n" in (org / "documentation/README.md").read_text()
    assert check_tree(copy, demo=True).errors == []


@pytest.mark.parametrize("system_file", sorted((REPO / "systems").glob("*.json")), ids=lambda p: p.stem)
def test_repository_system_descriptions_pass_the_system_rules(system_file, tmp_path):
    from compliance.check import Report, check_system

    description = json.loads(system_file.read_text())
    description.pop("saaf_harness")
    (tmp_path / system_file.name).write_text(json.dumps(description))
    report = Report(demo=False)
    check_system(tmp_path / system_file.name, description["division"], description["submitter"], report)
    assert report.errors == []


@pytest.mark.slow
def test_a_speculating_run_records_its_metrics_and_the_tree_names_the_proposer(chain, tmp_path):
    """A Server run with n-gram speculation from the system's engine settings: its metrics lie
    beside LoadGen's logs, and the packaged system description's
    sw_notes say which proposer ran."""
    root, _, _ = chain
    copy_root, copy = tmp_path / "repo", tmp_path / "submission"
    shutil.copytree(root, copy_root, ignore=shutil.ignore_patterns("submission"))
    system = json.loads((copy_root / "systems/tiny.json").read_text())
    system["saaf_harness"]["engine"]["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3}
    (copy_root / "systems/tiny.json").write_text(json.dumps(system))
    # Speculation costs the tiny model more than it gives (its forward is cheaper than the host's
    # work around it), so it serves a lower rate within the latency limits.
    conf = copy_root / "measurements/tiny/llama3.1-8b/Server/user.conf"
    conf.write_text(conf.read_text().replace("Server.target_qps = 100", "Server.target_qps = 40"))
    done = harness_run(copy_root, "Server", "performance")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "speculation (n-gram prompt lookup (k=3" in done.stdout
    logs = copy_root / "build/logs/tiny/llama3.1-8b/Server/performance"
    spec = json.loads((logs / "speculative_decoding.json").read_text())
    assert spec["method"] == "ngram" and spec["num_proposals"] > 0
    assert sum(spec["accepted_at_position"]) == spec["num_accepted_tokens"]
    detail, _ = read_detail_log(logs / "mlperf_log_detail.txt")
    assert detail["result_validity"] in ("VALID", "INVALID") and not detail.get("error_invalid_config")
    org, failures = package("tiny", copy, root=copy_root)
    assert not failures
    notes = json.loads((org / "systems/tiny.json").read_text())["sw_notes"]
    assert "llama3.1-8b Server: speculative decoding with n-gram prompt lookup (k=3" in notes
    assert check_tree(copy, demo=True).errors == []


def _replica_pids(pid: int) -> list[int]:
    """The data-parallel replicas among a process's children (multiprocessing's spawned workers)."""
    children = f"/proc/{pid}/task/{pid}/children"
    pids = [int(c) for c in open(children).read().split()]
    return [
        c
        for c in pids
        if b"spawn_main" in open(f"/proc/{c}/cmdline", "rb").read()
        and b"resource_tracker" not in open(f"/proc/{c}/cmdline", "rb").read()
    ]


@pytest.mark.slow
def test_two_replicas_from_the_cli_answer_each_sample_once(chain, tmp_path):
    root, _, _ = chain
    done = harness_run(root, "Offline", "accuracy", "--log-dir", tmp_path, "--engine", '{"data_parallel_size": 2}')
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("Offline accuracy: PASS"), done.stdout
    entries = json.loads((tmp_path / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in entries) == list(range(NUM_SAMPLES))


@pytest.mark.slow
def test_a_replica_killed_mid_run_ends_it_with_its_name_and_leaves_no_process(chain, tmp_path):
    root, _, _ = chain
    conf = tmp_path / "user.conf"  # a run long enough to be killed in
    conf.write_text(
        "llama3_1-8b.Server.target_qps = 20\nllama3_1-8b.Server.min_duration = 60000\n"
        "llama3_1-8b.Server.min_query_count = 100\n"
    )
    logs = tmp_path / "logs"
    proc = start_run(
        root, "Server", "performance", "--log-dir", logs, "--user-conf", conf, "--engine", '{"data_parallel_size": 2}'
    )
    try:
        replicas, deadline = [], time.monotonic() + 120
        while (len(replicas) < 2 or not (logs / "mlperf_log_detail.txt").exists()) and time.monotonic() < deadline:
            time.sleep(0.5)  # LoadGen has started once its detail log exists
            replicas = _replica_pids(proc.pid)
        assert len(replicas) == 2, "the run did not start two replicas"
        time.sleep(1.0)
        os.kill(replicas[1], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        # Well before the run's 60 s min_duration would have ended it, with a loaded machine's margin.
        assert time.monotonic() - killed < 40, "the run did not end on the replica's death"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3
    assert re.search(rf"data-parallel replica 1 \(pid {replicas[1]}, cores .*\) died .*the run is abandoned", stderr)
    assert not any(map(process_alive, replicas))


@pytest.mark.slow
def test_an_offline_run_shorter_than_min_duration_runs_again_at_its_measured_rate(chain, tmp_path):
    """LoadGen issues target_qps x min_duration x 1.1 samples in Offline: at a target_qps below what
    the machine does, they are done before min_duration and the run is INVALID. The chain's
    offline_rate sets target_qps from the rate measured, as LoadGen logs it back; LoadGen's rerun at
    it issues that many samples, and within the chain's reruns one is VALID."""
    from harness.submission import OFFLINE_RATE_MARGIN, OFFLINE_RERUNS, offline_rate

    root = chain[0]
    # The short run's target_qps asks for fewer samples than min_query_count, so it issues the 24 of
    # the chain's Offline run; its min_duration is 5x what they took there (at least 2 s), so they
    # end before it on a machine of any speed.
    chain_run, _ = read_detail_log(root / "build/logs/tiny/llama3.1-8b/Offline/performance/mlperf_log_detail.txt")
    min_duration_ms = max(2000, math.ceil(5 * chain_run["result_max_latency_ns"] / 1e6))
    conf = tmp_path / "user.conf"
    conf.write_text(
        USER_CONF.replace("Offline.min_duration = 0", f"Offline.min_duration = {min_duration_ms}").replace(
            "Offline.target_qps = 10", "Offline.target_qps = 0.01"
        )
    )
    logs = tmp_path / "Offline"

    def run(user_conf):
        done = harness_run(
            root, "Offline", "performance", "--user-conf", user_conf, "--log-dir", logs / "performance", "--no-warmup"
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return read_detail_log(logs / "performance" / "mlperf_log_detail.txt")[0]

    short = run(conf)
    assert short["effective_samples_per_query"] == NUM_SAMPLES
    assert short["result_min_duration_met"] is False and short["result_validity"] == "INVALID"
    runs = [short]
    for attempt in range(1, OFFLINE_RERUNS + 1):
        rerun = offline_rate(conf, "llama3_1-8b", logs)
        if rerun is None:
            break
        qps = json.loads((logs / "calibration" / "calibration.json").read_text())["target_qps"]
        assert qps == loadgen_double(runs[-1]["result_samples_per_second"] * OFFLINE_RATE_MARGIN, 3)
        assert rerun == ["--user-conf", str(logs / "calibration" / "user.conf")]
        assert f"llama3_1-8b.Offline.target_qps = {qps}\n" in Path(rerun[1]).read_text()
        assert (logs / "calibration" / f"short-run-{attempt}" / "mlperf_log_summary.txt").is_file()
        runs.append(run(rerun[1]))
        # LoadGen logs the rate as written, and issues 1.1 x min_duration of samples at it (its own
        # arithmetic: a double, truncated), at least min_query_count.
        assert runs[-1]["effective_target_qps"] == qps
        samples = int(1.1 * (min_duration_ms / 1000) * qps)
        assert runs[-1]["effective_samples_per_query"] == max(NUM_SAMPLES, samples)
    assert runs[-1]["result_min_duration_met"] is True and runs[-1]["result_validity"] == "VALID", runs[-1]


@pytest.mark.parametrize("fits", [None, "would take 9 min, past the demo's budget"])
def test_an_invalid_latency_run_runs_again_at_a_lower_rate_where_it_fits(tmp_path, fits):
    """A Server performance run LoadGen found INVALID at the calibrated rate (the machine slowed since
    its calibration) runs again at LATENCY_RERUN_SHARE of it, its logs kept beside the calibration;
    where the rerun does not fit the budget the INVALID run stays, and calibration.json says why."""
    from harness.submission import LATENCY_RERUN_SHARE, latency_rerun

    logs = tmp_path / "Server"
    (logs / "performance").mkdir(parents=True)
    (logs / "calibration").mkdir()
    conf = "llama3_1-8b.Server.target_qps = 4.779\nllama3_1-8b.Server.min_query_count = 460\n"
    (logs / "calibration" / "user.conf").write_text(conf)
    summary = "Server: target_qps 4.779, 90% of the capacity LoadGen runs found"
    (logs / "calibration" / "calibration.json").write_text(json.dumps({"target_qps": 4.779, "summary": summary}))

    def detail(validity):
        values = {
            "result_validity": validity,
            "effective_target_qps": 4.779,
            "result_first_token_99.00_percentile_latency_ns": 2_405_000_000,
            "result_time_per_output_token_99.00_percentile_ns": 92_500_000,
        }
        lines = [MLLOG_MARKER + " " + json.dumps({"key": k, "value": v, "metadata": {}}) for k, v in values.items()]
        (logs / "performance" / "mlperf_log_detail.txt").write_text("\n".join(lines) + "\n")

    detail("VALID")
    assert latency_rerun(logs, "llama3_1-8b", lambda text: fits) == (None, None)
    detail("INVALID")
    rerun, said = latency_rerun(logs, "llama3_1-8b", lambda text: fits)
    record = json.loads((logs / "calibration" / "calibration.json").read_text())
    qps = loadgen_double(4.779 * LATENCY_RERUN_SHARE, 4)
    assert said.startswith("the performance run at 4.779 QPS was INVALID (p99 TTFT 2405 ms, TPOT 92.5 ms)")
    assert record["summary"] == f"{summary}; {said}"
    if fits is None:
        assert rerun == ["--user-conf", str(logs / "calibration" / "user.conf")] and record["target_qps"] == qps
        assert f"llama3_1-8b.Server.target_qps = {qps}\n" in (logs / "calibration" / "user.conf").read_text()
        assert (logs / "calibration" / "invalid-run-1" / "mlperf_log_detail.txt").is_file()
        assert not (logs / "performance").exists() and f"run again at {qps} QPS" in said
    else:
        assert rerun is None and record["target_qps"] == 4.779 and said.endswith(f"a rerun at {qps} QPS {fits}")
        assert (logs / "calibration" / "user.conf").read_text() == conf and (logs / "performance").is_dir()


def test_a_demo_interactive_run_invalid_with_no_time_to_rerun_is_left_out(chain, tmp_path):
    """On the demo, an INVALID Interactive run whose rerun would not fit the budget is left out as a
    calibration leaves out a scenario no load meets here (Server covers the checker's one of the
    two): its logs moved beside the calibration, target_qps None, and the package has no results for
    it, its documentation says why, and our checker passes the tree."""
    from harness.submission import latency_rerun

    root, _, _ = chain
    copy_root, copy = tmp_path / "repo", tmp_path / "submission"
    shutil.copytree(root, copy_root, ignore=shutil.ignore_patterns("submission"))
    logs = copy_root / "build/logs/tiny/llama3.1-8b/Interactive"
    (logs / "performance").mkdir(parents=True)
    server = copy_root / "build/logs/tiny/llama3.1-8b/Server/performance"
    shutil.copy(server / "mlperf_log_detail.txt", logs / "performance")
    detail = (logs / "performance" / "mlperf_log_detail.txt").read_text()
    (logs / "performance" / "mlperf_log_detail.txt").write_text(detail.replace('"VALID"', '"INVALID"'))
    (logs / "calibration").mkdir()
    (logs / "calibration" / "user.conf").write_text("llama3_1-8b.Server.target_qps = 2.3656\n")
    calibrated = "Interactive: target_qps 2.3656, 90% of the capacity LoadGen runs found"
    (logs / "calibration" / "calibration.json").write_text(json.dumps({"target_qps": 2.3656, "summary": calibrated}))

    rerun, said = latency_rerun(logs, "llama3_1-8b", lambda text: "would take 9 min, past the demo's budget", True)
    record = json.loads((logs / "calibration" / "calibration.json").read_text())
    assert rerun is None and record["target_qps"] is None and "INVALID" in record["reason"]
    assert said.startswith("left out: the performance run at ") and said.endswith("invalid-run-1")
    assert record["summary"].startswith("Interactive: left out: ")
    assert record["summary"].endswith(f"(its calibration: {calibrated})")
    assert not (logs / "performance").exists()
    assert (logs / "calibration" / "invalid-run-1" / "mlperf_log_detail.txt").is_file()

    system = json.loads((copy_root / "systems/tiny.json").read_text())
    system["saaf_harness"]["scenarios"] = ["Offline", "Server", "Interactive"]
    (copy_root / "systems/tiny.json").write_text(json.dumps(system))
    org, failures = package("tiny", copy, root=copy_root)
    assert not failures and not (org / "results/tiny/tiny-llama/Interactive").exists()
    assert f"tiny-llama {record['summary']}\n" in (org / "documentation/README.md").read_text()
    assert check_tree(copy, demo=True).errors == []


def test_a_promoted_trial_becomes_the_performance_run_as_it_ran(tmp_path):
    """calibrate's `--promote-trial`: the chain copies the VALID trial's complete run to the
    scenario's performance folder, where a reader trusts it as the run it was; a trial whose files
    changed since is refused by name; without a promoted trial nothing is copied."""
    from compliance.run_folder import RunFolder, RunFolderError, complete_run
    from harness.submission import promoted_trial

    logs = tmp_path / "Interactive"
    trial = logs / "calibration/capacity/01-2.000qps"
    writer = RunFolder(trial)
    writer.open({"scenario": "Interactive"})
    (trial / "mlperf_log_detail.txt").write_text("detail\n")
    writer.complete("a trial")
    assert promoted_trial(logs) is None  # no calibration.json yet
    record = {"target_qps": 2.0, "promoted": "capacity/01-2.000qps", "summary": "s"}
    (logs / "calibration/calibration.json").write_text(json.dumps(record))
    said = promoted_trial(logs)
    assert "trial at 2.0 QPS, VALID, is the performance run" in said
    assert complete_run(logs / "performance")["status"] == "complete"
    assert (logs / "performance/mlperf_log_detail.txt").read_text() == "detail\n"
    shutil.rmtree(logs / "performance")
    (trial / "mlperf_log_detail.txt").write_text("changed\n")
    with pytest.raises(RunFolderError, match="01-2.000qps"):
        promoted_trial(logs)

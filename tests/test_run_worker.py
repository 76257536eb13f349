"""Several LoadGen runs on one engine that stays loaded (harness/run_worker.py, the report's runs): each
run's settings are LoadGen's mlperf.conf and its user.conf as in a run of its own, and each run's
counts, cache and responses are its own; a run the engine was not loaded for is refused, and a dead
worker is an error, not a wait."""

import json
import os
import signal

import pytest

from compliance.loadgen_logs import read_detail_log
from harness.config import HarnessConfigError
from harness.run_worker import RunWorker, worker_command
from tests.helpers import tiny_model_and_dataset
from tests.tiny_system import USER_CONF, write_system

MULTIPLE_CONFS = "Multiple conf files are used"


@pytest.fixture(scope="module")
def tiny_root(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("worker-repo")
    model_dir, _, _, dataset = tiny_model_and_dataset(tiny_llama[0], root, 24, seed=3)
    write_system(root, model_dir, dataset, root / "no-reference.json")
    system = json.loads((root / "systems" / "tiny.json").read_text())
    system["saaf_harness"].pop("accuracy_reference")
    (root / "systems" / "tiny.json").write_text(json.dumps(system))
    (root / "user.conf").write_text(USER_CONF)  # Server: 480 queries at 100 QPS, enough for early stopping
    return root


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """The workers' engines on one thread (they take this environment), as tests/tiny_system.py's runs
    are: with two on a busy 2-core machine the tiny model serves under the Server run's 100 QPS."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def start(root, engine=None, tmp=None):
    return RunWorker(
        worker_command("tiny", "llama3.1-8b", root, engine or {}, ("--log-responses",)), tmp / "worker.log"
    )


def responses(folder):
    return {e["qsl_idx"]: e["data"] for e in json.loads((folder / "mlperf_log_accuracy.json").read_text())}


@pytest.mark.slow
def test_runs_on_one_engine_are_each_a_run_of_its_own(tiny_root, tmp_path):
    folders = [tmp_path / name for name in ("offline-1", "server", "offline-2")]
    with start(tiny_root, tmp=tmp_path) as worker:
        for folder in folders:
            scenario = "Server" if folder.name == "server" else "Offline"
            line = worker.run(scenario, tiny_root / "user.conf", folder, folder.name)
            assert f"{scenario} performance: VALID" in line and "no errors" in line, line
    details = [read_detail_log(f / "mlperf_log_detail.txt") for f in folders]
    for (values, errors), folder in zip(details, folders):
        # mlperf.conf's settings in every run (token latencies, its seeds), the user.conf's over them.
        assert values["requested_use_token_latencies"] is True, folder
        assert values["effective_schedule_rng_seed"] == details[0][0]["effective_schedule_rng_seed"] != 0
        assert values["effective_sample_concatenate_permutation"] is True
        # LoadGen says the later runs are not a submission's; the first is as a run of its own.
        assert any(MULTIPLE_CONFS in e for e in errors) == (folder != folders[0]), errors
    # The Server run, a later one: mlperf.conf's TTFT limit for llama3_1-8b (ns), the user.conf's rate.
    assert details[1][0]["requested_server_ttft_latency"] == 2_000_000_000
    assert details[1][0]["effective_target_qps"] == 100 and details[1][0]["result_query_count"] >= 480
    # The second Offline run after a Server run on the same engine: the same responses and the same
    # work counted (nothing carried over: no cached prefix, no earlier steps in its counts).
    first, again = (json.loads((f / "run.json").read_text())["busy_s"] for f in (folders[0], folders[2]))
    for key in ("steps", "tokens", "attended_tokens"):
        assert first[key] == again[key] > 0, key
    assert responses(folders[0]) == responses(folders[2])
    assert len(responses(folders[0])) == 24


@pytest.mark.slow
def test_a_run_with_other_engine_settings_is_refused_and_the_worker_goes_on(tiny_root, tmp_path):
    with start(tiny_root, {"max_num_seqs": 8}, tmp_path) as worker:
        system = json.loads((tiny_root / "systems" / "tiny.json").read_text())
        system["saaf_harness"]["scenario_engine"] = {"Offline": {"max_num_batched_tokens": 512}}
        (tiny_root / "systems" / "tiny.json").write_text(json.dumps(system))
        try:
            with pytest.raises(HarnessConfigError, match="Offline run's engine settings differ from the worker's"):
                worker.run("Offline", tiny_root / "user.conf", tmp_path / "offline", "the Offline run")
        finally:
            system["saaf_harness"].pop("scenario_engine")
            (tiny_root / "systems" / "tiny.json").write_text(json.dumps(system))
        assert "VALID" in worker.run("Offline", tiny_root / "user.conf", tmp_path / "offline", "the Offline run")


def test_a_dead_worker_is_an_error_naming_the_run(tiny_root, tmp_path):
    worker = start(tiny_root, tmp=tmp_path)
    try:
        os.kill(worker.proc.pid, signal.SIGKILL)
        with pytest.raises(
            HarnessConfigError, match=r"the Server trial failed: the run worker ended \(exit status -9\)"
        ):
            worker.run("Server", tiny_root / "user.conf", tmp_path / "server", "the Server trial")
    finally:
        worker.close()


@pytest.mark.slow
def test_a_worker_that_cannot_load_its_engine_says_why(tiny_root, tmp_path):
    with start(tiny_root, {"max_num_seqs": -1}, tmp_path) as worker:
        with pytest.raises(HarnessConfigError, match="the run worker ended \\(exit status 1\\).*max_num_seqs"):
            worker.run("Offline", tiny_root / "user.conf", tmp_path / "offline", "the Offline run")

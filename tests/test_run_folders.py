"""What a submission system owes its users when runs are killed, names are wrong and requests fail
(issue 27), each on real runs of the tiny system (tests/tiny_system.py): a killed run leaves no
score that the packager or the checker takes; a name that is a path touches nothing outside the
build folder; a folder in use is refused; a failed request fails the run; Ctrl-C ends a Server run
cleanly with 130."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from compliance.check import check_tree
from compliance.loadgen_logs import read_detail_log
from compliance.package import PackagingError, package
from compliance.run_folder import STATUS_FILE
from systems.schema import REPO
from tests.helpers import process_alive
from tests.tiny_system import NUM_SAMPLES, harness_command, harness_run, reseal, start_run

LOGS = "build/logs/tiny/llama3.1-8b"


@pytest.fixture
def root(chain, tmp_path):
    """A copy of the chain's repository-like folder, runs included, to change."""
    copy = tmp_path / "repo"
    shutil.copytree(chain[0], copy, ignore=shutil.ignore_patterns("submission"))
    return copy


def status(folder):
    return json.loads((folder / STATUS_FILE).read_text())


def one_error_line(done) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


def wait_for_loadgen(proc, folder, timeout=120):
    """Until `proc` has taken `folder` (its status file names proc's pid: an earlier run's files are
    gone) and LoadGen runs there (its detail log exists), or the run ended."""
    deadline = time.monotonic() + timeout

    def taken():
        try:
            return status(folder)["pid"] == proc.pid
        except (OSError, ValueError, KeyError):  # not there yet, or being replaced
            return False

    while not (taken() and (folder / "mlperf_log_detail.txt").exists()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "LoadGen did not start"
        time.sleep(0.2)


def slow_conf(path, qps, queries=NUM_SAMPLES):
    """A Server user.conf whose run takes queries / qps seconds: long enough to act on."""
    path.write_text(
        f"llama3_1-8b.Server.target_qps = {qps}\nllama3_1-8b.Server.min_duration = 0\n"
        f"llama3_1-8b.Server.min_query_count = {queries}\n"
        f"llama3_1-8b.Server.performance_sample_count_override = {NUM_SAMPLES}\n"
    )
    return path


@pytest.mark.slow
def test_a_killed_accuracy_run_is_refused_by_the_packager_and_its_log_by_the_checker(chain, root, tmp_path):
    accuracy = root / LOGS / "Server" / "accuracy"
    assert status(accuracy)["status"] == "complete" and (accuracy / "accuracy.txt").is_file()
    proc = start_run(root, "Server", "accuracy", "--user-conf", slow_conf(tmp_path / "slow.conf", 2))
    try:
        wait_for_loadgen(proc, accuracy)
        time.sleep(2.0)  # some samples answered, most not
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The earlier run's files went when this one took the folder: no score lies beside its log.
    assert not (accuracy / "accuracy.txt").exists()
    assert status(accuracy)["status"] == "running"
    out = tmp_path / "submission"
    with pytest.raises(
        PackagingError,
        match=r"Server/accuracy holds no complete run: its run \(pid \d+, started .*\) "
        r"never finished: it was killed or crashed; run it again",
    ):
        package("tiny", out, root=root)
    assert not out.exists(), "the refusal came after something was written"
    done = subprocess.run(
        [sys.executable, "-m", "compliance.package", "--system", "tiny", "--root", str(root), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode != 0 and "never finished: it was killed or crashed" in one_error_line(done)
    # What the old packager made of it: the earlier score beside the killed run's log. The checker
    # refuses that tree, naming the log.
    tree = tmp_path / "stale-tree"
    shutil.copytree(chain[1], tree)
    scenario = tree / "open/TestOrg/results/tiny/tiny-llama/Server/accuracy"
    shutil.copy2(accuracy / "mlperf_log_accuracy.json", scenario / "mlperf_log_accuracy.json")
    errors = check_tree(tree, demo=True).errors
    assert any(re.search(r"Server/accuracy/mlperf_log_accuracy.json: \[accuracy-log\]", e) for e in errors), errors
    done = subprocess.run(
        [sys.executable, "-m", "compliance.check", str(tree), "--demo"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 1 and "[accuracy-log]" in done.stdout


def test_a_score_of_another_run_is_refused(root, tmp_path):
    """accuracy.txt computed from another log than the one beside it (here: the Offline run's score
    beside the Server run's log): changed since the run completed; and were the run's record of its
    files forged too, the hash= line still says which log was scored."""
    logs = root / LOGS
    shutil.copy2(logs / "Offline/accuracy/accuracy.txt", logs / "Server/accuracy/accuracy.txt")
    with pytest.raises(PackagingError, match="Server/accuracy/accuracy.txt: changed since its run completed"):
        package("tiny", tmp_path / "submission", root=root)
    reseal(logs / "Server/accuracy")
    with pytest.raises(
        PackagingError, match="Server/accuracy/accuracy.txt was not computed from the accuracy log beside it"
    ):
        package("tiny", tmp_path / "submission", root=root)


@pytest.mark.slow
def test_names_that_are_paths_touch_nothing_outside_the_build_folder(root, tmp_path):
    # root is tmp_path/repo: each name below, taken as a path, leads to tmp_path/sentinel.
    sentinel = tmp_path / "sentinel"
    (sentinel / "Offline").mkdir(parents=True)
    (sentinel / "Offline" / "keep.txt").write_text("keep")
    (sentinel / "x.json").write_text(json.dumps({**json.loads((root / "systems/tiny.json").read_text())}))
    before = {p: p.read_bytes() for p in sentinel.rglob("*") if p.is_file()}
    runs_before = {p: p.read_bytes() for p in (root / "build").rglob(STATUS_FILE)}
    commands = [
        (
            "harness.submission",
            "--system",
            "tiny",
            "--root",
            root,
            "--out",
            tmp_path / "out",
            "--benchmarks",
            "llama3.1-8b",
            "../../../../sentinel",
        ),
        ("compliance.package", "--system", "../../sentinel/x", "--root", root, "--out", tmp_path / "out"),
        ("harness", "run", "--system", "../../sentinel/x", "--root", root),
        ("harness.measure.calibrate", "--system", "../../sentinel/x", "--root", root),
        ("harness.measure.report", "--system", "../../sentinel/x", "--root", root, "--out", tmp_path / "out"),
    ]
    for command in commands:
        done = subprocess.run([sys.executable, "-m", *map(str, command)], capture_output=True, text=True, cwd=REPO)
        assert done.returncode != 0, command
        error = one_error_line(done)
        assert re.search(
            r"unknown benchmark\(s\) \['\.\./\.\./\.\./\.\./sentinel'\]|system name '\.\./\.\./sentinel/x' "
            r"is not a plain name",
            error,
        ), (command, error)
    assert {p: p.read_bytes() for p in sentinel.rglob("*") if p.is_file()} == before
    assert {p: p.read_bytes() for p in (root / "build").rglob(STATUS_FILE)} == runs_before, (
        "a run started before the names were checked"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value", [("model_name", "../../x"), ("submitter", "a/b"), ("division", "../open")])
def test_a_system_file_naming_a_path_is_refused(root, field, value):
    from systems.schema import System, SystemConfigError

    system = json.loads((root / "systems/tiny.json").read_text())
    (system["saaf_harness"] if field == "model_name" else system)[field] = value
    (root / "systems/tiny.json").write_text(json.dumps(system))
    with pytest.raises(SystemConfigError, match=re.escape(repr(value))):
        System.load("tiny", root)


@pytest.mark.slow
def test_a_second_run_into_a_folder_in_use_is_refused_and_a_later_one_replaces_it(root, tmp_path):
    logs = tmp_path / "logs"
    first = start_run(
        root,
        "Server",
        "performance",
        "--log-dir",
        logs,
        "--user-conf",
        slow_conf(tmp_path / "slow.conf", 10, queries=200),
        "--engine",
        '{"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}',
    )
    try:
        wait_for_loadgen(first, logs)
        second = harness_run(root, "Server", "performance", "--log-dir", logs)
        assert second.returncode != 0
        assert re.search(rf"run folder {re.escape(str(logs))} is in use by pid {first.pid} ", one_error_line(second))
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-2000:]
    done = status(logs)
    assert done["status"] == "complete" and done["pid"] == first.pid and done["scenario"] == "Server"
    assert "speculative_decoding.json" in done["files"] and "steps.json" in done["files"]
    # Back to back: the later run replaces the earlier one, says so, and leaves none of its files.
    third = harness_run(root, "Offline", "performance", "--log-dir", logs)
    assert third.returncode == 0, third.stderr[-2000:]
    assert f"{logs} held an earlier run (complete, from {done['started']}); this run replaces it" in third.stdout
    assert (
        status(logs)["scenario"] == "Offline" and json.loads((logs / "run.json").read_text())["scenario"] == "Offline"
    )
    assert read_detail_log(logs / "mlperf_log_detail.txt")[0]["effective_scenario"] == "Offline"
    # (a stale one made the packaged system claim speculation for a run that had none)
    assert not (logs / "speculative_decoding.json").exists()
    # A folder holding anything a run does not write is nobody's to clear.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    done = harness_run(root, "Offline", "performance", "--log-dir", mine)
    assert done.returncode != 0 and "holds notes.txt, which no run writes" in one_error_line(done)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


FAIL_A_STEP = """
import sys
import sut.engine.llm_engine
step = sut.engine.llm_engine.LLMEngine.step
calls = []
def failing_step(self):
    calls.append(1)
    if len(calls) == 3:  # a step in the middle of the run raises: its requests fail, the rest go on
        raise RuntimeError("planted failure")
    return step(self)
sut.engine.llm_engine.LLMEngine.step = failing_step
from harness.__main__ import main
sys.argv = ["harness", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_a_failed_request_fails_the_run_and_the_packager_refuses_it(root, tmp_path):
    performance = root / LOGS / "Offline" / "performance"
    command = harness_command(root, "Offline", "performance", "--no-warmup")
    done = subprocess.run([sys.executable, "-c", FAIL_A_STEP, *command[3:]], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 1, done.stderr[-2000:]
    verdict = done.stdout.strip().splitlines()[-1]
    assert re.match(
        rf"Offline performance: FAILED \((\d+) of {NUM_SAMPLES} requests failed; LoadGen said VALID\)", verdict
    ), verdict
    assert "planted failure" in one_error_line(done) and "the run is marked failed" in one_error_line(done)
    assert status(performance)["status"] == "failed"
    with pytest.raises(
        PackagingError,
        match=r"Offline/performance holds no complete run: its run failed: \d+ of 24 "
        r"requests failed \(the first: request \d+: engine step failed: "
        r"RuntimeError\('planted failure'\)\)",
    ):
        package("tiny", tmp_path / "submission", root=root)


def _children(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


@pytest.mark.slow
def test_ctrl_c_ends_a_server_run_with_130_and_its_folder_marked_failed(root, tmp_path):
    logs = tmp_path / "logs"
    proc = start_run(
        root,
        "Server",
        "performance",
        "--log-dir",
        logs,
        "--user-conf",
        slow_conf(tmp_path / "slow.conf", 5, queries=500),
        "--engine",
        '{"data_parallel_size": 2}',
    )
    try:
        wait_for_loadgen(proc, logs)
        time.sleep(1.0)
        replicas = [c for c in _children(proc.pid) if b"spawn_main" in open(f"/proc/{c}/cmdline", "rb").read()]
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group
        interrupted = time.monotonic()
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - interrupted < 20, "Ctrl-C took more than seconds"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Segmentation fault" not in err and "Traceback" not in err and "leaked" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "interrupted (Ctrl-C)" in errors[0], err[-3000:]
    state = status(logs)
    assert state["status"] == "failed" and "interrupted (Ctrl-C)" in state["reason"]
    assert not list(logs.parent.glob("core*")) and not list(REPO.glob("core*"))
    deadline = time.monotonic() + 10
    while any(map(process_alive, replicas)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert replicas and not any(map(process_alive, replicas)), "a replica was left running"


@pytest.mark.slow
@pytest.mark.parametrize("corruption", ["nan", "changed", "huge"])
def test_corrupt_norm_weights_end_the_run_with_an_error(root, tmp_path, corruption):
    """Three RMSNorm weights corrupted, as a bad copy would: NaN is refused at load; with the folder's
    SHA256SUMS any change is refused before loading; finite values far out of range load, their
    logits come out NaN, and every request fails (never a VALID run of token 0s)."""
    from sut.sample.sampler import NONFINITE_LOGITS
    from tests.test_bad_input import plant, write_sums

    model = root / "tiny-llama"
    system = json.loads((root / "systems/tiny.json").read_text())
    system["saaf_harness"]["model"] = str(model)  # the copy's, not the chain's
    (root / "systems/tiny.json").write_text(json.dumps(system))
    if corruption == "changed":
        write_sums(model)
    for layer in range(2):
        plant(
            model,
            f"model.layers.{layer}.input_layernorm.weight",
            {"nan": float("nan"), "huge": 3e38}.get(corruption, 0.5),
        )
    plant(model, "model.norm.weight", {"nan": float("nan"), "huge": 3e38}.get(corruption, 0.5))
    logs = tmp_path / "logs"
    done = harness_run(root, "Offline", "performance", "--log-dir", logs)
    error = one_error_line(done)
    if corruption == "huge":
        assert done.returncode == 1
        assert re.match(
            rf"Offline performance: FAILED \({NUM_SAMPLES} of {NUM_SAMPLES} requests failed; LoadGen said "
            r"VALID\)",
            done.stdout.strip().splitlines()[-1],
        )
        assert NONFINITE_LOGITS in error
    else:
        assert done.returncode != 0 and not (logs / "mlperf_log_detail.txt").exists(), "LoadGen started"
        assert {
            "nan": "tensor 'model.layers.0.input_layernorm.weight' holds NaN or inf values",
            "changed": "model.safetensors: its SHA-256 is",
        }[corruption] in error
    assert status(logs)["status"] == "failed"


def _binary_dataset(root, tmp_path):
    (root / "data.json").write_bytes(b"\x00\x9f\x92\x96" * 64)
    return (), "data.json: not a UTF-8 text file (binary data at byte 1)"


def _id_outside_vocab(root, tmp_path):
    records = json.loads((root / "data.json").read_text())
    records[3]["tok_input"][2] = 10**6
    (root / "data.json").write_text(json.dumps(records))
    return (), "1000000"


def _log_dir_a_file(root, tmp_path):
    (tmp_path / "logs").write_text("mine")
    return (), "logs"


def _no_tokenizer(root, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / "tiny-llama" / name).unlink()
    return ("--mode", "accuracy"), "tokenizer"


def _engine(setting):
    return lambda root, tmp_path: (("--engine", setting), "--engine")


EARLY = {
    "binary dataset": _binary_dataset,
    "token id outside the vocabulary": _id_outside_vocab,
    "--log-dir a file": _log_dir_a_file,
    "no tokenizer, accuracy run": _no_tokenizer,
    "tpot_target_ms NaN": _engine('{"tpot_target_ms": NaN}'),
    "prefix caching 'false'": _engine('{"enable_prefix_caching": "false"}'),
    "max_num_seqs true": _engine('{"max_num_seqs": true}'),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", EARLY)
def test_bad_input_ends_the_run_in_one_line_before_loadgen_starts(root, tmp_path, case):
    """Each found before the model loads or LoadGen starts: the user waits seconds, not a run, and
    no log folder says anything ran."""
    system = json.loads((root / "systems/tiny.json").read_text())
    system["saaf_harness"].update(model=str(root / "tiny-llama"), datasets={"llama3.1-8b": str(root / "data.json")})
    (root / "systems/tiny.json").write_text(json.dumps(system))
    args, named = EARLY[case](root, tmp_path)
    mode = args[1] if args[:1] == ("--mode",) else "performance"
    args = args[2:] if args[:1] == ("--mode",) else args
    # The chain's own folder, which holds a complete run (or a file given as --log-dir).
    log_dir = tmp_path / "logs" if case == "--log-dir a file" else root / LOGS / "Offline" / mode
    earlier = {p: p.read_bytes() for p in (root / LOGS / "Offline" / mode).iterdir()}
    done = harness_run(root, "Offline", mode, "--log-dir", log_dir, *args)
    assert named in one_error_line(done), (case, done.stderr[-2000:])
    # Refused before the run took its folder: the earlier run is still there, whole.
    assert {p: p.read_bytes() for p in (root / LOGS / "Offline" / mode).iterdir()} == earlier

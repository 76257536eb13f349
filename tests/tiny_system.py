"""A repository-like folder with one tiny system (`tiny`: the tiny Llama of conftest.py, open
division, Offline and Server) and every run of its submission chain: what the submission, checker
and run-folder tests build on (the `chain` fixture of conftest.py, one per session)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from compliance.check import SYSTEM_REQUIRED_FIELDS
from compliance.package import package
from compliance.run_folder import STATUS_FILE, sha256_of
from systems.schema import REPO
from tests.helpers import tiny_model_and_dataset

NUM_SAMPLES = 24
USER_CONF = """\
llama3_1-8b.Offline.target_qps = 10
llama3_1-8b.Offline.min_duration = 0
llama3_1-8b.Offline.min_query_count = 24
llama3_1-8b.Offline.performance_sample_count_override = 24
llama3_1-8b.Server.target_qps = 100
llama3_1-8b.Server.min_duration = 1000
llama3_1-8b.Server.min_query_count = 480
llama3_1-8b.Server.performance_sample_count_override = 24
"""
MEASUREMENTS = {
    "input_data_types": "int32",
    "retraining": "No",
    "starting_weights_filename": "random",
    "weight_data_types": "fp32",
    "weight_transformations": "none",
}


def write_system(
    root,
    model_dir,
    dataset,
    reference,
    *,
    benchmark="llama3.1-8b",
    name="tiny",
    model_name="tiny-llama",
    num_kv_blocks=2048,
    scenarios=("Offline", "Server"),
    user_conf=USER_CONF,
):
    """`root`'s systems/<name>.json (open division, a demo) running `model_dir` on `benchmark`'s
    `dataset` (a file, or {mode: file}), and its measurements folders with `user_conf`."""
    datasets = {mode: str(path) for mode, path in dataset.items()} if isinstance(dataset, dict) else str(dataset)
    system = {key: "N/A" for key in SYSTEM_REQUIRED_FIELDS}
    system.update(
        division="open",
        submitter="TestOrg",
        status="rdi",
        system_type="datacenter",
        saaf_harness={
            "model": str(model_dir),
            "datasets": {benchmark: datasets},
            "accuracy_reference": str(reference),
            "engine": {"num_kv_blocks": num_kv_blocks},
            "scenarios": list(scenarios),
            "model_name": model_name,
            "demo": True,
        },
    )
    (root / "systems").mkdir()
    (root / "systems" / f"{name}.json").write_text(json.dumps(system))
    for scenario in scenarios:
        folder = root / "measurements" / name / benchmark / scenario
        folder.mkdir(parents=True)
        (folder / "user.conf").write_text(user_conf)
        (folder / "measurements.json").write_text(json.dumps(MEASUREMENTS))
        (folder / "README.md").write_text(f"{model_name} {scenario}\n")


def reseal(folder):
    """The run folder's status file with its files' hashes as they are now: a planted change that the
    run-folder check (compliance/run_folder.py) would otherwise refuse."""
    status = json.loads((folder / STATUS_FILE).read_text())
    status["files"] = {name: sha256_of(folder / name) for name in status["files"]}
    (folder / STATUS_FILE).write_text(json.dumps(status))


def harness_command(root, scenario, mode, *args) -> list[str]:
    """`python -m harness run` for the tiny system under `root`; extra `args` go on its command line."""
    command = ["-m", "harness", "run", "--system", "tiny", "--scenario", scenario, "--mode", mode, "--root", root]
    return [sys.executable, *map(str, command), *map(str, args)]


def one_thread() -> dict:
    """The environment of a tiny model's run: one torch (and OpenMP) thread. Its steps are too small
    to share, and two threads on a busy 2-core machine are many times slower than one (gpt-oss's
    tiny chain's 1350 steps: 129 s against 14 s; the tiny Llama's Offline run: 3 samples/s against
    160): there its Server run at the committed 100 QPS was INVALID (p99 TTFT 16 s), where one
    thread's is VALID at a tenth of the TPOT limit."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def harness_run(root, scenario, mode, *args):
    """That command run to its end, on one thread."""
    return subprocess.run(
        harness_command(root, scenario, mode, *args), capture_output=True, text=True, cwd=REPO, env=one_thread()
    )


def run_and_package(root, system: str, benchmark: str, scenarios, modes) -> tuple[Path, dict]:
    """Every (scenario, mode) run of `benchmark` on `system` under `root`, each `python -m harness
    run` in a process of its own (as LoadGen requires) on one thread (`one_thread`). Then the tree
    packaged (failing on any packaging failure); returns (the tree, each run's verdict line by
    (scenario, mode))."""
    verdicts = {}
    for scenario in scenarios:
        for mode in modes:
            command = ["-m", "harness", "run", "--system", system, "--benchmark", benchmark, "--scenario", scenario]
            done = subprocess.run(
                [sys.executable, *command, "--mode", mode, "--root", str(root)],
                capture_output=True,
                text=True,
                cwd=REPO,
                env=one_thread(),
            )
            assert done.returncode == 0, done.stderr[-3000:]
            verdicts[scenario, mode] = done.stdout.strip().splitlines()[-1]
    tree = Path(root) / "submission"
    _, failures = package(system, tree, root=root)
    assert failures == []
    return tree, verdicts


def start_run(root, scenario, mode, *args):
    """That command in the background, on one thread, in its own process group (as a terminal runs a
    command)."""
    return subprocess.Popen(
        harness_command(root, scenario, mode, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=one_thread(),
        start_new_session=True,
    )


def build_chain(tiny_folder, root):
    """Every run of the demo chain for the tiny system under `root`, and the packaged tree; returns
    (root, the tree, each run's verdict line)."""
    # References are the model's own outputs, so ROUGE is high and a planted low score shows.
    model_dir, _, references, dataset = tiny_model_and_dataset(tiny_folder, root, NUM_SAMPLES, seed=5)
    reference = root / "reference.json"
    reference.write_text(
        json.dumps(
            {
                "scores": {
                    "rouge1": 80.0,
                    "rouge2": 80.0,
                    "rougeL": 80.0,
                    "rougeLsum": 80.0,
                    "gen_len": sum(map(len, references)),
                },
                "eos_token_ids": [2],
            }
        )
    )
    write_system(root, model_dir, dataset, reference)
    verdicts = {}
    for scenario in ("Offline", "Server"):
        for mode in ("performance", "accuracy", "TEST06"):
            done = harness_run(root, scenario, mode)  # one process per run, as LoadGen requires (harness/run.py)
            assert done.returncode == 0, done.stderr[-2000:]
            verdicts[scenario, mode] = done.stdout.strip().splitlines()[-1]
    tree = root / "submission"
    _, test06_failures = package("tiny", tree, root=root)
    assert not test06_failures
    return root, tree, verdicts

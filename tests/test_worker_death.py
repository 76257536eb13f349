"""A data-parallel replica, a tensor-parallel rank or a disaggregated prefill or decode worker killed
in the middle of a LoadGen run (Offline; Server for the disaggregated workers): the
harness (harness/loadgen_sut.py's loop, harness/run.py's `_abandon`) answers every sample LoadGen
issued exactly once, says which process died, marks the run's folder failed, exits with status 3
within seconds, and leaves no process behind. Each run is its own Python process, since `_abandon` ends the process.
(tests/test_submission.py kills a replica of a `python -m harness run` from outside; this test
counts the samples and covers a tensor-parallel rank too.)"""

import json
import subprocess
import sys
import time

import pytest

from compliance.run_folder import STATUS_FILE
from tests.helpers import process_alive
from tests.test_triton_kernels import REPO

SCRIPT = """
import json, os, signal, sys, threading, time
import mlperf_loadgen as lg
import harness.loadgen_sut as loadgen_sut
from harness.loadgen_sut import EngineSUT, construct_qsl
from compliance.run_folder import RunFolder
from harness.run import _abandon
from sut import LLMEngine, ReplicaPool, SamplingParams, make_engine
from tests.helpers import random_prompts

model, kind, out = sys.argv[1:]
folder = RunFolder(os.path.join(os.path.dirname(out), "run"))
folder.open({})
settings = dict(num_kv_blocks=256, max_num_seqs=4, device="cpu")  # 4 at a time: a run of many steps
if kind == "replica":
    engine = ReplicaPool(model, 2, **settings)
elif kind == "rank":
    engine = LLMEngine(model, tensor_parallel_size=2, **settings)
else:
    engine = make_engine(model, disaggregation={"prefill": 1, "decode": 1}, **settings)
server = kind in ("prefill", "decode")
victim = engine.ranks.procs[0] if kind == "rank" else engine.workers.procs[1 if kind in ("replica", "decode") else 0]
children = [p.pid for p in (engine.ranks.procs if kind == "rank" else engine.workers.procs)]
issued, answered = [], []
complete = loadgen_sut._complete
def counted(sample_id, tokens, first_token=False):
    if not first_token:
        answered.append(sample_id)
    complete(sample_id, tokens, first_token)
loadgen_sut._complete = counted

def fatal(error):
    with open(out, "w") as f:
        json.dump({"issued": issued, "answered": answered, "children": children, "victim": victim.pid,
                   "seconds_after_kill": time.monotonic() - killed[0]}, f)
    _abandon(engine, error, folder)

issue = EngineSUT.issue_queries
def issue_counted(self, samples):
    issued.extend(s.id for s in samples)
    issue(self, samples)
EngineSUT.issue_queries = issue_counted
prompts = random_prompts([20] * 64, seed=4)
sut = EngineSUT(engine, prompts, SamplingParams(max_tokens=230, min_tokens=1, ignore_eos=True), server, on_fatal=fatal)

killed = []
def kill_when_busy():
    while len(issued) < len(prompts):
        threading.Event().wait(0.05)
    killed.append(time.monotonic())
    os.kill(victim.pid, signal.SIGKILL)
threading.Thread(target=kill_when_busy, daemon=True).start()

qsl = construct_qsl(len(prompts), len(prompts))
settings = lg.TestSettings()
settings.scenario = lg.TestScenario.Server if server else lg.TestScenario.Offline
settings.mode = lg.TestMode.PerformanceOnly
settings.use_token_latencies = True
settings.min_query_count, settings.min_duration_ms = len(prompts), 0
settings.server_target_qps = 500
log_settings = lg.LogSettings()
log_settings.log_output.outdir = os.path.dirname(out)
sut.run_test(qsl, settings, log_settings)
print("LoadGen returned: the death went unnoticed", flush=True)
sys.exit(0)
"""


@pytest.mark.parametrize(
    "kind, name",
    [
        ("replica", "data-parallel replica 1"),
        ("rank", "tensor-parallel rank 1"),
        ("prefill", "prefill worker 0"),
        ("decode", "decode worker 0"),
    ],
)
@pytest.mark.slow
def test_a_process_killed_mid_run_ends_the_run_with_its_name_and_every_sample_answered_once(
    tiny_llama, tmp_path, kind, name
):
    out = tmp_path / "answers.json"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_llama[0]), kind, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    record = json.loads(out.read_text())
    assert f"error: harness: {name} (pid {record['victim']}" in done.stderr and "the run is abandoned" in done.stderr
    assert record["seconds_after_kill"] < 10
    status = json.loads((tmp_path / "run" / STATUS_FILE).read_text())
    assert status["status"] == "failed" and name in status["reason"], status  # no reader takes it for a result
    assert sorted(record["answered"]) == sorted(record["issued"]) and len(record["issued"]) == 64, (
        "a sample lost or answered twice"
    )
    deadline = time.monotonic() + 10
    while any(map(process_alive, record["children"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(process_alive, record["children"])), "a replica or rank was left running"

"""Data-parallel replicas (sut/engine/replicas.py): N engine processes behind the online engine's
interface give one engine's outputs, answer every LoadGen sample exactly once, and a replica that
dies ends the run with an error naming it, every request answered once, no process left behind."""

import json
import os
import signal
import time

import mlperf_loadgen as lg
import pytest

from accuracy.accuracy_log import read_accuracy_log
from sut import LLM, EngineClient, ReplicaPool, SamplingParams, WorkerError, make_engine
from sut.errors import ConfigError
from tests.helpers import random_prompts
from tests.test_loadgen_sut import NUM_SAMPLES, PARAMS, run_loadgen

SETTINGS = dict(num_kv_blocks=256, max_num_seqs=16, device="cpu")


@pytest.fixture(scope="module")
def pool(tiny_llama):
    pool = ReplicaPool(tiny_llama[0], 2, **SETTINGS)
    assert isinstance(pool, EngineClient) and all(hasattr(pool, name) for name in EngineClient.__annotations__)
    yield pool
    pool.close()
    assert not any(p.is_alive() for p in pool.workers.procs)


@pytest.mark.slow
def test_offline_api_with_two_replicas_gives_one_engines_outputs_in_order(tiny_llama):
    prompts = random_prompts([3 + (5 * i) % 30 for i in range(12)], seed=8)
    params = [SamplingParams(max_tokens=6 + i % 4, temperature=0.8 * (i % 2), seed=i) for i in range(12)]
    want = LLM(tiny_llama[0], **SETTINGS).generate(prompts, params)
    llm = LLM(tiny_llama[0], data_parallel_size=2, **SETTINGS)
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.request_id for o in got] == sorted(o.request_id for o in got)
    stats = llm.engine.kv_cache_stats()["replicas"]
    assert len(stats) == 2 and all(s["peak_blocks_used"] > 0 for s in stats), "a replica did no work"
    llm.engine.close()


@pytest.mark.slow
def test_replicas_get_disjoint_cores_and_threads(pool):
    cores = [place["cores"] for place in pool.placements]
    assert all(cores) and not set(cores[0]) & set(cores[1])
    assert [place["env"]["OMP_NUM_THREADS"] for place in pool.placements] == [str(len(c)) for c in cores]


@pytest.mark.parametrize("scenario", [lg.TestScenario.Offline, lg.TestScenario.Server])
def test_loadgen_answers_every_sample_once_with_one_engines_tokens(tiny_llama, pool, tmp_path, scenario):
    prompts = random_prompts([5 + (i * 7) % 40 for i in range(NUM_SAMPLES)], seed=21)
    assert not run_loadgen(
        tiny_llama,
        prompts,
        tmp_path,
        scenario,
        lg.TestMode.AccuracyOnly,
        engine=pool,
        min_query_count=NUM_SAMPLES,
        server_target_qps=50,
    )
    entries = json.loads((tmp_path / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in entries) == list(range(NUM_SAMPLES)), "a sample lost or answered twice"
    logged = read_accuracy_log(tmp_path / "mlperf_log_accuracy.json")
    want = LLM(tiny_llama[0], **SETTINGS).generate(prompts, PARAMS)
    assert [logged[i] for i in range(NUM_SAMPLES)] == [o.token_ids for o in want]


@pytest.mark.slow
def test_a_killed_replica_ends_the_run_with_its_name_and_every_request_answered_once(tiny_llama):
    pool = ReplicaPool(tiny_llama[0], 2, **SETTINGS)
    assert isinstance(pool, EngineClient) and all(hasattr(pool, name) for name in EngineClient.__annotations__)
    try:
        prompts = random_prompts([20] * 16, seed=3)
        # Two short requests (one a replica, least work first), the rest long enough to be in flight.
        ids = [
            pool.add_request(p, SamplingParams(max_tokens=4 if i < 2 else 230, ignore_eos=True))
            for i, p in enumerate(prompts)
        ]
        answered = []
        while len(answered) < 2:  # both replicas at work
            answered += pool.step()
        victim = pool.workers.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=rf"data-parallel replica 1 \(pid {victim.pid}, cores .*\) died"):
            while True:
                answered += pool.step()
        # Seen at the next poll (POLL_S) with no news: the bound tells that from a hang, with the
        # margin a loaded machine needs.
        assert time.monotonic() - start < 30
        answered += pool.fail_all("replica died")
        assert sorted(o.request_id for o in answered) == sorted(ids), "a request lost or answered twice"
        assert any(o.finish_reason == "error" for o in answered)
        with pytest.raises(WorkerError, match="replicas stopped"):
            pool.add_request(prompts[0])
    finally:
        pool.close()
    assert not any(p.is_alive() for p in pool.workers.procs)


@pytest.mark.slow
def test_a_replica_that_cannot_load_is_named(tiny_llama, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_llama[0].iterdir():
        data = f.read_bytes()
        (broken / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors" else data)
    with pytest.raises(WorkerError, match=r"data-parallel replica \d .* could not start: CheckpointError"):
        ReplicaPool(broken, 2, **SETTINGS)


def test_bad_data_parallel_settings_are_refused_by_name(tiny_llama):
    with pytest.raises(ConfigError, match="data_parallel_size must be a positive integer"):
        make_engine(tiny_llama[0], data_parallel_size=0)
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match=f"needs {cores + 1} cores"):
        make_engine(tiny_llama[0], data_parallel_size=cores + 1, **SETTINGS)
    with pytest.raises(ConfigError, match="use sut.make_engine"):
        from sut import LLMEngine

        LLMEngine(tiny_llama[0], data_parallel_size=2)

"""Disaggregated prefill and decode (sut/engine/disaggregated.py, sut/engine/kv_transfer.py): a
prefill worker and a decode worker on gloo give one engine's tokens (greedy and seeded sampling,
chunked prefill, preemption on the decode side, stop tokens, both proposers), the first token comes
from the prefill side and the prompt's blocks move once, LoadGen gets every sample answered once,
aborts on either side are answered once, and bad settings are refused by name. (A worker killed
mid-run: tests/test_worker_death.py.)"""

import json
import os

import mlperf_loadgen as lg
import pytest

from accuracy.accuracy_log import read_accuracy_log
from sut import LLM, EngineClient, SamplingParams, make_engine
from sut.engine.disaggregated import DisaggregatedPool
from sut.errors import ConfigError
from tests.helpers import random_prompts
from tests.test_loadgen_sut import NUM_SAMPLES, PARAMS, detail, run_loadgen
from tests.test_speculative import proposers, repetitive_prompts, tiny_draft  # noqa: F401 (a fixture)

SPLIT = {"prefill": 1, "decode": 1}
# A step of 24 tokens: longer prompts are prefilled in chunks; 12 blocks of 16 tokens do not hold
# eight requests to the end: the decode side preempts.
SETTINGS = dict(num_kv_blocks=12, max_model_len=192, max_num_batched_tokens=24, device="cpu")


def requests(n: int, seed: int):
    prompts = random_prompts([3 + (11 * i) % 50 for i in range(n)], seed=seed)
    params = [
        SamplingParams(
            max_tokens=[1, 9, 90, 40][i % 4],
            temperature=0.9 * (i % 2),
            seed=i if i % 2 else None,
            min_tokens=i % 3 if i % 4 else 0,
            stop_token_ids=[7, 19] if i % 3 == 2 else (),
            ignore_eos=i % 4 == 2,  # long enough to fill the KV cache
        )
        for i in range(n)
    ]
    return prompts, params


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_outputs_are_one_engines_with_first_tokens_from_the_prefill_side(tiny_llama, batch):
    prompts, params = requests(12, seed=5)
    want = LLM(tiny_llama[0], max_num_seqs=batch, **SETTINGS).generate(prompts, params)
    llm = LLM(tiny_llama[0], max_num_seqs=batch, disaggregation=SPLIT, **SETTINGS)
    pool = llm.engine
    assert isinstance(pool, DisaggregatedPool) and isinstance(pool, EngineClient)
    try:
        got = llm.generate(prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
        assert any(o.finish_reason == "stop" for o in got) and any(len(o.token_ids) > 1 for o in got)
        went_on = sum(len(o.token_ids) > 1 for o in got)  # the others ended with their first token
        transfers = pool.transfer_stats()
        sent, received = transfers["prefill"][0]["sent"], transfers["decode"][0]["received"]
        assert sent["transfers"] == received["transfers"] == went_on
        block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 layers, 16 tokens, 2 KV heads of 16, fp32
        blocks = sum(-(-len(p) // 16) for p, o in zip(prompts, got) if len(o.token_ids) > 1)
        assert sent["bytes"] == received["bytes"] == blocks * block_bytes
        stats = pool.kv_cache_stats()
        if batch == 8:
            assert stats["decode"][0]["num_preemptions"] > 0, "the decode side never preempted"
    finally:
        pool.close()
    assert not any(p.is_alive() for p in pool.workers.procs)


@pytest.mark.slow
def test_both_proposers_on_the_decode_side_are_token_identical(tiny_llama, tiny_draft):  # noqa: F811
    prompts = repetitive_prompts(6, seed=2)
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8 * (i % 2), seed=i) for i in range(6)]
    for name, spec in proposers(tiny_llama, tiny_draft).items():
        if name == "target":
            continue
        # Seeded sampling with speculation draws from the generator as the verifier does: the
        # same engine with the same proposer, colocated, is the reference (greedy: any engine).
        # Room for all: a preempted sequence drops the drafts it drew, whichever engine preempts it.
        settings = {**SETTINGS, "num_kv_blocks": 64}
        want = LLM(tiny_llama[0], speculative_config=spec, **settings).generate(prompts, params)
        llm = LLM(tiny_llama[0], disaggregation=SPLIT, speculative_config=spec, **settings)
        try:
            assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in want], name
            spec_stats = llm.engine.spec_stats()
            assert spec_stats["method"] == spec["method"] and spec_stats["num_draft_tokens"] > 0, name
        finally:
            llm.engine.close()


@pytest.fixture(scope="module")
def pool(tiny_llama):
    pool = make_engine(tiny_llama[0], disaggregation=SPLIT, num_kv_blocks=256, max_num_seqs=16, device="cpu")
    yield pool
    pool.close()
    assert not any(p.is_alive() for p in pool.workers.procs)


@pytest.mark.slow
def test_workers_get_disjoint_cores(pool):
    cores = [place["cores"] for place in pool.placements]
    assert all(cores) and not set(cores[0]) & set(cores[1])


def test_loadgen_server_answers_every_sample_once_with_first_tokens_from_the_prefill_side(tiny_llama, pool, tmp_path):
    prompts = random_prompts([5 + (i * 7) % 40 for i in range(NUM_SAMPLES)], seed=21)
    pool.reset()
    accuracy, performance = tmp_path / "accuracy", tmp_path / "performance"
    for folder, mode in ((accuracy, lg.TestMode.AccuracyOnly), (performance, lg.TestMode.PerformanceOnly)):
        folder.mkdir()
        streamed = dict(pool.streamed_by_role)
        assert not run_loadgen(
            tiny_llama,
            prompts,
            folder,
            lg.TestScenario.Server,
            mode,
            engine=pool,
            min_query_count=NUM_SAMPLES,
            min_duration_ms=0,
            server_target_qps=50,
        )
        # Each query's first token streamed from the prefill worker, none from the decode worker
        # (LoadGen's first-token callback; the rest come with the completion).
        assert pool.streamed_by_role["prefill"] - streamed["prefill"] >= NUM_SAMPLES
        assert pool.streamed_by_role["decode"] - streamed["decode"] > 0
    entries = json.loads((accuracy / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in entries) == list(range(NUM_SAMPLES)), "a sample lost or answered twice"
    logged = read_accuracy_log(accuracy / "mlperf_log_accuracy.json")
    want = LLM(tiny_llama[0], num_kv_blocks=256, max_num_seqs=16, device="cpu").generate(prompts, PARAMS)
    assert [logged[i] for i in range(NUM_SAMPLES)] == [o.token_ids for o in want]
    logged = detail(performance)
    assert logged["result_first_token_99.00_percentile_latency_ns"] > 0
    assert logged["result_time_per_output_token_99.00_percentile_ns"] > 0
    received = pool.transfer_stats()["decode"][0]
    assert received["received"]["transfers"] >= NUM_SAMPLES and received["received"]["mb_per_s"] > 0
    assert received["handoff_p99_ms"] is not None


def test_aborts_on_either_side_are_answered_once(pool):
    pool.reset()
    prompts = random_prompts([40] * 6, seed=9)
    ids = [
        pool.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True), on_token=lambda t: None) for p in prompts
    ]
    pool.abort(ids[0])  # still at the prefill worker
    answered, decoded = [], pool.streamed_by_role["decode"]
    while pool.streamed_by_role["decode"] < decoded + 10:  # the others are decoding by now
        answered += pool.step()
    for request_id in ids[1:]:
        pool.abort(request_id)
    while pool.has_unfinished():
        answered += pool.step()
    assert sorted(o.request_id for o in answered) == sorted(ids), "a request lost or answered twice"
    assert all(o.finish_reason == "abort" for o in answered)
    assert all(s["peak_blocks_used"] > 0 for s in pool.kv_cache_stats()["decode"])
    # The routing's counts are back to nothing queued and nothing on its way.
    assert pool._prefill_tokens == [0] and pool._claimed == [0] and not pool._claims


def test_bad_disaggregation_settings_are_refused_by_name(tiny_llama):
    for value, message in (
        ({"prefill": 0, "decode": 1}, r"disaggregation.prefill must be an integer >= 1"),
        ({"prefill": 1}, r"disaggregation.decode must be an integer >= 1"),
        ({"prefill": 1, "decode": 1, "ratio": 2}, r"unknown key\(s\) \['ratio'\] in engine setting disaggregation"),
        ([1, 1], "engine setting disaggregation must be an object"),
    ):
        with pytest.raises(ConfigError, match=message):
            make_engine(tiny_llama[0], disaggregation=value)
    with pytest.raises(ConfigError, match="data_parallel_size > 1 and disaggregation"):
        make_engine(tiny_llama[0], disaggregation=SPLIT, data_parallel_size=2)
    with pytest.raises(ConfigError, match="static_batching and disaggregation"):
        make_engine(tiny_llama[0], disaggregation=SPLIT, static_batching=True)
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(
        ConfigError, match=f"disaggregation=1 prefill \\+ {cores} decode workers needs {cores + 1} cores"
    ):
        make_engine(tiny_llama[0], disaggregation={"prefill": 1, "decode": cores}, device="cpu")
    with pytest.raises(ConfigError, match="use sut.make_engine"):
        from sut import LLMEngine

        LLMEngine(tiny_llama[0], disaggregation=SPLIT)

"""The rigs' data-sheet step costs (harness/predict/rigs.py): the models' parameter counts as
published, a step costing the longer of its reads and its FLOPs, and a faster memory giving a
bandwidth-bound engine its share more."""

import pytest

from harness.predict.rigs import (
    EFFICIENCY,
    GPUS,
    MODELS,
    TRAFFIC,
    Placement,
    offline_rate,
    placement,
    placement_row,
    replica_engine,
    roofline_costs,
)
from systems.schema import System


def test_the_shapes_hold_the_published_parameter_counts():
    # Llama-3.1-8B: 8.03 B parameters (its model card); Llama-2-70B: 68.98 B (the Llama 2 paper's 70B).
    assert MODELS["llama3.1-8b"].parameters == pytest.approx(8.03e9, rel=0.005)
    assert MODELS["llama2-70b-99.9"].parameters == pytest.approx(68.98e9, rel=0.005)
    # K and V for 32 layers, 8 KV heads of 128, in bf16: 128 KiB a token.
    assert MODELS["llama3.1-8b"].kv_bytes_per_token(2.0) == 32 * 2 * 8 * 128 * 2


def test_a_step_costs_the_longer_of_its_reads_and_its_flops():
    costs = roofline_costs(GPUS["H100-SXM-80GB"], MODELS["llama3.1-8b"], "bfloat16", tp=1)
    bandwidth = 3.35e12 * EFFICIENCY.bandwidth
    # One decoding row at 1,000 tokens of context: the weights and its KV cache read.
    decode = {"step": 1, "prefill_token": 0, "decode_token": 1, "attention": 1000.5, "decode_context": 1001}
    read = (2 * MODELS["llama3.1-8b"].parameters + 1001 * 131072) / bandwidth
    assert costs.seconds(decode) == pytest.approx(read + EFFICIENCY.host_s)
    # A 4,096-token prefill chunk: its GEMMs and attention, far longer than reading the weights.
    prefill = {"step": 1, "prefill_token": 4096, "decode_token": 0, "attention": 4096 * 2048.5, "decode_context": 0}
    flops = 4096 * 2 * MODELS["llama3.1-8b"].parameters + 4096 * 2048.5 * 4 * 32 * 32 * 128
    assert costs.seconds(prefill) == pytest.approx(flops / (989.5e12 * EFFICIENCY.compute) + EFFICIENCY.host_s)
    assert costs.seconds(prefill, scale=1.2) == pytest.approx(1.2 * costs.seconds(prefill))
    # FP8 weights: half the bytes to read, twice the peak.
    fp8 = roofline_costs(GPUS["H100-SXM-80GB"], MODELS["llama3.1-8b"], "fp8", tp=1)
    assert fp8.weight_bytes == costs.weight_bytes / 2 and fp8.compute == 2 * costs.compute


def test_a_faster_memory_serves_offline_faster_by_at_most_its_bandwidth():
    rates = {}
    for rig in ("H100-SXM-80GB", "H200-SXM-141GB"):
        system = System.load(f"8x{rig}")
        costs = roofline_costs(GPUS[rig], MODELS["llama3.1-8b"], "bfloat16", tp=1)
        engine, replicas = replica_engine(system, "llama3.1-8b", "Offline", costs)
        assert replicas == 8 and engine.config.max_num_seqs == 256
        rates[rig] = offline_rate(engine, TRAFFIC["llama3.1-8b"], queries=600)
    assert 1.0 < rates["H200-SXM-141GB"] / rates["H100-SXM-80GB"] <= 4.8 / 3.35 + 1e-6


def test_a_split_serves_what_the_lower_of_its_two_pools_does():
    found = Placement(gpus=8, prefill_per_gpu=40.0, decode_per_gpu=10.0, colocated_per_gpu=9.0)
    splits = found.splits()
    assert splits[0] == (2, 6, 60.0) and len(splits) == 7  # 2 x 40 = 80 prefill, 6 x 10 = 60 decode
    assert all(q == min(p * 40.0, d * 10.0) for p, d, q in splits)
    assert [q for *_, q in splits] == sorted((q for *_, q in splits), reverse=True)
    assert Placement(8, None, 10.0, 9.0).splits() == []
    assert "2P + 6D: 60.0 QPS (0.83x colocated 72.0)" in placement_row(found)


def test_each_phase_alone_is_simulated_at_its_own_limit(monkeypatch):
    """On a short simulated run: a GPU that only prefills serves more prompts at the TTFT limit than
    one that also decodes them, and a colocated GPU's capacity stays under the pools' combined."""
    import harness.predict.rigs as rigs

    monkeypatch.setattr(rigs, "SIM_DURATION_MS", 10_000)
    monkeypatch.setattr(rigs, "SIM_QUERIES", 200)
    found = placement("H200-SXM-141GB", "llama3.1-8b", "Server", "fp8")
    assert found.gpus == 8 and found.prefill_per_gpu > found.colocated_per_gpu > 0
    assert found.decode_per_gpu > 0
    best = found.splits()[0]
    assert best[0] + best[1] == 8 and best[2] == min(best[0] * found.prefill_per_gpu, best[1] * found.decode_per_gpu)

"""The 8-GPU rigs' system files: every benchmark and scenario resolves (engine settings checked by
the engine's rules, user.conf by LoadGen's keys), the llama2-70b split fits the card (weights plus
the K/V of one longest sequence per GPU, within the engine's memory budget), and `make submission`
on a rig builds none of the CPU demo's model or data."""

import os
import subprocess

import pytest

from harness.config import RunConfig
from systems.benchmarks import BENCHMARKS
from systems.schema import REPO, System

RIGS = {"8xH100-SXM-80GB": 80e9, "8xH200-SXM-141GB": 141e9}
# Llama-2-70B and Llama-3.1-8B (their config.json): hidden, intermediate, layers, heads, KV heads, vocabulary.
SHAPES = {"llama2-70b-99.9": (8192, 28672, 80, 64, 8, 32000), "llama3.1-8b": (4096, 14336, 32, 32, 8, 128256)}


def weight_bytes(hidden, intermediate, layers, heads, kv_heads, vocab) -> int:
    head_dim = hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    return 2 * (layers * (attention + 3 * hidden * intermediate + 2 * hidden) + 2 * vocab * hidden + hidden)


@pytest.mark.parametrize("rig", RIGS)
def test_each_benchmark_and_scenario_resolves(rig):
    system = System.load(rig)
    assert system.division == "closed" and not system.demo
    for benchmark in ("llama3.1-8b", "llama2-70b-99.9"):
        for scenario in system.scenarios:
            cfg = RunConfig.resolve(rig, benchmark, scenario, "performance")
            assert BENCHMARKS[benchmark].loadgen_name(scenario) in cfg.user_conf.read_text()
    assert system.engine_settings("Server", "llama3.1-8b")["data_parallel_size"] == 8
    assert system.engine_settings("Server", "llama3.1-8b")["tensor_parallel_size"] == 1


@pytest.mark.parametrize("rig", RIGS)
def test_the_70b_split_fits_the_card_and_uses_all_eight(rig):
    settings = System.load(rig).engine_settings("Offline", "llama2-70b-99.9")
    tp, dp = settings["tensor_parallel_size"], settings["data_parallel_size"]
    assert tp * dp == 8
    hidden, intermediate, layers, heads, kv_heads, vocab = SHAPES["llama2-70b-99.9"]
    per_gpu = weight_bytes(*SHAPES["llama2-70b-99.9"]) / tp
    kv_per_token = 2 * layers * kv_heads * (hidden // heads) * 2 / tp
    budget = settings["gpu_memory_utilization"] * RIGS[rig]
    assert per_gpu + 2048 * kv_per_token * 16 < budget, "sixteen sequences of 1024 + 1024 tokens do not fit"
    if tp > 1:  # the next smaller split would not leave room for them
        assert weight_bytes(*SHAPES["llama2-70b-99.9"]) / (tp // 2) + 2048 * kv_per_token * 2 * 16 > budget


def test_make_submission_on_a_rig_builds_no_demo_model_or_data(tmp_path):
    env = {**os.environ, "SAAF_CACHE": str(tmp_path)}  # where nothing is built yet
    for rig in RIGS:
        plan = subprocess.run(
            ["make", "-n", "submission", f"SYSTEM={rig}"], cwd=REPO, env=env, capture_output=True, text=True
        ).stdout
        assert "compliance.submission --system " + rig in plan
        assert "convert_gguf" not in plan and "demo_data" not in plan
    demo = subprocess.run(["make", "-n", "submission"], cwd=REPO, env=env, capture_output=True, text=True).stdout
    assert "convert_gguf" in demo and "demo_data" in demo

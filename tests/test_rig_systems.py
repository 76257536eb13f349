"""The 8-GPU rigs' system files: every benchmark and scenario resolves (engine settings checked by
the engine's rules, user.conf by LoadGen's keys), the llama2-70b split fits the card (weights plus
the K/V of one longest sequence per GPU, within the engine's memory budget), gpt-oss-120b's one GPU
a replica holds its weights and its batch of the performance set's longest sequences, deepseek-r1's
FP8 weights fit eight H200s (not eight H100s) with its batch, and `make
submission` on a rig builds none of the CPU demo's model or data; only deepseek-r1 and gpt-oss-120b
Interactive speculate, each as the closed division allows it (the reference's head, 3 drafts)."""

import math
import os
import subprocess

import pytest
import torch

from harness.config import RunConfig, check_engine_settings, check_speculation_allowed
from sut.bench.gpu_steps import DEEPSEEK_R1
from sut.config import ModelConfig
from sut.worker.kv_cache import blocks_for_one_sequence, kv_bytes_per_block
from systems.benchmarks import BENCHMARKS
from systems.schema import REPO, System, saaf_cache

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
    for benchmark in ("llama3.1-8b", "llama2-70b-99.9", "gpt-oss-120b", "deepseek-r1"):
        if benchmark not in system.models:  # deepseek-r1 needs more than 8 H100s
            continue
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


# openai/gpt-oss-120b's config.json (v61-models.md section 2b): 36 layers alternating a 128-token
# sliding window and full attention, 64 query and 8 KV heads of 64, 128 experts (top 4) of
# intermediate 2880 in MXFP4, the rest bf16.
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "attention_bias": True,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
    "rope_theta": 150000,
    "quantization_config": {"quant_method": "mxfp4"},
    "torch_dtype": "bfloat16",
    "eos_token_id": 200002,
}
MXFP4_BITS = 4.25  # 4-bit e2m1 values and one 8-bit E8M0 scale per 32
PERF_LONGEST = 15330 + 10240  # the performance set's longest prompt and the most new tokens
ACCURACY_LONGEST = 2871 + 32768  # the accuracy set's longest prompt (NVIDIA's v6.0 README) and its new tokens
CUDA_CONTEXT = 1e9  # the CUDA context and the allocator's slack, which the runner's budget (free memory) sees


def gpt_oss_weight_bytes(c: ModelConfig) -> tuple[float, float]:
    """(the MXFP4 experts' bytes, the bf16 rest's) of one whole copy of gpt-oss (TP 1)."""
    h, e, inter, layers = c.hidden_size, c.moe.num_experts, c.intermediate_size, c.num_layers
    experts = layers * e * (h * 2 * inter + inter * h)  # gate_up [h, 2 x inter] and down [inter, h]
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    attention = h * q + q + 2 * (h * kv + kv) + q * h + h + c.num_heads  # q, k, v, o with biases; sinks
    router, expert_biases, norms = h * e + e, e * (2 * inter + h), 2 * h
    rest = layers * (attention + router + expert_biases + norms) + h + 2 * c.vocab_size * h  # untied embeddings
    return experts * MXFP4_BITS / 8, rest * 2


@pytest.mark.parametrize("rig", RIGS)
def test_gpt_oss_fits_one_gpu_a_replica_with_its_batch_of_the_longest_sequences(rig):
    """Per GPU, as the engine sizes its cache (sut/worker/model_runner.py): the weights, the runner's
    reserves for a step's activations and logits, and the CUDA context, under gpu_memory_utilization
    of the card; in what is left, K/V blocks of 18 layers (a full layer and a window layer share a
    block index, from two tables) for max_num_seqs sequences of the performance set's longest length
    (every token in the full layers' table, the window's 128 in the window layers' table) and one
    step's chunk of window blocks beside them; and room for one sequence of max_model_len, which the
    engine needs to start and which holds every mode's longest sequence."""
    c = ModelConfig.from_dict(GPT_OSS_120B)
    settings = System.load(rig).engine_settings("Offline", "gpt-oss-120b")
    assert (settings["data_parallel_size"], settings["tensor_parallel_size"]) == (8, 1)
    experts, rest = gpt_oss_weight_bytes(c)
    assert 60.5e9 < experts < 61.5e9 and 4.2e9 < rest < 4.5e9  # 60.9 GB and 4.3 GB: 65.2 GB a GPU
    chunk, seqs = settings["max_num_batched_tokens"], settings["max_num_seqs"]
    activations = chunk * (6 * c.hidden_size + 3 * c.intermediate_size) * 4  # the runner's reserves
    logits = seqs * c.vocab_size * 4 * 3
    cache = settings["gpu_memory_utilization"] * RIGS[rig] - experts - rest - activations - logits - CUDA_CONTEXT
    block, bs = kv_bytes_per_block(c, 16, torch.bfloat16), 16
    assert block == 2 * 18 * bs * 8 * 64 * 2  # 36 KiB a token
    window = math.ceil(c.sliding_window / bs) + 1  # a decoding sequence's window blocks
    longest = (math.ceil(PERF_LONGEST / bs) + window) * block
    batch = seqs * longest + math.ceil(chunk / bs) * block  # and a step's chunk in the window layers' table
    assert batch <= cache, (
        f"{seqs} sequences of {PERF_LONGEST} tokens need {batch / 1e9:.1f} GB, {cache / 1e9:.1f} left"
    )
    assert (seqs + 1) * longest + math.ceil(chunk / bs) * block > cache * 0.9  # not far below what fits
    max_model_len = settings["max_model_len"]
    assert max_model_len >= max(PERF_LONGEST, ACCURACY_LONGEST)
    assert blocks_for_one_sequence(c, bs, max_model_len, chunk) * block <= cache


def test_make_submission_on_a_rig_builds_no_demo_model_or_data(tmp_path):
    env = {**os.environ, "SAAF_CACHE": str(tmp_path)}  # where nothing is built yet
    for rig in RIGS:
        plan = subprocess.run(
            ["make", "-n", "submission", f"SYSTEM={rig}"], cwd=REPO, env=env, capture_output=True, text=True
        ).stdout
        assert "harness.submission --system " + rig in plan
        assert "convert_gguf" not in plan and "xsum_demo" not in plan
    demo = subprocess.run(["make", "-n", "submission"], cwd=REPO, env=env, capture_output=True, text=True).stdout
    assert "convert_gguf" in demo and "xsum_demo" in demo


DS_LONGEST_PROMPT, DS_MEAN_RESPONSE, DS_MAX_NEW = 3136 + 4, 3886, 20000  # the reference's MAX_ISL (+ template), OSL


def deepseek_bytes_per_gpu(c: ModelConfig, tp: int) -> float:
    """One GPU's weight bytes at TP (and expert parallel) `tp`: FP8 (1 byte) where the checkpoint has
    it, with a 4-byte scale per 128 x 128 block; bf16 for the embeddings and head (split by vocabulary),
    the norms, the router, and kv_b_proj (dequantized: the absorbed attention splits it)."""
    m, h, layers = c.mla, c.hidden_size, c.num_layers
    heads = c.num_heads // tp
    fp8 = layers * (
        h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)  # q_a and kv_a, on every GPU
        + m.q_lora_rank * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)  # q_b, this GPU's heads
        + heads * m.v_head_dim * h  # o_proj, its columns
    )
    moe_layers, dense_layers = layers - c.moe.first_dense_layers, c.moe.first_dense_layers
    per_expert = 3 * h * c.moe.expert_intermediate_size
    fp8 += dense_layers * 3 * h * c.intermediate_size // tp
    fp8 += moe_layers * (c.moe.num_experts // tp * per_expert + c.moe.shared_experts * per_expert // tp)
    bf16 = layers * (m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim) + 2 * h + m.q_lora_rank)
    bf16 += 2 * c.vocab_size * h // tp + moe_layers * (c.moe.num_experts * h)  # router fp32: counted as 2 x bf16
    return fp8 * (1 + 4 / 128**2) + 2 * bf16


def test_deepseek_r1_fits_eight_h200s_in_fp8_with_its_batch():
    """Per GPU at TP/EP 8, as the engine sizes its cache: the FP8 weights (~85 GB), the runner's
    reserves and the CUDA context under gpu_memory_utilization of the card; in what is left, the
    latent K/V (576 values a token a layer, the same on every GPU) of max_num_seqs sequences of the
    longest prompt and the reference's mean response, and one sequence of max_model_len, which holds
    the longest prompt and the most new tokens. On 8 H100s the weights alone exceed the budget."""
    c = ModelConfig.from_dict(DEEPSEEK_R1)
    assert c.quantization == "fp8" and c.mla.cache_dim == 576 and c.moe.first_dense_layers == 3
    rig = "8xH200-SXM-141GB"
    settings = System.load(rig).engine_settings("Offline", "deepseek-r1")
    tp = settings["tensor_parallel_size"]
    assert (settings["data_parallel_size"], tp) == (1, 8)
    weights = deepseek_bytes_per_gpu(c, tp)
    assert 83e9 < weights < 87e9, weights
    chunk, seqs = settings["max_num_batched_tokens"], settings["max_num_seqs"]
    activations = chunk * (6 * c.hidden_size + 3 * c.intermediate_size) * 4
    logits = seqs * c.vocab_size * 4 * 3
    cache = settings["gpu_memory_utilization"] * RIGS[rig] - weights - activations - logits - CUDA_CONTEXT
    bs = 16
    block = kv_bytes_per_block(c, bs, torch.bfloat16)
    assert block == 61 * bs * 576 * 2  # 70,272 B a token
    mean = math.ceil((DS_LONGEST_PROMPT + DS_MEAN_RESPONSE) / bs) * block
    assert seqs * mean <= cache, f"{seqs} sequences need {seqs * mean / 1e9:.1f} GB, {cache / 1e9:.1f} left"
    assert settings["max_model_len"] >= DS_LONGEST_PROMPT + DS_MAX_NEW
    assert blocks_for_one_sequence(c, bs, settings["max_model_len"], chunk) * block <= cache
    h100 = System.load("8xH100-SXM-80GB")
    assert "deepseek-r1" not in h100.models
    assert weights > h100.engine_settings("Offline")["gpu_memory_utilization"] * RIGS["8xH100-SXM-80GB"]


def test_deepseek_r1_interactive_holds_its_mtp_module_beside_its_batch():
    """The speculating Interactive engine holds, per GPU, its part of the MTP module as the runner
    loads it (built on the meta device: one MoE layer's heads and 32 experts, FP8 kept as the
    checkpoint stores them, eh_proj counted bf16) and a one-layer latent cache beside the 61 layers'
    (a pool block costs 62/61), and still fits its batch of the longest prompt and mean response."""
    from sut.model.deepseek_mtp import DeepseekV3MTPLayer
    from sut.model.fp8 import keep_checkpoint_fp8
    from sut.model.loader import checkpoint_layout
    from sut.parallel import Shard, local_config

    c = ModelConfig.from_dict(DEEPSEEK_R1)
    rig = "8xH200-SXM-141GB"
    settings = System.load(rig).engine_settings("Interactive", "deepseek-r1")
    tp, seqs, chunk = settings["tensor_parallel_size"], settings["max_num_seqs"], settings["max_num_batched_tokens"]
    assert settings["speculative_config"]["method"] == "mtp"
    with torch.device("meta"):
        layer = DeepseekV3MTPLayer(local_config(c, tp)).bfloat16()
        layer.mlp.gate.float()  # the router's weight and bias stay fp32, as the loader keeps them
        layout = checkpoint_layout(layer, Shard(0, tp))
        scaled = {
            n for n, (_, _, shape) in layout.items() if len(shape) == 2 and "norm" not in n and "eh_proj" not in n
        }
        kept = keep_checkpoint_fp8(layer, scaled, torch.bfloat16)
    assert "mlp.experts" in kept and "self_attn.o_proj" in kept
    module = sum(p.numel() * p.element_size() for p in layer.parameters())
    assert 1.6e9 < module < 1.7e9, module  # 32 experts x 44M FP8 params, eh_proj 7168 x 14336 bf16, attention
    activations = chunk * (6 * c.hidden_size + 3 * c.intermediate_size) * 4
    logits = seqs * c.vocab_size * 4 * 3
    weights = deepseek_bytes_per_gpu(c, tp) + module
    cache = settings["gpu_memory_utilization"] * RIGS[rig] - weights - activations - logits - CUDA_CONTEXT
    bs = 16
    block = kv_bytes_per_block(c, bs, torch.bfloat16) * 62 // 61
    mean = math.ceil((DS_LONGEST_PROMPT + DS_MEAN_RESPONSE) / bs) * block
    assert seqs * mean <= cache, f"{seqs} sequences need {seqs * mean / 1e9:.1f} GB, {cache / 1e9:.1f} left"
    assert blocks_for_one_sequence(c, bs, settings["max_model_len"], chunk) * block <= cache
    # The rig file's note: ~499k tokens of room, where the same budget without the module holds ~531k.
    without = cache + module
    assert 490e3 < cache / (block / bs) < 510e3 and 520e3 < without / (block * 61 / 62 / bs) < 540e3


# Where v6.1's closed division allows speculative decoding, as the reference runs it (systems/benchmarks.py).
DS_I = ("deepseek-r1", "Interactive")
SPECULATING = {
    DS_I: {"method": "mtp", "num_speculative_tokens": 3},
    ("gpt-oss-120b", "Interactive"): {
        "method": "eagle3",
        "model": str(saaf_cache() / "models" / "gpt-oss-120b-Eagle3-long-context"),
        "num_speculative_tokens": 3,
    },
}


@pytest.mark.parametrize("rig", RIGS)
def test_only_deepseek_r1_and_gpt_oss_interactive_speculate_with_the_references_heads(rig):
    """Each speculating engine is Interactive's own (a second engine: its settings are Offline's and
    Server's with speculative_config), checked by the engine's rules and the closed division's."""
    system = System.load(rig)
    speculating = 0
    for benchmark in system.models:
        for scenario in system.scenarios:
            settings = system.engine_settings(scenario, benchmark)
            want = SPECULATING.get((benchmark, scenario))
            assert settings.get("speculative_config") == want, (benchmark, scenario)
            check_engine_settings(system, benchmark, scenario)
            check_speculation_allowed(system, BENCHMARKS[benchmark], scenario)
            if want is not None:
                speculating += 1
                plain = {k: v for k, v in settings.items() if k != "speculative_config"}
                assert (
                    plain == system.engine_settings("Offline", benchmark) == system.engine_settings("Server", benchmark)
                )
    assert speculating == (2 if "deepseek-r1" in system.models else 1)
    for benchmark in ("llama3.1-8b", "llama2-70b-99.9"):
        assert "speculative_config" not in system.engine_settings("Interactive", benchmark)


def test_the_report_of_a_speculating_engine_runs_its_configurations_on_one_engine():
    """harness/measure/ablation.py at deepseek-r1's Interactive settings (and Server's): only the report's own
    proposer configuration speculates (report.proposers: MTP for deepseek-r1; gpt-oss-120b's EAGLE3
    head is not deepseek-r1's), and the run worker's Offline and Server runs get the same settings
    under each configuration's (harness/run_worker.py refuses a run whose differ), also where Server
    itself speculates (as an open-division file might)."""
    from harness.measure.ablation import configurations

    def rig(server_speculates: bool) -> System:
        system = System.load("8xH200-SXM-141GB")
        if server_speculates:
            system.benchmark_scenario_engine["deepseek-r1"]["Server"] = {"speculative_config": SPECULATING[DS_I]}
        return system

    for server_speculates in (False, True):
        for scenario in ("Interactive", "Server"):
            configs = configurations(rig(server_speculates), "deepseek-r1", DS_LONGEST_PROMPT, scenario)
            speculating = [c for c in configs if c.engine.get("speculative_config") is not None]
            assert [(c.label, c.engine["speculative_config"]) for c in speculating] == [
                ("MTP speculation", SPECULATING[DS_I])
            ]
            for config in configs:
                system = rig(server_speculates)
                for run in ("Offline", "Server"):
                    system.lay_over(run, config.engine)
                assert system.engine_settings("Offline", "deepseek-r1") == system.engine_settings(
                    "Server", "deepseek-r1"
                ), (server_speculates, scenario, config.label)

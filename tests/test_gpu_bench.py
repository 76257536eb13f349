"""sut/bench/gpu_steps.py (gpu_check's engine steps) on a tiny Llama shape on CPU, Triton kernels in the
interpreter: the steps run through the engine's ModelRunner, and the roofline's bytes are the
weights read plus every context's K/V."""

import os
import subprocess
import sys

import pytest
import torch

from sut.bench.gpu_steps import StepBench
from tests.test_triton_kernels import REPO

TINY = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
    dtype="float32",
)


@pytest.mark.slow
def test_step_bench_runs_decode_and_mixed_steps(monkeypatch):
    bench = StepBench(
        TINY,
        "cpu",
        max_num_seqs=4,
        max_model_len=64,
        max_tokens=4 * 20 + 2 * 16,
        kernels="triton",
        cpu={"quantized_weights": False},
    )
    outputs = []
    execute = bench.runner.execute
    monkeypatch.setattr(bench.runner, "execute", lambda step: outputs.append(execute(step)) or outputs[-1])
    decode = bench.measure(3, 20, repeats=2)
    mixed = bench.measure(2, 20, prefill=16, repeats=2)
    assert [o.shape for o in outputs] == [(3, 256)] * 4 + [(3, 256)] * 4  # 2 warm + 2 timed; logits per sequence
    assert all(torch.isfinite(o).all() for o in outputs)
    embed = 256 * 64 * 4
    weights = sum(p.numel() * 4 for p in bench.runner.model.parameters()) - embed
    kv_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads, head_dim 16, fp32
    assert decode["bytes_read"] == weights + 3 * 20 * kv_per_token
    assert mixed["bytes_read"] == weights + (2 * 20 + 2 * 16) * kv_per_token
    assert decode["gpu_ms"] > 0 and mixed["tokens_per_s"] > 0 and not decode["cuda_graphs"]
    assert bench.block_manager.num_free_blocks == bench.block_manager.num_blocks  # each step's sequences freed


def test_step_bench_runs_gpt_oss_with_window_tables_and_mxfp4_experts():
    """gpu_check's gpt-oss steps on a tiny shape: random MXFP4 experts, sinks, window tables."""
    from sut.bench.gpu_steps import GPT_OSS_120B

    tiny = {
        **GPT_OSS_120B,
        **dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        **dict(num_key_value_heads=2, head_dim=16, sliding_window=8, num_local_experts=8, dtype="float32"),
    }
    bench = StepBench(tiny, "cpu", max_num_seqs=4, max_model_len=64, max_tokens=4 * 20 + 2 * 16)
    experts = bench.runner.model.model.layers[0].mlp.experts
    assert experts.mxfp4 and bench.runner.kv_window == 8
    decode = bench.measure(3, 20, repeats=2)
    mixed = bench.measure(2, 20, prefill=16, repeats=2)
    kv_per_token = 2 * 1 * 2 * 16 * 4  # K and V of one layer of each kind, 2 KV heads, head_dim 16, fp32
    touched = 1 - (1 - 4 / 8) ** 3  # the expected share of gpt-oss's top-4 of the tiny 8 experts 3 tokens pick
    assert decode["bytes_read"] == int(bench.weight_bytes + bench.expert_bytes * touched) + 3 * (20 + 8) * kv_per_token
    assert mixed["tokens_per_s"] > 0
    assert bench.block_manager.num_free_blocks == bench.block_manager.num_blocks


REQUIREMENTS_BEYOND_GPU_CHECK = (
    "mlperf_loadgen",
    "transformers",
    "tokenizers",
    "safetensors",
    "datasets",
    "pandas",
    "yaml",
    "tqdm",
    "gguf",
    "accelerate",
    "pytest",
    "rouge_score",
    "absl",
    "six",
    "nltk",
)


@pytest.mark.slow
def test_gpu_check_needs_nothing_beyond_torch_triton_numpy(tmp_path):
    """What a lent GPU machine has: in a process where our other requirements cannot be imported
    (as in a venv without them; torch's optional imports fall back as they would there), every
    module gpu_check's GPU path imports (the engine's steps included) loads, and without a GPU it
    says so and exits 0."""
    code = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {set(REQUIREMENTS_BEYOND_GPU_CHECK)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
import triton.testing, sut.bench.gpu_check
assert sut.bench.gpu_check.main(["--out", {str(tmp_path)!r}, "--kernels-only"]) == 0
sys.exit(sut.bench.gpu_check.main(["--out", {str(tmp_path)!r}]))
"""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("no CUDA GPU") == 2


@pytest.mark.slow
def test_tensor_parallel_check_on_gloo_matches_one_process():
    """gpu_check's TP=2 check, on two CPU processes: random_model's slices make the one process's
    model, so the logits agree to fp32 rounding and the greedy tokens are the same."""
    from sut.bench.gpu_steps import tensor_parallel_check

    result = tensor_parallel_check(TINY, "cpu")
    assert result["size"] == 2 and result["greedy_tokens_agree"]
    assert result["max_abs_logit_diff"] < 1e-5 * max(1.0, result["logit_scale"]), result


def test_the_results_page_has_each_half_it_was_given():
    """sut/bench/gpu_report.py's page from the kernels' results alone, and with the engine's too
    (synthetic numbers: the page's layout, which only a GPU run would otherwise reach)."""
    from sut.bench.gpu_report import markdown

    row = dict(ok=True, max_abs_err=1e-3, case="c", dtype="bf16", error=None)
    kernels_only = dict(
        device="NVIDIA H200",
        software="torch x",
        peak_gbps=4800,
        peak_tflops=989,
        measured_gbps=4000.0,
        measured_tflops=700.0,
        elapsed_s=1.0,
        checks={"decode attention": [row]},
        decode=[dict(batch=32, context=2048, ms=0.1, gbps=3600.0, peak_ratio=0.9, sdpa_ms=0.2, speedup_vs_sdpa=2.0)],
        prefill=[
            dict(case="1 x 4096", tokens=4096, ms=1.0, tflops=500.0, peak_ratio=0.7, sdpa_ms=None, speedup_vs_sdpa=None)
        ],
    )
    page = markdown(kernels_only)
    assert "| decode attention | 1 | 0 | 1.00e-03 |" in page and "| 32 | 2048 | 0.100 | 3600 | 90% |" in page
    assert "Engine steps" not in page and "Tensor parallel" not in page
    step = dict(
        model="llama3.1-8b",
        decodes=1,
        context=1024,
        prefill=0,
        cuda_graphs=True,
        gpu_ms=10.0,
        host_ms=0.5,
        tokens_per_s=100.0,
        gbps=3500.0,
        peak_ratio=0.875,
        host_share=0.05,
    )
    page = markdown({**kernels_only, "tensor_parallel": dict(skipped="1 GPU"), "engine": [step]})
    assert "Tensor parallel (TP=2 against one process" in page and "not run: 1 GPU" in page
    assert "| llama3.1-8b | 1 decodes x 1024 | CUDA graphs | 10.000 | 0.500 | 5% | 100 | 3500 | 88% |" in page
    assert (
        "8B decode step at batch 1 >= 85% of the weight-plus-KV roofline (best of eager and graphs): met in 1 of 1"
        in page
    )


@pytest.mark.slow
def test_step_bench_runs_one_rank_of_a_deepseek_r1_shaped_fp8_model():
    """gpu_check's DeepSeek-R1 steps on a tiny shape: rank 0's share of TP/EP 2 alone in a group of
    one, its decoder linears and experts FP8 with 128 x 128 block scales (the slices of the whole
    random model's), steps over the latent cache with logits of its vocabulary slice."""
    from sut.bench.gpu_steps import DEEPSEEK_R1
    from sut.config import ModelConfig
    from sut.model.fp8 import Fp8Linear
    from sut.model.loader import random_model

    tiny = {
        **DEEPSEEK_R1,
        **dict(vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=128),
        **dict(num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4),
        **dict(n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2, n_shared_experts=2),
        **dict(q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64),
        **dict(max_position_embeddings=256, torch_dtype="float32"),
    }
    bench = StepBench(tiny, "cpu", max_num_seqs=4, max_model_len=64, max_tokens=4 * 20 + 2 * 16, one_rank_of=2)
    try:
        model = bench.runner.model
        attn, moe = model.model.layers[1].self_attn, model.model.layers[1].mlp
        assert isinstance(attn.q_b_proj, Fp8Linear) and moe.experts.fp8
        assert moe.experts.gate_up_proj.shape[0] == 4 and model.lm_head.weight.shape[0] == 128
        whole = random_model(ModelConfig.from_dict(tiny), torch.float32, torch.device("cpu"))
        want = whole.model.layers[1].self_attn.q_b_proj
        assert torch.equal(attn.q_b_proj.weight.view(torch.uint8), want.weight[:256].view(torch.uint8))
        assert torch.equal(attn.q_b_proj.weight_scale_inv, want.weight_scale_inv[:2])
        assert torch.equal(moe.experts.down_proj, whole.model.layers[1].mlp.experts.down_proj[:4])
        outputs = []
        execute = bench.runner.execute
        bench.runner.execute = lambda step: outputs.append(execute(step)) or outputs[-1]
        decode = bench.measure(3, 20, repeats=2)
        mixed = bench.measure(2, 20, prefill=16, repeats=2)
        assert all(o.shape[1] == 128 and torch.isfinite(o).all() for o in outputs)
        kv_per_token = 2 * (64 + 64) * 4  # one entry a layer (the 64-dim latent and 64 rope dims), 2 layers, fp32
        touched = 1 - (1 - 2 / 8) ** 3
        assert decode["bytes_read"] == int(bench.weight_bytes + bench.expert_bytes * touched) + 3 * 20 * kv_per_token
        assert mixed["tokens_per_s"] > 0
        assert bench.block_manager.num_free_blocks == bench.block_manager.num_blocks
    finally:
        bench.close()


def test_one_peak_measurement_serves_the_report_and_the_gpu_check():
    """sut/bench/peaks.py measures for both: the report's (harness/measure/roofline.py: 256 MiB, 2048-square,
    best of 5) and the GPU check's (its own sizes and timer, here a stub that says each call took 1 ms)."""
    from harness.measure.roofline import measure_peaks as report_peaks
    from sut.bench.peaks import data_sheet_peaks, measure_peaks

    timed = []

    def one_ms(fn):
        timed.append(fn())
        return 1e-3

    got = measure_peaks("cpu", torch.float32, copy_bytes=4 << 20, matmul_size=64, timer=(one_ms, "a stub"))
    assert len(timed) == 2 and timed[1].shape == (64, 64)
    assert got["bandwidth_gbps"] == 2 * (4 << 20) / 1e-3 / 1e9 and got["flops_tflops"] == 2 * 64**3 / 1e-3 / 1e12
    assert got["method"].startswith("a 4 MiB copy (read + write) and a 64-square float32 matrix product, a stub")
    report = report_peaks()
    assert report.keys() == got.keys() and report["device"] == "cpu"
    assert report["method"].startswith(
        "a 256 MiB copy (read + write) and a 2048-square float32 matrix product, best of 5"
    )
    assert data_sheet_peaks("NVIDIA H100 80GB HBM3") == (3350, 989) and data_sheet_peaks("NVIDIA H100 NVL")[0] == 3900
    assert data_sheet_peaks("a CPU") == (None, None)

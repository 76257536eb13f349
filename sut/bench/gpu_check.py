"""`make gpu-check`, the engine's half: kernels/gpu_check.py's checks and benchmarks, then tensor
parallelism against one process (where there are two GPUs) and the engine's own steps on a
Llama-3.1-8B-shaped model with random weights (sut/bench/gpu_steps.py: decode at batch 1, 32, 128,
256 and a mixed step, eager and from CUDA graphs, against the weight-plus-KV roofline), then on a
gpt-oss-120b-shaped one with random MXFP4 experts, in the same results.json and results.md. Without
a GPU it says so and exits 0.

    python3 -m sut.bench.gpu_check --out build/gpu-check

Like the kernels' half it needs torch, Triton and numpy alone, so it runs on a lent GPU machine as
it is.
"""

import sys

import torch

from kernels import gpu_check
from sut.bench.gpu_steps import GPT_OSS_120B, LLAMA_31_8B, StepBench, tensor_parallel_check

# The engine's steps on Llama-3.1-8B's shape (sut/bench/gpu_steps.py): decodes over ~1k-token contexts,
# and one mixed step of a 2048-token prefill chunk beside 256 decodes.
ENGINE_BATCHES = [1, 32, 128, 256]
ENGINE_CONTEXT = 1024
ENGINE_MIXED = (256, 2048)
GPT_OSS_BATCHES = [1, 64, 256]


def bench_engine(device, peak_gbps) -> list[dict]:
    """Each step eager and from CUDA graphs (the mixed step runs eagerly either way)."""
    decodes, prefill = ENGINE_MIXED
    max_tokens = max(ENGINE_BATCHES) * ENGINE_CONTEXT + 2 * prefill
    print("  engine steps: a Llama-3.1-8B-shaped model with random bf16 weights, capturing CUDA graphs", flush=True)
    bench = StepBench(
        LLAMA_31_8B,
        device,
        max_num_seqs=max(ENGINE_BATCHES),
        max_model_len=2 * prefill,
        max_tokens=max_tokens,
        cuda_graphs=True,
    )
    graphs = bench.runner.graphs
    rows = []
    for mode in ("eager", "CUDA graphs"):
        bench.runner.graphs = graphs if mode == "CUDA graphs" else None
        for batch in ENGINE_BATCHES:
            print(f"  engine decode step, batch {batch}, {mode}", flush=True)
            rows.append(bench.measure(batch, ENGINE_CONTEXT))
        if mode == "eager":
            print(f"  engine mixed step: {prefill} prefill tokens + {decodes} decodes", flush=True)
            rows.append(bench.measure(decodes, ENGINE_CONTEXT, prefill=prefill))
    for row in rows:
        row["weight_bytes"] = bench.weight_bytes
        row["peak_ratio"] = row["gbps"] / peak_gbps if peak_gbps else None
        row["host_share"] = row["host_ms"] / row["gpu_ms"]
    del bench, graphs
    torch.cuda.empty_cache()
    return rows


def bench_engine_gpt_oss(device, peak_gbps) -> list[dict]:
    """gpt-oss-120b's shape with random MXFP4 experts (about 61 GB): decode steps eager and from CUDA
    graphs over ~1k-token contexts, and a mixed step (sinks, window tables, the MXFP4 MoE kernel)."""
    decodes, prefill = 64, 2048
    print("  engine steps: a gpt-oss-120b-shaped model with random MXFP4 experts, capturing CUDA graphs", flush=True)
    bench = StepBench(
        GPT_OSS_120B,
        device,
        max_num_seqs=max(GPT_OSS_BATCHES),
        max_model_len=2 * prefill,
        max_tokens=max(GPT_OSS_BATCHES) * ENGINE_CONTEXT + 2 * prefill,
        cuda_graphs=True,
    )
    graphs = bench.runner.graphs
    rows = []
    for mode in ("eager", "CUDA graphs"):
        bench.runner.graphs = graphs if mode == "CUDA graphs" else None
        for batch in GPT_OSS_BATCHES:
            print(f"  gpt-oss decode step, batch {batch}, {mode}", flush=True)
            rows.append(bench.measure(batch, ENGINE_CONTEXT))
        if mode == "eager":
            print(f"  gpt-oss mixed step: {prefill} prefill tokens + {decodes} decodes", flush=True)
            rows.append(bench.measure(decodes, ENGINE_CONTEXT, prefill=prefill))
    for row in rows:
        row["model"] = "gpt-oss-120b"
        row["weight_bytes"] = bench.weight_bytes + bench.expert_bytes
        row["peak_ratio"] = row["gbps"] / peak_gbps if peak_gbps else None
        row["host_share"] = row["host_ms"] / row["gpu_ms"]
    del bench, graphs
    torch.cuda.empty_cache()
    return rows


def check_tensor_parallel() -> dict:
    """TP=2 against one process on two of the GPUs (sut/bench/gpu_steps.py: a two-layer model of
    Llama-3.1-8B's width, fp32, random weights), where there is more than one GPU."""
    count = torch.cuda.device_count()
    if count < 2:
        print(f"  tensor parallel: {count} GPU here, so no TP=2 check", flush=True)
        return dict(skipped=f"{count} GPU")
    try:
        result = tensor_parallel_check({**LLAMA_31_8B, "num_hidden_layers": 2, "dtype": "float32"}, "cuda")
    except Exception as e:  # noqa: BLE001 - reported in the results
        return dict(ok=False, error=f"{type(e).__name__}: {e}")
    result["ok"] = result["greedy_tokens_agree"] and result["max_abs_logit_diff"] <= 1e-3 * max(
        1.0, result["logit_scale"]
    )
    print(
        f"  tensor parallel: TP=2 {'matches' if result['ok'] else 'DIFFERS from'} one process (largest logit "
        f"difference {result['max_abs_logit_diff']:.2e} of {result['logit_scale']:.2f})",
        flush=True,
    )
    return result


def add_engine_results(results: dict, device, skip_bench: bool) -> None:
    results["tensor_parallel"] = check_tensor_parallel()
    results["engine"] = []
    if not skip_bench:
        try:
            results["engine"] = bench_engine(device, results["measured_gbps"])
        except Exception as e:  # noqa: BLE001 - the kernels' results still get written
            results["engine_error"] = f"{type(e).__name__}: {e}"
            print(f"  engine steps FAILED: {results['engine_error']}", flush=True)
        try:
            results["engine"] += bench_engine_gpt_oss(device, results["measured_gbps"])
        except Exception as e:  # noqa: BLE001
            results["engine_gpt_oss_error"] = f"{type(e).__name__}: {e}"
            print(f"  gpt-oss engine steps FAILED: {results['engine_gpt_oss_error']}", flush=True)


def main(argv=None) -> int:
    return gpu_check.main(argv, more=add_engine_results)


if __name__ == "__main__":
    sys.exit(main())

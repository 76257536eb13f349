"""`make gpu-check`, the engine's half: kernels/gpu_check.py's checks and benchmarks, then tensor
parallelism against one process (where there are two GPUs) and the engine's own steps on a
Llama-3.1-8B-shaped model with random weights (sut/bench/gpu_steps.py: decode at batch 1, 32, 128,
256 and a mixed step, eager and from CUDA graphs, against the weight-plus-KV roofline), then on a
gpt-oss-120b-shaped one with random MXFP4 experts, and on rank 0's share of a DeepSeek-R1-shaped one
at TP/EP 8 with random FP8 weights, in the same results.json and results.md. Without
a GPU it says so and exits 0.

    python3 -m sut.bench.gpu_check --out build/gpu-check

Like the kernels' half it needs torch, Triton and numpy alone, so it runs on a lent GPU machine as
it is.
"""

import sys

import torch

from kernels import gpu_check
from sut.bench.gpu_steps import DEEPSEEK_R1, GPT_OSS_120B, LLAMA_31_8B, StepBench, tensor_parallel_check

# The engine's steps (sut/bench/gpu_steps.py), decodes over ~1k-token contexts and one mixed step of a
# prefill chunk beside decodes, per model: (its shape, what it is, decode batches, (decodes, chunk) mixed).
# DeepSeek-R1: rank 0's share of TP/EP 8 (the whole model fits no one GPU), eager (the engine refuses
# CUDA graphs with tensor parallelism).
ENGINE_CONTEXT = 1024
ENGINE_MODELS = {
    "llama3.1-8b": (LLAMA_31_8B, "random bf16 weights", [1, 32, 128, 256], (256, 2048), {}),
    "gpt-oss-120b": (GPT_OSS_120B, "random MXFP4 experts, about 61 GB", [1, 64, 256], (64, 2048), {}),
    "deepseek-r1": (
        DEEPSEEK_R1,
        "random FP8 block-scaled weights, one rank's share of TP/EP 8 (about 85 GB), its collectives not timed",
        [1, 16, 64],
        (64, 2048),
        dict(one_rank_of=8, cuda_graphs=False),
    ),
}


def bench_engine(device, peak_gbps, model: str) -> list[dict]:
    """Each step eager and from CUDA graphs where the model takes them (the mixed step runs eagerly
    either way)."""
    raw, what, batches, (decodes, prefill), options = ENGINE_MODELS[model]
    options = dict(cuda_graphs=True) | options
    print(f"  engine steps: a {model}-shaped model with {what}", flush=True)
    bench = StepBench(
        raw,
        device,
        max_num_seqs=max(batches),
        max_model_len=2 * prefill,
        max_tokens=max(batches) * ENGINE_CONTEXT + 2 * prefill,
        **options,
    )
    graphs = bench.runner.graphs
    rows = []
    try:
        for mode in ("eager", "CUDA graphs") if graphs else ("eager",):
            bench.runner.graphs = graphs if mode == "CUDA graphs" else None
            for batch in batches:
                print(f"  {model} decode step, batch {batch}, {mode}", flush=True)
                rows.append(bench.measure(batch, ENGINE_CONTEXT))
            if mode == "eager":
                print(f"  {model} mixed step: {prefill} prefill tokens + {decodes} decodes", flush=True)
                rows.append(bench.measure(decodes, ENGINE_CONTEXT, prefill=prefill))
    finally:
        bench.close()
    for row in rows:
        row["model"] = model
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
        for model in ENGINE_MODELS:
            try:
                results["engine"] += bench_engine(device, results["measured_gbps"], model)
            except Exception as e:  # noqa: BLE001 - the kernels' results still get written
                results.setdefault("engine_error", []).append(f"{model}: {type(e).__name__}: {e}")
                print(f"  {model} engine steps FAILED: {results['engine_error'][-1]}", flush=True)


def main(argv=None) -> int:
    return gpu_check.main(argv, more=add_engine_results)


if __name__ == "__main__":
    sys.exit(main())

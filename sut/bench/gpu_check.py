"""`make gpu-check`: on a CUDA machine, compile and test every Triton kernel against its PyTorch
reference, then benchmark the kernels and the engine's steps against the card's measured peaks, and
write results.json and results.md to --out. Without a GPU it says so and exits 0.

    python3 -m sut.bench.gpu_check --out build/gpu-check                  # make gpu-check
    python3 -m sut.bench.gpu_check --out build/gpu-check --kernels-only   # the kernels alone

In order, each job in its own module: the kernels' correctness checks (kernels/checks/gpu_cases.py:
every kernel against its reference at the served shapes, the rejection sampler's token ids exactly);
the card's copy bandwidth and dense bf16 GEMM rate (sut/bench/peaks.py, the measurement the report's
hardware bound uses too); the kernels' benchmarks against those (kernels/checks/gpu_bench.py:
decode and prefill attention against torch's scaled_dot_product_attention, gpt-oss's attention and
MoE, DeepSeek's MLA; kernels/checks/fp8.py: the FP8 kernels); then, unless --kernels-only, tensor
parallelism against one process (where there are two GPUs) and the engine's own steps on models of
Llama-3.1-8B's, gpt-oss-120b's and (rank 0's share at TP/EP 8) DeepSeek-R1's shape with random
weights (sut/bench/gpu_steps.py: decode and a mixed step, eager and from CUDA graphs, against the
weight-plus-KV roofline); last the page (sut/bench/gpu_report.py).

It needs torch, Triton and numpy alone (any recent versions; nothing else from requirements.txt),
so it runs on a lent GPU machine as it is, with no network and no `make setup`.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

from kernels.checks.fp8 import fp8_benchmarks
from kernels.checks.gpu_bench import bench_decode, bench_mla, bench_moe, bench_prefill, bench_sinks_window, time_ms
from kernels.checks.gpu_cases import CHECKS
from sut.bench.gpu_report import write_results
from sut.bench.gpu_steps import ENGINE_MODELS, bench_engine, check_tensor_parallel
from sut.bench.peaks import data_sheet_peaks, measure_peaks

# The card's peaks as the GPU check measures them (sut/bench/peaks.py): a 2 GiB copy and an
# 8192-square bf16 product, timed as the kernels are.
PEAK_COPY_BYTES = 2**31
PEAK_MATMUL_SIZE = 8192


def arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/gpu-check", help="folder for results.json and results.md")
    parser.add_argument("--skip-bench", action="store_true", help="correctness checks only")
    parser.add_argument(
        "--kernels-only", action="store_true", help="the kernels' checks and benchmarks alone: no engine steps"
    )
    return parser.parse_args(argv)


def run_kernels(device, skip_bench: bool) -> dict:
    """The kernels' checks against their references, then (unless `skip_bench`) the measured peaks
    and the attention benchmarks: the results, as results.json holds them."""
    name = torch.cuda.get_device_name(device)
    peak_gbps, peak_tflops = data_sheet_peaks(name)
    import triton

    software = f"torch {torch.__version__}, Triton {triton.__version__}, Python {sys.version.split()[0]}"
    print(
        f"gpu-check on {name} ({software}): data sheet {peak_gbps or '?'} GB/s, {peak_tflops or '?'} dense bf16 "
        "TFLOP/s",
        flush=True,
    )
    results = dict(
        device=name,
        software=software,
        peak_gbps=peak_gbps,
        peak_tflops=peak_tflops,
        measured_gbps=None,
        measured_tflops=None,
        checks={},
        decode=[],
        prefill=[],
    )
    for what, run, _ in CHECKS:
        t = time.time()
        rows = run(device)
        results["checks"][what] = rows
        failed = sum(not r["ok"] for r in rows)
        print(f"  {what}: {len(rows) - failed}/{len(rows)} cases match the reference ({time.time() - t:.0f} s)")
    if not skip_bench:
        peaks = measure_peaks(
            str(device),
            torch.bfloat16,
            copy_bytes=PEAK_COPY_BYTES,
            matmul_size=PEAK_MATMUL_SIZE,
            timer=(lambda fn: time_ms(fn) / 1e3, "Triton's do_bench"),
        )
        gbps, tflops = results["measured_gbps"], results["measured_tflops"] = (
            peaks["bandwidth_gbps"],
            peaks["flops_tflops"],
        )
        print(f"  measured: copy {gbps:.0f} GB/s, dense bf16 GEMM {tflops:.0f} TFLOP/s", flush=True)
        results["decode"] = bench_decode(device, gbps)
        results["prefill"] = bench_prefill(device, tflops)
        results["gpt_oss_attention"] = bench_sinks_window(device, gbps, tflops)
        results["mla_attention"] = bench_mla(device, gbps, tflops)
        results["moe"] = bench_moe(device, gbps, tflops)
        results["fp8"] = fp8_benchmarks(device)
    return results


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
    args = arguments(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing checked.")
        return 0
    start = time.time()
    device = torch.device("cuda")
    results = run_kernels(device, args.skip_bench)
    if not args.kernels_only:
        add_engine_results(results, device, args.skip_bench)
    return write_results(results, Path(args.out), start)


if __name__ == "__main__":
    sys.exit(main())

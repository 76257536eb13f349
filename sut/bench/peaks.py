"""The machine's peaks, measured here: its memory bandwidth (a large copy: bytes read plus written
per second) and its dense matrix-product rate (a square product in a given dtype); and the vendors'
data-sheet numbers for the GPUs the GPU check knows. One measurement serves both its users: the
report's hardware bound (harness/measure/roofline.py, before the ablation's runs, on CPU or GPU: a 256 MiB
copy and a 2048-square product, best of REPEATS synchronized wall-clock runs) and the GPU check
(sut/bench/gpu_check.py: a 2 GiB copy and an 8192-square bf16 product, each timed by Triton's
do_bench), whose kernel and engine-step ratios are of these numbers. It needs torch alone."""

import time
from collections.abc import Callable
from functools import partial

import torch

COPY_BYTES = 256 * 2**20
MATMUL_SIZE = 2048
REPEATS = 5

# (substring of torch.cuda.get_device_name, peak HBM GB/s, dense bf16 tensor TFLOP/s); first match
# wins, so the more specific names come first. Vendor data-sheet numbers.
PEAKS = [
    ("GH200", 4000, 989),
    ("H200", 4800, 989),
    ("H100 NVL", 3900, 835),
    ("H100 PCIe", 2000, 756),
    ("H100", 3350, 989),  # SXM ("NVIDIA H100 80GB HBM3")
    ("B200", 8000, 2250),
    ("A100-SXM4-80GB", 2039, 312),
    ("A100 80GB PCIe", 1935, 312),
    ("A100", 1555, 312),  # 40GB
    ("L40S", 864, 362),
    ("L4", 300, 121),
]


def data_sheet_peaks(device_name: str) -> tuple[float | None, float | None]:
    """(GB/s, dense bf16 TFLOP/s) of the data sheet for the GPU `device_name`; None where PEAKS has none."""
    for key, gbps, tflops in PEAKS:
        if key in device_name:
            return gbps, tflops
    return None, None


def best_seconds(fn, device: torch.device) -> float:
    """The best of REPEATS calls of `fn`, in wall-clock seconds, the device synchronized around each."""
    best = float("inf")
    for _ in range(REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_peaks(
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    copy_bytes: int = COPY_BYTES,
    matmul_size: int = MATMUL_SIZE,
    timer: tuple[Callable[[Callable], float], str] | None = None,
) -> dict:
    """{"bandwidth_gbps", "flops_tflops", "device", "method"} measured here: a `copy_bytes` copy
    (read + write) and a `matmul_size`-square matrix product in `dtype`. `timer`: (the seconds one
    call of a function takes, how the method names it); by default the best of REPEATS."""
    dev = torch.device(device)
    seconds, timing = timer or (lambda fn: best_seconds(fn, dev), f"best of {REPEATS}")
    src = torch.ones(copy_bytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    copy_s = seconds(partial(dst.copy_, src))
    del src, dst
    a = torch.randn(matmul_size, matmul_size, device=dev).to(dtype)
    b = torch.randn(matmul_size, matmul_size, device=dev).to(dtype)
    matmul_s = seconds(partial(torch.mm, a, b))
    del a, b
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "device": device,
        "bandwidth_gbps": 2 * copy_bytes / copy_s / 1e9,
        "flops_tflops": 2 * matmul_size**3 / matmul_s / 1e12,
        "method": (
            f"a {copy_bytes >> 20} MiB copy (read + write) and a {matmul_size}-square "
            f"{str(dtype).removeprefix('torch.')} matrix product, {timing}, "
            f"torch with {torch.get_num_threads()} threads"
        ),
    }

"""The bound the hardware sets on a run, beside what the run took (gpt-fast's roofline reasoning):
a step cannot be faster than reading its weights and its batch's K/V from memory at the bandwidth
the machine measures, nor than its FLOPs at the machine's measured peak.

`measure_peaks` measures both on the machine the runs use (a large copy: bytes read plus written
per second; a square matrix product in the model's dtype), before the runs. The engine counts what
its steps did (`busy_s` in each run's run.json, sut/engine/llm_engine.py busy_stats): the weights'
bytes read once per step (in the smallest form it holds them), each attended token's K/V read
once, and the decoder layers' linear FLOPs per token. `bound` divides: the larger of bytes over
bandwidth and FLOPs over peak is the least time the run's steps could have taken; attention's
FLOPs, the LM head and every activation are left out, and totals are used rather than each
step's larger term, so it is a lower bound, never above what any engine could do.
"""

import torch


def measure_peaks(device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """{"bandwidth_gbps", "flops_tflops", "device", "method"} measured here, best of 5: a 256 MiB
    copy and a 2048-square product in `dtype` (sut/bench/peaks.py, the GPU check's measurement too)."""
    from sut.bench.peaks import measure_peaks  # here: reading runs (the report) imports no engine

    return measure_peaks(device, dtype)


def bound(busy: dict, peaks: dict, measured_arithmetic: bool = True) -> dict | None:
    """The least time the run's steps could have taken and what bounds it, against their busy time;
    None where the run's record lacks the counts (an older run). Where the engine computes in other
    arithmetic than the peak was measured in (`measured_arithmetic` False: int16 dot products, which
    run faster than fp32's FMAs), the FLOPs bound nothing and the memory term alone is given."""
    if "min_bytes_read" not in busy or not peaks:
        return None
    memory_s = busy["min_bytes_read"] / (peaks["bandwidth_gbps"] * 1e9)
    compute_s = busy["min_flops"] / (peaks["flops_tflops"] * 1e12) if measured_arithmetic else 0.0
    busy_s = busy["prefill_s"] + busy["decode_s"]
    least = max(memory_s, compute_s)
    return {
        "bound_s": least,
        "busy_s": busy_s,
        "bound_by": ("memory" if memory_s >= compute_s else "compute")
        + ("" if measured_arithmetic else " (no peak measured for its arithmetic)"),
        "share_of_bound": least / busy_s if busy_s else None,  # 1.0: running at the hardware's limit
        "gb_read": busy["min_bytes_read"] / 1e9,
        "gflop": busy["min_flops"] / 1e9,
    }

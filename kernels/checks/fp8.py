"""The FP8 kernels on a GPU at the shapes they serve: correctness against the PyTorch references
(`fp8_cases`) and speed (`fp8_benchmarks`), each returning plain dicts for the GPU check
(sut/bench/gpu_check.py).

Shapes. DeepSeek-R1 (block-scaled, 128 x 128): q_a_proj 7168 -> 1536, kv_a_proj_with_mqa 7168 -> 576,
o_proj 16384 -> 7168 (one GPU: 128 heads x 128), and its routed experts (256, top-8; gate_up
7168 -> 2 x 2048, down 2048 -> 7168) through `fused_moe_fp8_triton`, at 1, 64 and 512 tokens.
Llama-3.1-8B (per output channel, as the engine's `quantization: fp8` makes them): qkv
4096 -> 6144, gate_up 4096 -> 28672, down 14336 -> 4096, at 1, 32 and 512 tokens.

A case follows kernels/checks/compare.py's convention: the kernel on inputs of the dtype, the
reference in fp32 on the same (already rounded) inputs, compared at `compare.TOLERANCES`. `scale`
divides every size (dims, tokens, experts) for a quick run, e.g. in Triton's interpreter on CPU (the
tests).
"""

import math
import time

import torch

from kernels.checks.compare import run_case
from kernels.fp8 import (
    FP8_BLOCK,
    FP8_DTYPE,
    fp8_linear_reference,
    fp8_linear_triton,
    quantize_fp8_block,
    quantize_fp8_per_channel,
)
from kernels.fused_moe import fused_moe_fp8_reference, fused_moe_fp8_triton, fused_moe_triton

# (name, in K, out N)
DEEPSEEK_LINEARS = [
    ("DeepSeek q_a_proj", 7168, 1536),
    ("DeepSeek kv_a_proj_with_mqa", 7168, 576),
    ("DeepSeek o_proj (TP1)", 16384, 7168),
]
DEEPSEEK_TOKENS = (1, 64, 512)
LLAMA_LINEARS = [
    ("Llama-3.1-8B qkv_proj", 4096, 6144),
    ("Llama-3.1-8B gate_up_proj", 4096, 28672),
    ("Llama-3.1-8B down_proj", 14336, 4096),
]
LLAMA_TOKENS = (1, 32, 512)
# DeepSeek's routed experts: (hidden, intermediate, experts, top-k)
DEEPSEEK_MOE = (7168, 2048, 256, 8)
L2_FLUSH_BYTES = 256 << 20  # weights cycled through per benchmark, so no timed call reads them from L2


def _scaled(n: int, scale: int) -> int:
    return max(1, n // scale)


def random_fp8_weight(n: int, k: int, block: int | None, device, generator: torch.Generator):
    """`(w_fp8 [n, k], scale)` quantized from N(0, 1/k) weights with rows (or blocks) of varied size
    (a factor 0.25..4), so the scales differ: outputs of x ~ N(0, 1) are about N(0, 1)."""
    w = torch.randn(n, k, generator=generator, device=device) / math.sqrt(k)
    w *= torch.exp2(torch.empty(n, 1, device=device).uniform_(-2, 2, generator=generator))
    return quantize_fp8_block(w, block) if block else quantize_fp8_per_channel(w)


def random_fp8_experts(num_experts: int, rows: int, cols: int, device, generator: torch.Generator):
    """`(w_fp8 [E, rows, cols], scale_inv [E, ceil(rows/128), ceil(cols/128)])`: random e4m3 values
    of magnitude up to 448 (no NaN codes) and block scales giving N(0, 1/cols)-sized weights, built
    without a dense fp32 copy of all the experts (DeepSeek's are 11 GB in FP8)."""
    w = torch.empty(num_experts, rows, cols, dtype=FP8_DTYPE, device=device)
    for e in range(num_experts):  # one expert at a time: a dense copy of all would be 45 GB in fp32
        w[e] = (torch.randn(rows, cols, generator=generator, device=device) * 100).clamp(-448, 448).to(FP8_DTYPE)
    grid = (num_experts, -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    scale = torch.empty(grid, device=device).uniform_(0.5, 2.0, generator=generator) / (100 * math.sqrt(cols))
    return w, scale


def _routing(num_tokens: int, num_experts: int, top_k: int, device, generator: torch.Generator):
    """DeepSeek-like routing: top-k of random logits, weights normalized over the k (fp32)."""
    logits = torch.randn(num_tokens, num_experts, generator=generator, device=device)
    top, ids = logits.sigmoid().topk(top_k, dim=-1)
    return top / top.sum(dim=-1, keepdim=True), ids


def linear_shapes(scale: int = 1) -> list[tuple[str, int, int, int | None, tuple[int, ...]]]:
    """(name, K, N, block or None for per channel, token counts), sizes divided by `scale`."""
    shapes = [(name, k, n, FP8_BLOCK, DEEPSEEK_TOKENS) for name, k, n in DEEPSEEK_LINEARS]
    shapes += [(name, k, n, None, LLAMA_TOKENS) for name, k, n in LLAMA_LINEARS]
    return [
        (name, _scaled(k, scale), _scaled(n, scale), block, tuple(sorted({_scaled(m, scale) for m in tokens})))
        for name, k, n, block, tokens in shapes
    ]


def moe_shape(scale: int = 1) -> tuple[int, int, int, int, tuple[int, ...]]:
    hidden, intermediate, num_experts, top_k = DEEPSEEK_MOE
    experts = max(2, num_experts // scale)
    tokens = tuple(sorted({_scaled(t, scale) for t in DEEPSEEK_TOKENS}))
    return _scaled(hidden, scale), _scaled(intermediate, scale), experts, min(top_k, experts), tokens


def fp8_cases(device="cuda", scale: int = 1) -> list[dict]:
    """Every FP8 kernel against its reference at the shapes of the module's docstring (`scale`
    divides the sizes): the linear with bf16 activations at each token count, and fp32 ones at the
    middle count, with a bias on the per-channel shapes (Llama's qkv may have one); the MoE with bf16
    activations at each token count and fp32 at the smallest."""
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    for name, k, n, block, tokens in linear_shapes(scale):
        w_fp8, w_scale = random_fp8_weight(n, k, block, device, g)
        bias = None if block else torch.randn(n, generator=g, device=device).to(torch.bfloat16)
        kind = f"{'block' if block else 'per-channel'} {k}->{n}"
        runs = [(m, torch.bfloat16) for m in tokens] + [(tokens[len(tokens) // 2], torch.float32)]
        for m, dtype in runs:
            x = torch.randn(m, k, generator=g, device=device).to(dtype)

            def check(x=x, w_fp8=w_fp8, w_scale=w_scale, bias=bias, block=block):
                got = fp8_linear_triton(x, w_fp8, w_scale, bias, block)
                return got.float(), fp8_linear_reference(x.float(), w_fp8, w_scale, bias, block)

            rows.append(run_case(f"fp8_linear {name} ({kind}) M={m}", dtype, check))
        del w_fp8, w_scale
        _empty_cache(device)
    hidden, intermediate, num_experts, top_k, tokens = moe_shape(scale)
    w_gate_up, s_gate_up = random_fp8_experts(num_experts, 2 * intermediate, hidden, device, g)
    w_down, s_down = random_fp8_experts(num_experts, hidden, intermediate, device, g)
    weights = (w_gate_up, s_gate_up, w_down, s_down)
    for num_tokens, dtype in [(t, torch.bfloat16) for t in tokens] + [(tokens[0], torch.float32)]:
        topk_weights, topk_ids = _routing(num_tokens, num_experts, top_k, device, g)
        x = torch.randn(num_tokens, hidden, generator=g, device=device).to(dtype)

        def check(x=x, topk_weights=topk_weights, topk_ids=topk_ids, weights=weights):
            got = fused_moe_fp8_triton(x, *weights, topk_weights, topk_ids)
            return got.float(), fused_moe_fp8_reference(x.float(), *weights, topk_weights, topk_ids)

        what = f"fused_moe_fp8 DeepSeek experts (H={hidden}, I={intermediate}, {num_experts} experts top-{top_k})"
        rows.append(run_case(f"{what} T={num_tokens}", dtype, check))
    del weights, w_gate_up, w_down
    _empty_cache(device)
    return rows


def _empty_cache(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _time_ms(calls, warmup: int = 5, iters: int = 30) -> float:
    """Mean milliseconds per call, by CUDA events over `iters` calls after `warmup` (each call one
    of `calls` in turn: the same op on different copies of its weights)."""
    for i in range(warmup):
        calls[i % len(calls)]()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for i in range(iters):
        calls[i % len(calls)]()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _copies(nbytes: int) -> int:
    """Copies of a weight to cycle through so that the timed calls stream it from memory, not L2."""
    return max(1, min(64, -(-L2_FLUSH_BYTES // max(1, nbytes))))


def fp8_benchmarks(device="cuda", scale: int = 1) -> list[dict]:
    """Each shape of `fp8_cases` with bf16 activations: milliseconds per call, GB/s of the weight
    bytes read (FP8 weights and their scales; the experts hit, each once, for the MoE), TFLOP/s, and
    the same product with bf16 weights (torch's matmul; the dense Triton MoE with silu) as the
    baseline of the speedup. Weights are cycled over copies so no timed call finds them in L2.
    Prints one line per row."""
    if torch.device(device).type != "cuda":
        raise ValueError("fp8_benchmarks times CUDA kernels: give it a CUDA device")
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    for name, k, n, block, tokens in linear_shapes(scale):
        first = random_fp8_weight(n, k, block, device, g)
        fp8_bytes = first[0].nbytes + first[1].nbytes
        fp8_weights = [first] + [tuple(t.clone() for t in first) for _ in range(_copies(fp8_bytes) - 1)]
        dense = first[0].to(torch.bfloat16)  # the baseline's weights (their values do not change its time)
        dense_weights = [dense] + [dense.clone() for _ in range(_copies(dense.nbytes) - 1)]
        for m in tokens:
            x = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
            ms = _time_ms([lambda w=w: fp8_linear_triton(x, w[0], w[1], None, block) for w in fp8_weights])
            bf16_ms = _time_ms([lambda w=w: x @ w.T for w in dense_weights])
            rows.append(
                _bench_row(
                    f"fp8_linear {name}", "block" if block else "per-channel", m, ms, fp8_bytes, 2 * m * n * k, bf16_ms
                )
            )
        del fp8_weights, dense_weights, first, dense
        torch.cuda.empty_cache()
    hidden, intermediate, num_experts, top_k, tokens = moe_shape(scale)
    w_gate_up, s_gate_up = random_fp8_experts(num_experts, 2 * intermediate, hidden, device, g)
    w_down, s_down = random_fp8_experts(num_experts, hidden, intermediate, device, g)
    # The baseline: the experts' FP8 values in bf16, unscaled (values do not change the time), as
    # `[E, in, out]` views; 22.5 GB at DeepSeek's size.
    try:
        dense = (w_gate_up.to(torch.bfloat16).transpose(1, 2), w_down.to(torch.bfloat16).transpose(1, 2))
    except torch.OutOfMemoryError:
        dense = None
    for num_tokens in tokens:
        topk_weights, topk_ids = _routing(num_tokens, num_experts, top_k, device, g)
        x = torch.randn(num_tokens, hidden, generator=g, device=device).to(torch.bfloat16)
        hit = int(torch.unique(topk_ids).numel())
        per_expert = w_gate_up[0].nbytes + s_gate_up[0].nbytes + w_down[0].nbytes + s_down[0].nbytes
        args = (x, w_gate_up, s_gate_up, w_down, s_down, topk_weights, topk_ids)
        ms = _time_ms([lambda: fused_moe_fp8_triton(*args)])
        bf16_ms = None
        if dense is not None:
            bf16_ms = _time_ms(
                [lambda d=dense: fused_moe_triton(x, d[0], None, d[1], None, topk_weights, topk_ids, activation="silu")]
            )
        flops = 6 * num_tokens * top_k * hidden * intermediate
        what = f"fused_moe_fp8 DeepSeek experts ({num_experts} top-{top_k}, {hit} hit)"
        rows.append(_bench_row(what, "block", num_tokens, ms, hit * per_expert, flops, bf16_ms))
    del w_gate_up, w_down, dense
    torch.cuda.empty_cache()
    return rows


def _bench_row(what: str, scales: str, m: int, ms: float, weight_bytes: int, flops: int, bf16_ms) -> dict:
    row = dict(
        kernel=what,
        scales=scales,
        tokens=m,
        ms=ms,
        gbps=weight_bytes / ms / 1e6,
        tflops=flops / ms / 1e9,
        bf16_ms=bf16_ms,
        speedup_vs_bf16=bf16_ms / ms if bf16_ms else None,
    )
    speedup = f", {row['speedup_vs_bf16']:.2f}x bf16 weights" if bf16_ms else ""
    print(
        f"  {what} [{scales}] M={m}: {ms * 1e3:.1f} us, {row['gbps']:.0f} GB/s of weights, "
        f"{row['tflops']:.1f} TFLOP/s{speedup}",
        flush=True,
    )
    return row


def main() -> int:
    """`python -m kernels.checks.fp8 [scale]`: the cases and the benchmarks on this machine's GPU."""
    import sys

    scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    t = time.time()
    rows = fp8_cases("cuda", scale)
    for row in rows:
        status = "ok" if row["ok"] else f"FAIL {row['error']}"
        print(f"  {row['case']} [{row['dtype']}]: max abs err {row['max_abs_err']}: {status}", flush=True)
    failed = sum(not r["ok"] for r in rows)
    print(f"FP8 cases: {len(rows) - failed}/{len(rows)} match the reference ({time.time() - t:.0f} s)", flush=True)
    fp8_benchmarks("cuda", scale)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The GPU check's kernel benchmarks, in bf16 on CUDA: decode attention (batch 1..256, context
512..8192: GB/s of K/V read against the measured bandwidth, and against torch's
scaled_dot_product_attention on the same data laid out contiguously), prefill attention (TFLOP/s
against the measured GEMM rate), gpt-oss's attention (sinks, its 128-key window) and MoE (bf16 and
MXFP4 experts), DeepSeek's MLA attention. Each `bench_*` returns one row a case and takes the
measured peaks its ratios are of (sut/bench/peaks.py measures them; sut/bench/gpu_check.py runs
these; the FP8 kernels' benchmark is kernels/checks/fp8.py's)."""

from functools import partial

import torch
import torch.nn.functional as F

from kernels.checks import compare
from kernels.checks.shapes import (
    GPT_OSS_HEADS,
    GPT_OSS_WINDOW,
    MLA_ABSORBED_DIMS,
    MLA_ABSORBED_HEADS,
    MLA_DECOMPRESSED,
    MOE_SHAPE,
    MOE_TOKENS,
)
from kernels.decode_attention import decode_attention_triton
from kernels.fused_moe import (
    fused_moe_mxfp4_reference,
    fused_moe_mxfp4_triton,
    fused_moe_reference,
    fused_moe_triton,
)
from kernels.prefill_attention import prefill_attention_triton

# Llama-3.1-8B's attention shape: 32 query heads, 8 KV heads, head_dim 128.
BENCH_HEADS = (32, 8, 128)
BENCH_BLOCK_SIZE = 16
DECODE_BATCHES = [1, 8, 32, 64, 128, 256]
DECODE_CONTEXTS = [512, 2048, 8192]
# (name, query_lens, seq_lens): whole prompts, and a chunk after cached context.
PREFILL_CASES = [
    ("1 x 4096 prompt", [4096], [4096]),
    ("4 x 1024 prompts", [1024] * 4, [1024] * 4),
    ("2048 chunk after 2048 cached", [2048], [4096]),
    ("1 x 8192 prompt", [8192], [8192]),
]


def time_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=50)


def _paged_bench_inputs(
    seq_lens: list[int],
    device,
    heads: tuple[int, int, int] = BENCH_HEADS,
    v_head_dim: int | None = None,
    shared_kv: bool = False,
):
    """Random bf16 K and V caches with the sequences' blocks scattered; MLA: V's own head dim
    `v_head_dim`, and with `shared_kv` V is the view `k_cache[..., :v_head_dim]` (absorbed)."""
    num_q_heads, num_kv_heads, head_dim = heads
    g = torch.Generator().manual_seed(0)
    blocks = [-(-n // BENCH_BLOCK_SIZE) for n in seq_lens]
    order = torch.randperm(sum(blocks), generator=g)  # scattered blocks, as a long-running engine has them
    block_tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    taken = 0
    for i, n in enumerate(blocks):
        block_tables[i, :n] = order[taken : taken + n]
        taken += n
    shape = (sum(blocks), BENCH_BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device, dtype=torch.bfloat16)
    if shared_kv:
        v_cache = k_cache[..., :v_head_dim]
    else:
        v_cache = torch.randn(*shape[:3], v_head_dim or head_dim, device=device, dtype=torch.bfloat16)
    return k_cache, v_cache, block_tables.to(device)


def _prefill_bench_inputs(query_lens: list[int], seq_lens: list[int], num_q_heads: int, head_dim: int, device):
    """Random bf16 queries for `query_lens` tokens of each sequence, their `cu_seqlens` and the
    sequences' lengths."""
    q = torch.randn(sum(query_lens), num_q_heads, head_dim, device=device, dtype=torch.bfloat16)
    cu = torch.tensor(
        [0] + [sum(query_lens[: i + 1]) for i in range(len(query_lens))], dtype=torch.int32, device=device
    )
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, cu, lens


def _sdpa_ms(fn) -> float | None:
    """SDPA's time, or None where it cannot run the case (e.g. out of memory)."""
    try:
        return time_ms(fn)
    except (RuntimeError, torch.OutOfMemoryError) as e:
        print(f"  SDPA baseline skipped: {type(e).__name__}: {str(e).splitlines()[0]}")
        torch.cuda.empty_cache()
        return None


def _contiguous(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """The sequences' K or V as `[num_seqs, num_kv_heads, length, head_dim]` (SDPA's layout)."""
    return cache[block_tables.long()].flatten(1, 2)[:, :length].transpose(1, 2).contiguous()


def bench_decode(device, peak_gbps) -> list[dict]:
    num_q_heads, num_kv_heads, head_dim = BENCH_HEADS
    rows = []
    for context in DECODE_CONTEXTS:
        print(f"  decode attention, context {context}: batch {DECODE_BATCHES}", flush=True)
        for batch in DECODE_BATCHES:
            k_cache, v_cache, block_tables = _paged_bench_inputs([context] * batch, device)
            q = torch.randn(batch, num_q_heads, head_dim, device=device, dtype=torch.bfloat16)
            lens = torch.full((batch,), context, dtype=torch.int32, device=device)
            scale = head_dim**-0.5
            ms = time_ms(partial(decode_attention_triton, q, k_cache, v_cache, block_tables, lens, scale, context))
            keys, values = _contiguous(k_cache, block_tables, context), _contiguous(v_cache, block_tables, context)
            del k_cache, v_cache
            q4 = q[:, :, None, :]
            sdpa_ms = _sdpa_ms(partial(F.scaled_dot_product_attention, q4, keys, values, scale=scale, enable_gqa=True))
            del keys, values
            torch.cuda.empty_cache()
            gbps = 2 * batch * context * num_kv_heads * head_dim * 2 / ms / 1e6  # K and V, bf16
            rows.append(
                dict(
                    batch=batch,
                    context=context,
                    ms=ms,
                    gbps=gbps,
                    peak_ratio=gbps / peak_gbps if peak_gbps else None,
                    sdpa_ms=sdpa_ms,
                    speedup_vs_sdpa=sdpa_ms / ms if sdpa_ms else None,
                )
            )
    return rows


def bench_prefill(device, peak_tflops) -> list[dict]:
    num_q_heads, num_kv_heads, head_dim = BENCH_HEADS
    rows = []
    for name, query_lens, seq_lens in PREFILL_CASES:
        print(f"  prefill attention: {name}", flush=True)
        k_cache, v_cache, block_tables = _paged_bench_inputs(seq_lens, device)
        q, cu, lens = _prefill_bench_inputs(query_lens, seq_lens, num_q_heads, head_dim, device)
        scale = head_dim**-0.5
        ms = time_ms(partial(prefill_attention_triton, q, k_cache, v_cache, block_tables, cu, lens, scale))
        tflops = compare.attention_flops(query_lens, seq_lens, num_q_heads, head_dim) / ms / 1e9
        sdpa_ms = None
        if query_lens == seq_lens and len(set(seq_lens)) == 1:  # SDPA's causal mask has no context offset
            keys, values = (
                _contiguous(k_cache, block_tables, seq_lens[0]),
                _contiguous(v_cache, block_tables, seq_lens[0]),
            )
            qs = q.view(len(seq_lens), seq_lens[0], num_q_heads, head_dim).transpose(1, 2)
            sdpa_ms = _sdpa_ms(
                lambda: F.scaled_dot_product_attention(qs, keys, values, is_causal=True, scale=scale, enable_gqa=True)
            )
            del keys, values
        del k_cache, v_cache
        torch.cuda.empty_cache()
        rows.append(
            dict(
                case=name,
                tokens=sum(query_lens),
                ms=ms,
                tflops=tflops,
                peak_ratio=tflops / peak_tflops if peak_tflops else None,
                sdpa_ms=sdpa_ms,
                speedup_vs_sdpa=sdpa_ms / ms if sdpa_ms else None,
            )
        )
    return rows


def bench_moe(device, peak_gbps, peak_tflops) -> list[dict]:
    """The fused MoE at gpt-oss's shape with bf16 activations, for bf16 weights (as transformers
    holds them, `[E, H, 2I]`, and K-contiguous, `[E, 2I, H]` transposed) and MXFP4 ones: GB/s of
    the weights of the experts the batch hits (each read once) against the measured bandwidth,
    TFLOP/s, and the PyTorch reference (a loop over the experts hit) on the same weights."""
    hidden, intermediate, num_experts, top_k = MOE_SHAPE
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    for weights_name in ("bf16 [E, H, 2I]", "bf16 [E, 2I, H] (K-contiguous)", "MXFP4"):
        print(f"  gpt-oss MoE, {weights_name} weights: tokens {MOE_TOKENS}", flush=True)
        mxfp4 = weights_name == "MXFP4"
        weights = compare.random_moe_weights(num_experts, hidden, intermediate, torch.bfloat16, device, g, mxfp4)
        if "K-contiguous" in weights_name:
            weights = tuple(w.transpose(1, 2).contiguous().transpose(1, 2) if w.dim() == 3 else w for w in weights)
        kernel = fused_moe_mxfp4_triton if mxfp4 else fused_moe_triton
        reference = fused_moe_mxfp4_reference if mxfp4 else fused_moe_reference
        for num_tokens in MOE_TOKENS:
            topk_weights, topk_ids = compare.random_routing(num_tokens, num_experts, top_k, device, g)
            x = torch.randn(num_tokens, hidden, device=device, generator=g).to(torch.bfloat16)
            ms = time_ms(partial(kernel, x, *weights, topk_weights, topk_ids))
            try:
                torch_ms = time_ms(partial(reference, x, *weights, topk_weights, topk_ids))
            except (RuntimeError, torch.OutOfMemoryError) as e:
                print(f"  torch baseline skipped: {type(e).__name__}: {str(e).splitlines()[0]}")
                torch_ms = None
            gbps = compare.moe_weight_bytes(topk_ids, hidden, intermediate, mxfp4) / ms / 1e6
            tflops = 6 * num_tokens * top_k * hidden * intermediate / ms / 1e9
            rows.append(
                dict(
                    weights=weights_name,
                    tokens=num_tokens,
                    experts_hit=int(torch.unique(topk_ids).numel()),
                    ms=ms,
                    gbps=gbps,
                    peak_ratio=gbps / peak_gbps if peak_gbps else None,
                    tflops=tflops,
                    tflops_ratio=tflops / peak_tflops if peak_tflops else None,
                    torch_ms=torch_ms,
                    speedup_vs_torch=torch_ms / ms if torch_ms else None,
                )
            )
        del weights
        torch.cuda.empty_cache()
    return rows


# gpt-oss's attention benchmark: decode (batch, context) and prefill (name, query_lens, seq_lens).
GPT_OSS_DECODE_CASES = [(1, 8192), (64, 4096), (256, 4096)]
GPT_OSS_PREFILL_CASES = [("1 x 4096 prompt", [4096], [4096]), ("2048 chunk after 2048 cached", [2048], [4096])]


def bench_sinks_window(device, peak_gbps, peak_tflops) -> list[dict]:
    """gpt-oss's attention (bf16, its heads) with sinks, over the whole context (its full layers)
    and over its 128-key window (its sliding layers), each beside the same kernel with neither
    (`plain_ms`): decode's GB/s of the K/V it must read (the window's alone) against the measured
    bandwidth, prefill's TFLOP/s over the visible keys against the measured GEMM rate."""
    num_q_heads, num_kv_heads, head_dim = GPT_OSS_HEADS
    scale = head_dim**-0.5
    sinks = torch.randn(num_q_heads, device=device).to(torch.bfloat16)
    rows = []

    def add(kernel, case, run, rate_of):
        plain_ms = time_ms(run)
        for window in (None, GPT_OSS_WINDOW):
            ms = time_ms(partial(run, sinks=sinks, sliding_window=window))
            rate, unit, peak = rate_of(window, ms)
            rows.append(
                dict(
                    kernel=kernel,
                    case=case,
                    window=window,
                    ms=ms,
                    plain_ms=plain_ms,
                    rate=rate,
                    unit=unit,
                    peak_ratio=rate / peak if peak else None,
                )
            )

    print(f"  gpt-oss attention (sinks, window {GPT_OSS_WINDOW} or none): decode, prefill", flush=True)
    for batch, context in GPT_OSS_DECODE_CASES:
        k_cache, v_cache, block_tables = _paged_bench_inputs([context] * batch, device, GPT_OSS_HEADS)
        q = torch.randn(batch, num_q_heads, head_dim, device=device, dtype=torch.bfloat16)
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        run = partial(decode_attention_triton, q, k_cache, v_cache, block_tables, lens, scale, context)
        kv_bytes = 2 * batch * num_kv_heads * head_dim * 2  # per key: K and V, bf16

        def decode_rate(window, ms):
            return kv_bytes * min(context, window or context) / ms / 1e6, "GB/s", peak_gbps

        add("decode", f"batch {batch} x context {context}", run, decode_rate)
        del k_cache, v_cache
        torch.cuda.empty_cache()
    for name, query_lens, seq_lens in GPT_OSS_PREFILL_CASES:
        k_cache, v_cache, block_tables = _paged_bench_inputs(seq_lens, device, GPT_OSS_HEADS)
        q, cu, lens = _prefill_bench_inputs(query_lens, seq_lens, num_q_heads, head_dim, device)
        run = partial(prefill_attention_triton, q, k_cache, v_cache, block_tables, cu, lens, scale)

        def prefill_rate(window, ms):
            flops = compare.attention_flops(query_lens, seq_lens, num_q_heads, head_dim, window)
            return flops / ms / 1e9, "TFLOP/s", peak_tflops

        add("prefill", name, run, prefill_rate)
        del k_cache, v_cache
        torch.cuda.empty_cache()
    return rows


# DeepSeek MLA's benchmark: absorbed decode (batch, context) for each head count, decompressed prefill.
MLA_DECODE_BATCHES = [1, 32, 64]
MLA_DECODE_CONTEXTS = [1024, 4096, 8192]
MLA_PREFILL_CASES = [("1 x 4096 prompt", [4096], [4096]), ("2048 chunk after 2048 cached", [2048], [4096])]


def bench_mla(device, peak_gbps, peak_tflops) -> list[dict]:
    """DeepSeek-R1's attention in bf16, block size 16. Absorbed decode (128 and 16 query heads on
    the 576-dim KV head; for 128 also 32 heads a program, `block_h=32`): GB/s of the cache it must
    read (each token's 576 dims once: V is the same row) against the measured bandwidth, and
    TFLOP/s (QK over 576 dims, PV over 512) against the GEMM rate (128 heads do ~240 FLOPs a byte,
    past the card's ridge: that side bounds them); beside torch's SDPA on the same K/V laid out
    contiguously, the heads as the rows of one query (no K/V copied per head). Decompressed prefill
    (128 heads, 192/128): TFLOP/s, beside SDPA for the whole prompt."""
    d_k, d_v = MLA_ABSORBED_DIMS
    rows = []

    def row(kernel, case, heads, ms, flops, kv_bytes=None, sdpa_ms=None):
        gbps, tflops = (kv_bytes / ms / 1e6 if kv_bytes else None), flops / ms / 1e9
        rows.append(
            dict(
                kernel=kernel,
                case=case,
                heads=heads,
                ms=ms,
                gbps=gbps,
                peak_ratio=gbps / peak_gbps if gbps and peak_gbps else None,
                tflops=tflops,
                tflops_ratio=tflops / peak_tflops if peak_tflops else None,
                sdpa_ms=sdpa_ms,
                speedup_vs_sdpa=sdpa_ms / ms if sdpa_ms else None,
            )
        )

    for num_q_heads in MLA_ABSORBED_HEADS:
        print(
            f"  MLA absorbed decode, {num_q_heads} heads: batch {MLA_DECODE_BATCHES} x context {MLA_DECODE_CONTEXTS}",
            flush=True,
        )
        scale = 192**-0.5
        for context in MLA_DECODE_CONTEXTS:
            for batch in MLA_DECODE_BATCHES:
                k_cache, v_cache, block_tables = _paged_bench_inputs(
                    [context] * batch, device, (num_q_heads, 1, d_k), d_v, shared_kv=True
                )
                q = torch.randn(batch, num_q_heads, d_k, device=device, dtype=torch.bfloat16)
                lens = torch.full((batch,), context, dtype=torch.int32, device=device)
                run = partial(decode_attention_triton, q, k_cache, v_cache, block_tables, lens, scale, context)
                keys = _contiguous(k_cache, block_tables, context)  # [batch, 1, context, 576]
                q4 = q[:, None]  # the heads as one query's rows
                sdpa_ms = _sdpa_ms(partial(F.scaled_dot_product_attention, q4, keys, keys[..., :d_v], scale=scale))
                del keys
                flops = 2.0 * batch * context * num_q_heads * (d_k + d_v)
                kv_bytes = batch * context * d_k * 2
                case = f"batch {batch} x context {context}"
                row("absorbed decode", case, num_q_heads, time_ms(run), flops, kv_bytes, sdpa_ms)
                if num_q_heads > 16:
                    row(
                        "absorbed decode, block_h 32",
                        case,
                        num_q_heads,
                        time_ms(partial(run, block_h=32)),
                        flops,
                        kv_bytes,
                    )
                del k_cache, v_cache
                torch.cuda.empty_cache()
    heads, decompressed_dk, decompressed_dv = MLA_DECOMPRESSED
    for name, query_lens, seq_lens in MLA_PREFILL_CASES:
        print(f"  MLA decompressed prefill, {heads} heads: {name}", flush=True)
        k_cache, v_cache, block_tables = _paged_bench_inputs(
            seq_lens, device, (heads, heads, decompressed_dk), decompressed_dv
        )
        q, cu, lens = _prefill_bench_inputs(query_lens, seq_lens, heads, decompressed_dk, device)
        scale = decompressed_dk**-0.5
        ms = time_ms(partial(prefill_attention_triton, q, k_cache, v_cache, block_tables, cu, lens, scale))
        sdpa_ms = None
        if query_lens == seq_lens and len(seq_lens) == 1:
            keys, values = (
                _contiguous(k_cache, block_tables, seq_lens[0]),
                _contiguous(v_cache, block_tables, seq_lens[0]),
            )
            qs = q.view(1, seq_lens[0], heads, decompressed_dk).transpose(1, 2)
            sdpa_ms = _sdpa_ms(lambda: F.scaled_dot_product_attention(qs, keys, values, is_causal=True, scale=scale))
            del keys, values
        flops = compare.attention_flops(query_lens, seq_lens, heads, decompressed_dk, v_head_dim=decompressed_dv)
        row("decompressed prefill", name, heads, ms, flops, sdpa_ms=sdpa_ms)
        del k_cache, v_cache
        torch.cuda.empty_cache()
    return rows

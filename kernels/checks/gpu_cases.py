"""The GPU check's correctness half: every Triton kernel against its PyTorch reference on CUDA at
the shapes the engine serves (Llama's attention, gpt-oss's sinks and window and its MoE, DeepSeek's
MLA, the FP8 kernels of kernels/checks/fp8.py), the rejection sampler's token ids exactly. Each
`check_*` runs its cases and returns one row a case (`compare.run_case`); `CHECKS` lists them with
the kernels they cover. sut/bench/gpu_check.py runs them."""

import torch

from kernels.checks import compare
from kernels.checks.compare import run_case
from kernels.checks.fp8 import fp8_cases
from kernels.checks.shapes import (
    GPT_OSS_HEADS,
    GPT_OSS_WINDOW,
    MLA_ABSORBED_DIMS,
    MLA_ABSORBED_HEADS,
    MLA_DECOMPRESSED,
    MOE_SHAPE,
    MOE_TOKENS,
)
from kernels.decode_attention import _decode_reduce_kernel, _decode_split_kernel, attend_paged_latent_keys
from kernels.fp8 import _fp8_linear_kernel
from kernels.fused_moe import _fused_moe_kernel
from kernels.kv_cache import _store_kvcache_kernel
from kernels.mxfp4 import e2m1_to_fp32, mxfp4_weight_tiles
from kernels.prefill_attention import _find_sequence, _prefill_kernel
from kernels.rejection_sample import _block_weights, _rejection_sample_kernel
from kernels.rms_norm import _rms_norm_kernel
from kernels.rotary import _rotary_kernel, _rotate_heads
from kernels.triton_utils import attend_paged_keys, online_softmax_tile

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def check_decode(device) -> list[dict]:
    results = []
    for dtype in DTYPES:
        for gqa, head_dim, block_size in [
            (1, 128, 16),
            (2, 64, 8),
            (4, 128, 32),
            (8, 128, 16),
            (4, 64, 128),
            (8, 64, 64),
        ]:
            lens = compare.ragged_lengths(block_size) + [3000]
            for num_splits in (1, None):  # one pass; split-K as the launcher chooses it
                case = f"decode gqa={gqa} head_dim={head_dim} block_size={block_size} splits={num_splits or 'auto'}"
                results.append(
                    run_case(
                        case,
                        dtype,
                        lambda: compare.check_decode_attention(
                            lens, 8 * gqa, 8, head_dim, block_size, dtype, device, num_splits
                        ),
                    )
                )
    return results


def check_prefill(device) -> list[dict]:
    results = []
    query_lens = [300, 1, 5, 100, 17, 1]
    seq_lens = [300, 1000, 1005, 612, 17, 1]
    for dtype in DTYPES:
        for gqa, head_dim, block_size in [(1, 128, 16), (4, 128, 16), (8, 64, 32), (2, 128, 128)]:
            case = f"prefill gqa={gqa} head_dim={head_dim} block_size={block_size}"
            results.append(
                run_case(
                    case,
                    dtype,
                    lambda: compare.check_prefill_attention(
                        query_lens, seq_lens, 8 * gqa, 8, head_dim, block_size, dtype, device
                    ),
                )
            )
    return results


def check_mixed_step(device) -> list[dict]:
    """A step as the engine runs it on a GPU: decodes on the decode kernel, a verification, chunks
    and prompts on the prefill kernel, at the 8B and 70B attention shapes (GQA 4 and 8)."""
    query_lens = [1] * 6 + [5, 300, 17, 1]
    seq_lens = [1, 40, 700, 3000, 129, 16, 1005, 300, 1000, 612]
    return [
        run_case(
            f"mixed step gqa={gqa} head_dim={head_dim} block_size=16",
            dtype,
            lambda: compare.check_mixed_step_attention(query_lens, seq_lens, 8 * gqa, 8, head_dim, 16, dtype, device)[
                :2
            ],
        )
        for dtype in DTYPES
        for gqa, head_dim in ((4, 128), (8, 128), (4, 64))
    ]


def check_sinks_window(device) -> list[dict]:
    """gpt-oss's attention at its shape: sinks alone (its full layers), sinks with the 128-key
    window (its sliding layers) and the window alone; decode in one pass, split-K as the launcher
    chooses it and over 8 splits; prefill (prompts, chunks after cached context); a mixed step. With
    a window the blocks before it are freed: NaN-filled, stale table entries
    (`compare.free_blocks_before_window`)."""
    num_q_heads, num_kv_heads, head_dim = GPT_OSS_HEADS
    decode_lens = compare.ragged_lengths(16) + [127, 128, 129, 3000]
    query_lens, seq_lens = [300, 1, 5, 100, 17, 1, 130], [300, 1000, 1005, 612, 17, 1, 260]
    mixed_query_lens = [1] * 6 + [5, 300, 17, 1]
    mixed_seq_lens = [1, 40, 700, 3000, 129, 16, 1005, 300, 1000, 612]
    shape = (num_q_heads, num_kv_heads, head_dim)
    results = []
    for dtype in DTYPES:
        for sinks, window in ((True, None), (True, GPT_OSS_WINDOW), (False, GPT_OSS_WINDOW)):
            extras = dict(sinks=sinks, sliding_window=window)
            what = f"sinks={sinks} window={window}"
            for block_size in (16, 32):
                for num_splits in (1, None, 8):
                    results.append(
                        run_case(
                            f"decode {what} block_size={block_size} splits={num_splits or 'auto'}",
                            dtype,
                            lambda: compare.check_decode_attention(
                                decode_lens, *shape, block_size, dtype, device, num_splits, **extras
                            ),
                        )
                    )
            results.append(
                run_case(
                    f"prefill {what} block_size=16",
                    dtype,
                    lambda: compare.check_prefill_attention(query_lens, seq_lens, *shape, 16, dtype, device, **extras),
                )
            )
            results.append(
                run_case(
                    f"mixed step {what} block_size=16",
                    dtype,
                    lambda: compare.check_mixed_step_attention(
                        mixed_query_lens, mixed_seq_lens, *shape, 16, dtype, device, **extras
                    )[:2],
                )
            )
    return results


def check_mla(device) -> list[dict]:
    """DeepSeek's MLA at its shapes: absorbed decode (128 and 16 query heads on the one 576-dim KV
    head, V its view; one pass, split-K as the launcher chooses it and over 8 splits, and 32 heads
    a program for 128), absorbed prefill (chunks after cached context, prompts) and a mixed step;
    decompressed prefill and a mixed step (192/128, 128 heads); the KV-cache writes of both (keys
    alone for absorbed). All in bf16; in fp32 (a tighter tolerance, but each case is a compilation
    of its own) split-K decode, a prefill of each kind and the writes."""
    d_k, d_v = MLA_ABSORBED_DIMS
    absorbed = dict(v_head_dim=d_v, shared_kv=True)
    decode_lens = compare.ragged_lengths(16) + [1000, 3000]
    query_lens, seq_lens = [300, 1, 5, 100, 17, 1], [300, 1000, 1005, 612, 17, 1]
    mixed_query_lens = [1] * 6 + [5, 300, 17, 1]
    mixed_seq_lens = [1, 40, 700, 3000, 129, 16, 1005, 300, 1000, 612]
    heads, decompressed_dk, decompressed_dv = MLA_DECOMPRESSED
    decompressed = dict(v_head_dim=decompressed_dv)
    results = []

    def add(case, dtype, check):
        results.append(run_case(case, dtype, check))
        torch.cuda.empty_cache()

    for dtype in (torch.bfloat16, torch.float32):
        full = dtype == torch.bfloat16
        for num_q_heads in MLA_ABSORBED_HEADS:
            what = f"absorbed {num_q_heads} heads {d_k}/{d_v}"
            variants = [(1, None), (None, None), (8, None)] + ([(None, 32)] if num_q_heads > 16 else [])
            for num_splits, block_h in variants if full else [(8, None)]:
                add(
                    f"decode {what} splits={num_splits or 'auto'}" + (f" block_h={block_h}" if block_h else ""),
                    dtype,
                    lambda: compare.check_decode_attention(
                        decode_lens, num_q_heads, 1, d_k, 16, dtype, device, num_splits, block_h=block_h, **absorbed
                    ),
                )
            if full or num_q_heads == 16:
                add(
                    f"prefill {what}",
                    dtype,
                    lambda: compare.check_prefill_attention(
                        query_lens, seq_lens, num_q_heads, 1, d_k, 16, dtype, device, **absorbed
                    ),
                )
            if full:
                add(
                    f"mixed step {what}",
                    dtype,
                    lambda: compare.check_mixed_step_attention(
                        mixed_query_lens, mixed_seq_lens, num_q_heads, 1, d_k, 16, dtype, device, **absorbed
                    )[:2],
                )
        what = f"decompressed {heads} heads {decompressed_dk}/{decompressed_dv}"
        add(
            f"prefill {what}",
            dtype,
            lambda: compare.check_prefill_attention(
                query_lens, seq_lens, heads, heads, decompressed_dk, 16, dtype, device, **decompressed
            ),
        )
        if full:
            add(
                f"mixed step {what}",
                dtype,
                lambda: compare.check_mixed_step_attention(
                    mixed_query_lens, mixed_seq_lens, heads, heads, decompressed_dk, 16, dtype, device, **decompressed
                )[:2],
            )
        add(
            f"store_kvcache absorbed {d_k} keys only",
            dtype,
            lambda: compare.check_store_kvcache(300, 1, d_k, 16, dtype, device, v_head_dim=d_v, keys_only=True),
        )
        add(
            f"store_kvcache {what}",
            dtype,
            lambda: compare.check_store_kvcache(
                300, heads, decompressed_dk, 16, dtype, device, v_head_dim=decompressed_dv
            ),
        )
    return results


def check_kv_cache(device) -> list[dict]:
    return [
        run_case(
            f"store_kvcache block_size={bs}", dtype, lambda: compare.check_store_kvcache(300, 8, 128, bs, dtype, device)
        )
        for dtype in DTYPES
        for bs in (8, 16, 128)
    ]


def check_rms_norm(device) -> list[dict]:
    return [
        run_case(
            f"rms_norm hidden={hidden} residual={res}",
            dtype,
            lambda: compare.check_rms_norm(257, hidden, dtype, device, res),
        )
        for dtype in DTYPES
        for hidden in (4096, 8192, 576)
        for res in (False, True)
    ]


def check_rotary(device) -> list[dict]:
    return [
        run_case(
            f"rotary heads={hq}/{hkv} head_dim={hd}",
            dtype,
            lambda: compare.check_rotary(257, hq, hkv, hd, dtype, device),
        )
        for dtype in DTYPES
        for hq, hkv, hd in ((32, 8, 128), (64, 8, 128), (9, 3, 64))
    ]


def check_rejection_sample(device) -> list[dict]:
    """Llama 3's vocabulary, 256 sequences (a quarter greedy) of 4 drafts each or of 0..4; the
    token ids must be equal (dyadic probabilities: see kernels/rejection_sample.py)."""
    greedy = [i % 4 == 0 for i in range(256)]
    results = []
    for with_draft_probs in (True, False):
        for name, num_drafts in (("k=4", [4] * 256), ("k=0..4", [i % 5 for i in range(256)])):
            case = f"rejection sample batch=256 {name} vocab=128256 {'draft probs' if with_draft_probs else 'n-gram'}"
            results.append(
                run_case(
                    case,
                    torch.float32,
                    lambda: compare.check_rejection_sample(num_drafts, greedy, 128256, with_draft_probs, device),
                )
            )
    return results


def check_moe(device) -> list[dict]:
    """The fused MoE at gpt-oss's shape (hidden 2880 is no power of two: the K and N masks), bf16
    weights and MXFP4 ones, at each batch; K-contiguous weights, fp16, fp32; and tokens routed to
    9 of 16 experts (empty experts) at the decode and the prefill tiles; and slots of other
    expert-parallel ranks (id -1)."""
    hidden, intermediate, num_experts, top_k = MOE_SHAPE
    cases = []
    for num_tokens in MOE_TOKENS:
        cases.append((f"fused_moe bf16 weights T={num_tokens}", torch.bfloat16, num_tokens, {}))
        cases.append((f"fused_moe MXFP4 weights T={num_tokens}", torch.bfloat16, num_tokens, dict(mxfp4=True)))
    cases += [
        ("fused_moe K-contiguous bf16 weights T=64", torch.bfloat16, 64, dict(k_contiguous=True)),
        ("fused_moe T=64", torch.float16, 64, {}),
        ("fused_moe T=64", torch.float32, 64, {}),
        ("fused_moe MXFP4 weights T=64", torch.float32, 64, dict(mxfp4=True)),
    ]
    for num_tokens in (37, 300):
        for mxfp4 in (False, True):
            name = f"fused_moe {'MXFP4' if mxfp4 else 'bf16'} weights T={num_tokens} on 9 of 16 experts"
            cases.append((name, torch.bfloat16, num_tokens, dict(mxfp4=mxfp4, num_experts=16, num_used=9)))
    for num_tokens in (1, 300):  # expert parallel: 7 of 8 slots another rank's (id -1, written as zeros)
        name = f"fused_moe bf16 weights T={num_tokens}, 7/8 of the slots id -1 (expert parallel)"
        cases.append((name, torch.bfloat16, num_tokens, dict(other_ranks=0.875)))
    results = []
    for case, dtype, num_tokens, options in cases:
        options = dict(num_experts=num_experts) | options
        results.append(
            run_case(
                case,
                dtype,
                lambda: compare.check_fused_moe(
                    num_tokens, hidden, intermediate, top_k=top_k, dtype=dtype, device=device, **options
                ),
            )
        )
        torch.cuda.empty_cache()
    return results


# A step's attention: the decode kernel's two launches, the prefill kernel, and the jit helpers they call.
STEP_ATTENTION = [
    _decode_split_kernel,
    _decode_reduce_kernel,
    _prefill_kernel,
    _find_sequence,
    attend_paged_keys,
    online_softmax_tile,
]

# Correctness: each entry is (what, run the cases -> list of results, the @triton.jit functions it
# covers). tests/test_triton_kernels.py checks that these cover every kernel in kernels/.
CHECKS = [
    (
        "decode attention",
        check_decode,
        [_decode_split_kernel, _decode_reduce_kernel, attend_paged_latent_keys, attend_paged_keys, online_softmax_tile],
    ),
    (
        "prefill attention",
        check_prefill,
        [_prefill_kernel, _find_sequence, attend_paged_latent_keys, attend_paged_keys, online_softmax_tile],
    ),
    ("mixed step attention", check_mixed_step, STEP_ATTENTION),
    ("gpt-oss attention (sinks, sliding window)", check_sinks_window, STEP_ATTENTION),
    (
        "DeepSeek MLA attention (absorbed, decompressed)",
        check_mla,
        [*STEP_ATTENTION, attend_paged_latent_keys, _store_kvcache_kernel],
    ),
    ("KV-cache write", check_kv_cache, [_store_kvcache_kernel]),
    ("RMSNorm", check_rms_norm, [_rms_norm_kernel]),
    ("rotary", check_rotary, [_rotary_kernel, _rotate_heads]),
    ("rejection sampler", check_rejection_sample, [_rejection_sample_kernel, _block_weights]),
    ("gpt-oss MoE", check_moe, [_fused_moe_kernel, mxfp4_weight_tiles, e2m1_to_fp32]),
    ("FP8 GEMM and DeepSeek MoE (kernels/fp8.py)", fp8_cases, [_fp8_linear_kernel, _fused_moe_kernel]),
]

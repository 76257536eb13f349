"""Each Triton kernel against its PyTorch reference on random inputs: shared by the tests (CPU,
Triton's interpreter, small shapes), tests/compile_for_gpu.py and the GPU check (CUDA, the served
shapes: kernels/checks/gpu_cases.py and fp8.py, each case a row by `run_case`).

Every `check_*` returns `(got, want)` in fp32: `got` from the kernel on inputs of the given dtype,
`want` from the reference on fp32 copies of the same (already rounded) inputs, so the difference is
the kernel's own rounding. `assert_close` applies the tolerance of the dtype. The exception is the
rejection sampler, whose outputs are token ids: they must be equal."""

import itertools

import torch

from kernels.attention import AttentionMetadata, paged_attention_triton
from kernels.decode_attention import decode_attention_reference, decode_attention_triton
from kernels.fused_moe import (
    fused_moe_mxfp4_reference,
    fused_moe_mxfp4_triton,
    fused_moe_reference,
    fused_moe_triton,
)
from kernels.kv_cache import store_kvcache_reference, store_kvcache_triton
from kernels.prefill_attention import prefill_attention_reference, prefill_attention_triton
from kernels.rejection_sample import rejection_sample_reference, rejection_sample_triton
from kernels.rms_norm import add_rms_norm_reference, add_rms_norm_triton, rms_norm_reference, rms_norm_triton
from kernels.rotary import rotary_reference, rotary_triton

# (atol, rtol) per input dtype. fp32: only summation order differs. fp16/bf16: the output is
# rounded once to the dtype, and on a GPU the softmax probabilities are rounded to it for the P@V
# dot; bf16 allows two of its 8-bit-mantissa ulps because Triton's interpreter rounds fp32 to bf16
# toward zero (GPUs round to nearest).
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    if not got.is_floating_point():  # token ids
        assert torch.equal(got, want), f"{what}: {int((got != want).sum())} of {got.numel()} differ"
        return
    atol, rtol = TOLERANCES[dtype]
    assert not got.isnan().any(), f"{what}: NaN in the kernel's output"
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{what} ({dtype}): {m}")


def run_case(case: str, dtype: torch.dtype, check) -> dict:
    """One case as a row of the GPU check's results: `check()` returns (got, want); a compile or
    launch error fails the case, not the run."""
    result = dict(case=case, dtype=str(dtype).removeprefix("torch."), ok=False, max_abs_err=None, error="")
    try:
        got, want = check()
        result["max_abs_err"] = float((got - want).abs().max()) if got.numel() else 0.0
        assert_close(got, want, dtype, case)
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported in the results, with the case
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return result


def _randn(generator: torch.Generator, *shape, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def random_paged_cache(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    generator: torch.Generator,
    v_head_dim: int | None = None,
    shared_kv: bool = False,
):
    """K and V caches `[num_blocks, block_size, num_kv_heads, head_dim]` of random values and block
    tables that scatter each sequence's blocks over the pool in random order (plus spare blocks no
    one owns, and a zero-padded last column as the engine pads its tables). MLA: `v_head_dim`, V's
    own head dim (K's being `head_dim`); `shared_kv`, V is the view `k_cache[..., :v_head_dim]`
    (absorbed MLA's one entry a token) instead of a cache of its own."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    taken = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = torch.tensor(order[taken : taken + n], dtype=torch.int32)
        taken += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = _randn(generator, *shape, dtype=dtype, device=device)
    if shared_kv:
        v_cache = k_cache[..., :v_head_dim]
    else:
        v_cache = _randn(generator, *shape[:3], v_head_dim or head_dim, dtype=dtype, device=device)
    return k_cache, v_cache, block_tables.to(device)


def random_sinks(generator: torch.Generator, num_q_heads: int, dtype: torch.dtype, device) -> torch.Tensor:
    """One sink logit per query head, as gpt-oss learns them (held in the model's dtype): spread
    wide, so that some heads' sinks take most of the softmax's mass and others next to none."""
    return (3 * torch.randn(num_q_heads, generator=generator)).to(device=device, dtype=dtype)


def free_blocks_before_window(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    first_positions: list[int],
    window: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """What the block manager leaves behind a sliding window: sequence i's blocks wholly before the
    first key its first query (at `first_positions[i]`) sees are freed and reused. Here they are
    filled with NaN, and every other one of their table entries is pointed at an arbitrary block
    (another sequence's, a spare, a NaN one). A kernel that reads any of them gives NaN or wrong
    values. Returns the new block tables."""
    block_size, num_blocks = k_cache.shape[1], k_cache.shape[0]
    tables = block_tables.cpu().clone()
    for i, first_pos in enumerate(first_positions):
        for j in range(max(0, first_pos - window + 1) // block_size):
            freed = int(tables[i, j])
            k_cache[freed] = float("nan")
            v_cache[freed] = float("nan")
            if j % 2:
                tables[i, j] = int(torch.randint(num_blocks, (1,), generator=generator))
    return tables.to(block_tables.device)


def check_decode_attention(
    context_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    num_splits: int | None = None,
    seed: int = 0,
    sinks: bool = False,
    sliding_window: int | None = None,
    v_head_dim: int | None = None,
    shared_kv: bool = False,
    block_h: int | None = None,
):
    """`sinks`: random ones (`random_sinks`); `sliding_window`: with the blocks before each window
    freed and filled with NaN (`free_blocks_before_window`). MLA: `head_dim` is K's (and q's),
    `v_head_dim` V's, `shared_kv` V a view of K (`random_paged_cache`). `block_h`: query heads a
    program, for the launcher."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, block_tables = random_paged_cache(
        context_lens, num_kv_heads, head_dim, block_size, dtype, device, g, v_head_dim, shared_kv
    )
    q = _randn(g, len(context_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    sink_logits, block_tables = _sinks_and_window(
        g, [1] * len(context_lens), context_lens, num_q_heads, k_cache, v_cache, block_tables, sinks, sliding_window
    )
    extras = dict(sinks=sink_logits, sliding_window=sliding_window)
    got = decode_attention_triton(
        q, k_cache, v_cache, block_tables, lens, scale, max(context_lens), num_splits, block_h=block_h, **extras
    )
    want = decode_attention_reference(
        q.float(), k_cache.float(), v_cache.float(), block_tables, lens, scale, **_fp32(extras)
    )
    return got.float(), want


def check_prefill_attention(
    query_lens: list[int],
    seq_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    seed: int = 0,
    sinks: bool = False,
    sliding_window: int | None = None,
    v_head_dim: int | None = None,
    shared_kv: bool = False,
    **tiles,
):
    """`seq_lens[i] - query_lens[i]` tokens of sequence i are cached context (chunked prefill); its
    query tokens follow them. `tiles`: block_m / block_n for the launcher. `sinks`,
    `sliding_window`, `v_head_dim`, `shared_kv`: as for `check_decode_attention`."""
    q, k_cache, v_cache, block_tables, cu_seqlens_q, lens, extras = _random_step(
        query_lens,
        seq_lens,
        num_q_heads,
        num_kv_heads,
        head_dim,
        block_size,
        dtype,
        device,
        seed,
        sinks,
        sliding_window,
        v_head_dim,
        shared_kv,
    )
    scale = head_dim**-0.5
    got = prefill_attention_triton(q, k_cache, v_cache, block_tables, cu_seqlens_q, lens, scale, **tiles, **extras)
    want = prefill_attention_reference(
        q.float(), k_cache.float(), v_cache.float(), block_tables, cu_seqlens_q, lens, scale, **_fp32(extras)
    )
    return got.float(), want


def _random_step(
    query_lens,
    seq_lens,
    num_q_heads,
    num_kv_heads,
    head_dim,
    block_size,
    dtype,
    device,
    seed,
    sinks,
    sliding_window,
    v_head_dim,
    shared_kv,
):
    """A step's random inputs for the prefill and mixed-step checks: the paged K/V with its block
    tables (the blocks before each window freed), the queries, cu_seqlens_q, the sequence lengths
    and the kernel's extras (sinks, sliding_window)."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, block_tables = random_paged_cache(
        seq_lens, num_kv_heads, head_dim, block_size, dtype, device, g, v_head_dim, shared_kv
    )
    q = _randn(g, sum(query_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    cu_seqlens_q = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    sink_logits, block_tables = _sinks_and_window(
        g, query_lens, seq_lens, num_q_heads, k_cache, v_cache, block_tables, sinks, sliding_window
    )
    return q, k_cache, v_cache, block_tables, cu_seqlens_q, lens, dict(sinks=sink_logits, sliding_window=sliding_window)


def _sinks_and_window(g, query_lens, seq_lens, num_q_heads, k_cache, v_cache, block_tables, sinks, sliding_window):
    """Random sinks (or None), and the block tables with the blocks before each sequence's window
    (that of its first query) freed."""
    sink_logits = random_sinks(g, num_q_heads, k_cache.dtype, k_cache.device) if sinks else None
    if sliding_window is not None:
        first_positions = [s - q for q, s in zip(query_lens, seq_lens)]
        block_tables = free_blocks_before_window(k_cache, v_cache, block_tables, first_positions, sliding_window, g)
    return sink_logits, block_tables


def _fp32(extras: dict) -> dict:
    """The reference's copy of the kernel's extras: sinks in fp32."""
    return extras | dict(sinks=None if extras["sinks"] is None else extras["sinks"].float())


def check_mixed_step_attention(
    query_lens: list[int],
    seq_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    seed: int = 0,
    sinks: bool = False,
    sliding_window: int | None = None,
    v_head_dim: int | None = None,
    shared_kv: bool = False,
):
    """A whole step through `paged_attention_triton`, as the model calls it: its leading one-token
    rows on the decode kernel, the others on the prefill kernel, against the prefill reference for
    all of them. `sinks`, `sliding_window`, `v_head_dim`, `shared_kv`: as for
    `check_decode_attention`."""
    q, k_cache, v_cache, block_tables, cu_seqlens_q, lens, extras = _random_step(
        query_lens,
        seq_lens,
        num_q_heads,
        num_kv_heads,
        head_dim,
        block_size,
        dtype,
        device,
        seed,
        sinks,
        sliding_window,
        v_head_dim,
        shared_kv,
    )
    meta = AttentionMetadata(
        torch.full((len(q),), -1, device=device), block_tables, cu_seqlens_q, lens, list(query_lens), list(seq_lens)
    )
    scale = head_dim**-0.5
    got = paged_attention_triton(q, None, None, k_cache, v_cache, meta, scale, **extras)
    want = prefill_attention_reference(
        q.float(), k_cache.float(), v_cache.float(), block_tables, cu_seqlens_q, lens, scale, **_fp32(extras)
    )
    return got.float(), want, meta.num_decodes


def check_store_kvcache(
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    seed: int = 0,
    v_head_dim: int | None = None,
    keys_only: bool = False,
):
    """Tokens written to random distinct slots, every third one skipped (slot -1); the caches
    start random, so a write to a wrong slot or a skipped one shows. MLA: `v_head_dim`, V's own
    head dim (a V cache of its own); `keys_only`, K alone is stored (`v` None; V is the view
    `k_cache[..., :v_head_dim]`). The caches come back flattened into one row."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = -(-num_tokens // block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[::3] = -1
    slots = slots.to(device)
    k = _randn(g, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    if v_head_dim is None and not keys_only:
        v = _randn(g, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
        caches = _randn(g, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
        got, want = caches.clone(), caches.float()
        store_kvcache_triton(k, v, got[0], got[1], slots)
        store_kvcache_reference(k.float(), v.float(), want[0], want[1], slots)
        return got.float(), want
    k_cache = _randn(g, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    got_k, want_k = k_cache.clone(), k_cache.float()
    if keys_only:
        store_kvcache_triton(k, None, got_k, got_k[..., :v_head_dim], slots)
        store_kvcache_reference(k.float(), None, want_k, want_k[..., :v_head_dim], slots)
        return got_k.float().flatten(), want_k.flatten()
    v = _randn(g, num_tokens, num_kv_heads, v_head_dim, dtype=dtype, device=device)
    v_cache = _randn(g, num_blocks, block_size, num_kv_heads, v_head_dim, dtype=dtype, device=device)
    got_v, want_v = v_cache.clone(), v_cache.float()
    store_kvcache_triton(k, v, got_k, got_v, slots)
    store_kvcache_reference(k.float(), v.float(), want_k, want_v, slots)
    return torch.cat((got_k.flatten(), got_v.flatten())).float(), torch.cat((want_k.flatten(), want_v.flatten()))


def check_rms_norm(num_rows: int, hidden: int, dtype: torch.dtype, device, with_residual: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = _randn(g, num_rows, hidden, dtype=dtype, device=device)
    weight = (1 + 0.1 * _randn(g, hidden, dtype=torch.float32, device=device)).to(dtype)
    eps = 1e-5
    if not with_residual:
        return rms_norm_triton(x, weight, eps).float(), rms_norm_reference(x.float(), weight.float(), eps)
    residual = _randn(g, num_rows, hidden, dtype=dtype, device=device)
    got = torch.cat(add_rms_norm_triton(x, residual, weight, eps))
    want = torch.cat(add_rms_norm_reference(x.float(), residual.float(), weight.float(), eps))
    return got.float(), want


def rope_table(positions: torch.Tensor, head_dim: int, theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain rotate-half cos/sin table (fp32) for these positions."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def check_rotary(
    num_tokens: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    seed: int = 0,
):
    """`cos`, `sin` `[num_tokens, head_dim]` fp32 rows (default: a plain table at random positions),
    cast to `dtype` as the model does. q and k are views of one fused projection, as in a model."""
    g = torch.Generator().manual_seed(seed)
    if cos is None:
        cos, sin = rope_table(torch.randint(0, 8192, (num_tokens,), generator=g), head_dim)
    cos, sin = cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)
    qk = _randn(g, num_tokens, num_q_heads + num_kv_heads, head_dim, dtype=dtype, device=device)
    q, k = qk[:, :num_q_heads], qk[:, num_q_heads:]
    got = torch.cat([t.flatten() for t in rotary_triton(q, k, cos, sin)])
    want = torch.cat([t.flatten() for t in rotary_reference(q.float(), k.float(), cos.float(), sin.float())])
    return got.float(), want


def ragged_lengths(block_size: int) -> list[int]:
    """Lengths around block boundaries: 1, block_size - 1, block_size, block_size + 1, many blocks."""
    return [1, block_size - 1, block_size, block_size + 1, 5 * block_size + 3]


def attention_flops(
    query_lens: list[int],
    seq_lens: list[int],
    num_q_heads: int,
    head_dim: int,
    sliding_window: int | None = None,
    v_head_dim: int | None = None,
) -> float:
    """Causal attention FLOPs: two matmuls (QK^T over `head_dim`, PV over `v_head_dim`, by default
    the same) of 2 FLOPs per multiply-add over each query row's visible keys (with a sliding window
    W, at most W of them)."""
    if sliding_window is None:
        visible = sum(q * (s - q) + q * (q + 1) / 2 for q, s in zip(query_lens, seq_lens))
    else:
        visible = sum(min(p + 1, sliding_window) for q, s in zip(query_lens, seq_lens) for p in range(s - q, s))
    return 2.0 * visible * num_q_heads * (head_dim + (v_head_dim or head_dim))


def dyadic_probs(logits: torch.Tensor) -> torch.Tensor:
    """softmax(logits) rounded down to multiples of 2^-22: each row's mass is at most 1, so every
    partial sum, in any order, is exact in fp32, and the rejection sampler's kernel and reference
    draw the same tokens (their summation orders differ)."""
    return torch.floor(logits.float().softmax(-1) * 2.0**22) / 2.0**22


def random_rejection_batch(
    num_drafts: list[int],
    greedy: list[bool],
    vocab: int,
    with_draft_probs: bool,
    device,
    generator: torch.Generator,
    extra_slots: int = 1,
    exact_sums: bool = True,
) -> dict:
    """Arguments of `rejection_sample_*` for sequences with these draft counts and greedy flags:
    target rows with a third of the vocabulary masked out (as top-k/top-p leave them), draft rows
    near them with masks of their own, drafts mostly sampled from q (from p without q; greedy ones
    q's argmax) so that runs of accepts happen, and the rest uniformly random tokens (which
    may lie outside q's or p's support). Some uniforms are 0 or the largest fp32 below 1.
    `exact_sums`: dyadic probabilities (`dyadic_probs`), else plain softmax ones (see
    kernels/rejection_sample.py on rounding)."""
    g = generator
    cu = torch.tensor([0, *itertools.accumulate(num_drafts)], dtype=torch.int32)
    num_seqs, total = len(num_drafts), int(cu[-1])
    logits = 3 * torch.randn(total + num_seqs, vocab, generator=g)
    logits[torch.rand(logits.shape, generator=g) < 1 / 3] = float("-inf")
    logits[:, 0] = 0.0  # every row keeps some mass
    probs = dyadic_probs if exact_sums else (lambda x: x.softmax(-1))
    target_probs = probs(logits)
    target_argmax = logits.argmax(-1)
    # Row of the target that scores each draft: cu[i] + i + j.
    seq_of_draft = torch.repeat_interleave(torch.arange(num_seqs), torch.tensor(num_drafts, dtype=torch.int64))
    scored_row = torch.arange(total) + seq_of_draft
    draft_logits = logits[scored_row].clamp(min=-4) + torch.randn(total, vocab, generator=g)
    draft_logits[torch.rand(draft_logits.shape, generator=g) < 1 / 6] = float("-inf")
    draft_logits[:, 1] = 0.0
    draft_probs = probs(draft_logits)
    sampled_from = draft_probs if with_draft_probs else target_probs[scored_row]
    drafts = torch.multinomial(sampled_from, 1, generator=g).flatten() if total else torch.zeros(0, dtype=torch.int64)
    is_greedy = torch.tensor(greedy, dtype=torch.bool)
    drafts = torch.where(is_greedy[seq_of_draft], draft_logits.argmax(-1), drafts)  # a greedy draft model
    random_token = torch.rand(total, generator=g) < 1 / 8
    drafts = torch.where(random_token, torch.randint(0, vocab, (total,), generator=g), drafts)
    accept_uniforms = torch.rand(total, generator=g)
    sample_uniforms = torch.rand(num_seqs, generator=g)
    largest_below_1 = 1 - 2.0**-24
    accept_uniforms[::7], sample_uniforms[::5] = largest_below_1, largest_below_1
    accept_uniforms[3::7], sample_uniforms[2::5] = 0.0, 0.0
    args = dict(
        cu_num_draft=cu,
        draft_token_ids=drafts,
        draft_probs=draft_probs if with_draft_probs else None,
        target_probs=target_probs,
        target_argmax=target_argmax,
        is_greedy=is_greedy,
        accept_uniforms=accept_uniforms,
        sample_uniforms=sample_uniforms,
    )
    args = {k: v.to(device) if v is not None else None for k, v in args.items()}
    return args | dict(max_num_draft=max(num_drafts, default=0) + extra_slots)


def check_rejection_sample(
    num_drafts: list[int],
    greedy: list[bool],
    vocab: int,
    with_draft_probs: bool,
    device,
    seed: int = 0,
    exact_sums: bool = True,
    **launch,
):
    """Kernel and reference on `random_rejection_batch`: token ids (int64), which must be equal.
    `launch`: block_v for the launcher."""
    g = torch.Generator().manual_seed(seed)
    args = random_rejection_batch(num_drafts, greedy, vocab, with_draft_probs, device, g, exact_sums=exact_sums)
    return rejection_sample_triton(**args, **launch), rejection_sample_reference(**args)


# gpt-oss mixture of experts (kernels/fused_moe.py)


def random_routing(
    num_tokens: int, num_experts: int, top_k: int, device, generator: torch.Generator, num_used: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(topk_weights fp32, topk_ids int64)` `[num_tokens, top_k]` as gpt-oss's router gives them:
    top-k of random logits, softmax over the k. `num_used`: only a random subset of that many
    experts is ever chosen (the others stay empty)."""
    num_used = num_used or num_experts
    logits = torch.randn(num_tokens, num_experts, generator=generator, device=device)
    unused = torch.randperm(num_experts, generator=generator, device=device)[: num_experts - num_used]
    logits[:, unused] = float("-inf")
    top, ids = logits.topk(top_k, dim=-1)
    return top.softmax(dim=-1), ids


def random_moe_weights(
    num_experts: int,
    hidden: int,
    intermediate: int,
    dtype: torch.dtype,
    device,
    generator: torch.Generator,
    mxfp4: bool,
) -> tuple[torch.Tensor, ...]:
    """gpt-oss expert weights: dense `(w_gate_up [E, H, 2I], b_gate_up, w_down [E, I, H], b_down)`,
    or MXFP4 `(gate_up_blocks, gate_up_scales, b_gate_up, down_blocks, down_scales, b_down)` of
    random bytes (every e2m1 value) and scales around the dense weights' size. The sizes put a
    good share of gate/up pre-activations past the clamp (±7) and the output near 1."""

    def randn(*shape, std):
        return (std * torch.randn(*shape, generator=generator, device=device)).to(dtype)

    gate_up_std, down_std = 4 / hidden**0.5, 0.2 / intermediate**0.5
    b_gate_up, b_down = randn(num_experts, 2 * intermediate, std=1.0), randn(num_experts, hidden, std=0.1)
    if not mxfp4:
        w_gate_up = randn(num_experts, hidden, 2 * intermediate, std=gate_up_std)
        return w_gate_up, b_gate_up, randn(num_experts, intermediate, hidden, std=down_std), b_down

    def mxfp4_tensor(rows, cols, std):
        blocks = torch.randint(0, 256, (num_experts, rows, cols // 32, 16), generator=generator, device=device)
        # random e2m1 values have an rms of 2.93: pick exponents around std / 2.93
        base = 127 + round(torch.log2(torch.tensor(std / 2.93)).item())
        scales = torch.randint(base - 1, base + 2, (num_experts, rows, cols // 32), generator=generator, device=device)
        return blocks.to(torch.uint8), scales.to(torch.uint8)

    gate_up_blocks, gate_up_scales = mxfp4_tensor(2 * intermediate, hidden, gate_up_std)
    down_blocks, down_scales = mxfp4_tensor(hidden, intermediate, down_std)
    return gate_up_blocks, gate_up_scales, b_gate_up, down_blocks, down_scales, b_down


def check_fused_moe(
    num_tokens: int,
    hidden: int,
    intermediate: int,
    num_experts: int,
    top_k: int,
    dtype: torch.dtype,
    device,
    mxfp4: bool = False,
    num_used: int | None = None,
    seed: int = 0,
    k_contiguous: bool = False,
    other_ranks: float = 0.0,
    **config,
):
    """`fused_moe_triton` (or `fused_moe_mxfp4_triton`) against its reference on random weights and
    routing (`num_used`: experts the router ever picks; the rest stay empty). `config`: tile
    overrides for the launcher. MXFP4 weights are the same bytes for both; x and the biases are
    rounded to `dtype` first. `k_contiguous`: the kernel gets the dense weights as transposed views
    of `[E, out, in]` tensors (the checkpoint's orientation). `other_ranks`: the share of slots given
    id -1, another expert-parallel rank's (computed as nothing)."""
    g = torch.Generator(device=device).manual_seed(seed)
    weights = random_moe_weights(num_experts, hidden, intermediate, dtype, device, g, mxfp4)
    if k_contiguous and not mxfp4:
        weights = tuple(w.transpose(1, 2).contiguous().transpose(1, 2) if w.dim() == 3 else w for w in weights)
    topk_weights, topk_ids = random_routing(num_tokens, num_experts, top_k, device, g, num_used)
    if other_ranks:
        topk_ids = topk_ids.masked_fill(torch.rand(topk_ids.shape, generator=g, device=device) < other_ranks, -1)
    x = torch.randn(num_tokens, hidden, generator=g, device=device).to(dtype)
    fp32 = [w if w.dtype == torch.uint8 else w.float() for w in weights]
    if mxfp4:
        got = fused_moe_mxfp4_triton(x, *weights, topk_weights, topk_ids, config=config)
        want = fused_moe_mxfp4_reference(x.float(), *fp32, topk_weights, topk_ids)
    else:
        got = fused_moe_triton(x, *weights, topk_weights, topk_ids, config=config)
        want = fused_moe_reference(x.float(), *fp32, topk_weights, topk_ids)
    return got.float(), want


def moe_weight_bytes(topk_ids: torch.Tensor, hidden: int, intermediate: int, mxfp4: bool, dtype_bytes: int = 2) -> int:
    """Bytes of expert weights a MoE layer must read for this routing: every expert hit, once
    (gate_up and down matrices and their biases; MXFP4: half a byte per weight plus a scale byte
    per 32)."""
    experts_hit = int(torch.unique(topk_ids[topk_ids >= 0]).numel())  # -1: another rank's slot
    weights = 3 * hidden * intermediate  # 2I x H and H x I
    matrix_bytes = weights // 2 + weights // 32 if mxfp4 else weights * dtype_bytes
    return experts_hit * (matrix_bytes + (2 * intermediate + hidden) * dtype_bytes)

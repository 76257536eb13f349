"""Each Triton kernel against its PyTorch reference on random inputs: shared by the tests (CPU,
Triton's interpreter, small shapes) and `python -m kernels.gpu_check` (CUDA, larger shapes).

Every `check_*` returns `(got, want)` in fp32: `got` from the kernel on inputs of the given dtype,
`want` from the reference on fp32 copies of the same (already rounded) inputs, so the difference is
the kernel's own rounding. `assert_close` applies the tolerance of the dtype. The exception is the
rejection sampler, whose outputs are token ids: they must be equal."""

import itertools

import torch

from kernels.attention import AttentionMetadata, paged_attention_triton
from kernels.decode_attention import decode_attention_reference, decode_attention_triton
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
):
    """K and V caches `[num_blocks, block_size, num_kv_heads, head_dim]` of random values and block
    tables that scatter each sequence's blocks over the pool in random order (plus spare blocks no
    one owns, and a zero-padded last column as the engine pads its tables)."""
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
    v_cache = _randn(generator, *shape, dtype=dtype, device=device)
    return k_cache, v_cache, block_tables.to(device)


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
):
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, block_tables = random_paged_cache(
        context_lens, num_kv_heads, head_dim, block_size, dtype, device, g
    )
    q = _randn(g, len(context_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    got = decode_attention_triton(q, k_cache, v_cache, block_tables, lens, scale, max(context_lens), num_splits)
    want = decode_attention_reference(q.float(), k_cache.float(), v_cache.float(), block_tables, lens, scale)
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
    **tiles,
):
    """`seq_lens[i] - query_lens[i]` tokens of sequence i are cached context (chunked prefill); its
    query tokens follow them. `tiles`: block_m / block_n for the launcher."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, block_tables = random_paged_cache(seq_lens, num_kv_heads, head_dim, block_size, dtype, device, g)
    q = _randn(g, sum(query_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    cu_seqlens_q = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    got = prefill_attention_triton(q, k_cache, v_cache, block_tables, cu_seqlens_q, lens, scale, **tiles)
    want = prefill_attention_reference(
        q.float(), k_cache.float(), v_cache.float(), block_tables, cu_seqlens_q, lens, scale
    )
    return got.float(), want


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
):
    """A whole step through `paged_attention_triton`, as the model calls it: its leading one-token
    rows on the decode kernel, the others on the prefill kernel, against the prefill reference for
    all of them."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, block_tables = random_paged_cache(seq_lens, num_kv_heads, head_dim, block_size, dtype, device, g)
    q = _randn(g, sum(query_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    cu_seqlens_q = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    meta = AttentionMetadata(
        torch.full((len(q),), -1, device=device), block_tables, cu_seqlens_q, lens, list(query_lens), list(seq_lens)
    )
    scale = head_dim**-0.5
    got = paged_attention_triton(q, None, None, k_cache, v_cache, meta, scale)
    want = prefill_attention_reference(
        q.float(), k_cache.float(), v_cache.float(), block_tables, cu_seqlens_q, lens, scale
    )
    return got.float(), want, meta.num_decodes


def check_store_kvcache(
    num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, device, seed: int = 0
):
    """Tokens written to random distinct slots, every third one skipped (slot -1); the caches
    start random, so a write to a wrong slot or a skipped one shows."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = -(-num_tokens // block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[::3] = -1
    k = _randn(g, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    v = _randn(g, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    caches = _randn(g, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    got, want = caches.clone(), caches.float()
    slots = slots.to(device)
    store_kvcache_triton(k, v, got[0], got[1], slots)
    store_kvcache_reference(k.float(), v.float(), want[0], want[1], slots)
    return got.float(), want


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


def attention_flops(query_lens: list[int], seq_lens: list[int], num_q_heads: int, head_dim: int) -> float:
    """Causal attention FLOPs: two matmuls (QK^T, PV) of 2 FLOPs per multiply-add over each query
    row's visible keys."""
    visible = sum(q * (s - q) + q * (q + 1) / 2 for q, s in zip(query_lens, seq_lens))
    return 4.0 * visible * num_q_heads * head_dim


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

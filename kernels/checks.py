"""Each Triton kernel against its PyTorch reference on random inputs: shared by the tests (CPU,
Triton's interpreter, small shapes) and `python -m kernels.gpu_check` (CUDA, larger shapes).

Every `check_*` returns `(got, want)` in fp32: `got` from the kernel on inputs of the given dtype,
`want` from the reference on fp32 copies of the same (already rounded) inputs, so the difference is
the kernel's own rounding. `assert_close` applies the tolerance of the dtype."""

import itertools

import torch

from kernels.decode_attention import decode_attention_reference, decode_attention_triton
from kernels.kv_cache import store_kvcache_reference, store_kvcache_triton
from kernels.prefill_attention import prefill_attention_reference, prefill_attention_triton
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
    atol, rtol = TOLERANCES[dtype]
    assert not got.isnan().any(), f"{what}: NaN in the kernel's output"
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{what} ({dtype}): {m}")


def _randn(generator: torch.Generator, *shape, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def random_paged_cache(seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                       device, generator: torch.Generator):
    """K and V caches `[num_blocks, block_size, num_kv_heads, head_dim]` of random values and block
    tables that scatter each sequence's blocks over the pool in random order (plus spare blocks no
    one owns, and a zero-padded last column as the engine pads its tables)."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    taken = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = torch.tensor(order[taken:taken + n], dtype=torch.int32)
        taken += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = _randn(generator, *shape, dtype=dtype, device=device)
    v_cache = _randn(generator, *shape, dtype=dtype, device=device)
    return k_cache, v_cache, block_tables.to(device)


def check_decode_attention(context_lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int,
                           block_size: int, dtype: torch.dtype, device, num_splits: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, block_tables = random_paged_cache(context_lens, num_kv_heads, head_dim, block_size, dtype, device, g)
    q = _randn(g, len(context_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=device)
    scale = head_dim ** -0.5
    got = decode_attention_triton(q, k_cache, v_cache, block_tables, lens, scale, max(context_lens), num_splits)
    want = decode_attention_reference(q.float(), k_cache.float(), v_cache.float(), block_tables, lens, scale)
    return got.float(), want


def check_prefill_attention(query_lens: list[int], seq_lens: list[int], num_q_heads: int, num_kv_heads: int,
                            head_dim: int, block_size: int, dtype: torch.dtype, device, seed: int = 0, **tiles):
    """`seq_lens[i] - query_lens[i]` tokens of sequence i are cached context (chunked prefill); its
    query tokens follow them. `tiles`: block_m / block_n for the launcher."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, block_tables = random_paged_cache(seq_lens, num_kv_heads, head_dim, block_size, dtype, device, g)
    q = _randn(g, sum(query_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    cu_seqlens_q = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    scale = head_dim ** -0.5
    got = prefill_attention_triton(q, k_cache, v_cache, block_tables, cu_seqlens_q, lens, scale, **tiles)
    want = prefill_attention_reference(q.float(), k_cache.float(), v_cache.float(), block_tables, cu_seqlens_q, lens,
                                       scale)
    return got.float(), want


def check_store_kvcache(num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                        device, seed: int = 0):
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


def check_rotary(num_tokens: int, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device,
                 cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, seed: int = 0):
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


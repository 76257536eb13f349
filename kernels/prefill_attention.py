"""Paged prefill attention for a variable-length batch: several query tokens per sequence over the
paged KV cache, causal, with the offset of the already-cached context. One kernel serves whole
prompts, chunked-prefill chunks, single decode tokens and a speculative verifier's draft tokens.

Queries are flat `[num_tokens, num_q_heads, head_dim]`; sequence i's query rows are
`cu_seqlens_q[i] .. cu_seqlens_q[i+1]-1`, and it has `seq_lens[i]` tokens in the cache in all
(this step's included, already stored), so its query row r sits at position
`seq_lens[i] - query_len_i + r` and sees keys 0 .. that position.

A program takes BLOCK_Q query tokens of one sequence and one KV head, and puts all query heads of
that KV head into the rows of one tile (row = token * group + head in group), so the group shares
every K/V tile in tl.dot. The grid's first axis is an upper bound on the tiles of all sequences;
each program finds its sequence by binary search over cu_seqlens_q (no host-side tile list).

gpt-oss's optional extras, as in decode_attention.py: `sinks [num_q_heads]` (one logit per query
head in the softmax's denominator only) and `sliding_window` W (the row at position p sees keys
p - W + 1 .. p). With a window a tile's key loop starts at its first row's first key: the blocks
before it may be freed and reused, and are never read.

DeepSeek's MLA, as in decode_attention.py: K's head dim D_V + D_PE, V's D_V (its own tensor, or a view
of K's first D_V dims). A group wider than a tile (absorbed MLA's 16 or 128 query heads on one KV
head) is split over programs by heads: a tile then holds BLOCK_M // TILE_GROUP tokens of TILE_GROUP
heads. The wide rows get their own tile sizes (`tile_config`).
"""

import torch
import triton
import triton.language as tl

from kernels.decode_attention import attend_paged_latent_keys, head_dims
from kernels.triton_utils import check_dot_dim, upcast_dot_operands

LOG2E = 1.4426950408889634
BLOCK_M = 128  # rows (query token x head in group) per program on a GPU
BLOCK_N = 64  # keys per inner step


def tile_config(head_dim: int, d_pe: int) -> tuple[int, int]:
    """Default (block_m, block_n) for V's head dim `head_dim` and K's `d_pe` more: BLOCK_M x BLOCK_N
    for the 64/128-dim heads; for MLA's wider rows tiles whose fp32 accumulator (block_m x head_dim)
    and K tile fit an sm_90 SM on 8 warps (ptxas: the decompressed 192/128 dims at 128 x 32 spill 40
    bytes a thread, about as 128-dim heads do at 128 x 64; the absorbed 576/512 at 32 x 32 take 250
    registers, no spills, where 64 rows spill hundreds of bytes)."""
    if d_pe == 0:
        return BLOCK_M, BLOCK_N
    return (128, 32) if head_dim <= 128 else (32, 32)


def prefill_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Plain fp32 causal attention, one sequence at a time (with a window, over the keys from its
    first query's first key on: the blocks before them are not read). The output has V's head dim."""
    num_q_heads, block_size = q.shape[1], k_cache.shape[1]
    group = num_q_heads // k_cache.shape[2]
    out = q.new_empty(q.shape[0], num_q_heads, v_cache.shape[-1])
    cu = cu_seqlens_q.tolist()
    for i, n in enumerate(seq_lens.tolist()):
        start, end = cu[i], cu[i + 1]
        first_pos = n - (end - start)  # of the first query
        lo = max(0, first_pos - sliding_window + 1) if sliding_window else 0
        first = lo // block_size
        blocks = block_tables[i, first : -(-n // block_size)].long()
        skip, stop = lo - first * block_size, n - first * block_size
        keys = k_cache[blocks].flatten(0, 1)[skip:stop].float().repeat_interleave(group, dim=1)  # [n - lo, q_heads, d]
        values = v_cache[blocks].flatten(0, 1)[skip:stop].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[start:end].float(), keys) * scale
        positions = torch.arange(first_pos, n, device=q.device)
        key_positions = torch.arange(lo, n, device=q.device)[None, :]
        visible = key_positions <= positions[:, None]
        if sliding_window:
            visible &= key_positions > positions[:, None] - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:  # one more logit per head, dropped after the softmax
            sink = sinks.float()[:, None, None].expand(-1, end - start, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out[start:end] = torch.einsum("htn,nhd->thd", probs, values).to(q.dtype)
    return out


@triton.jit
def _find_sequence(cu_seqlens_q_ptr, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """The sequence whose tiles include `tile`: sequence s owns the tiles from
    cu_seqlens_q[s] // BLOCK_Q + s on, enough for its query_len tokens (the + s gives each
    sequence one spare tile for its ragged start)."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    seq_lens_ptr,
    sinks_ptr,
    out_ptr,
    scale_log2,
    window,
    num_seqs,
    q_stride_token,
    q_stride_head,
    out_stride_token,
    out_stride_head,
    cache_stride_block,
    cache_stride_token,
    cache_stride_head,
    v_stride_block,
    v_stride_token,
    v_stride_head,
    block_tables_stride,
    GROUP: tl.constexpr,
    TILE_GROUP: tl.constexpr,
    HEAD_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    V_IS_K: tl.constexpr,
):
    tile = tl.program_id(0)
    # Axis 1: the KV head and its tile of TILE_GROUP query heads (all GROUP in one unless HEAD_TILES > 1).
    kv_head = tl.program_id(1) // HEAD_TILES
    head_tile = tl.program_id(1) % HEAD_TILES
    seq = _find_sequence(cu_seqlens_q_ptr, num_seqs, tile, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    first_token = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # of this tile, within the sequence
    if first_token >= query_len:
        return  # a spare tile
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len  # cached before this step's tokens

    rows = tl.arange(0, BLOCK_M)
    tokens = first_token + rows // TILE_GROUP
    in_group = head_tile * TILE_GROUP + rows % TILE_GROUP
    heads = kv_head * GROUP + in_group
    row_ok = (rows < BLOCK_Q * TILE_GROUP) & (tokens < query_len)
    if HEAD_TILES > 1:
        row_ok = row_ok & (in_group < GROUP)  # the last tile's heads past the group
    row_pos = context_len + tokens
    dims = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + tokens).to(tl.int64)
    q_row_ptrs = q_ptr + q_rows[:, None] * q_stride_token + heads[:, None] * q_stride_head
    q = tl.load(q_row_ptrs + dims[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    q_pe = q  # the queries' rope dims (MLA), past the first HEAD_DIM
    if D_PE > 0:
        q_pe = tl.load(q_row_ptrs + HEAD_DIM + tl.arange(0, D_PE)[None, :], mask=row_ok[:, None], other=0.0)
        if UPCAST_DOT:
            q_pe = q_pe.to(tl.float32)

    # Online softmax in base 2; the finite floor for m keeps fully masked tiles and padded rows at
    # exp2(-inf) = 0 instead of NaN.
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:
        # The sink is one more (unscaled) logit in the denominator: m = sink, l = exp2(sink - m) = 1.
        m = tl.load(sinks_ptr + heads, mask=in_group < GROUP, other=0.0).to(tl.float32) * 1.4426950408889634
        l = tl.full([BLOCK_M], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * block_tables_stride
    kv_head_offset = kv_head * cache_stride_head
    v_head_offset = kv_head * v_stride_head
    first_pos = context_len + first_token  # of the tile's first query token
    kv_end = tl.minimum(seq_len, first_pos + BLOCK_Q)
    if USE_WINDOW:
        # Three runs of keys: from the first row's first key (nothing before it is read) up to the
        # last row's first key, masked by the window (whole steps); then keys every row sees,
        # unmasked; then the rest up to the last row, masked causally.
        window_start = tl.maximum(first_pos - window + 1, 0)
        last_window_start = tl.maximum(kv_end - window, window_start)  # of the tile's last token
        head_end = tl.minimum(window_start + tl.cdiv(last_window_start - window_start, BLOCK_N) * BLOCK_N, kv_end)
        unmasked_end = head_end + tl.maximum(first_pos + 1 - head_end, 0) // BLOCK_N * BLOCK_N
        m, l, acc = attend_paged_latent_keys(
            q,
            q_pe,
            m,
            l,
            acc,
            k_cache_ptr,
            v_cache_ptr,
            block_table,
            kv_head_offset,
            v_head_offset,
            window_start,
            head_end,
            row_pos,
            scale_log2,
            cache_stride_block,
            cache_stride_token,
            v_stride_block,
            v_stride_token,
            window,
            HEAD_DIM,
            D_PE,
            BLOCK_SIZE,
            BLOCK_N,
            UPCAST_DOT,
            MASKED=True,
            USE_WINDOW=True,
            V_IS_K=V_IS_K,
        )
    else:
        # Keys before the tile's first query position are visible to every row: whole steps of
        # them need no mask. The rest, up to the tile's last query position, are masked causally.
        head_end = 0
        unmasked_end = first_pos // BLOCK_N * BLOCK_N
    m, l, acc = attend_paged_latent_keys(
        q,
        q_pe,
        m,
        l,
        acc,
        k_cache_ptr,
        v_cache_ptr,
        block_table,
        kv_head_offset,
        v_head_offset,
        head_end,
        unmasked_end,
        row_pos,
        scale_log2,
        cache_stride_block,
        cache_stride_token,
        v_stride_block,
        v_stride_token,
        window,
        HEAD_DIM,
        D_PE,
        BLOCK_SIZE,
        BLOCK_N,
        UPCAST_DOT,
        MASKED=False,
        USE_WINDOW=False,
        V_IS_K=V_IS_K,
    )
    m, l, acc = attend_paged_latent_keys(
        q,
        q_pe,
        m,
        l,
        acc,
        k_cache_ptr,
        v_cache_ptr,
        block_table,
        kv_head_offset,
        v_head_offset,
        unmasked_end,
        kv_end,
        row_pos,
        scale_log2,
        cache_stride_block,
        cache_stride_token,
        v_stride_block,
        v_stride_token,
        window,
        HEAD_DIM,
        D_PE,
        BLOCK_SIZE,
        BLOCK_N,
        UPCAST_DOT,
        MASKED=True,
        USE_WINDOW=False,  # every row's window holds these keys
        V_IS_K=V_IS_K,
    )

    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # padded rows have l = 0
    tl.store(
        out_ptr + q_rows[:, None] * out_stride_token + heads[:, None] * out_stride_head + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    block_m: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The Triton kernel behind `prefill_attention_reference`'s interface (`block_m`, `block_n`:
    tile sizes, smaller in tests so that a few tokens span several tiles, else `tile_config`'s;
    `out`: where to write, a view of a larger step's output, else a new tensor; `sinks` (any float
    dtype, read as fp32) and `sliding_window`: see the module's docstring, None for neither; MLA's
    head dims too)."""
    num_tokens, num_q_heads, _ = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    group = num_q_heads // num_kv_heads
    head_dim, d_pe, v_is_k = head_dims(q, k_cache, v_cache)
    default_m, default_n = tile_config(head_dim, d_pe)
    block_m, block_n = block_m or default_m, block_n or default_n
    check_dot_dim("block_m", block_m)
    check_dot_dim("block_n", block_n)
    assert block_tables.stride(-1) == 1
    if sinks is not None:
        assert sinks.shape == (num_q_heads,) and sinks.stride(0) == 1, f"sinks must be [{num_q_heads}], contiguous"
    if sliding_window is not None:
        assert sliding_window >= 1, f"sliding_window must be at least 1, got {sliding_window}"
    out = q.new_empty(num_tokens, num_q_heads, head_dim) if out is None else out
    assert out.shape == (num_tokens, num_q_heads, head_dim) and out.stride(-1) == 1
    if num_tokens == 0:
        return out
    # A group wider than a tile is split by heads: tiles of block_m heads of one token each.
    tile_group = min(group, block_m)
    head_tiles = triton.cdiv(group, tile_group)
    block_q = block_m // tile_group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads * head_tiles)
    num_warps = 8 if block_m >= 128 or (d_pe and block_m * head_dim > 64 * 128) else 4
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        seq_lens,
        q if sinks is None else sinks,  # not read without sinks
        out,
        scale * LOG2E,
        sliding_window or 0,
        num_seqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        TILE_GROUP=tile_group,
        HEAD_TILES=head_tiles,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        D_PE=d_pe,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        UPCAST_DOT=upcast_dot_operands(q.dtype),
        HAS_SINKS=sinks is not None,
        USE_WINDOW=sliding_window is not None,
        V_IS_K=v_is_k,
        num_warps=num_warps,
    )
    return out

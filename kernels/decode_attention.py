"""Paged decode attention: one query token per sequence over its cached keys and values.

`q [num_seqs, num_q_heads, head_dim]`; each layer's cache is `[num_blocks, block_size,
num_kv_heads, head_dim]`, and sequence i's token t lives in block `block_tables[i, t // block_size]`
at offset `t % block_size`; the query attends to all `context_lens[i]` cached tokens (its own
included). GQA: query heads h*group .. (h+1)*group-1 share KV head h.

gpt-oss's two extras, both optional: `sinks [num_q_heads]`, one learned logit per query head that
joins the (already scaled) logits in the softmax's denominator and is then dropped, so it only
adds exp(sink - max) there; and `sliding_window` W, so the query at position p sees only the keys
at positions p - W + 1 .. p. Blocks wholly before the window may already be freed and reused (their
block-table entries are stale): they are never read.

The kernel reads each KV head's tokens once for all query heads of its group: one program takes a
(sequence, KV head, split) and holds the group's queries as the rows of a tl.dot tile, padded to 16.
Long contexts are split across programs (split-K) so that small batches still fill the GPU; a
second kernel merges the splits' partial results by their log-sum-exp.
"""

import math

import torch
import triton
import triton.language as tl

from kernels.triton_utils import attend_paged_keys, check_dot_dim, num_sms, upcast_dot_operands

LOG2E = 1.4426950408889634
BLOCK_N = 64  # keys per inner step
MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost outweighs the parallelism it adds
MAX_SPLITS = 64


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Plain fp32 attention, one sequence at a time (over the window's keys alone: the blocks
    before it are not read)."""
    num_q_heads, block_size = q.shape[1], k_cache.shape[1]
    group = num_q_heads // k_cache.shape[2]
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        lo = max(0, n - sliding_window) if sliding_window else 0  # the first key in the window
        first = lo // block_size
        blocks = block_tables[i, first : -(-n // block_size)].long()
        skip = lo - first * block_size
        keys = k_cache[blocks].flatten(0, 1)[skip : n - first * block_size].float().repeat_interleave(group, dim=1)
        values = v_cache[blocks].flatten(0, 1)[skip : n - first * block_size].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i].float(), keys) * scale  # [q_heads, keys]
        if sinks is not None:  # one more logit per head, dropped after the softmax
            probs = torch.cat([scores, sinks.float()[:, None]], dim=1).softmax(-1)[:, :-1]
        else:
            probs = scores.softmax(-1)
        out[i] = torch.einsum("hn,nhd->hd", probs, values).to(q.dtype)
    return out


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    sinks_ptr,
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    scale_log2,
    window,
    q_stride_seq,
    q_stride_head,
    out_stride_seq,
    out_stride_head,
    cache_stride_block,
    cache_stride_token,
    cache_stride_head,
    block_tables_stride,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    # The keys to attend: all of the context, or with a sliding window its last `window` keys
    # (nothing before them is read: those blocks may be freed).
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(context_len - window, 0)
    # Each split takes a whole number of BLOCK_N steps of this sequence's own keys.
    split_len = tl.cdiv(tl.cdiv(context_len - first_key, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first_key + split * split_len
    end = tl.minimum(start + split_len, context_len)

    rows = tl.arange(0, BLOCK_H)  # query heads of this KV head, padded
    heads = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * q_stride_seq + heads[:, None] * q_stride_head + dims[None, :], mask=row_ok[:, None], other=0.0
    )
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # Online softmax in base 2. m starts at a finite floor, not -inf, so that a tile whose keys are
    # all masked gives exp2(-inf - floor) = 0 and never exp2(-inf - -inf) = NaN.
    m = tl.full([BLOCK_H], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    if HAS_SINKS:
        # The sink is one more logit (not scaled) in the denominator: seed the softmax with it,
        # m = sink, l = exp2(sink - m) = 1. Only split 0 carries it, so the merge counts it once
        # (and split 0 always holds keys, so its lse stays finite).
        sink = tl.load(sinks_ptr + heads, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        m = tl.where(split == 0, sink, m)
        l = tl.where(split == 0, 1.0, l)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * block_tables_stride
    # Every head row sits at the last cached position, so the causal mask keeps just the keys < end.
    last_pos = tl.zeros([BLOCK_H], tl.int32) + (context_len - 1)
    m, l, acc = attend_paged_keys(
        q,
        m,
        l,
        acc,
        k_cache_ptr,
        v_cache_ptr,
        block_table,
        kv_head * cache_stride_head,
        start,
        end,
        last_pos,
        scale_log2,
        cache_stride_block,
        cache_stride_token,
        window,
        HEAD_DIM,
        BLOCK_SIZE,
        BLOCK_N,
        UPCAST_DOT,
        MASKED=True,
        USE_WINDOW=False,  # the keys start at the window: one row, so nothing else to mask
    )

    # An empty split (context shorter than the splits) has l = 0: divide by 1 and give it lse -inf.
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + seq * out_stride_seq + heads[:, None] * out_stride_head + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        # partial_out [num_seqs, num_q_heads, NUM_SPLITS, HEAD_DIM], partial_lse [.., NUM_SPLITS] (fp32)
        partial = (seq * NUM_Q_HEADS + heads) * NUM_SPLITS + split
        tl.store(partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :], out, mask=row_ok[:, None])
        lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
        tl.store(partial_lse_ptr + partial, lse, mask=row_ok)


@triton.jit
def _decode_reduce_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    out_stride_seq,
    out_stride_head,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    # One program per (sequence, query head): weight each split by exp2(lse - max lse). A sink,
    # if any, is already in split 0's lse and output.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_DIM)
    partial = (seq * NUM_Q_HEADS + head) * NUM_SPLITS + splits
    lse = tl.load(partial_lse_ptr + partial)
    # The first split always holds tokens (context_len >= 1), so the max is finite.
    weights = tl.exp2(lse - tl.max(lse, axis=0))
    parts = tl.load(partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :])
    out = tl.sum(parts * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + seq * out_stride_seq + head * out_stride_head + dims, out.to(out_ptr.dtype.element_ty))


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """Enough splits for about two programs per SM, none shorter than MIN_TOKENS_PER_SPLIT tokens,
    rounded to a power of two (each value is a separate compilation)."""
    wanted = math.ceil(2 * num_sms(device) / (num_seqs * num_kv_heads))
    useful = math.ceil(max_context_len / MIN_TOKENS_PER_SPLIT)
    splits = max(1, min(wanted, useful, MAX_SPLITS))
    return triton.next_power_of_2(splits)


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_context_len: int,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The Triton kernels behind `decode_attention_reference`'s interface. `max_context_len` (a host
    int, so no device sync) sizes the split-K (over the window's keys alone where there is one);
    `num_splits` overrides it (a power of two). `out`: where to write (a view of a larger step's
    output), else a new tensor. `sinks` (any float dtype, read as fp32) and `sliding_window`: see
    the module's docstring; None for neither."""
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    check_dot_dim("head_dim", head_dim)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and q.stride(-1) == 1
    assert block_tables.stride(-1) == 1
    if sinks is not None:
        assert sinks.shape == (num_q_heads,) and sinks.stride(0) == 1, f"sinks must be [{num_q_heads}], contiguous"
    if sliding_window is not None:
        assert sliding_window >= 1, f"sliding_window must be at least 1, got {sliding_window}"
        max_context_len = min(max_context_len, sliding_window)
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, q.device)
    assert num_splits & (num_splits - 1) == 0, f"num_splits must be a power of two, got {num_splits}"
    out = torch.empty_like(q) if out is None else out
    assert out.shape == q.shape and out.stride(-1) == 1
    if num_seqs == 0:
        return out
    if num_splits > 1:
        partial_out = torch.empty(num_seqs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        partial_lse = torch.empty(num_seqs, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        partial_out = partial_lse = out  # not written
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        q if sinks is None else sinks,  # not read without sinks
        out,
        partial_out,
        partial_lse,
        scale * LOG2E,
        sliding_window or 0,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=BLOCK_N,
        NUM_SPLITS=num_splits,
        UPCAST_DOT=upcast_dot_operands(q.dtype),
        HAS_SINKS=sinks is not None,
        USE_WINDOW=sliding_window is not None,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_q_heads)](
            partial_out,
            partial_lse,
            out,
            out.stride(0),
            out.stride(1),
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            NUM_SPLITS=num_splits,
        )
    return out

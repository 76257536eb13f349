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

DeepSeek's MLA (multi-head latent attention): K's head dim may be D_K = D_V + D_PE, V's D_V (both
powers of two), the output's D_V; q has D_K dims. The score is then two dots, the first D_V dims
and the last D_PE ones (the rope part). V is read through its own strides, so it may be a view of
K's first D_V dims: absorbed MLA stores one 576-dim row per token (512 latent + 64 rope dims) in one
KV head shared by all query heads, and reads V = k_cache[..., :512] from the same K tile. Such a
group (16 or 128 query heads) is taken in tiles of `BLOCK_H` heads, one program each, so that a
program's accumulator stays in registers. With D_PE = 0 the kernels are what they were.
"""

import math

import torch
import triton
import triton.language as tl

from kernels.triton_utils import attend_paged_keys, check_dot_dim, num_sms, online_softmax_tile, upcast_dot_operands

LOG2E = 1.4426950408889634
BLOCK_N = 64  # keys per inner step
MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost outweighs the parallelism it adds
MAX_SPLITS = 64
# MLA's wide rows (D_V 512, D_K 576): 16 query heads a program (an fp32 accumulator of 16 x 512, 64
# registers a thread over 4 warps) and 16 keys a step. For sm_90 ptxas gives this 182-188 registers
# and no spills (two programs an SM); 32 keys a step spill, as do 32 heads on 4 warps (32 heads on 8
# warps do not: `block_h=32` gets 8 warps).
MLA_BLOCK_H = 16
MLA_BLOCK_N = 16
MLA_NUM_STAGES = 2
MAX_ACC_ELEMENTS = MLA_BLOCK_H * 512  # a program's accumulator rows x D_V at most (heads in tiles past it)
MAX_REDUCE_DIMS = 128  # output dims per program of the split-K merge


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
    before it are not read). The output has V's head dim (MLA: see the module's docstring)."""
    num_q_heads, block_size = q.shape[1], k_cache.shape[1]
    group = num_q_heads // k_cache.shape[2]
    out = q.new_empty(q.shape[0], num_q_heads, v_cache.shape[-1])
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
def attend_paged_latent_keys(
    q,
    q_pe,
    m,
    l,
    acc,
    k_cache_ptr,
    v_cache_ptr,
    block_table,
    k_head_offset,
    v_head_offset,
    start,
    end,
    row_pos,
    scale_log2,
    k_stride_block,
    k_stride_token,
    v_stride_block,
    v_stride_token,
    window,
    HEAD_DIM: tl.constexpr,
    D_PE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    MASKED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    V_IS_K: tl.constexpr,
):
    """`attend_paged_keys` (kernels/triton_utils.py; the same arguments and masks) for K rows of
    HEAD_DIM + D_PE dims: `q` holds the queries' first HEAD_DIM dims, `q_pe` their last D_PE, and
    the score is the sum of the two dots. V (HEAD_DIM dims) has strides of its own; V_IS_K: V is
    K's first HEAD_DIM dims (absorbed MLA), taken from the K tile instead of read again. With
    D_PE = 0 this is attend_paged_keys itself (`q_pe`, V's strides and V_IS_K unused)."""
    if D_PE == 0:
        m, l, acc = attend_paged_keys(
            q,
            m,
            l,
            acc,
            k_cache_ptr,
            v_cache_ptr,
            block_table,
            k_head_offset,
            start,
            end,
            row_pos,
            scale_log2,
            k_stride_block,
            k_stride_token,
            window,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK_N,
            UPCAST_DOT,
            MASKED,
            USE_WINDOW,
        )
    else:
        dims = tl.arange(0, HEAD_DIM)
        pe_dims = HEAD_DIM + tl.arange(0, D_PE)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            key_ok = pos < end
            block = tl.load(block_table + pos // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
            slot = pos % BLOCK_SIZE
            k_rows = block * k_stride_block + slot * k_stride_token + k_head_offset
            k = tl.load(k_cache_ptr + k_rows[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
            k_pe = tl.load(k_cache_ptr + k_rows[:, None] + pe_dims[None, :], mask=key_ok[:, None], other=0.0)
            if UPCAST_DOT:
                k = k.to(tl.float32)
                k_pe = k_pe.to(tl.float32)
            if V_IS_K:
                v = k
            else:
                v_rows = block * v_stride_block + slot * v_stride_token + v_head_offset
                v = tl.load(v_cache_ptr + v_rows[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
                if UPCAST_DOT:
                    v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
            s += tl.dot(q_pe, tl.trans(k_pe), input_precision="ieee")
            s = s * scale_log2  # [rows, BLOCK_N]
            m, l, acc = online_softmax_tile(s, v, pos, key_ok, row_pos, window, m, l, acc, MASKED, USE_WINDOW)
    return m, l, acc


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
    v_stride_block,
    v_stride_token,
    v_stride_head,
    block_tables_stride,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_TILES: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    V_IS_K: tl.constexpr,
):
    # Axis 0: the sequence and its tile of BLOCK_H query heads (HEAD_TILES of them a KV head, the
    # fastest-varying, so that the tiles sharing a K/V read run side by side).
    seq = tl.program_id(0) // HEAD_TILES
    head_tile = tl.program_id(0) % HEAD_TILES
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

    rows = head_tile * BLOCK_H + tl.arange(0, BLOCK_H)  # query heads of this KV head, padded
    heads = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + seq * q_stride_seq + heads[:, None] * q_stride_head
    q = tl.load(q_rows + dims[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    q_pe = q  # the queries' rope dims (MLA), past the first HEAD_DIM
    if D_PE > 0:
        q_pe = tl.load(q_rows + HEAD_DIM + tl.arange(0, D_PE)[None, :], mask=row_ok[:, None], other=0.0)
        if UPCAST_DOT:
            q_pe = q_pe.to(tl.float32)

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
    m, l, acc = attend_paged_latent_keys(
        q,
        q_pe,
        m,
        l,
        acc,
        k_cache_ptr,
        v_cache_ptr,
        block_table,
        kv_head * cache_stride_head,
        kv_head * v_stride_head,
        start,
        end,
        last_pos,
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
        USE_WINDOW=False,  # the keys start at the window: one row, so nothing else to mask
        V_IS_K=V_IS_K,
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
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    # One program per (sequence, query head, BLOCK_D output dims): weight each split by
    # exp2(lse - max lse). A sink, if any, is already in split 0's lse and output.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    partial = (seq * NUM_Q_HEADS + head) * NUM_SPLITS + splits
    lse = tl.load(partial_lse_ptr + partial)
    # The first split always holds tokens (context_len >= 1), so the max is finite.
    weights = tl.exp2(lse - tl.max(lse, axis=0))
    parts = tl.load(partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :])
    out = tl.sum(parts * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + seq * out_stride_seq + head * out_stride_head + dims, out.to(out_ptr.dtype.element_ty))


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """Enough splits for about two programs per SM, none shorter than MIN_TOKENS_PER_SPLIT tokens,
    rounded to a power of two (each value is a separate compilation). `num_kv_heads`: the programs
    a sequence has without splits (its KV heads, times the head tiles of each: MLA)."""
    wanted = math.ceil(2 * num_sms(device) / (num_seqs * num_kv_heads))
    useful = math.ceil(max_context_len / MIN_TOKENS_PER_SPLIT)
    splits = max(1, min(wanted, useful, MAX_SPLITS))
    return triton.next_power_of_2(splits)


def head_dims(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, bool]:
    """`(D_V, D_PE, V_IS_K)` of a paged attention call, checked: K's head dim is D_V + D_PE (q's
    too), V's D_V, each a power of two >= 16 for tl.dot (D_PE may be 0); V_IS_K: V is a view of K's
    first D_V dims (absorbed MLA), which the kernels read once. The caches' last dim is contiguous;
    with D_PE = 0 they have one layout (as the engine allocates them)."""
    d_k, d_v = k_cache.shape[-1], v_cache.shape[-1]
    assert q.shape[-1] == d_k, f"q's head dim {q.shape[-1]} is not K's {d_k}"
    assert k_cache.shape[:3] == v_cache.shape[:3], f"K cache {list(k_cache.shape)} and V cache {list(v_cache.shape)}"
    d_pe = d_k - d_v
    assert d_pe >= 0, f"V's head dim {d_v} is larger than K's {d_k}"
    check_dot_dim("head_dim" if d_pe == 0 else "V's head dim", d_v)
    if d_pe:
        check_dot_dim("K's head dim past V's (MLA's rope dims)", d_pe)
    else:
        assert k_cache.stride() == v_cache.stride(), "K and V caches of one head dim need one layout"
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and q.stride(-1) == 1
    v_is_k = d_pe > 0 and v_cache.data_ptr() == k_cache.data_ptr() and v_cache.stride() == k_cache.stride()
    return d_v, d_pe, v_is_k


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
    block_h: int | None = None,
) -> torch.Tensor:
    """The Triton kernels behind `decode_attention_reference`'s interface. `max_context_len` (a host
    int, so no device sync) sizes the split-K (over the window's keys alone where there is one);
    `num_splits` overrides it (a power of two). `out`: where to write (a view of a larger step's
    output), else a new tensor. `sinks` (any float dtype, read as fp32) and `sliding_window`: see
    the module's docstring; None for neither. MLA (K's head dim D_V + D_PE, V a tensor of its own
    or a view of K's first D_V dims): see the module's docstring. `block_h`: query heads a program
    (a power of two >= 16; tests set it to tile small groups), else by the head dims."""
    num_seqs, num_q_heads, _ = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    head_dim, d_pe, v_is_k = head_dims(q, k_cache, v_cache)
    assert block_tables.stride(-1) == 1
    if sinks is not None:
        assert sinks.shape == (num_q_heads,) and sinks.stride(0) == 1, f"sinks must be [{num_q_heads}], contiguous"
    if sliding_window is not None:
        assert sliding_window >= 1, f"sliding_window must be at least 1, got {sliding_window}"
        max_context_len = min(max_context_len, sliding_window)
    if block_h is None:
        # The whole group in one program (padded to 16 rows), unless its accumulator would pass
        # MAX_ACC_ELEMENTS: then tiles of the heads (MLA's 16 or 128 over D_V 512: 16 a tile).
        block_h = max(16, min(triton.next_power_of_2(group), MAX_ACC_ELEMENTS // head_dim))
        if d_pe:
            block_h = min(block_h, MLA_BLOCK_H)
    check_dot_dim("block_h", block_h)
    head_tiles = triton.cdiv(group, block_h)
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads * head_tiles, max_context_len, q.device)
    assert num_splits & (num_splits - 1) == 0, f"num_splits must be a power of two, got {num_splits}"
    out = q.new_empty(num_seqs, num_q_heads, head_dim) if out is None else out
    assert out.shape == (num_seqs, num_q_heads, head_dim) and out.stride(-1) == 1
    if num_seqs == 0:
        return out
    if num_splits > 1:
        partial_out = torch.empty(num_seqs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        partial_lse = torch.empty(num_seqs, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        partial_out = partial_lse = out  # not written
    # MLA's wide rows: fewer keys a step, 4 warps a 16-head tile.
    launch = dict(num_warps=min(8, 4 * block_h // 16), num_stages=MLA_NUM_STAGES) if d_pe else {}
    _decode_split_kernel[(num_seqs * head_tiles, num_kv_heads, num_splits)](
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
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        BLOCK_H=block_h,
        HEAD_TILES=head_tiles,
        HEAD_DIM=head_dim,
        D_PE=d_pe,
        BLOCK_SIZE=block_size,
        BLOCK_N=MLA_BLOCK_N if d_pe else BLOCK_N,
        NUM_SPLITS=num_splits,
        UPCAST_DOT=upcast_dot_operands(q.dtype),
        HAS_SINKS=sinks is not None,
        USE_WINDOW=sliding_window is not None,
        V_IS_K=v_is_k,
        **launch,
    )
    if num_splits > 1:
        block_d = min(head_dim, MAX_REDUCE_DIMS)
        _decode_reduce_kernel[(num_seqs, num_q_heads, head_dim // block_d)](
            partial_out,
            partial_lse,
            out,
            out.stride(0),
            out.stride(1),
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=num_splits,
        )
    return out

"""Small helpers shared by the Triton kernels and their launchers."""

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """Whether kernels run in Triton's interpreter (TRITON_INTERPRET=1, read when a kernel module
    is imported)."""
    return bool(triton.knobs.runtime.interpret)


def upcast_dot_operands(dtype: torch.dtype) -> bool:
    """Whether to feed tl.dot fp32 operands instead of `dtype` ones. On a GPU, bf16/fp16 operands
    use the fast tensor-core path (with fp32 accumulation); the interpreter gets bf16 dots wrong,
    so there they are upcast (exact: bf16 values are fp32 values)."""
    return dtype == torch.bfloat16 and interpreting()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors to fill (a small stand-in off CUDA, where it only shapes grids)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def check_dot_dim(name: str, value: int) -> None:
    """tl.dot needs power-of-two operand dims of at least 16 (GPUs require it; the interpreter
    does not check, so check here to keep CPU tests honest)."""
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16 for tl.dot, got {value}")


@triton.jit
def attend_paged_keys(
    q,
    m,
    l,
    acc,
    k_cache_ptr,
    v_cache_ptr,
    block_table,
    kv_head_offset,
    start,
    end,
    row_pos,
    scale_log2,
    cache_stride_block,
    cache_stride_token,
    window,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    MASKED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
):
    """Online-softmax update of (m, l, acc) with the paged keys start .. end-1 of one KV head,
    BLOCK_N at a time from `start` (shared by the decode and prefill kernels). MASKED: mask keys past
    `end` and past each row's position `row_pos` (and, with USE_WINDOW, those at or before
    `row_pos - window`: a sliding window of `window` keys); without it every row sees every key.
    No key before `start` is read (its block-table entry may name a freed block), so a sliding
    window's callers start at the first key the window needs."""
    dims = tl.arange(0, HEAD_DIM)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        key_ok = pos < end
        # Gather per token, so the tile size does not depend on the cache's block size.
        block = tl.load(block_table + pos // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        offsets = block * cache_stride_block + (pos % BLOCK_SIZE) * cache_stride_token + kv_head_offset
        k = tl.load(k_cache_ptr + offsets[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
        v = tl.load(v_cache_ptr + offsets[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2  # [rows, BLOCK_N]
        m, l, acc = online_softmax_tile(s, v, pos, key_ok, row_pos, window, m, l, acc, MASKED, USE_WINDOW)
    return m, l, acc


@triton.jit
def online_softmax_tile(s, v, pos, key_ok, row_pos, window, m, l, acc, MASKED: tl.constexpr, USE_WINDOW: tl.constexpr):
    """One tile of keys at positions `pos` into the running softmax (m, l, acc): their scores `s
    [rows, BLOCK_N]`, already scaled for exp2, masked as `attend_paged_keys` says, and their values
    `v`."""
    if MASKED:
        visible = key_ok[None, :] & (pos[None, :] <= row_pos[:, None])
        if USE_WINDOW:
            visible = visible & (pos[None, :] > row_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l, acc

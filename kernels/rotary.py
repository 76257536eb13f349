"""Rotary position embedding of queries and keys, rotate-half layout (as Hugging Face's Llama).

The cos/sin rows come from the model's table (sut/model/llama.py computes it once in fp32, including
Llama 3.1's rope scaling, and casts the rows of a step to the model dtype), so any scaling scheme
is a property of the table, not of this op."""

import torch
import triton
import triton.language as tl


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`q [num_tokens, num_q_heads, head_dim]`, `k [num_tokens, num_kv_heads, head_dim]` rotated by
    each token's `cos`, `sin` rows `[num_tokens, head_dim]`."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    x_stride_token,
    x_stride_head,
    cos1,
    cos2,
    sin1,
    sin2,
    NUM_HEADS: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    HALF: tl.constexpr,
):
    # [heads, half] tiles: out = x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1).
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, HALF)[None, :]
    mask = heads < NUM_HEADS
    src = x_ptr + token * x_stride_token + heads * x_stride_head + dims
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + token * NUM_HEADS * 2 * HALF + heads * 2 * HALF + dims
    tl.store(dst, (x1 * cos1 - x2 * sin1).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos2 + x1 * sin2).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    q_stride_token,
    q_stride_head,
    k_stride_token,
    k_stride_head,
    cos_stride,
    sin_stride,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_Q_HEADS: tl.constexpr,
    BLOCK_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
):
    # One program per token: its cos/sin row is loaded once for all query and key heads.
    token = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, HALF)[None, :]
    cos1 = tl.load(cos_ptr + token * cos_stride + dims).to(tl.float32)
    cos2 = tl.load(cos_ptr + token * cos_stride + HALF + dims).to(tl.float32)
    sin1 = tl.load(sin_ptr + token * sin_stride + dims).to(tl.float32)
    sin2 = tl.load(sin_ptr + token * sin_stride + HALF + dims).to(tl.float32)
    _rotate_heads(
        q_ptr, q_out_ptr, token, q_stride_token, q_stride_head, cos1, cos2, sin1, sin2, NUM_Q_HEADS, BLOCK_Q_HEADS, HALF
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        k_stride_token,
        k_stride_head,
        cos1,
        cos2,
        sin1,
        sin2,
        NUM_KV_HEADS,
        BLOCK_KV_HEADS,
        HALF,
    )


def rotary_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel behind `rotary_reference`'s interface (new, contiguous outputs)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = head_dim // 2
    assert half & (half - 1) == 0, f"head_dim must be a power of two, got {head_dim}"
    assert q.stride(-1) == k.stride(-1) == cos.stride(-1) == sin.stride(-1) == 1
    q_out = torch.empty(q.shape, dtype=torch.promote_types(q.dtype, cos.dtype), device=q.device)
    k_out = torch.empty(k.shape, dtype=torch.promote_types(k.dtype, cos.dtype), device=k.device)
    if num_tokens:
        _rotary_kernel[(num_tokens,)](
            q,
            k,
            cos,
            sin,
            q_out,
            k_out,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            sin.stride(0),
            NUM_Q_HEADS=num_q_heads,
            NUM_KV_HEADS=num_kv_heads,
            BLOCK_Q_HEADS=triton.next_power_of_2(num_q_heads),
            BLOCK_KV_HEADS=triton.next_power_of_2(num_kv_heads),
            HALF=half,
        )
    return q_out, k_out

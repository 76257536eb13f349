"""RMSNorm, alone and fused with the residual add that precedes it in every Llama layer.

Numerics follow transformers' LlamaRMSNorm, which keeps greedy output token-identical to it: the
residual stream is in the model dtype (the add rounds to it), the norm is computed in fp32, rounded
to the model dtype, and then multiplied by the weight."""

import torch
import triton
import triton.language as tl


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rms_norm(x + residual), x + residual)`: the normed input of the next block and the new residual."""
    residual = x + residual
    return rms_norm_reference(residual, weight, eps), residual


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    eps,
    x_stride,
    residual_stride,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    # One program per row (token); the whole row fits in one block.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0).to(tl.float32)
        # The residual stream lives in the model dtype: round the sum to it and norm the rounded value.
        s = (x + r).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * HIDDEN + cols, s, mask=mask)
        x = s.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / HIDDEN
    h = x * tl.rsqrt(mean_square + eps)
    # Round to the normed input's dtype before the weight multiply, as the reference does (the
    # launcher passes x itself as residual_out when there is no residual, so this is x's dtype).
    h = h.to(residual_out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * HIDDEN + cols, (h * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    assert x2.stride(-1) == 1
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    residual_out = None
    if residual is not None:
        residual2 = residual.reshape(-1, hidden)
        assert residual2.stride(-1) == 1
        residual_out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            residual2 if residual is not None else x2,
            weight,
            out,
            residual_out if residual is not None else x2,
            eps,
            x2.stride(0),
            residual2.stride(0) if residual is not None else 0,
            HIDDEN=hidden,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(8, max(1, block // 256)),
        )
    out = out.view(x.shape)
    return out if residual is None else (out, residual_out.view(x.shape))


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(x, residual, weight, eps)

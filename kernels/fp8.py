"""FP8 (e4m3fn) weights for the linear layers: quantizers, a dequantizer, a PyTorch reference of
the linear and a Triton GEMM that reads the FP8 weights and dequantizes them in its K loop
(weight-only FP8, W8A16: the activations keep the engine's dtype).

Two scale layouts, both multiplying (dequantized weight = fp8 value * scale):

- per output channel: `scale` fp32 `[out]`, one per row, `amax(row) / 448` (e4m3fn's largest
  value is 448). How the engine quantizes a bf16 checkpoint at load (sut/model/fp8.py).
- per block: `scale_inv` fp32 `[ceil(out / 128), ceil(in / 128)]`, one per 128 x 128 block of the
  weight (the last row and column of blocks may be partial). DeepSeek-R1's checkpoint stores its
  linears this way (`weight_scale_inv`; despite the name it multiplies).

A block (or row) of zeros gets scale 1: its values are 0 whatever the scale. The weights are
`[out, in]` (nn.Linear's layout); the quantizers and the dequantizer also take leading dims
(`[experts, out, in]`).

The Triton kernel computes `out[m, n] = sum_k x[m, k] * w[n, k] * scale` in fp32: each FP8 tile
is converted to x's dtype (exact: e4m3 values fit bf16 and fp16) for the tensor-core dot, and the
scales multiply the fp32 products: per channel once after the K loop, per block once per K step
(a K step never straddles two scale blocks: BLOCK_K divides 128). Small batches (decode) split K
over several programs when the output tiles alone would leave SMs idle; the partial sums go to an
fp32 workspace that one torch sum reduces (no atomics, no host sync: CUDA-graph safe).
"""

import functools

import torch
import triton
import triton.language as tl

from kernels.triton_utils import check_dot_dim, interpreting, num_sms, upcast_dot_operands

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
FP8_BLOCK = 128  # DeepSeek-R1's block of weights per scale, in both dims
_sms = functools.cache(num_sms)  # per device: the tile chooser runs at every call


def _check_weight(w: torch.Tensor, what: str = "weight") -> None:
    if not w.is_floating_point() or w.dtype == FP8_DTYPE:
        raise TypeError(f"quantizing to FP8 needs a float {what} of a wider dtype, got {w.dtype}")
    if w.dim() < 2:
        raise ValueError(f"the {what} must be [..., out, in], got {list(w.shape)}")


def _to_fp8(scaled: torch.Tensor) -> torch.Tensor:
    # torch's cast turns values past 448 into NaN: clamp first (rounding can push amax's own just past).
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    if not bool(amax.isfinite().all()):  # one host sync per weight, at load
        raise ValueError("the weight holds NaN or inf values: it cannot be quantized to FP8")
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def quantize_fp8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w [..., out, in]` to `(w_fp8 [..., out, in] float8_e4m3fn, scale [..., out] fp32)`, each
    row scaled so that its largest magnitude becomes 448 (rounded to nearest in fp8)."""
    _check_weight(w)
    w32 = w.float()
    scale = _scale_of(w32.abs().amax(dim=-1))
    return _to_fp8(w32 / scale[..., None]), scale


def _block_grid(rows: int, cols: int, block: int) -> tuple[int, int]:
    return triton.cdiv(rows, block), triton.cdiv(cols, block)


def quantize_fp8_block(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """`w [..., out, in]` to `(w_fp8 [..., out, in], scale_inv [..., ceil(out/block), ceil(in/block)]
    fp32)`: one scale per `block x block` tile, `amax(tile) / 448` (the last tiles may be partial)."""
    _check_weight(w)
    if block < 1:
        raise ValueError(f"block must be a positive integer, got {block}")
    *lead, rows, cols = w.shape
    row_blocks, col_blocks = _block_grid(rows, cols, block)
    padded = torch.nn.functional.pad(w.float(), (0, col_blocks * block - cols, 0, row_blocks * block - rows))
    tiles = padded.reshape(*lead, row_blocks, block, col_blocks, block)
    scale = _scale_of(tiles.abs().amax(dim=(-3, -1)))  # [..., row_blocks, col_blocks]
    scaled = (tiles / scale[..., :, None, :, None]).reshape(*lead, row_blocks * block, col_blocks * block)
    return _to_fp8(scaled[..., :rows, :cols]), scale


def _check_scale(w_fp8: torch.Tensor, scale: torch.Tensor, block: int | None) -> None:
    if w_fp8.dtype != FP8_DTYPE:
        raise TypeError(f"FP8 weights must be float8_e4m3fn, got {w_fp8.dtype}")
    if w_fp8.dim() < 2:
        raise ValueError(f"FP8 weights must be [..., out, in], got {list(w_fp8.shape)}")
    if scale.dtype != torch.float32:
        raise TypeError(f"FP8 scales must be float32, got {scale.dtype}")
    *lead, rows, cols = w_fp8.shape
    want = [*lead, rows] if block is None else [*lead, *_block_grid(rows, cols, block)]
    if list(scale.shape) != want:
        what = "per channel" if block is None else f"per {block}x{block} block"
        raise ValueError(f"FP8 scales {what} must be {want} for weights {list(w_fp8.shape)}, got {list(scale.shape)}")


def dequantize_fp8(
    w_fp8: torch.Tensor, scale: torch.Tensor, block: int | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """`w_fp8 * scale` in fp32, then cast to `dtype`: `scale [..., out]` per channel (`block` None)
    or `[..., ceil(out/block), ceil(in/block)]` per block."""
    _check_scale(w_fp8, scale, block)
    w = w_fp8.float()
    if block is None:
        return (w * scale[..., None]).to(dtype)
    rows, cols = w.shape[-2:]
    expanded = scale.repeat_interleave(block, dim=-2)[..., :rows, :].repeat_interleave(block, dim=-1)[..., :cols]
    return (w * expanded).to(dtype)


def fp8_linear_reference(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """`x [..., in] @ dequantize(w).T + bias`, computed in fp32 and returned in x's dtype."""
    _check_linear(x, w_fp8, scale, bias, block)
    w = dequantize_fp8(w_fp8, scale, block)
    out = x.float() @ w.T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


# Triton


@triton.jit
def _fp8_linear_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sk,
    stride_os,
    stride_om,
    stride_on,
    SCALE_BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """out[split, m, n] for one (BLOCK_M, BLOCK_N) tile over the K range of split `program_id(1)`:
    sum over k of x[m, k] * w[n, k] times the scales. SCALE_BLOCK 0: `scale [N]` per channel, applied
    after the loop; else `scale [cdiv(N, SCALE_BLOCK), cdiv(K, SCALE_BLOCK)]`, applied per K step
    (SCALE_BLOCK a multiple of BLOCK_K, k_per_split a multiple of BLOCK_K). The bias goes to split 0."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    # Grouped order: GROUP_M M-blocks share each N-block's weights while they are in L2.
    num_m_blocks = tl.cdiv(M, BLOCK_M)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n_blocks
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_cols = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        a = tl.load(x_rows + offs_k[None, :] * stride_xk, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_cols + offs_k[:, None] * stride_wk, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if UPCAST_DOT:
            a = a.to(tl.float32)
        w = w.to(a.dtype)  # exact: every e4m3 value is a bf16, fp16 and fp32 value
        if SCALE_BLOCK:
            s = tl.load(
                scale_ptr + (offs_n // SCALE_BLOCK) * stride_sn + (k0 // SCALE_BLOCK) * stride_sk,
                mask=n_mask,
                other=0.0,
            )
            acc += tl.dot(a, w, input_precision="ieee") * s[None, :]
        else:
            acc = tl.dot(a, w, acc, input_precision="ieee")
    if not SCALE_BLOCK:
        acc = acc * tl.load(scale_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        bias_cols = tl.where(pid_k == 0, N, 0)  # the first split adds the bias, the others read none
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < bias_cols, other=0.0).to(tl.float32)[None, :]
    out_ptrs = (
        out_ptr
        + pid_k.to(tl.int64) * stride_os
        + offs_m[:, None].to(tl.int64) * stride_om
        + offs_n[None, :] * stride_on
    )
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def fp8_linear_config(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device | str = "cuda") -> dict:
    """Tiles for `fp8_linear_triton` on sm_90 (untuned: kernels/checks/fp8.py's benchmark is where
    to tune them). Decode (M <= 16): 16-row tiles, long K steps (a 64 x 128 FP8 tile is 8 KiB), and
    split K until about two programs per SM stream the weights; mid M: 32/64-row tiles; prefill
    (M > 64): 128 x 128 tiles, 64-deep K steps, split K only when the tiles fill under half the SMs.
    fp32 activations (tests, the GPU check) get small tiles. Every BLOCK_K divides 128."""
    if dtype == torch.float32:
        config = dict(block_m=16 if m <= 16 else 32, block_n=32, block_k=32, num_warps=4, num_stages=2)
    elif m <= 16:
        config = dict(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)
    elif m <= 64:
        config = dict(block_m=32 if m <= 32 else 64, block_n=64, block_k=128, num_warps=4, num_stages=4)
    else:
        config = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
    sms = _sms(torch.device(device))
    tiles = triton.cdiv(m, config["block_m"]) * triton.cdiv(n, config["block_n"])
    k_steps = triton.cdiv(k, config["block_k"])
    split = 1
    if m <= 64 and tiles < 2 * sms:
        split = triton.cdiv(2 * sms, tiles)
    elif 2 * tiles <= sms:
        split = sms // tiles
    split = max(1, min(split, k_steps // 4))  # at least 4 K steps per split
    return config | dict(group_m=8, split_k=split)


def _check_linear(x: torch.Tensor, w_fp8: torch.Tensor, scale: torch.Tensor, bias, block) -> None:
    _check_scale(w_fp8, scale, block)
    if w_fp8.dim() != 2:
        raise ValueError(f"FP8 linear weights must be [out, in], got {list(w_fp8.shape)}")
    if x.shape[-1] != w_fp8.shape[1]:
        raise ValueError(f"x [..., {x.shape[-1]}] does not fit FP8 weights {list(w_fp8.shape)} ([out, in])")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if bias is not None and tuple(bias.shape) != (w_fp8.shape[0],):
        raise ValueError(f"bias must be [{w_fp8.shape[0]}], got {list(bias.shape)}")


def fp8_linear_triton(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    block: int | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """`fp8_linear_reference`'s interface on the Triton GEMM: x `[..., K]` (bf16, fp16 or fp32, any
    strides), `w_fp8 [N, K]`, scales per channel or per `block` (a multiple of BLOCK_K), bias of any
    float dtype; out `[..., N]` in x's dtype. `config`: tile overrides (block_m, block_n, block_k,
    group_m, split_k, num_warps, num_stages) over `fp8_linear_config`'s."""
    _check_linear(x, w_fp8, scale, bias, block)
    n, k = w_fp8.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return torch.zeros(*lead, n, dtype=x.dtype, device=x.device)
    config = fp8_linear_config(m, n, k, x.dtype, x.device) | (config or {})
    for name in ("block_m", "block_n", "block_k"):
        check_dot_dim(name, config[name])
    if block is not None and block % config["block_k"]:
        raise ValueError(f"block_k must divide the scale block {block}, got {config['block_k']}")
    k_per_split = triton.cdiv(triton.cdiv(k, config["block_k"]), config["split_k"]) * config["block_k"]
    splits = triton.cdiv(k, k_per_split)
    if splits == 1:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        out_view = out[None]
    else:
        out_view = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, config["block_m"]) * triton.cdiv(n, config["block_n"]), splits)
    _fp8_linear_kernel[grid](
        x2,
        w_fp8,
        scale,
        bias if bias is not None else scale,  # not read without HAS_BIAS
        out_view,
        m,
        n,
        k,
        k_per_split,
        x2.stride(0),
        x2.stride(1),
        w_fp8.stride(0),
        w_fp8.stride(1),
        scale.stride(0),
        scale.stride(1) if block is not None else 0,
        out_view.stride(0),
        out_view.stride(1),
        out_view.stride(2),
        SCALE_BLOCK=block or 0,
        HAS_BIAS=bias is not None,
        UPCAST_DOT=upcast_dot_operands(x.dtype),
        BLOCK_M=config["block_m"],
        BLOCK_N=config["block_n"],
        BLOCK_K=config["block_k"],
        GROUP_M=config["group_m"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    out = out_view[0] if splits == 1 else out_view.sum(dim=0).to(x.dtype)
    return out.view(*lead, n)


def fp8_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """The FP8 linear the model calls: the Triton GEMM on CUDA (and in Triton's interpreter, for
    tests), else the PyTorch reference."""
    if x.is_cuda or interpreting():
        return fp8_linear_triton(x, w_fp8, scale, bias, block)
    return fp8_linear_reference(x, w_fp8, scale, bias, block)

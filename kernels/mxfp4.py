"""MXFP4 (OCP microscaling FP4), the format of gpt-oss's expert weights: a PyTorch dequantizer and
quantizer, and the Triton helpers that decode it inside a kernel (kernels/fused_moe.py).

A weight `[..., N, K]` (`N` outputs, `K` inputs, K a multiple of 32) is stored as two tensors:

- `blocks` uint8 `[..., N, K/32, 16]`: 32 e2m1 values per block, two per byte, the low nibble first
  (value 2j in bits 0-3 of byte j, value 2j+1 in bits 4-7). An e2m1 nibble is sign (bit 3), a 2-bit
  exponent and a 1-bit mantissa: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
- `scales` uint8 `[..., N, K/32]`: one E8M0 exponent per block, the block's factor 2^(s - 127).

So a value is `e2m1(nibble) * 2^(scale - 127)`, exact in fp32 and in bf16 (two mantissa bits) for
every scale a checkpoint uses (E8M0 0 and 255, 2^-127 and NaN, are not expected: in the kernel's
decoder 0 reads as 0.0 and 255 as inf). transformers (`integrations/mxfp4.py`,
`convert_moe_packed_tensors`) decodes the same way and then transposes to `[E, K, N]`;
`dequantize_mxfp4` returns `[..., N, K]`, before that transpose.
"""

import torch
import triton
import triton.language as tl

MXFP4_BLOCK = 32  # values per scale
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _check_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> None:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(f"MXFP4 blocks must be [..., N, K/32, 16] (16 bytes per block), got {list(blocks.shape)}")
    if blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 scales must be blocks' shape without its last dim: blocks {list(blocks.shape)}, "
            f"scales {list(scales.shape)}"
        )


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """`blocks [..., N, K/32, 16]`, `scales [..., N, K/32]` (uint8) to a dense `[..., N, K]` tensor
    of `dtype`: the values transformers' dequantization gives, before its transpose."""
    _check_mxfp4(blocks, scales)
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    nibbles = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).long()  # [..., K/32, 16, 2]: low first
    values = lut[nibbles].flatten(-3)  # [..., N, K]
    # 2^(s - 127) in fp32 (as torch.ldexp computes it), applied per block of 32
    factors = torch.pow(2.0, scales.to(torch.int32) - 127).to(torch.float32)
    return (values * factors.repeat_interleave(MXFP4_BLOCK, dim=-1)).to(dtype)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense `[..., N, K]` float tensor (K a multiple of 32) to MXFP4 `(blocks, scales)`: each
    block's scale is the smallest power of two that brings its absmax to at most 6 (the largest
    e2m1 value), and each value is rounded to the nearest e2m1 value. For building small MXFP4
    checkpoints in tests; not a calibrated quantizer."""
    if not weight.is_floating_point():
        raise TypeError(f"quantize_mxfp4 needs a float tensor, got {weight.dtype}")
    if weight.dim() < 2 or weight.shape[-1] % MXFP4_BLOCK:
        raise ValueError(f"quantize_mxfp4 needs [..., N, K] with K a multiple of 32, got {list(weight.shape)}")
    w = weight.float().unflatten(-1, (-1, MXFP4_BLOCK))  # [..., N, K/32, 32]
    absmax = w.abs().amax(dim=-1)
    exponent = torch.where(absmax > 0, torch.ceil(torch.log2(absmax / 6.0)), torch.zeros_like(absmax))
    exponent = exponent.clamp(-127, 127)
    scaled = w / torch.pow(2.0, exponent)[..., None]
    magnitudes = torch.tensor(E2M1_VALUES[:8], device=weight.device)
    midpoints = (magnitudes[1:] + magnitudes[:-1]) / 2
    codes = torch.bucketize(scaled.abs().clamp(max=6.0), midpoints)  # 0..7, nearest (ties down)
    codes = codes + 8 * ((scaled < 0) & (codes > 0))  # sign bit; zeros stay +0
    codes = codes.to(torch.uint8).unflatten(-1, (MXFP4_BLOCK // 2, 2))
    blocks = codes[..., 0] | (codes[..., 1] << 4)
    scales = (exponent + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


@triton.jit
def e2m1_to_fp32(nibble):
    """e2m1 nibbles (int32, 0..15) to their fp32 values, by building the fp32 bit pattern: a
    normal nibble (exponent e > 0) is 2^(e-1) * (1 + m/2), fp32 exponent e + 126 and the top
    mantissa bit m; e == 0 is 0 or 0.5 (fp32 exponent 126)."""
    e = (nibble >> 1) & 3
    m = nibble & 1
    bits = tl.where(e > 0, ((e + 126) << 23) | (m << 22), m * (126 << 23))
    value = bits.to(tl.float32, bitcast=True)
    return tl.where((nibble & 8) != 0, -value, value)


@triton.jit
def mxfp4_weight_tiles(
    blocks_ptr, scales_ptr, rows, row_mask, k0, K, stride_row, stride_scale_row, BLOCK_K: tl.constexpr
):
    """Weights k0 .. k0+BLOCK_K-1 of the given rows (outputs) of one expert's MXFP4 matrix, as two
    fp32 tiles `[BLOCK_K/2, len(rows)]`: the even k (low nibbles) and the odd k (high nibbles).
    `blocks_ptr` and `scales_ptr` point at the expert's `[N, K/2]` bytes and `[N, K/32]` scales;
    k0 and BLOCK_K are multiples of 32."""
    byte = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # [BLOCK_K/2]
    mask = (byte < K // 2)[:, None] & row_mask[None, :]
    packed = tl.load(blocks_ptr + rows[None, :] * stride_row + byte[:, None], mask=mask, other=0).to(tl.int32)
    scale = tl.load(scales_ptr + rows[None, :] * stride_scale_row + (byte // 16)[:, None], mask=mask, other=0)
    factor = (scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2^(s - 127)
    return e2m1_to_fp32(packed & 15) * factor, e2m1_to_fp32(packed >> 4) * factor

"""The CPU engine's ops: kernels.KernelOps computed by the C kernels (ops.c, attention.c)
for fp32 tensors, each falling back to the PyTorch reference otherwise.

- RMSNorm (with its residual add), rope, the KV-cache write and SiLU-and-mul: one C call each
  where the references take 4 to 12 PyTorch calls, whose dispatch costs more than the arithmetic
  at decode batch sizes.
- Decode attention straight from the paged KV cache: SDPA needs each decode's keys and values
  gathered into one tensor first (`index_select` copies of every block, per layer and step); the C
  kernel reads the blocks in place through the block table, one task per (sequence, KV head), its
  query heads together. Prefill chunks keep SDPA.
"""

from functools import partial

import torch

from kernels import KernelOps, paged_attention
from kernels.activation import silu_and_mul_reference
from kernels.kv_cache import store_kvcache_reference
from kernels.rms_norm import add_rms_norm_reference, rms_norm_reference
from kernels.rotary import rotary_reference

F32 = torch.float32


def _rows_contiguous(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == F32 and t.is_contiguous() for t in tensors)


def rms_norm_c(x, weight, eps, lib):
    if not _rows_contiguous(x, weight):
        return rms_norm_reference(x, weight, eps)
    out = torch.empty_like(x)
    lib.rms_norm_f32(
        x.data_ptr(), None, weight.data_ptr(), out.data_ptr(), None, x.numel() // x.shape[-1], x.shape[-1], eps
    )
    return out


def add_rms_norm_c(x, residual, weight, eps, lib):
    if not _rows_contiguous(x, residual, weight) or x.shape != residual.shape:
        return add_rms_norm_reference(x, residual, weight, eps)
    out, total = torch.empty_like(x), torch.empty_like(x)
    lib.rms_norm_f32(
        x.data_ptr(),
        residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        total.data_ptr(),
        x.numel() // x.shape[-1],
        x.shape[-1],
        eps,
    )
    return out, total


def _heads_contiguous(x: torch.Tensor) -> bool:
    """[tokens, heads, dim] with heads and dims packed (the token stride may be larger)."""
    return x.dtype == F32 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def rotary_c(q, k, cos, sin, lib):
    """q rotated into a new contiguous tensor (the decode attention kernel reads it so), k in place."""
    if not (_heads_contiguous(q) and _heads_contiguous(k) and _rows_contiguous(cos, sin)) or q.shape[2] > 512:
        return rotary_reference(q, k, cos, sin)
    q_out = torch.empty(q.shape, dtype=F32)
    lib.rotary_f32(
        q.data_ptr(),
        q.stride(0),
        q_out.data_ptr(),
        k.data_ptr(),
        k.stride(0),
        cos.data_ptr(),
        sin.data_ptr(),
        q.shape[0],
        q.shape[1],
        k.shape[1],
        q.shape[2],
    )
    return q_out, k


def store_kvcache_c(k, v, k_cache, v_cache, slot_mapping, lib):
    if not (
        v is not None  # latent attention's one entry a token: the reference stores it
        and _heads_contiguous(k)
        and _heads_contiguous(v)
        and _rows_contiguous(k_cache, v_cache)
        and slot_mapping.dtype == torch.int64
        and slot_mapping.is_contiguous()
    ):
        return store_kvcache_reference(k, v, k_cache, v_cache, slot_mapping)
    lib.store_kv_f32(
        k.data_ptr(),
        k.stride(0),
        v.data_ptr(),
        v.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        slot_mapping.data_ptr(),
        k.shape[0],
        k.shape[1] * k.shape[2],
    )


def silu_and_mul_c(gate_up, lib):
    if not _rows_contiguous(gate_up):
        return silu_and_mul_reference(gate_up)
    inter = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], inter)
    lib.silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // gate_up.shape[-1], inter)
    return out


def decode_attention_c(
    q: torch.Tensor, out: torch.Tensor, group, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float, lib
) -> None:
    """Attention of the single-token queries `q[group.q_rows]` over their sequences' cached K/V,
    written to the same rows of `out` (fp32, contiguous)."""
    _, block_size, kv_heads, dim = k_cache.shape
    rc = lib.paged_decode_attention(
        q.data_ptr(),
        out.data_ptr(),
        group.q_rows.data_ptr(),
        group.seq_lens.data_ptr(),
        group.tables.data_ptr(),
        len(group.q_rows),
        group.tables.shape[1],
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_size,
        q.shape[1],
        kv_heads,
        dim,
        scale,
    )
    if rc != 0:
        raise RuntimeError(f"sut.cpu.ops: paged_decode_attention failed with code {rc}")


def paged_attention_c(q, k, v, k_cache, v_cache, meta, scale, lib, sinks=None, sliding_window=None):
    if sinks is not None or sliding_window is not None:  # gpt-oss's: the C decode kernel has neither
        return paged_attention(q, k, v, k_cache, v_cache, meta, scale, sinks=sinks, sliding_window=sliding_window)
    if v_cache.shape[-1] != k_cache.shape[-1]:  # latent attention's values, a part of its keys: neither
        return paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    if (
        q.dtype != F32
        or not q.is_contiguous()
        or not lib.decode_attention_available(q.shape[1], k_cache.shape[2], k_cache.shape[3])
    ):
        return paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    return paged_attention(q, k, v, k_cache, v_cache, meta, scale, decode_kernel=partial(decode_attention_c, lib=lib))


def c_ops(lib) -> KernelOps:
    """The op set on the C kernels `lib` (sut.cpu.build.library())."""
    return KernelOps(
        f"torch+c-{lib.level}",
        partial(rms_norm_c, lib=lib),
        partial(add_rms_norm_c, lib=lib),
        partial(rotary_c, lib=lib),
        partial(store_kvcache_c, lib=lib),
        partial(paged_attention_c, lib=lib),
        partial(silu_and_mul_c, lib=lib),
    )

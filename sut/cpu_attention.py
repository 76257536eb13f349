"""The CPU engine's ops: the PyTorch ops (kernels.TORCH_OPS), with decode attention computed by
cpu_attention.c straight from the paged KV cache.

SDPA needs each decode's keys and values gathered into one tensor first (`index_select` copies of
every block, per layer and step); the C kernel reads the blocks in place through the block table,
one task per (sequence, KV head), its query heads together. Prefill chunks keep SDPA."""

import dataclasses

import torch

from kernels import TORCH_OPS, KernelOps, paged_attention
from sut.cpu_quant import library


def decode_attention_c(q: torch.Tensor, out: torch.Tensor, group, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       scale: float) -> None:
    """Attention of the single-token queries `q[group.q_rows]` over their sequences' cached K/V,
    written to the same rows of `out` (fp32, contiguous)."""
    _, block_size, kv_heads, dim = k_cache.shape
    rc = library().paged_decode_attention(
        q.data_ptr(), out.data_ptr(), group.q_rows.data_ptr(), group.seq_lens.data_ptr(), group.tables.data_ptr(),
        len(group.q_rows), group.tables.shape[1], k_cache.data_ptr(), v_cache.data_ptr(), block_size, q.shape[1],
        kv_heads, dim, scale)
    if rc != 0:
        raise RuntimeError(f"cpu_attention: paged_decode_attention failed with code {rc}")


def cpu_ops() -> KernelOps:
    """TORCH_OPS with the C decode attention for fp32 caches, or TORCH_OPS alone when the kernels
    cannot be built here."""
    if library() is None:
        return TORCH_OPS
    return dataclasses.replace(TORCH_OPS, name="torch+c", paged_attention=paged_attention_cpu)


def paged_attention_cpu(q, k, v, k_cache, v_cache, meta, scale):
    if q.dtype != torch.float32 or not q.is_contiguous() or not library().decode_attention_available(
            q.shape[1], k_cache.shape[2], k_cache.shape[3]):
        return paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    return paged_attention(q, k, v, k_cache, v_cache, meta, scale, decode_kernel=decode_attention_c)

"""KV-cache write by slot mapping: token t's key and value go to cache slot `slot_mapping[t]`
(slot = block * block_size + offset in the block); slot -1 means "do not store" (e.g. a token whose
K/V are already cached). Each layer's cache is `[num_blocks, block_size, num_kv_heads, head_dim]`.

DeepSeek's MLA: K and V may have head dims of their own (decompressed: 192 and 128), and where V is
a view of the K cache's first dims (absorbed: one 576-dim entry a token, V its first 512) only K is
stored: `v` None."""

import torch
import triton
import triton.language as tl


def store_kvcache_reference(
    k: torch.Tensor,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new keys and values `[num_tokens, num_kv_heads, head_dim]` into their cache slots;
    `v` None: the keys alone (`v_cache`, a view of `k_cache`, is not written)."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, slot_mapping = k[keep], slot_mapping[keep]
        v = None if v is None else v[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    if v is not None:
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


@triton.jit
def _store_kvcache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_stride_token,
    k_stride_head,
    v_stride_token,
    v_stride_head,
    cache_stride_slot,
    cache_stride_head,
    v_cache_stride_slot,
    v_cache_stride_head,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    V_HEAD_DIM: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_V: tl.constexpr,
):
    # One program per token: all its heads at once.
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < NUM_HEADS) & (dims < HEAD_DIM)
    dst = slot * cache_stride_slot + heads * cache_stride_head + dims
    k = tl.load(k_ptr + token * k_stride_token + heads * k_stride_head + dims, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    if HAS_V:
        dims = tl.arange(0, BLOCK_DV)[None, :]
        mask = (heads < NUM_HEADS) & (dims < V_HEAD_DIM)
        dst = slot * v_cache_stride_slot + heads * v_cache_stride_head + dims
        v = tl.load(v_ptr + token * v_stride_token + heads * v_stride_head + dims, mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kvcache_triton(
    k: torch.Tensor,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor,
) -> None:
    """The Triton kernel behind `store_kvcache_reference`'s interface."""
    num_tokens, num_heads, head_dim = k.shape
    # Slots are addressed as one run over the layer's blocks, so each layer's cache is contiguous.
    assert k_cache.is_contiguous() and k.stride(-1) == 1
    if v is not None:
        assert v_cache.is_contiguous() and v.stride(-1) == 1 and v.shape[:2] == k.shape[:2]
    if num_tokens == 0:
        return
    v_dim = head_dim if v is None else v.shape[-1]
    _store_kvcache_kernel[(num_tokens,)](
        k,
        k if v is None else v,  # not read without v
        k_cache,
        k_cache if v is None else v_cache,  # not written without v
        slot_mapping,
        k.stride(0),
        k.stride(1),
        k.stride(0) if v is None else v.stride(0),
        k.stride(1) if v is None else v.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.stride(1) if v is None else v_cache.stride(1),
        k_cache.stride(2) if v is None else v_cache.stride(2),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_HEADS=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        V_HEAD_DIM=v_dim,
        BLOCK_DV=triton.next_power_of_2(v_dim),
        HAS_V=v is not None,
    )

"""Attention, KV-cache write, norm and rope ops, each as a PyTorch reference (used on CPU) and,
on CUDA, as our Triton kernels. The model calls only the functions exported here, so the backend
switch lives in one place. Requests and LoadGen are unknown here: ops take tensors."""

from kernels.attention import AttentionMetadata, paged_attention, store_kvcache

__all__ = ["AttentionMetadata", "paged_attention", "store_kvcache"]

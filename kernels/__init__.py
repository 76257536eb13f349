"""The model's ops (RMSNorm, rotary embedding, KV-cache write, paged attention, SwiGLU's
activation), each as a PyTorch reference and (all but the activation) as our Triton kernel, one
concept per module: rms_norm, rotary, kv_cache, decode_attention, prefill_attention, activation;
attention holds the step's metadata and the paged-attention op
the model calls (the CPU one, and the dispatch to the decode or prefill kernel). checks.py runs
each kernel against its reference (for the tests and gpu_check.py, `make gpu-check`).

The model calls only the `KernelOps` set picked here, so the backend switch lives in one place: the
engine takes TRITON_OPS on CUDA and TORCH_OPS on CPU (its `kernels` setting can force either; on
CPU the Triton kernels run only in Triton's interpreter, TRITON_INTERPRET=1, which is for tests).
Requests and LoadGen are unknown here: ops take tensors."""

from dataclasses import dataclass
from typing import Callable

from kernels.activation import silu_and_mul_reference
from kernels.attention import AttentionMetadata, paged_attention, paged_attention_triton
from kernels.kv_cache import store_kvcache_reference, store_kvcache_triton
from kernels.rms_norm import add_rms_norm_reference, add_rms_norm_triton, rms_norm_reference, rms_norm_triton
from kernels.rotary import rotary_reference, rotary_triton


@dataclass(frozen=True)
class KernelOps:
    name: str
    rms_norm: Callable  # (x, weight, eps) -> out
    add_rms_norm: Callable  # (x, residual, weight, eps) -> (out, x + residual)
    rotary: Callable  # (q, k, cos, sin) -> (q, k) rotated
    store_kvcache: Callable  # (k, v, k_cache, v_cache, slot_mapping) -> None
    paged_attention: Callable  # (q, k, v, k_cache, v_cache, meta, scale) -> out
    silu_and_mul: Callable  # (gate_up) -> silu(gate) * up


TORCH_OPS = KernelOps("torch", rms_norm_reference, add_rms_norm_reference, rotary_reference, store_kvcache_reference,
                      paged_attention, silu_and_mul_reference)
# silu_and_mul on CUDA: torch's two elementwise kernels (no Triton kernel of ours yet)
TRITON_OPS = KernelOps("triton", rms_norm_triton, add_rms_norm_triton, rotary_triton, store_kvcache_triton,
                       paged_attention_triton, silu_and_mul_reference)

__all__ = ["AttentionMetadata", "KernelOps", "TORCH_OPS", "TRITON_OPS", "paged_attention"]

"""The model's ops (RMSNorm; rotary embedding; KV-cache write; paged attention, with gpt-oss's sinks
and sliding window and DeepSeek's MLA; SwiGLU's activation; the mixture of experts of gpt-oss and
DeepSeek-V3), each as a PyTorch reference and (all but the activation) as our Triton kernel, one
concept per module: rms_norm, rotary,
kv_cache, decode_attention, prefill_attention, activation, fused_moe (with mxfp4, the experts'
4-bit format, and DeepSeek's FP8 experts), fp8 (FP8 weights: quantizers and the weight-only
FP8 GEMM, which sut/model/fp8.py's linear calls directly); attention holds the step's metadata and
the paged-attention op the model calls (the CPU one, and the dispatch to the decode or prefill
kernel); rejection_sample is speculative decoding's verifier (exact rejection sampling of draft
tokens). The checks and benchmarks sit apart, in checks/: checks/compare.py runs each kernel
against its reference (for the tests and the GPU check, `make gpu-check`), checks/gpu_cases.py and
gpu_bench.py are the GPU check's kernel cases and benchmarks, checks/fp8.py those of the FP8 kernels,
checks/shapes.py the served models' shapes they share.

The model calls only the `KernelOps` set that `select_ops` picks, so the backend switch lives in one
place: our Triton kernels on CUDA, and on CPU the op set of the engine's CPU backend (its C kernels,
handed in by the runner) or, without one, TORCH_OPS. The engine's `kernels` setting can force
Triton or torch; on CPU the Triton kernels run only in Triton's interpreter (TRITON_INTERPRET=1,
which is for tests). Requests and LoadGen are unknown here: ops take tensors."""

from collections.abc import Callable
from dataclasses import dataclass

from kernels.activation import silu_and_mul_reference
from kernels.attention import AttentionMetadata, paged_attention, paged_attention_triton
from kernels.fused_moe import (
    fused_moe_fp8_reference,
    fused_moe_fp8_triton,
    fused_moe_mxfp4_reference,
    fused_moe_mxfp4_triton,
    fused_moe_reference,
    fused_moe_triton,
)
from kernels.kv_cache import store_kvcache_reference, store_kvcache_triton
from kernels.rejection_sample import rejection_sample_reference, rejection_sample_triton
from kernels.rms_norm import add_rms_norm_reference, add_rms_norm_triton, rms_norm_reference, rms_norm_triton
from kernels.rotary import rotary_reference, rotary_triton
from kernels.triton_utils import interpreting


@dataclass(frozen=True)
class KernelOps:
    name: str
    rms_norm: Callable  # (x, weight, eps) -> out
    add_rms_norm: Callable  # (x, residual, weight, eps) -> (out, x + residual)
    rotary: Callable  # (q, k, cos, sin) -> (q, k) rotated
    store_kvcache: Callable  # (k, v, k_cache, v_cache, slot_mapping) -> None
    paged_attention: Callable  # (q, k, v, k_cache, v_cache, meta, scale, sinks=None, sliding_window=None) -> out
    silu_and_mul: Callable  # (gate_up) -> silu(gate) * up
    rejection_sample: Callable = rejection_sample_reference  # the verifier of speculative decoding (see its module)
    # (x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids, alpha, limit, activation="gpt_oss") -> out:
    # gpt-oss's experts; activation="silu" (biases None) for DeepSeek's: silu(gate) * up over [gate | up];
    # a topk_ids entry of -1 (another expert-parallel rank's slot) adds 0, in each of the three
    fused_moe: Callable = fused_moe_reference
    # (x, gate_up_blocks, gate_up_scales, b_gate_up, down_blocks, down_scales, b_down, topk_weights,
    # topk_ids, alpha, limit) -> out: the same from MXFP4 expert weights
    fused_moe_mxfp4: Callable = fused_moe_mxfp4_reference
    # (x, w_gate_up, gate_up_scale_inv, w_down, down_scale_inv, topk_weights, topk_ids, block=128) -> out:
    # DeepSeek's experts (silu, no biases) from FP8 weights [E, out, in] scaled per 128 x 128 block
    fused_moe_fp8: Callable = fused_moe_fp8_reference


TORCH_OPS = KernelOps(
    "torch",
    rms_norm_reference,
    add_rms_norm_reference,
    rotary_reference,
    store_kvcache_reference,
    paged_attention,
    silu_and_mul_reference,
)
# silu_and_mul on CUDA: torch's two elementwise kernels (no Triton kernel of ours yet)
TRITON_OPS = KernelOps(
    "triton",
    rms_norm_triton,
    add_rms_norm_triton,
    rotary_triton,
    store_kvcache_triton,
    paged_attention_triton,
    silu_and_mul_reference,
    rejection_sample_triton,
    fused_moe_triton,
    fused_moe_mxfp4_triton,
    fused_moe_fp8_triton,
)

KERNEL_SETTINGS = ("auto", "triton", "torch")


def select_ops(device_type: str, setting: str = "auto", cpu_ops: KernelOps | None = None) -> KernelOps:
    """The op set for a model on `device_type` ("cuda", "cpu"): `setting` "auto" takes TRITON_OPS on
    CUDA and on CPU `cpu_ops` (the CPU backend's, None where it has none) or else TORCH_OPS;
    "triton" and "torch" force those. ValueError for Triton off CUDA outside the interpreter."""
    if setting not in KERNEL_SETTINGS:
        raise ValueError(f"kernels must be one of {list(KERNEL_SETTINGS)}, got {setting!r}")
    if setting == "triton" or (setting == "auto" and device_type == "cuda"):
        # Off CUDA, Triton runs only in its interpreter: that is for tests, far too slow to serve.
        if device_type != "cuda" and not interpreting():
            raise ValueError(
                "kernels='triton' needs a CUDA device, or TRITON_INTERPRET=1 (Triton's interpreter, "
                "for tests) set before kernels is imported"
            )
        return TRITON_OPS
    if setting == "auto" and device_type == "cpu" and cpu_ops is not None:
        return cpu_ops
    return TORCH_OPS


__all__ = [
    "AttentionMetadata",
    "KernelOps",
    "TORCH_OPS",
    "TRITON_OPS",
    "paged_attention",
    "rejection_sample_reference",
    "rejection_sample_triton",
    "select_ops",
]

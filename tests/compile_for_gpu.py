"""Compile every Triton kernel for a GPU target (default sm_90) on a machine without one: the real
launchers run on small CPU tensors, but each kernel launch is replaced by an ahead-of-time compile
(Triton's frontend, then ptxas) of exactly what the launcher would launch. Catches what Triton's
interpreter lets through: constexpr and dtype errors, loop-carried type changes, tl.dot shapes.

Run without TRITON_INTERPRET (test_triton_kernels.py starts it in a subprocess). Prints one line
per compiled kernel and exits 1 on the first failure."""

import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "compile_for_gpu needs the real Triton compiler"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels.decode_attention  # noqa: E402
import kernels.fp8  # noqa: E402
import kernels.fused_moe  # noqa: E402
import kernels.kv_cache  # noqa: E402
import kernels.prefill_attention  # noqa: E402
import kernels.rejection_sample  # noqa: E402
import kernels.rms_norm  # noqa: E402
import kernels.rotary  # noqa: E402
from kernels.checks import compare  # noqa: E402

POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.int32: "*i32",
    torch.int64: "*i64",
    torch.bool: "*u1",
    torch.uint8: "*u8",
    torch.float8_e4m3fn: "*fp8e4nv",
}
TARGET = GPUTarget("cuda", int(os.environ.get("SAAF_COMPILE_ARCH", "90")), 32)
LAUNCH_OPTIONS = ("num_warps", "num_stages")
compiled: set[tuple] = set()


class CompileInsteadOfLaunch:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` compiles it for TARGET
    with the signature and constexprs the JIT would derive from these arguments."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return self.compile

    def compile(self, *args, **kwargs):
        fn = self.kernel
        values = dict(zip(fn.arg_names, args)) | {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
        signature, constexprs = {}, {}
        for param in fn.params:
            value = values[param.name]
            # As the JIT does: constexpr parameters, and integer arguments equal to 1 (unless marked
            # do_not_specialize), are constants.
            if param.is_constexpr or (
                isinstance(value, int) and not isinstance(value, bool) and value == 1 and not param.do_not_specialize
            ):
                signature[param.name], constexprs[param.name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                signature[param.name] = POINTER_TYPES[value.dtype]
            elif isinstance(value, float):
                signature[param.name] = "fp32"
            else:
                signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        options = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}
        key = (
            fn.__name__,
            tuple(sorted(signature.items())),
            tuple(sorted(constexprs.items())),
            tuple(sorted(options.items())),
        )
        if key in compiled:
            return
        compiled.add(key)
        try:
            binary = triton.compile(ASTSource(fn, signature, constexprs), target=TARGET, options=options)
        except Exception as e:
            print(f"FAILED {fn.__name__} {constexprs} {options}: {type(e).__name__}: {e}")
            sys.exit(1)
        print(
            f"compiled {fn.__name__} for sm_{TARGET.arch} {constexprs} {options}: "
            f"{binary.metadata.shared} bytes of shared memory"
        )


def main():
    for module in (
        kernels.decode_attention,
        kernels.prefill_attention,
        kernels.kv_cache,
        kernels.rms_norm,
        kernels.rotary,
        kernels.rejection_sample,
        kernels.fused_moe,
        kernels.fp8,
    ):
        source = Path(module.__file__).read_text()
        for name in dir(module):
            # Launched kernels only (`name[grid](...)`); jit helpers they call stay as they are.
            if isinstance(getattr(module, name), triton.runtime.JITFunction) and f"{name}[" in source:
                setattr(module, name, CompileInsteadOfLaunch(getattr(module, name)))
    # The engine's dtype on a GPU (bf16; fp16 is the same code), Llama-shaped heads (8 KV heads,
    # GQA 1/4/8, head_dim 64/128: 8B is GQA 4 and 70B GQA 8 at head_dim 128); one sequence too (the
    # JIT turns an int argument of 1 into a constant); a mixed step (decodes on the decode kernel,
    # the rest on the prefill kernel) with one sequence and with several on each.
    dtype = torch.bfloat16
    for gqa, head_dim in ((1, 128), (4, 128), (8, 128), (8, 64)):
        for num_splits in (1, 4):
            compare.check_decode_attention([5, 40], 8 * gqa, 8, head_dim, 16, dtype, "cpu", num_splits)
        compare.check_prefill_attention([5, 1], [5, 40], 8 * gqa, 8, head_dim, 16, dtype, "cpu")
        compare.check_prefill_attention([5], [40], 8 * gqa, 8, head_dim, 16, dtype, "cpu")
        compare.check_mixed_step_attention([1, 5], [9, 40], 8 * gqa, 8, head_dim, 16, dtype, "cpu")
        compare.check_mixed_step_attention([1, 1, 5, 3], [9, 300, 40, 3], 8 * gqa, 8, head_dim, 16, dtype, "cpu")
        compare.check_rotary(3, 8 * gqa, 8, head_dim, dtype, "cpu")
    # gpt-oss's attention (64 query heads over 8 KV heads, head_dim 64): sinks, its 128-key sliding
    # window, both; one pass and split-K, prefill, a mixed step.
    for sinks, window in ((True, None), (False, 128), (True, 128)):
        extras = dict(sinks=sinks, sliding_window=window)
        for num_splits in (1, 4):
            compare.check_decode_attention([5, 400], 64, 8, 64, 16, dtype, "cpu", num_splits, **extras)
        compare.check_prefill_attention([5, 1], [5, 200], 64, 8, 64, 16, dtype, "cpu", **extras)
        compare.check_mixed_step_attention([1, 1, 5], [9, 300, 200], 64, 8, 64, 16, dtype, "cpu", **extras)
    compile_mla(dtype)
    compare.check_store_kvcache(4, 8, 128, 16, dtype, "cpu")
    for with_residual in (False, True):
        compare.check_rms_norm(3, 4096, dtype, "cpu", with_residual)
    # The rejection sampler with draft probabilities and without (n-gram drafts); fp32 only. No
    # drafts at all (max_num_draft 0, an output row stride of 1) must compile to the same kernel.
    for with_draft_probs in (True, False):
        compare.check_rejection_sample([0, 4, 2], [False, True, False], 1000, with_draft_probs, "cpu")
        args = compare.random_rejection_batch(
            [0, 0], [False, True], 1000, with_draft_probs, "cpu", torch.Generator().manual_seed(0), extra_slots=0
        )
        kernels.rejection_sample.rejection_sample_triton(**args)
    compile_fused_moe()
    compile_fp8()
    print(f"{len(compiled)} kernel variants compiled for sm_{TARGET.arch}")


def compile_mla(dtype: torch.dtype):
    """DeepSeek's MLA (kernels/decode_attention.py): absorbed, 128 and 16 query heads (one GPU, and
    tensor parallel 8) on one KV head of 576 dims whose first 512 are V (a view); one pass and
    split-K, 32 heads a program too (the GPU check's variant), prefill and a mixed step. Decompressed:
    192-dim keys and 128-dim values a head, KV heads = query heads (128 or 16: the same kernels),
    prefill, decode and a mixed step. The KV-cache writes of both."""
    absorbed = dict(v_head_dim=512, shared_kv=True)
    for heads in (128, 16):
        for num_splits in (1, 4):
            compare.check_decode_attention([5, 40], heads, 1, 576, 16, dtype, "cpu", num_splits, **absorbed)
        compare.check_prefill_attention([5, 1], [5, 40], heads, 1, 576, 16, dtype, "cpu", **absorbed)
        compare.check_mixed_step_attention([1, 1, 5], [9, 300, 40], heads, 1, 576, 16, dtype, "cpu", **absorbed)
    for num_splits in (1, 4):
        compare.check_decode_attention([5, 40], 128, 1, 576, 16, dtype, "cpu", num_splits, block_h=32, **absorbed)
    compare.check_prefill_attention([5, 1], [5, 40], 16, 16, 192, 16, dtype, "cpu", v_head_dim=128)
    compare.check_decode_attention([5, 40], 16, 16, 192, 16, dtype, "cpu", 4, v_head_dim=128)
    compare.check_mixed_step_attention([1, 1, 5], [9, 300, 40], 16, 16, 192, 16, dtype, "cpu", v_head_dim=128)
    compare.check_store_kvcache(4, 1, 576, 16, dtype, "cpu", v_head_dim=512, keys_only=True)
    compare.check_store_kvcache(4, 16, 192, 16, dtype, "cpu", v_head_dim=128)


def compile_fused_moe():
    """gpt-oss's MoE (kernels/fused_moe.py): both launches (gate_up with the SwiGLU, down with the
    routing weight) with dense bf16 and MXFP4 weights, at the launcher's decode tiles (top-4 of 128
    experts, one token) and prefill tiles (4096 tokens), top-k 4 and 1; dense weights also
    K-contiguous (`[E, out, in]` storage); fp32 at its own tiles (the GPU check runs it). Small
    dims: the compiled kernel does not depend on them."""
    from kernels.fused_moe import moe_tile_config

    for mxfp4 in (False, True):
        for dtype, num_tokens in ((torch.bfloat16, 1), (torch.bfloat16, 4096), (torch.float32, 1)):
            config = moe_tile_config(num_tokens * 4, 128, dtype, mxfp4)
            for top_k in (4, 1) if dtype == torch.bfloat16 and num_tokens == 1 else (4,):
                compare.check_fused_moe(3, 64, 64, 8, top_k, dtype, "cpu", mxfp4=mxfp4, **config)
            if not mxfp4 and dtype == torch.bfloat16:
                compare.check_fused_moe(3, 64, 64, 8, 4, dtype, "cpu", k_contiguous=True, **config)


def compile_fp8():
    """FP8 weights: the linear GEMM (kernels/fp8.py) with scales per channel and per 128 x 128 block,
    bf16 at the decode (also split K: an fp32 workspace), mid-batch and prefill tiles, with a bias
    and without, fp32 at its own tiles; the fused MoE from block-scaled FP8 experts (silu, no biases)
    at the decode and prefill tiles of 256 experts top-8 (DeepSeek), bf16 and fp32; the dense MoE
    with the silu activation and no biases. Small dims: the compiled kernel does not depend on them."""
    from kernels.fp8 import fp8_linear_config, fp8_linear_triton, quantize_fp8_block, quantize_fp8_per_channel
    from kernels.fused_moe import fused_moe_fp8_triton, fused_moe_triton, moe_tile_config

    g = torch.Generator().manual_seed(0)
    w = torch.randn(136, 200, generator=g)
    bias = torch.randn(136, generator=g).to(torch.bfloat16)
    for block in (None, 128):
        w_fp8, scale = quantize_fp8_block(w) if block else quantize_fp8_per_channel(w)
        for dtype, m in ((torch.bfloat16, 1), (torch.bfloat16, 32), (torch.bfloat16, 512), (torch.float32, 1)):
            config = fp8_linear_config(m, 4096, 4096, dtype, "cpu") | dict(split_k=1)
            x = torch.randn(m, 200, generator=g).to(dtype)
            for b in (None, bias):
                fp8_linear_triton(x, w_fp8, scale, b, block, config=config)
            if m == 1:
                fp8_linear_triton(x, w_fp8, scale, None, block, config=config | dict(split_k=2, block_k=32))
    num_experts, top_k, hidden, intermediate = 8, 8, 200, 136  # ragged: scales [E, 3, 2] and [E, 2, 2]
    w_gate_up, s_gate_up = quantize_fp8_block(torch.randn(num_experts, 2 * intermediate, hidden, generator=g))
    w_down, s_down = quantize_fp8_block(torch.randn(num_experts, hidden, intermediate, generator=g))
    for dtype, num_tokens in ((torch.bfloat16, 1), (torch.bfloat16, 4096), (torch.float32, 1)):
        config = moe_tile_config(num_tokens * top_k, 256, dtype, False)
        x = torch.randn(3, hidden, generator=g).to(dtype)
        topk_weights, topk_ids = compare.random_routing(3, num_experts, top_k, "cpu", g)
        fused_moe_fp8_triton(x, w_gate_up, s_gate_up, w_down, s_down, topk_weights, topk_ids, config=config)
        if dtype == torch.bfloat16:
            dense = (w_gate_up.float().transpose(1, 2).to(dtype), w_down.float().transpose(1, 2).to(dtype))
            fused_moe_triton(
                x, dense[0], None, dense[1], None, topk_weights, topk_ids, config=config, activation="silu"
            )


if __name__ == "__main__":
    main()

"""gpt-oss's mixture of experts (kernels/fused_moe.py) and MXFP4 (kernels/mxfp4.py): the PyTorch
references against transformers (GptOssExperts after its router; the MXFP4 dequantization), the
routing layout's invariants, and the Triton kernels against the references in Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before any kernel module is imported).
Slots of id -1 (expert parallelism: another rank's expert) in every variant, dense, MXFP4 and FP8:
they contribute 0, the kernel computes nothing for them, and DeepSeek's expert-parallel ranks pass
them so. Shapes are small; the GPU check (kernels/checks/gpu_cases.py) runs gpt-oss's own on a GPU."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kernels import TORCH_OPS, TRITON_OPS
from kernels.checks import compare
from kernels.checks.compare import assert_close
from kernels.fp8 import dequantize_fp8, quantize_fp8_block
from kernels.fused_moe import (
    ACTIVATIONS,
    _launch,
    fused_moe_fp8_reference,
    fused_moe_fp8_triton,
    fused_moe_mxfp4_reference,
    fused_moe_mxfp4_triton,
    fused_moe_reference,
    fused_moe_triton,
    max_padded_slots,
    moe_align_block_size,
    moe_tile_config,
    swiglu_reference,
)
from kernels.mxfp4 import E2M1_VALUES, dequantize_mxfp4, quantize_mxfp4

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_TILES = dict(block_m=16, block_n=32, block_k=32)
MXFP4_TILES = dict(block_m=16, block_n=32, block_k=64)


# MXFP4


def every_byte_blocks(num_experts: int, rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """uint8 blocks `[E, rows, cols/32, 16]` holding each of the 256 byte values about equally often."""
    n = num_experts * rows * cols // 2
    values = torch.arange(n) % 256
    return values[torch.randperm(n, generator=generator)].to(torch.uint8).reshape(num_experts, rows, cols // 32, 16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
def test_dequantize_mxfp4_matches_transformers(dtype):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = every_byte_blocks(3, 16, 256, g)
    # every scale a checkpoint can hold but NaN's 255 (fp16 under- and overflows as transformers does)
    scales = torch.randint(0, 255, (3, 16, 8), generator=g).to(torch.uint8)
    scales.view(-1)[:255] = torch.arange(255, dtype=torch.uint8)
    want = convert_moe_packed_tensors(blocks, scales, dtype=dtype).transpose(1, 2)
    got = dequantize_mxfp4(blocks, scales, dtype)
    assert got.shape == (3, 16, 256) and got.dtype == dtype
    torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    # bit for bit, signed zeros and all
    assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))


def test_dequantize_mxfp4_values_and_layout():
    """Byte j of a block holds values 2j (low nibble) and 2j + 1; the scale is 2^(s - 127)."""
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0] = 0x21  # values 0.5 (nibble 1), 1.0 (nibble 2)
    blocks[0, 0, 15] = 0xF7  # 6.0, -6.0
    got = dequantize_mxfp4(blocks, torch.tensor([[129]], dtype=torch.uint8), torch.float32)
    assert got.shape == (1, 32)
    assert got[0, :2].tolist() == [2.0, 4.0] and got[0, 30:].tolist() == [24.0, -24.0]
    assert got[0, 2:30].abs().sum() == 0
    lut = dequantize_mxfp4(
        torch.tensor([[[16 * i + i for i in range(16)]]], dtype=torch.uint8),
        torch.tensor([[127]], dtype=torch.uint8),
        torch.float32,
    )
    assert lut[0, ::2].tolist() == list(E2M1_VALUES)


def test_quantize_mxfp4_round_trip():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 64, 96, generator=g) * torch.logspace(-3, 2, 96)  # blocks of very different sizes
    blocks, scales = quantize_mxfp4(w)
    assert blocks.shape == (4, 64, 3, 16) and scales.shape == (4, 64, 3)
    assert blocks.dtype == scales.dtype == torch.uint8
    d = dequantize_mxfp4(blocks, scales, torch.float32)
    # each value within half of e2m1's widest gap (2, between 4 and 6) times its block's scale
    factor = torch.pow(2.0, scales.float() - 127).repeat_interleave(32, dim=-1)
    assert ((d - w).abs() <= factor + 1e-30).all()
    assert (d - w).norm() / w.norm() < 0.15
    # values already on the MXFP4 grid come back exactly
    exact = dequantize_mxfp4(
        every_byte_blocks(2, 8, 64, g), torch.randint(110, 140, (2, 8, 2), generator=g).to(torch.uint8), torch.float32
    )
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(exact), torch.float32), exact)
    # all-zero blocks are fine
    assert dequantize_mxfp4(*quantize_mxfp4(torch.zeros(2, 32)), torch.float32).abs().sum() == 0


def test_mxfp4_bad_inputs():
    blocks, scales = torch.zeros(2, 4, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8)
    with pytest.raises(TypeError, match="uint8"):
        dequantize_mxfp4(blocks.int(), scales)
    with pytest.raises(TypeError, match="uint8"):
        dequantize_mxfp4(blocks, scales.float())
    with pytest.raises(ValueError, match="16 bytes per block"):
        dequantize_mxfp4(torch.zeros(2, 4, 8, dtype=torch.uint8), scales)
    with pytest.raises(ValueError, match="scales must be"):
        dequantize_mxfp4(blocks, torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(4, 48))
    with pytest.raises(TypeError, match="float"):
        quantize_mxfp4(torch.zeros(4, 64, dtype=torch.int32))


# Routing layout


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,block_m,num_used",
    [
        (1, 4, 1, 16, None),
        (1, 128, 4, 16, None),
        (13, 8, 2, 16, 3),
        (33, 16, 4, 16, None),
        (100, 6, 3, 64, 5),
        (0, 4, 2, 16, None),
    ],
)
def test_moe_align_block_size_invariants(num_tokens, num_experts, top_k, block_m, num_used):
    g = torch.Generator().manual_seed(num_tokens)
    _, topk_ids = compare.random_routing(num_tokens, num_experts, top_k, "cpu", g, num_used)
    sorted_ids, expert_ids, post = moe_align_block_size(topk_ids.int(), num_experts, block_m)
    num_slots = num_tokens * top_k
    capacity = max_padded_slots(num_slots, num_experts, block_m)
    assert sorted_ids.dtype == expert_ids.dtype == post.dtype == torch.int32
    assert sorted_ids.shape == (capacity,) and expert_ids.shape == (capacity // block_m,) and post.shape == (1,)
    counts = torch.bincount(topk_ids.flatten(), minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    n = int(post)
    assert n == int(padded.sum()) and n % block_m == 0 and n <= capacity
    # every slot exactly once, the sentinel everywhere else
    valid = sorted_ids[sorted_ids < num_slots]
    assert sorted(valid.tolist()) == list(range(num_slots))
    assert (sorted_ids[n:] == num_slots).all() and (sorted_ids >= 0).all() and (sorted_ids <= num_slots).all()
    # each block is one expert's, and holds only its slots (ascending), experts in order, no empty one
    flat = topk_ids.flatten()
    blocks = sorted_ids[:n].view(-1, block_m)
    for b, (row, expert) in enumerate(zip(blocks, expert_ids[: n // block_m].tolist())):
        real = row[row < num_slots]
        assert len(real) > 0 or (b > 0 and expert_ids[b - 1] == expert), "a block of padding alone"
        assert (flat[real.long()] == expert).all()
        assert real.tolist() == sorted(real.tolist())
    assert expert_ids[: n // block_m].tolist() == sorted(expert_ids[: n // block_m].tolist())
    assert set(expert_ids[: n // block_m].tolist()) == set(flat.tolist())
    assert (expert_ids[n // block_m :] == -1).all()


def test_moe_align_block_size_padding_in_place():
    """Expert 1 gets slots 0 and 3, expert 3 slot 1 and 2 (tokens 0, 1 with top-2), block 4."""
    sorted_ids, expert_ids, post = moe_align_block_size(torch.tensor([[1, 3], [3, 1]]), 4, 4)
    assert int(post) == 8
    assert sorted_ids.tolist()[:8] == [0, 3, 4, 4, 1, 2, 4, 4]
    assert expert_ids.tolist()[:2] == [1, 3]


# PyTorch reference against transformers


@pytest.mark.parametrize("implementation", ["grouped_mm", "eager"])
@pytest.mark.parametrize("top_k", [2, 4])
def test_reference_matches_transformers(implementation, top_k):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = GptOssConfig(hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=top_k)
    config._experts_implementation = implementation
    torch.manual_seed(0)
    mlp = GptOssMLP(config).float()
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0.0, 1.0)
        mlp.experts.gate_up_proj.mul_(0.5)  # pre-activations often past the clamp (±7)
        mlp.experts.down_proj.mul_(0.1)
        x = torch.randn(3, 11, 64)
        want, _ = mlp(x)
        _, topk_weights, topk_ids = mlp.router(x.reshape(-1, 64))
        e = mlp.experts
        got = fused_moe_reference(
            x.reshape(-1, 64),
            e.gate_up_proj,
            e.gate_up_proj_bias,
            e.down_proj,
            e.down_proj_bias,
            topk_weights,
            topk_ids,
        )
    gate_up = x.reshape(-1, 64) @ e.gate_up_proj[0]
    assert (gate_up.abs() > 7).float().mean() > 0.05, "the test should reach the clamp"
    torch.testing.assert_close(got, want.reshape(-1, 64), atol=1e-5, rtol=1e-5)


def test_swiglu_reference_clamps():
    gate_up = torch.tensor([[10.0, 10.0, -10.0, -10.0, 1.0, 0.5]])
    alpha, limit = 1.702, 7.0
    want = [7 * torch.sigmoid(torch.tensor(7 * alpha)) * 8, -10 * torch.sigmoid(torch.tensor(-10 * alpha)) * -6]
    want.append(torch.sigmoid(torch.tensor(alpha)) * 1.5)
    torch.testing.assert_close(swiglu_reference(gate_up, alpha, limit)[0], torch.stack(want))


def test_mxfp4_reference_is_dense_reference_on_dequantized_weights():
    g = torch.Generator().manual_seed(3)
    w = compare.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=True)
    topk_weights, topk_ids = compare.random_routing(5, 4, 2, "cpu", g)
    x = torch.randn(5, 64, generator=g)
    gate_up = dequantize_mxfp4(w[0], w[1], torch.float32).transpose(1, 2)
    down = dequantize_mxfp4(w[3], w[4], torch.float32).transpose(1, 2)
    want = fused_moe_reference(x, gate_up, w[2], down, w[5], topk_weights, topk_ids)
    assert torch.equal(fused_moe_mxfp4_reference(x, *w, topk_weights, topk_ids), want)


def test_reference_bad_inputs():
    g = torch.Generator().manual_seed(0)
    w = compare.random_moe_weights(4, 32, 16, torch.float32, "cpu", g, mxfp4=False)
    topk_weights, topk_ids = compare.random_routing(3, 4, 2, "cpu", g)
    x = torch.randn(3, 32)
    with pytest.raises(ValueError, match="x must be"):
        fused_moe_reference(torch.randn(3, 16), *w, topk_weights, topk_ids)
    with pytest.raises(ValueError, match="w_down must be"):
        fused_moe_reference(x, w[0], w[1], w[2][:, :8], w[3], topk_weights, topk_ids)
    with pytest.raises(ValueError, match="topk_ids and topk_weights"):
        fused_moe_reference(x, *w, topk_weights[:2], topk_ids)
    with pytest.raises(TypeError, match="integers"):
        fused_moe_reference(x, *w, topk_weights, topk_ids.float())
    with pytest.raises(ValueError, match="must lie in"):
        fused_moe_reference(x, *w, topk_weights, topk_ids + 3)
    with pytest.raises(TypeError, match="x's dtype"):
        fused_moe_triton(x.bfloat16(), *w, topk_weights, topk_ids)
    m = compare.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=True)
    with pytest.raises(ValueError, match="down_scales must be"):
        fused_moe_mxfp4_reference(torch.randn(3, 64), *m[:4], m[4][:, :1], m[5], topk_weights, topk_ids)
    with pytest.raises(ValueError, match="gate_up_blocks must be uint8"):
        fused_moe_mxfp4_triton(torch.randn(3, 64), m[0].int(), *m[1:], topk_weights, topk_ids)
    with pytest.raises(ValueError, match="block_k must be a multiple of 32"):
        fused_moe_mxfp4_triton(torch.randn(3, 64), *m, topk_weights, topk_ids, config=dict(block_k=16))


# Triton against the reference


# (tokens, hidden, intermediate, experts, top_k, experts used): one token; top-1 and top-4; empty
# experts; token counts not a multiple of the block; hidden not a multiple of block_k and
# intermediate not one of block_n (the masks on K and N).
DENSE_CASES = [
    (1, 64, 32, 4, 1, None),
    (1, 96, 48, 16, 4, None),
    (13, 80, 48, 8, 2, 3),
    (37, 64, 32, 16, 4, 9),
    (20, 48, 64, 4, 3, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: "T{}-H{}-I{}-E{}-k{}-used{}".format(*c))
def test_fused_moe_triton(case, dtype):
    num_tokens, hidden, intermediate, num_experts, top_k, num_used = case
    got, want = compare.check_fused_moe(
        num_tokens, hidden, intermediate, num_experts, top_k, dtype, DEVICE, num_used=num_used, **SMALL_TILES
    )
    assert got.shape == (num_tokens, hidden)
    assert_close(got, want, dtype, f"fused_moe {case}")


def test_fused_moe_triton_fp16_and_own_tiles():
    """fp16, and the launcher's own tile choice (no overrides)."""
    got, want = compare.check_fused_moe(9, 64, 32, 4, 2, torch.float16, DEVICE)
    assert_close(got, want, torch.float16, "fused_moe fp16")


def test_gpu_checks_expert_parallel_case():
    """gpu_check's expert-parallel case (7 of 8 slots another rank's, id -1) at a small shape: the
    kernel equals the reference, and rows whose slots are all -1 come out 0."""
    got, want = compare.check_fused_moe(17, 64, 32, 8, 4, torch.float32, DEVICE, other_ranks=0.875, **SMALL_TILES)
    assert_close(got, want, torch.float32, "fused_moe expert parallel")
    assert (want == 0).all(dim=1).any(), "some token has every slot on another rank"
    assert torch.equal(got[(want == 0).all(dim=1)], want[(want == 0).all(dim=1)])


def test_fused_moe_triton_k_contiguous_weights():
    """Weights stored `[E, out, in]` (the checkpoint's orientation) passed as transposed views."""
    g = torch.Generator().manual_seed(5)
    w_gate_up, b_gate_up, w_down, b_down = compare.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=False)
    topk_weights, topk_ids = compare.random_routing(7, 4, 2, "cpu", g)
    x = torch.randn(7, 64, generator=g)
    gate_up_t = w_gate_up.transpose(1, 2).contiguous().transpose(1, 2)
    down_t = w_down.transpose(1, 2).contiguous().transpose(1, 2)
    got = fused_moe_triton(x, gate_up_t, b_gate_up, down_t, b_down, topk_weights, topk_ids, config=SMALL_TILES)
    want = fused_moe_reference(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids)
    assert_close(got, want, torch.float32, "fused_moe K-contiguous")


def test_fused_moe_triton_no_tokens():
    g = torch.Generator().manual_seed(0)
    w = compare.random_moe_weights(4, 32, 16, torch.float32, "cpu", g, mxfp4=False)
    out = fused_moe_triton(torch.zeros(0, 32), *w, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int64))
    assert out.shape == (0, 32)


MXFP4_CASES = [
    (1, 64, 32, 4, 1, None),
    (1, 96, 64, 16, 4, None),
    (13, 64, 96, 8, 2, 3),
    (21, 160, 32, 16, 4, 9),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", MXFP4_CASES, ids=lambda c: "T{}-H{}-I{}-E{}-k{}-used{}".format(*c))
def test_fused_moe_mxfp4_triton(case, dtype):
    num_tokens, hidden, intermediate, num_experts, top_k, num_used = case
    got, want = compare.check_fused_moe(
        num_tokens,
        hidden,
        intermediate,
        num_experts,
        top_k,
        dtype,
        DEVICE,
        mxfp4=True,
        num_used=num_used,
        **MXFP4_TILES,
    )
    assert got.shape == (num_tokens, hidden)
    assert_close(got, want, dtype, f"fused_moe mxfp4 {case}")


def test_fused_moe_mxfp4_triton_wide_k_tile():
    """block_k 128 over K 96 and 160: a partial MXFP4 tile (K masked by whole 32-blocks)."""
    got, want = compare.check_fused_moe(
        6, 160, 96, 4, 2, torch.bfloat16, DEVICE, mxfp4=True, block_m=16, block_n=64, block_k=128
    )
    assert_close(got, want, torch.bfloat16, "fused_moe mxfp4 block_k=128")


# Slots of no expert (id -1): expert parallelism's slots of other ranks' experts

NO_EXPERT_PATTERNS = ["none", "some", "tokens", "all"]


def no_expert_routing(num_tokens, num_experts, top_k, pattern, generator):
    """Random routing with slots set to -1: none, some (about 40%), every slot of every third token
    (and some others), or all."""
    topk_weights, topk_ids = compare.random_routing(num_tokens, num_experts, top_k, "cpu", generator)
    drop = torch.rand(topk_ids.shape, generator=generator) < (0.4 if pattern == "some" else 0.2)
    if pattern == "tokens":
        drop[::3] = True
    drop = drop if pattern in ("some", "tokens") else torch.full_like(drop, pattern == "all")
    if pattern in ("some", "tokens"):
        assert drop.any() and not drop.all()
    if pattern == "tokens":
        assert drop.all(dim=1).any() and not drop.all(dim=1).all()
    return topk_weights, topk_ids.masked_fill(drop, -1)


def valid_slots_loop(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids, activation):
    """`[T, H]` fp32, token by token from dense weights `[E, H, 2I]`, `[E, I, H]` (biases or None):
    the sum over the token's slots whose id is not -1 of weight * (act(x @ Wgu + b) @ Wd + bd)."""
    out = torch.zeros(x.shape[0], w_down.shape[2])
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if e == -1:
                continue
            h = x[t].float() @ w_gate_up[e] + (0 if b_gate_up is None else b_gate_up[e])
            if activation == "silu":
                gate, up = h.chunk(2)
                act = F.silu(gate) * up
            else:
                act = swiglu_reference(h)
            out[t] += topk_weights[t, j] * (act @ w_down[e] + (0 if b_down is None else b_down[e]))
    return out


def after_nan(t: torch.Tensor) -> torch.Tensor:
    """`t [E, ...]` as a view one expert into a buffer whose expert "-1" (the memory before expert 0)
    is NaN: a kernel that read expert -1's weights would produce NaN."""
    buffer = torch.full((t.shape[0] + 1, *t.shape[1:]), float("nan"), dtype=t.dtype)
    buffer[1:] = t
    return buffer[1:]


NO_EXPERT_DIMS = (11, 64, 32, 6, 3)  # tokens, hidden, intermediate, experts, top-k: 33 slots, blocks of 16
VARIANTS = ["dense-gpt_oss", "dense-silu", "mxfp4", "fp8"]


def no_expert_case(variant, dtype, pattern, seed=0):
    """(Triton output, reference on fp32, the loop over the valid slots, topk_ids) for one variant:
    dense weights with gpt-oss's activation (biases) or silu (none), MXFP4 (gpt-oss), FP8 (silu)."""
    num_tokens, hidden, intermediate, num_experts, top_k = NO_EXPERT_DIMS
    g = torch.Generator().manual_seed(seed)
    topk_weights, topk_ids = no_expert_routing(num_tokens, num_experts, top_k, pattern, g)
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    routing = (topk_weights, topk_ids)
    if variant == "fp8":
        w_gate_up, s_gate_up = quantize_fp8_block(torch.randn(num_experts, 2 * intermediate, hidden, generator=g) / 4)
        w_down, s_down = quantize_fp8_block(torch.randn(num_experts, hidden, intermediate, generator=g) / 6)
        weights = (w_gate_up, after_nan(s_gate_up), w_down, after_nan(s_down))
        got = fused_moe_fp8_triton(x, *weights, *routing, config=SMALL_TILES)
        want = fused_moe_fp8_reference(x.float(), *weights, *routing)
        dense = (dequantize_fp8(w_gate_up, s_gate_up, 128).transpose(1, 2), None)
        dense += (dequantize_fp8(w_down, s_down, 128).transpose(1, 2), None)
        return got, want, valid_slots_loop(x, *dense, *routing, "silu"), topk_ids
    mxfp4 = variant == "mxfp4"
    weights = compare.random_moe_weights(num_experts, hidden, intermediate, dtype, "cpu", g, mxfp4=mxfp4)
    fp32 = [w if w.dtype == torch.uint8 else w.float() for w in weights]
    if mxfp4:
        got = fused_moe_mxfp4_triton(x, *weights, *routing, config=MXFP4_TILES)
        want = fused_moe_mxfp4_reference(x.float(), *fp32, *routing)
        dense = (dequantize_mxfp4(fp32[0], fp32[1], torch.float32).transpose(1, 2), fp32[2])
        dense += (dequantize_mxfp4(fp32[3], fp32[4], torch.float32).transpose(1, 2), fp32[5])
        return got, want, valid_slots_loop(x, *dense, *routing, "gpt_oss"), topk_ids
    activation = variant.split("-")[1]
    if activation == "silu":  # DeepSeek's experts have no biases
        weights, fp32 = (weights[0], None, weights[2], None), (fp32[0], None, fp32[2], None)
    got = fused_moe_triton(x, *weights, *routing, config=SMALL_TILES, activation=activation)
    want = fused_moe_reference(x.float(), *fp32, *routing, activation=activation)
    return got, want, valid_slots_loop(x, *fp32, *routing, activation), topk_ids


@pytest.mark.slow
@pytest.mark.parametrize("pattern", NO_EXPERT_PATTERNS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_no_expert_slots_reference_is_the_loop_over_valid_slots(variant, pattern):
    """The references on fp32: a -1 slot adds nothing (its weight whatever it is), the others as
    computed from the weights directly; a token with every slot -1 comes out exactly 0."""
    _, want, loop, topk_ids = no_expert_case(variant, torch.float32, pattern)
    torch.testing.assert_close(want, loop, atol=1e-5, rtol=1e-5)
    none = (topk_ids == -1).all(dim=1)
    assert (want[none] == 0).all() and (want[~none].abs().sum(dim=1) > 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pattern", NO_EXPERT_PATTERNS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_no_expert_slots_triton_matches_reference(variant, pattern, dtype):
    got, want, _, topk_ids = no_expert_case(variant, dtype, pattern)
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got.float(), want, dtype, f"{variant} with -1 slots ({pattern})")
    assert (got[(topk_ids == -1).all(dim=1)] == 0).all()


@pytest.mark.parametrize("pattern", ["some", "tokens", "all"])
@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,block_m", [(1, 4, 4, 16), (13, 8, 2, 16), (33, 16, 4, 16), (100, 6, 3, 64)]
)
def test_moe_align_block_size_no_expert_run(num_tokens, num_experts, top_k, block_m, pattern):
    """Every valid slot once, in a block of its expert; the -1 slots in a run of their own after the
    experts' (blocks of expert -1), padded the same; all within num_tokens_post_padded and the
    capacity bound."""
    g = torch.Generator().manual_seed(num_tokens + top_k)
    if num_tokens == 1 and pattern == "tokens":
        pattern = "some"  # one token: "tokens" would drop it whole
    _, topk_ids = no_expert_routing(num_tokens, num_experts, top_k, pattern, g)
    sorted_ids, expert_ids, post = moe_align_block_size(topk_ids.int(), num_experts, block_m)
    num_slots = num_tokens * top_k
    capacity = max_padded_slots(num_slots, num_experts, block_m)
    assert sorted_ids.shape == (capacity,) and expert_ids.shape == (capacity // block_m,)
    flat = topk_ids.flatten()
    counts = torch.bincount(flat + 1, minlength=num_experts + 1)  # the -1 slots' count first
    n = int(post)
    assert n == int(((counts + block_m - 1) // block_m * block_m).sum()) and n % block_m == 0 and n <= capacity
    valid = sorted_ids[sorted_ids < num_slots]
    assert sorted(valid.tolist()) == list(range(num_slots))  # every slot once, -1 slots included
    assert (sorted_ids[n:] == num_slots).all() and (expert_ids[n // block_m :] == -1).all()
    blocks = sorted_ids[:n].view(-1, block_m)
    block_experts = expert_ids[: n // block_m]
    for row, expert in zip(blocks, block_experts.tolist()):
        real = row[row < num_slots]
        assert len(real) > 0
        assert (flat[real.long()] == expert).all()  # -1 blocks hold exactly the -1 slots
        assert real.tolist() == sorted(real.tolist())
    # the experts' runs in order, then the -1 run, of ceil(count / block_m) blocks
    num_none_blocks = -(-int(counts[0]) // block_m)
    assert (block_experts[len(block_experts) - num_none_blocks :] == -1).all()
    experts = block_experts[: len(block_experts) - num_none_blocks].tolist()
    assert experts == sorted(experts) and all(e >= 0 for e in experts)


def test_moe_align_block_size_no_expert_by_hand_and_the_bound():
    """Expert 1: slots 0, 3; expert 3: slot 2; -1: slots 1, 4, 5 (3 tokens, top-2), block 4. And the
    bound's worst case: every expert hit once and one -1 slot, each run a whole block."""
    sorted_ids, expert_ids, post = moe_align_block_size(torch.tensor([[1, -1], [3, 1], [-1, -1]]), 4, 4)
    assert int(post) == 12
    assert sorted_ids.tolist()[:12] == [0, 3, 6, 6, 2, 6, 6, 6, 1, 4, 5, 6]
    assert expert_ids.tolist()[:3] == [1, 3, -1]
    ids = torch.tensor([[0], [1], [2], [3], [-1]])
    sorted_ids, expert_ids, post = moe_align_block_size(ids, 4, 4)
    assert int(post) == 20 == max_padded_slots(5, 4, 4) == len(sorted_ids)
    assert expert_ids.tolist() == [0, 1, 2, 3, -1]


@pytest.mark.parametrize("bad", [-2, 4])
def test_references_refuse_ids_outside_minus_one_to_experts(bad):
    g = torch.Generator().manual_seed(2)
    topk_weights, topk_ids = compare.random_routing(3, 4, 2, "cpu", g)
    topk_ids[1, 0] = bad
    x = torch.randn(3, 64, generator=g)
    message = r"topk_ids must lie in \[-1, 4\)"
    w = compare.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=False)
    with pytest.raises(ValueError, match=message):
        fused_moe_reference(x, *w, topk_weights, topk_ids)
    m = compare.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=True)
    with pytest.raises(ValueError, match=message):
        fused_moe_mxfp4_reference(x, *m, topk_weights, topk_ids)
    f = (*quantize_fp8_block(torch.randn(4, 64, 64, generator=g)), *quantize_fp8_block(torch.randn(4, 64, 32)))
    with pytest.raises(ValueError, match=message):
        fused_moe_fp8_reference(x, *f, topk_weights, topk_ids)


def test_no_expert_blocks_write_zeros_over_garbage_and_read_no_weights():
    """Both launches straight into NaN-filled outputs: the -1 slots' rows come out 0, the others
    their expert's values. The weights and biases are `after_nan` views, so an M-block that read
    expert -1's would write NaN."""
    num_tokens, hidden, intermediate, num_experts, top_k = NO_EXPERT_DIMS
    g = torch.Generator().manual_seed(7)
    topk_weights, topk_ids = no_expert_routing(num_tokens, num_experts, top_k, "tokens", g)
    w = compare.random_moe_weights(num_experts, hidden, intermediate, torch.float32, "cpu", g, mxfp4=False)
    w_gate_up, b_gate_up, w_down, b_down = (after_nan(t) for t in w)
    x = torch.randn(num_tokens, hidden, generator=g)
    num_slots = num_tokens * top_k
    config = moe_tile_config(num_slots, num_experts, torch.float32, False) | SMALL_TILES
    routing = moe_align_block_size(topk_ids, num_experts, config["block_m"])
    assert (routing[1] == -1).any() and int(routing[2]) > routing[1].tolist().index(-1) * config["block_m"]
    common = dict(routing=routing, num_slots=num_slots, config=config, alpha=1.702, limit=7.0, fmt="dense")
    act = torch.full((num_slots, intermediate), float("nan"))
    _launch(
        x, w_gate_up, None, b_gate_up, act, None, n=intermediate, k=hidden, top_k=top_k,
        activation=ACTIVATIONS["gpt_oss"], **common,
    )  # fmt: skip
    weights = topk_weights.reshape(-1).contiguous()
    slots_out = torch.full((num_slots, hidden), float("nan"))
    _launch(act, w_down, None, b_down, slots_out, weights, n=hidden, k=intermediate, top_k=1, activation=0, **common)
    none = topk_ids.reshape(-1) == -1
    assert none.any() and not none.all()
    assert (act[none] == 0).all() and (slots_out[none] == 0).all()
    ids = topk_ids.reshape(-1)[~none]
    rows = x[torch.arange(num_slots)[~none] // top_k]
    want_act = swiglu_reference(torch.bmm(rows[:, None], w[0][ids])[:, 0] + w[1][ids])
    torch.testing.assert_close(act[~none], want_act, atol=1e-5, rtol=1e-5)
    want_out = (torch.bmm(act[~none][:, None], w[2][ids])[:, 0] + w[3][ids]) * weights[~none, None]
    torch.testing.assert_close(slots_out[~none], want_out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ops", [TORCH_OPS, TRITON_OPS], ids=lambda o: o.name)
@pytest.mark.parametrize("fp8", [False, True], ids=["dense", "fp8"])
def test_deepseek_expert_parallel_ranks_pass_other_ranks_slots_as_minus_one(ops, fp8):
    """DeepseekV3Experts with a shard (2 ranks of 8 experts): the op gets this rank's experts by
    local id and -1 for every other slot, and the ranks' outputs sum to the whole model's."""
    from sut.config import ModelConfig
    from sut.model.deepseek_v3 import DeepseekV3Experts
    from sut.parallel import Shard, local_config
    from tests.test_deepseek_v3 import DEEPSEEK_TINY

    config = ModelConfig.from_dict({**DEEPSEEK_TINY, "architectures": ["DeepseekV3ForCausalLM"]})
    num_experts, top_k, hidden = config.moe.num_experts, config.moe.experts_per_token, config.hidden_size
    g = torch.Generator().manual_seed(11)
    whole = DeepseekV3Experts(config)
    gate_up = torch.randn(whole.gate_up_proj.shape, generator=g) / hidden**0.5
    down = torch.randn(whole.down_proj.shape, generator=g) / gate_up.shape[1] ** 0.5
    if fp8:
        (gate_up, gate_up_scale), (down, down_scale) = quantize_fp8_block(gate_up), quantize_fp8_block(down)
        whole.fp8, whole.gate_up_proj_scale_inv, whole.down_proj_scale_inv = True, gate_up_scale, down_scale
    whole.gate_up_proj.data, whole.down_proj.data = gate_up, down
    topk_weights, topk_ids = compare.random_routing(9, num_experts, top_k, "cpu", g)
    x = torch.randn(9, hidden, generator=g)
    seen = []

    def recording(op):
        return lambda *args, **kwargs: seen.append(args[-1].clone()) or op(*args, **kwargs)

    ops = dataclasses.replace(ops, fused_moe=recording(ops.fused_moe), fused_moe_fp8=recording(ops.fused_moe_fp8))
    want = whole(x, topk_weights, topk_ids, ops)
    total = torch.zeros_like(want)
    for rank in range(2):
        part = DeepseekV3Experts(local_config(config, 2))
        held = part.gate_up_proj.shape[0]
        mine = slice(rank * held, (rank + 1) * held)
        part.gate_up_proj.data, part.down_proj.data = gate_up[mine], down[mine]
        if fp8:
            part.fp8, part.gate_up_proj_scale_inv, part.down_proj_scale_inv = (
                True,
                gate_up_scale[mine],
                down_scale[mine],
            )
        total += part(x, topk_weights, topk_ids, ops, Shard(rank, 2))
        local = topk_ids - rank * held
        ours = (local >= 0) & (local < held)
        assert ours.any() and not ours.all()
        assert torch.equal(seen[-1], torch.where(ours, local, -1))
    torch.testing.assert_close(total, want, atol=1e-5, rtol=1e-5)

"""gpt-oss's mixture of experts (kernels/fused_moe.py) and MXFP4 (kernels/mxfp4.py): the PyTorch
references against transformers (GptOssExperts after its router; the MXFP4 dequantization), the
routing layout's invariants, and the Triton kernels against the references in Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before any kernel module is imported).
Shapes are small; kernels/gpu_check.py runs gpt-oss's own on a GPU."""

import pytest
import torch

from kernels import checks
from kernels.checks import assert_close
from kernels.fused_moe import (
    fused_moe_mxfp4_reference,
    fused_moe_mxfp4_triton,
    fused_moe_reference,
    fused_moe_triton,
    max_padded_slots,
    moe_align_block_size,
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
    _, topk_ids = checks.random_routing(num_tokens, num_experts, top_k, "cpu", g, num_used)
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
    w = checks.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=True)
    topk_weights, topk_ids = checks.random_routing(5, 4, 2, "cpu", g)
    x = torch.randn(5, 64, generator=g)
    gate_up = dequantize_mxfp4(w[0], w[1], torch.float32).transpose(1, 2)
    down = dequantize_mxfp4(w[3], w[4], torch.float32).transpose(1, 2)
    want = fused_moe_reference(x, gate_up, w[2], down, w[5], topk_weights, topk_ids)
    assert torch.equal(fused_moe_mxfp4_reference(x, *w, topk_weights, topk_ids), want)


def test_reference_bad_inputs():
    g = torch.Generator().manual_seed(0)
    w = checks.random_moe_weights(4, 32, 16, torch.float32, "cpu", g, mxfp4=False)
    topk_weights, topk_ids = checks.random_routing(3, 4, 2, "cpu", g)
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
    m = checks.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=True)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: "T{}-H{}-I{}-E{}-k{}-used{}".format(*c))
def test_fused_moe_triton(case, dtype):
    num_tokens, hidden, intermediate, num_experts, top_k, num_used = case
    got, want = checks.check_fused_moe(
        num_tokens, hidden, intermediate, num_experts, top_k, dtype, DEVICE, num_used=num_used, **SMALL_TILES
    )
    assert got.shape == (num_tokens, hidden)
    assert_close(got, want, dtype, f"fused_moe {case}")


def test_fused_moe_triton_fp16_and_own_tiles():
    """fp16, and the launcher's own tile choice (no overrides)."""
    got, want = checks.check_fused_moe(9, 64, 32, 4, 2, torch.float16, DEVICE)
    assert_close(got, want, torch.float16, "fused_moe fp16")


def test_fused_moe_triton_k_contiguous_weights():
    """Weights stored `[E, out, in]` (the checkpoint's orientation) passed as transposed views."""
    g = torch.Generator().manual_seed(5)
    w_gate_up, b_gate_up, w_down, b_down = checks.random_moe_weights(4, 64, 32, torch.float32, "cpu", g, mxfp4=False)
    topk_weights, topk_ids = checks.random_routing(7, 4, 2, "cpu", g)
    x = torch.randn(7, 64, generator=g)
    gate_up_t = w_gate_up.transpose(1, 2).contiguous().transpose(1, 2)
    down_t = w_down.transpose(1, 2).contiguous().transpose(1, 2)
    got = fused_moe_triton(x, gate_up_t, b_gate_up, down_t, b_down, topk_weights, topk_ids, config=SMALL_TILES)
    want = fused_moe_reference(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids)
    assert_close(got, want, torch.float32, "fused_moe K-contiguous")


def test_fused_moe_triton_no_tokens():
    g = torch.Generator().manual_seed(0)
    w = checks.random_moe_weights(4, 32, 16, torch.float32, "cpu", g, mxfp4=False)
    out = fused_moe_triton(torch.zeros(0, 32), *w, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int64))
    assert out.shape == (0, 32)


MXFP4_CASES = [
    (1, 64, 32, 4, 1, None),
    (1, 96, 64, 16, 4, None),
    (13, 64, 96, 8, 2, 3),
    (21, 160, 32, 16, 4, 9),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", MXFP4_CASES, ids=lambda c: "T{}-H{}-I{}-E{}-k{}-used{}".format(*c))
def test_fused_moe_mxfp4_triton(case, dtype):
    num_tokens, hidden, intermediate, num_experts, top_k, num_used = case
    got, want = checks.check_fused_moe(
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
    got, want = checks.check_fused_moe(
        6, 160, 96, 4, 2, torch.bfloat16, DEVICE, mxfp4=True, block_m=16, block_n=64, block_k=128
    )
    assert_close(got, want, torch.bfloat16, "fused_moe mxfp4 block_k=128")

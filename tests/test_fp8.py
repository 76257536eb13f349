"""FP8 weights: the quantizers and the dequantizer (kernels/fp8.py) against hand computations; the
Triton FP8 GEMM against its reference in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before any kernel module is imported); the fused
MoE's silu activation and its block-scaled FP8 experts (kernels/fused_moe.py) against a plain loop
over the experts as transformers' DeepseekV3Experts runs it; the engine's `quantization: fp8`
(sut/model/fp8.py, the loader) on a tiny Llama; and kernels/checks/fp8.py at a tiny scale."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels import TORCH_OPS, TRITON_OPS, AttentionMetadata
from kernels.checks.compare import assert_close, random_routing
from kernels.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    dequantize_fp8,
    fp8_linear,
    fp8_linear_reference,
    fp8_linear_triton,
    quantize_fp8_block,
    quantize_fp8_per_channel,
)
from kernels.fused_moe import fused_moe_fp8_reference, fused_moe_fp8_triton, fused_moe_reference, fused_moe_triton
from sut.config import EngineConfig, ModelConfig
from sut.errors import ConfigError
from sut.model.fp8 import Fp8Linear, quantize_linears
from sut.model.loader import load_model, random_model
from tests.helpers import TINY_CONFIG

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def codes(w_fp8: torch.Tensor) -> torch.Tensor:
    return w_fp8.view(torch.uint8)


# Quantizers and dequantizer


def test_per_channel_scales_and_values_by_hand():
    w = torch.tensor(
        [
            [1.0, -2.0, 0.5, 0.0],  # amax 2: scale 2/448, values 224, -448, 112, 0
            [0.0, 0.0, 0.0, 0.0],  # zeros: scale 1
            [896.0, 3.0, -896.0, 1.0],  # amax 896: scale 2, values 448, 1.5, -448, 0.5
            [448.0, 17.0, -9.0, 0.0],  # scale 1; 17 is halfway between 16 and 18: to even, 16; -9 stays
        ]
    )
    w_fp8, scale = quantize_fp8_per_channel(w)
    assert w_fp8.dtype == FP8_DTYPE and scale.dtype == torch.float32 and scale.shape == (4,)
    assert scale.tolist() == [torch.tensor(2.0 / 448).item(), 1.0, 2.0, 1.0]
    assert w_fp8.float().tolist() == [
        [224.0, -448.0, 112.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [448.0, 1.5, -448.0, 0.5],
        [448.0, 16.0, -9.0, 0.0],
    ]
    want = w.clone()
    want[3, 1] = 16.0
    torch.testing.assert_close(dequantize_fp8(w_fp8, scale), want, atol=0, rtol=2e-7)
    assert dequantize_fp8(w_fp8, scale, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_block_scales_by_hand_with_a_zero_block():
    """A 256 x 256 weight is 2 x 2 blocks of 128: amax 448 (scale 1), 1 (1/448), zeros (1), 896 (2)."""
    w = torch.zeros(256, 256)
    w[:128, :128] = 1.0
    w[5, 7] = -448.0
    w[:128, 128:] = 0.25
    w[100, 200] = 1.0
    w[128:, 128:] = 3.0
    w[200, 130] = 896.0
    w_fp8, scale_inv = quantize_fp8_block(w)
    assert scale_inv.shape == (2, 2) and scale_inv.dtype == torch.float32
    assert scale_inv.tolist() == [[1.0, torch.tensor(1 / 448).item()], [1.0, 2.0]]
    assert w_fp8[5, 7].item() == -448.0 and w_fp8[0, 0].item() == 1.0
    assert w_fp8[100, 200].item() == 448.0 and w_fp8[0, 128].item() == 112.0
    assert w_fp8[128:, :128].float().abs().sum() == 0
    assert w_fp8[200, 130].item() == 448.0 and w_fp8[128, 128].item() == 1.5
    torch.testing.assert_close(dequantize_fp8(w_fp8, scale_inv, 128), w, atol=0, rtol=2e-7)


def test_ragged_blocks_take_only_their_own_values():
    """out 200, in 136 at block 128: scales [2, 2], the last row and column of blocks partial."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 136, generator=g)
    w_fp8, scale_inv = quantize_fp8_block(w, 128)
    assert w_fp8.shape == (200, 136) and scale_inv.shape == (2, 2)
    for i, rows in enumerate((slice(0, 128), slice(128, 200))):
        for j, cols in enumerate((slice(0, 128), slice(128, 136))):
            assert scale_inv[i, j] == w[rows, cols].abs().max() / FP8_MAX
            assert w_fp8[rows, cols].float().abs().max() == FP8_MAX
    d = dequantize_fp8(w_fp8, scale_inv, 128)
    # e4m3 keeps 3 mantissa bits: each value within 2^-4 of itself (relative), or its block's step
    step = scale_inv.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :136] * 2**-6
    assert ((d - w).abs() <= torch.maximum(w.abs() * 2**-4, step)).all()


def test_quantizers_take_leading_dims_and_refuse_bad_input():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(3, 130, 70, generator=g)
    q, s = quantize_fp8_block(w)
    assert q.shape == (3, 130, 70) and s.shape == (3, 2, 1)
    for e in range(3):
        q_e, s_e = quantize_fp8_block(w[e])
        assert torch.equal(codes(q[e]), codes(q_e)) and torch.equal(s[e], s_e)
    q, s = quantize_fp8_per_channel(w)
    assert s.shape == (3, 130)
    bad = torch.ones(4, 4)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize_fp8_per_channel(bad)
    with pytest.raises(ValueError, match=r"per 128x128 block must be \[2, 1\]"):
        dequantize_fp8(q[0], torch.ones(2, 2), 128)
    with pytest.raises(ValueError, match=r"per channel must be \[130\]"):
        dequantize_fp8(q[0], torch.ones(2))
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        dequantize_fp8(w[0], s[0])


# The FP8 GEMM


def fp8_weight(n: int, k: int, block, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) / k**0.5 * torch.logspace(-1, 1, n)[:, None]  # rows of varied size
    return quantize_fp8_block(w, block) if block else quantize_fp8_per_channel(w)


@pytest.mark.slow
@pytest.mark.parametrize("block", [None, 128], ids=["per_channel", "block128"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("m", [1, 5, 33])
def test_fp8_linear_triton_matches_reference(block, dtype, m):
    """K 200 and N 136: neither a multiple of the tiles, nor of the 128 blocks (ragged last blocks)."""
    w_fp8, scale = fp8_weight(136, 200, block, seed=m)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, 200, generator=g).to(dtype)
    bias = torch.randn(136, generator=g).to(torch.bfloat16)
    for b in (bias, None):
        want = fp8_linear_reference(x.float(), w_fp8, scale, b, block)
        got = fp8_linear_triton(x, w_fp8, scale, b, block)
        assert got.dtype == dtype and got.shape == (m, 136)
        assert_close(got.float(), want, dtype, f"fp8_linear M={m}")


@pytest.mark.parametrize("block", [None, 128], ids=["per_channel", "block128"])
@pytest.mark.parametrize(
    "config",
    [
        dict(block_m=16, block_n=32, block_k=32, split_k=3),  # 3 K splits, an fp32 workspace
        dict(block_m=16, block_n=16, block_k=64, group_m=2),  # several M-blocks in L2 groups
        dict(block_m=16, block_n=32, block_k=128, split_k=2),  # a split of one K step, the last one ragged
    ],
)
@pytest.mark.slow
def test_fp8_linear_triton_tiles_and_split_k(block, config):
    w_fp8, scale = fp8_weight(136, 200, block, seed=7)
    x = torch.randn(40, 200, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    bias = torch.linspace(-1, 1, 136)
    got = fp8_linear_triton(x, w_fp8, scale, bias, block, config=config)
    assert_close(got.float(), fp8_linear_reference(x.float(), w_fp8, scale, bias, block), torch.bfloat16)


def test_fp8_linear_leading_dims_strides_and_errors():
    w_fp8, scale = fp8_weight(48, 64, 128, seed=3)
    x = torch.randn(2, 3, 128)[..., ::2]  # [2, 3, 64], not contiguous
    want = fp8_linear_reference(x, w_fp8, scale, None, 128)
    assert want.shape == (2, 3, 48)
    assert_close(fp8_linear(x, w_fp8, scale, None, 128), want, torch.float32)
    assert fp8_linear_triton(x[:0], w_fp8, scale, None, 128).shape == (0, 3, 48)
    with pytest.raises(ValueError, match="does not fit"):
        fp8_linear_triton(torch.randn(2, 65), w_fp8, scale, None, 128)
    with pytest.raises(ValueError, match="block_k must divide"):
        fp8_linear_triton(torch.randn(2, 64), w_fp8, scale, None, 128, config=dict(block_k=256))


# The fused MoE: silu and FP8 experts


def deepseek_experts_loop(x, gate_up_proj, down_proj, topk_weights, topk_ids):
    """transformers' DeepseekV3Experts, token by token: `gate_up_proj [E, 2I, H]`, `down_proj
    [E, H, I]` (nn.Linear's layout), gate then up halves, silu(gate) * up, weighted, summed."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate, up = F.linear(x[t], gate_up_proj[e]).chunk(2, dim=-1)
            out[t] += F.linear(F.silu(gate) * up, down_proj[e]) * topk_weights[t, j]
    return out


def deepseek_weights(num_experts, hidden, intermediate, seed):
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * intermediate, hidden, generator=g) * 2 / hidden**0.5
    down = torch.randn(num_experts, hidden, intermediate, generator=g) / intermediate**0.5
    return gate_up, down


def test_the_loop_is_transformers_deepseek_experts():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

    config = DeepseekV3Config(hidden_size=64, moe_intermediate_size=32, n_routed_experts=6, num_experts_per_tok=2)
    experts = DeepseekV3Experts(config)
    gate_up, down = deepseek_weights(6, 64, 32, seed=0)
    experts.gate_up_proj.data, experts.down_proj.data = gate_up, down
    g = torch.Generator().manual_seed(1)
    topk_weights, topk_ids = random_routing(9, 6, 2, "cpu", g)
    x = torch.randn(9, 64, generator=g)
    with torch.no_grad():
        want = experts(x, topk_ids, topk_weights)
    torch.testing.assert_close(deepseek_experts_loop(x, gate_up, down, topk_weights, topk_ids), want)


MOE_DIMS = (6, 200, 136, 2)  # experts, hidden, intermediate, top-k: 2I = 272, a 128-block mixes gate and up rows


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_tokens", [1, 5, 33])
def test_fused_moe_silu_matches_the_loop(dtype, num_tokens):
    num_experts, hidden, intermediate, top_k = MOE_DIMS
    gate_up, down = deepseek_weights(num_experts, hidden, intermediate, seed=num_tokens)
    g = torch.Generator().manual_seed(50 + num_tokens)
    topk_weights, topk_ids = random_routing(num_tokens, num_experts, top_k, "cpu", g)
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    gate_up, down = gate_up.to(dtype), down.to(dtype)
    want = deepseek_experts_loop(x.float(), gate_up.float(), down.float(), topk_weights, topk_ids)
    # the dense layout [E, in, out]: transposed views of the [E, out, in] weights (K-contiguous)
    dense = (gate_up.transpose(1, 2), down.transpose(1, 2))
    fp32 = (dense[0].float(), dense[1].float())
    reference = fused_moe_reference(x.float(), fp32[0], None, fp32[1], None, topk_weights, topk_ids, activation="silu")
    torch.testing.assert_close(reference, want, atol=1e-5, rtol=1e-5)
    got = fused_moe_triton(x, dense[0], None, dense[1], None, topk_weights, topk_ids, activation="silu")
    assert_close(got.float(), want, dtype, "fused_moe_triton silu")
    contiguous = fused_moe_triton(
        x, dense[0].contiguous(), None, dense[1].contiguous(), None, topk_weights, topk_ids, activation="silu"
    )
    assert_close(contiguous.float(), want, dtype, "fused_moe_triton silu, [E, in, out] contiguous")


def test_fused_moe_silu_takes_biases_and_refuses_unknown_activations():
    num_experts, hidden, intermediate, top_k = 4, 64, 32, 2
    gate_up, down = deepseek_weights(num_experts, hidden, intermediate, seed=3)
    g = torch.Generator().manual_seed(4)
    topk_weights, topk_ids = random_routing(7, num_experts, top_k, "cpu", g)
    x = torch.randn(7, hidden, generator=g)
    b_gate_up, b_down = torch.randn(num_experts, 2 * intermediate, generator=g), torch.randn(num_experts, hidden)
    args = (x, gate_up.transpose(1, 2), b_gate_up, down.transpose(1, 2), b_down, topk_weights, topk_ids)
    want = fused_moe_reference(*args, activation="silu")
    assert_close(fused_moe_triton(*args, activation="silu"), want, torch.float32)
    # the biases count: without them the result differs
    assert not torch.allclose(want, fused_moe_reference(*args[:2], None, args[3], None, *args[5:], activation="silu"))
    with pytest.raises(ValueError, match=r"activation must be one of \['gpt_oss', 'silu'\], got 'relu'"):
        fused_moe_reference(*args, activation="relu")
    with pytest.raises(ValueError, match="activation must be one of"):
        fused_moe_triton(*args, activation="relu")


def fp8_experts(num_experts, hidden, intermediate, seed):
    gate_up, down = deepseek_weights(num_experts, hidden, intermediate, seed)
    return (*quantize_fp8_block(gate_up), *quantize_fp8_block(down))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_tokens", [1, 5, 33])
def test_fused_moe_fp8_matches_the_loop_on_dequantized_weights(dtype, num_tokens):
    num_experts, hidden, intermediate, top_k = MOE_DIMS
    weights = fp8_experts(num_experts, hidden, intermediate, seed=num_tokens)
    w_gate_up, s_gate_up, w_down, s_down = weights
    assert s_gate_up.shape == (num_experts, 3, 2) and s_down.shape == (num_experts, 2, 2)
    g = torch.Generator().manual_seed(70 + num_tokens)
    topk_weights, topk_ids = random_routing(num_tokens, num_experts, top_k, "cpu", g)
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    want = deepseek_experts_loop(
        x.float(),
        dequantize_fp8(w_gate_up, s_gate_up, 128),
        dequantize_fp8(w_down, s_down, 128),
        topk_weights,
        topk_ids,
    )
    reference = fused_moe_fp8_reference(x.float(), *weights, topk_weights, topk_ids)
    torch.testing.assert_close(reference, want, atol=1e-5, rtol=1e-5)
    got = fused_moe_fp8_triton(x, *weights, topk_weights, topk_ids)
    assert got.dtype == dtype
    assert_close(got.float(), want, dtype, "fused_moe_fp8_triton")
    # the kernel ops: the reference on CPU, the kernel in TRITON_OPS
    assert TORCH_OPS.fused_moe_fp8 is fused_moe_fp8_reference and TRITON_OPS.fused_moe_fp8 is fused_moe_fp8_triton


@pytest.mark.slow
def test_fused_moe_fp8_tiles_and_shape_errors():
    num_experts, hidden, intermediate, top_k = MOE_DIMS
    weights = fp8_experts(num_experts, hidden, intermediate, seed=9)
    g = torch.Generator().manual_seed(10)
    topk_weights, topk_ids = random_routing(40, num_experts, top_k, "cpu", g, num_used=4)
    x = torch.randn(40, hidden, generator=g)
    want = fused_moe_fp8_reference(x, *weights, topk_weights, topk_ids)
    for config in (dict(block_m=16, block_n=16, block_k=32), dict(block_m=32, block_n=64, block_k=64)):
        assert_close(fused_moe_fp8_triton(x, *weights, topk_weights, topk_ids, config=config), want, torch.float32)
    with pytest.raises(ValueError, match="block_k must divide"):
        fused_moe_fp8_triton(x, *weights, topk_weights, topk_ids, config=dict(block_k=256))
    w_gate_up, s_gate_up, w_down, s_down = weights
    with pytest.raises(ValueError, match=r"gate_up_scale_inv must be \[6, 3, 2\]"):
        fused_moe_fp8_reference(x, w_gate_up, s_gate_up[:, :2], w_down, s_down, topk_weights, topk_ids)
    with pytest.raises(ValueError, match="w_down must be float8_e4m3fn"):
        fused_moe_fp8_triton(x, w_gate_up, s_gate_up, w_down.float(), s_down, topk_weights, topk_ids)


# The engine's `quantization: fp8`


def random_tiny_llama(dtype=torch.bfloat16):
    config = ModelConfig.from_dict({**TINY_CONFIG, "architectures": ["LlamaForCausalLM"]})
    return random_model(config, dtype, torch.device("cpu"), seed=3)


def prefill_logits(model, token_ids: list[int], ops=TORCH_OPS) -> torch.Tensor:
    """The logits of one prompt's prefill, on a KV cache of the prompt's own."""
    n, block_size = len(token_ids), 16
    num_blocks = -(-n // block_size)
    for layer in model.model.layers:
        attn = layer.self_attn
        shape = (num_blocks, block_size, attn.num_kv_heads, attn.head_dim)
        attn.k_cache = torch.zeros(shape, dtype=model.model.embed_tokens.weight.dtype)
        attn.v_cache = torch.zeros_like(attn.k_cache)
    meta = AttentionMetadata(
        torch.arange(n),
        torch.arange(num_blocks, dtype=torch.int32)[None],
        torch.tensor([0, n], dtype=torch.int32),
        torch.tensor([n], dtype=torch.int32),
        [n],
        [n],
    )
    model.ops = ops
    return model.compute_logits(model(torch.tensor(token_ids), torch.arange(n), meta))


PROMPT = [1, 17, 99, 4, 250, 31, 8, 77, 3, 200, 64, 5]


def test_fake_quantization_on_cpu():
    base, model = random_tiny_llama(), random_tiny_llama()
    assert quantize_linears(model, "cpu", torch.bfloat16) == 2 * 4  # qkv, o, gate_up, down per layer
    before, after = dict(base.named_parameters()), dict(model.named_parameters())
    assert before.keys() == after.keys()
    for name, w in after.items():
        if not name.endswith("proj.weight"):  # embeddings, LM head, norms: untouched
            assert torch.equal(w, before[name]), name
            continue
        assert isinstance(model.get_submodule(name.removesuffix(".weight")), nn.Linear)
        assert w.dtype == torch.bfloat16 and not torch.equal(w, before[name]), name
        # the FP8 round trip of the bf16 weight, and exactly representable: quantizing it again gives
        # the same FP8 values, which dequantize to the same bf16 weight
        q, s = quantize_fp8_per_channel(before[name])
        assert torch.equal(w, dequantize_fp8(q, s, dtype=torch.bfloat16)), name
        q2, s2 = quantize_fp8_per_channel(w)
        assert torch.equal(codes(q2), codes(q)), name
        torch.testing.assert_close(dequantize_fp8(q2, s2, dtype=torch.bfloat16), w, atol=0, rtol=2**-7)
    # the stacked q/k/v rows keep scales of their own: k_proj's rows are not scaled by q_proj's
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.shards == {"q_proj": 64, "k_proj": 32, "v_proj": 32}
    want, got = prefill_logits(base, PROMPT), prefill_logits(model, PROMPT)
    assert (got - want).norm() / want.norm() < 0.05


def test_fp8_linears_replace_the_dense_ones_off_fake():
    """`fake=False` (CUDA's path; here the Triton GEMM in the interpreter): each decoder linear is an
    Fp8Linear of the same FP8 weights the fake quantization rounds to, and the logits agree."""
    fake, model = random_tiny_llama(), random_tiny_llama()
    quantize_linears(fake, "cpu", torch.bfloat16)
    assert quantize_linears(model, "cpu", torch.bfloat16, fake=False) == 8
    qkv = model.model.layers[1].self_attn.qkv_proj
    assert isinstance(qkv, Fp8Linear) and qkv.weight.dtype == FP8_DTYPE and qkv.weight_scale.shape == (128,)
    assert qkv.shards == {"q_proj": 64, "k_proj": 32, "v_proj": 32} and qkv.bias is None
    assert torch.equal(qkv.dequantized(torch.bfloat16), fake.model.layers[1].self_attn.qkv_proj.weight)
    assert isinstance(model.lm_head, nn.Linear) and model.lm_head.weight.dtype == torch.bfloat16
    want = prefill_logits(fake, PROMPT)
    got = prefill_logits(model, PROMPT)
    assert (got - want).norm() / want.norm() < 0.02


def test_skip_matches_whole_name_parts():
    """DeepSeek's router is `mlp.gate`: skipped; Llama's `gate_up_proj` is not; nothing outside the
    decoder layers is touched."""

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(16, 4, bias=False)
            self.gate_up_proj = nn.Linear(16, 32, bias=True)

    model = nn.Module()
    model.model = nn.Module()
    model.model.layers = nn.ModuleList([Mlp()])
    model.lm_head = nn.Linear(16, 8)
    router, lm_head = model.model.layers[0].gate.weight.clone(), model.lm_head.weight.clone()
    assert quantize_linears(model, "cpu", torch.float32, fake=False) == 1
    assert isinstance(model.model.layers[0].gate_up_proj, Fp8Linear)
    assert model.model.layers[0].gate_up_proj.bias.shape == (32,)
    assert torch.equal(model.model.layers[0].gate.weight, router) and torch.equal(model.lm_head.weight, lm_head)


def test_fp8_linear_names_its_block_scales_as_deepseek_does():
    layer = Fp8Linear(7168, 1536, block=128, device="meta")
    params = dict(layer.named_parameters())
    assert params.keys() == {"weight", "weight_scale_inv"}
    assert params["weight"].dtype == FP8_DTYPE and params["weight_scale_inv"].shape == (12, 56)
    assert dict(Fp8Linear(64, 32, bias=True).named_parameters()).keys() == {"weight", "weight_scale", "bias"}
    w_fp8, scale = fp8_weight(40, 200, 128, seed=5)
    layer = Fp8Linear(200, 40, block=128)
    layer.weight.data, layer.weight_scale_inv.data = w_fp8, scale
    x = torch.randn(3, 200)
    assert_close(layer(x), fp8_linear_reference(x, w_fp8, scale, None, 128), torch.float32)


def test_load_model_quantizes_when_asked(tiny_llama):
    folder, _ = tiny_llama
    config = ModelConfig.from_folder(folder)
    plain = load_model(folder, config, torch.float32, torch.device("cpu"))
    model = load_model(folder, config, torch.float32, torch.device("cpu"), quantization="fp8")
    w, w0 = model.model.layers[0].mlp.down_proj.weight, plain.model.layers[0].mlp.down_proj.weight
    assert torch.equal(w, dequantize_fp8(*quantize_fp8_per_channel(w0)))
    assert torch.equal(model.lm_head.weight, plain.lm_head.weight)


def test_the_engine_computes_from_the_rounded_weights_beside_gguf_blocks(tmp_path):
    """A model folder may keep GGUF blocks of its weights for the CPU kernels (the demo model does):
    FP8-rounded weights no longer match them, so the engine computes from the rounded dense weights
    instead of refusing the folder."""
    from test_cpu_quant import blockify
    from transformers import LlamaConfig, LlamaForCausalLM

    from sut import LLM, SamplingParams
    from sut.cpu.build import library
    from sut.cpu.quant import BlockQuantLinear, write_gguf_blocks

    if library() is None:
        pytest.skip("no C compiler to build the CPU kernels: no GGUF blocks are used anyway")
    torch.manual_seed(5)
    hf = LlamaForCausalLM(LlamaConfig(**TINY_CONFIG)).eval()
    tensors = blockify(hf)
    hf.save_pretrained(tmp_path)
    write_gguf_blocks(tensors, tmp_path)
    settings = dict(dtype="float32", max_model_len=64, num_kv_blocks=8)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for quantization, blocks in ((None, True), ("fp8", False)):
        llm = LLM(tmp_path, quantization=quantization, **settings)
        modules = llm.engine.runner.model.modules()
        assert any(isinstance(m, BlockQuantLinear) for m in modules) == blocks, quantization
        assert len(llm.generate([[1, 5, 9]], greedy)[0].token_ids) == 4


def test_the_engine_setting_names_its_values():
    assert EngineConfig.from_kwargs(quantization="fp8").quantization == "fp8"
    assert EngineConfig.from_kwargs().quantization is None
    with pytest.raises(ConfigError) as refused:
        EngineConfig.from_kwargs(quantization="int4")
    assert str(refused.value) == "engine setting quantization must be one of ['fp8'] or None, got 'int4'"


# The GPU checks


def test_fp8_checks_run_at_a_tiny_scale():
    from kernels.checks import fp8 as fp8_checks

    rows = fp8_checks.fp8_cases(DEVICE, scale=64)
    assert len(rows) == 3 * 3 + 3 * 3 + 3  # (2 bf16 + 1 fp32) per linear shape, (2 bf16 + 1 fp32) MoE
    failed = [r for r in rows if not r["ok"]]
    assert not failed, failed
    assert {"case", "dtype", "ok", "max_abs_err", "error"} == rows[0].keys()


def test_fp8_and_int16_activations_are_refused_together():
    """int16 activations compute from the GGUF blocks, which FP8's rounded weights replace: refused, not ignored."""
    with pytest.raises(ConfigError, match="quantization='fp8' and cpu.int16_activations do not go together"):
        EngineConfig.from_kwargs(quantization="fp8", cpu={"int16_activations": True, "quantized_weights": True})

"""The oneDNN-packed linear layers the engine uses on CPU compute what nn.Linear computes."""

import pytest
import torch
from torch import nn

from sut import LLMEngine
from sut.cpu.linear import PackedLinear, onednn_available, pack_linears, packable_dtypes

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")

TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 64, 300])
def test_packed_linear_matches_nn_linear(dtype, bias, rows):
    """Where this CPU has no oneDNN bf16 path, bf16 layers stay nn.Linear: that is checked instead."""
    torch.manual_seed(rows)
    linear = nn.Linear(96, 160, bias=bias).to(dtype)
    x = torch.randn(rows, 96, dtype=dtype)
    expected = linear(x)
    model = nn.Sequential(linear)
    assert pack_linears(model) == (dtype in packable_dtypes())
    assert isinstance(model[0], PackedLinear) == (dtype in packable_dtypes())
    got = model(x)
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), **TOLERANCE[dtype])


def test_packed_linear_takes_batched_and_strided_input():
    linear = nn.Linear(32, 48)
    x = torch.randn(4, 5, 64)[..., ::2]  # [4, 5, 32], not contiguous
    torch.testing.assert_close(PackedLinear(linear)(x), linear(x), atol=1e-5, rtol=1e-5)


def test_pack_linears_replaces_every_linear_of_a_packable_dtype():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)), nn.Linear(4, 4).half())
    assert pack_linears(model) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    assert isinstance(model[3], nn.Linear)  # fp16 stays as it was


def test_cpu_engine_runs_on_packed_linears(tiny_llama):
    engine = LLMEngine(tiny_llama[0], device="cpu")
    model = engine.runner.model
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.model.layers[0].self_attn.qkv_proj, PackedLinear)

"""The CPU engine's C ops (sut/cpu/ops.py) at every instruction-set level this CPU runs, each
against its PyTorch reference: decode attention straight from the paged cache (alone and inside a
mixed step through paged_attention), RMSNorm with and without the residual add, rope, the KV-cache
write and SiLU-and-mul."""

import pytest
import torch

from kernels import TORCH_OPS
from kernels.attention import AttentionMetadata, paged_attention
from kernels.checks.compare import random_paged_cache
from kernels.decode_attention import decode_attention_reference
from sut.cpu.build import library
from sut.cpu.ops import c_ops
from tests.helpers import LEVELS

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler to build the CPU kernels")
EXACT = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (4, 4, 32), (8, 2, 128), (6, 3, 16)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_attention_matches_reference(level, heads, kv_heads, dim, block_size):
    g = torch.Generator().manual_seed(heads + block_size)
    lens = [2, block_size - 1, block_size, block_size + 1, 37, 300]
    k_cache, v_cache, tables = random_paged_cache(lens, kv_heads, dim, block_size, torch.float32, "cpu", g)
    q = 3 * torch.randn(len(lens), heads, dim, generator=g)  # peaked softmax, as a trained model's
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cu = torch.arange(len(lens) + 1, dtype=torch.int32)
    meta = AttentionMetadata(torch.full((len(lens),), -1), tables, cu, seq_lens, [1] * len(lens), lens)
    got = c_ops(library(level)).paged_attention(q, None, None, k_cache, v_cache, meta, dim**-0.5)
    want = decode_attention_reference(q, k_cache, v_cache, tables, seq_lens, dim**-0.5)
    torch.testing.assert_close(got, want, **EXACT)


@pytest.mark.parametrize("level", LEVELS)
def test_mixed_step_decodes_by_c_and_chunks_by_sdpa_match_reference(level):
    """A step with a prefill chunk over cached context, a fresh prompt and two decodes: the same as
    the all-PyTorch op."""
    g = torch.Generator().manual_seed(0)
    query_lens, lens = [1, 5, 1, 7], [40, 21, 3, 7]
    k_cache, v_cache, tables = random_paged_cache(lens, 3, 64, 16, torch.float32, "cpu", g)
    q = torch.randn(sum(query_lens), 9, 64, generator=g)
    k, v = torch.randn(7, 3, 64, generator=g), torch.randn(7, 3, 64, generator=g)  # the fresh prompt's
    cu = torch.tensor([0, 1, 6, 7, 14], dtype=torch.int32)

    def meta():
        return AttentionMetadata(
            torch.full((14,), -1), tables, cu, torch.tensor(lens, dtype=torch.int32), query_lens, lens
        )

    # the fresh prompt (no cached context) attends to this step's k, v: give the reference the same
    k_fresh, v_fresh = torch.zeros(14, 3, 64), torch.zeros(14, 3, 64)
    k_fresh[7:], v_fresh[7:] = k, v
    got = c_ops(library(level)).paged_attention(q, k_fresh, v_fresh, k_cache, v_cache, meta(), 0.125)
    want = paged_attention(q, k_fresh, v_fresh, k_cache, v_cache, meta(), 0.125)
    torch.testing.assert_close(got, want, **EXACT)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows, dim", [(1, 576), (3, 64), (70, 100), (600, 576)])  # 600 x 576: the threaded path
def test_rms_norms_match_reference(level, rows, dim):
    g = torch.Generator().manual_seed(rows)
    x, residual, weight = (
        torch.randn(rows, dim, generator=g),
        torch.randn(rows, dim, generator=g),
        torch.randn(dim, generator=g),
    )
    ops = c_ops(library(level))
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), TORCH_OPS.rms_norm(x, weight, 1e-5), **EXACT)
    for got, want in zip(
        ops.add_rms_norm(x, residual, weight, 1e-5), TORCH_OPS.add_rms_norm(x, residual, weight, 1e-5)
    ):
        torch.testing.assert_close(got, want, **EXACT)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_rotary_of_a_fused_qkv_output_matches_reference(level, tokens):
    """q and k as the model has them: strided views of one q/k/v projection output."""
    g = torch.Generator().manual_seed(tokens)
    heads, kv_heads, dim = 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g)
    angles = torch.rand(tokens, dim // 2, generator=g) * 100
    cos, sin = torch.cat((angles.cos(),) * 2, -1), torch.cat((angles.sin(),) * 2, -1)

    def split(t):
        q, k, _ = t.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)

    want_q, want_k = TORCH_OPS.rotary(*split(qkv.clone()), cos, sin)
    got_q, got_k = c_ops(library(level)).rotary(*split(qkv), cos, sin)
    assert got_q.is_contiguous()  # the C decode attention reads q so
    torch.testing.assert_close(got_q, want_q, **EXACT)
    torch.testing.assert_close(got_k, want_k, **EXACT)


@pytest.mark.parametrize("level", LEVELS)
def test_kv_cache_write_matches_reference(level):
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(6, 2 * 3 * 64, generator=g)
    k, v = (t.view(6, 3, 64) for t in kv.chunk(2, dim=-1))  # strided, as split from the projection
    slots = torch.tensor([5, -1, 0, 17, -1, 31])
    caches = [torch.zeros(4, 8, 3, 64) for _ in range(4)]
    TORCH_OPS.store_kvcache(k, v, caches[0], caches[1], slots)
    c_ops(library(level)).store_kvcache(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [1, 4, 40])  # 40 x 1536: the threaded path
def test_silu_and_mul_matches_reference(level, rows):
    gate_up = 6 * torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(rows))
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, -0.0])
    torch.testing.assert_close(c_ops(library(level)).silu_and_mul(gate_up), TORCH_OPS.silu_and_mul(gate_up), **EXACT)


def test_engine_takes_the_c_ops_of_its_level(tiny_llama):
    from sut import LLMEngine

    engine = LLMEngine(tiny_llama[0], device="cpu")
    assert engine.runner.model.ops.name == f"torch+c-{library().level}"

"""The CPU engine's decode attention (sut/cpu_attention.c, read from the paged cache in place)
against the PyTorch reference, alone and inside a mixed step through paged_attention."""

import pytest
import torch

from kernels.attention import AttentionMetadata, paged_attention
from kernels.checks import random_paged_cache
from kernels.decode_attention import decode_attention_reference
from sut.cpu_attention import cpu_ops, paged_attention_cpu
from sut.cpu_quant import library

pytestmark = pytest.mark.skipif(library() is None or not library().decode_attention_available(9, 3, 64),
                                reason="the C decode attention needs a C compiler and AVX-512")


@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (4, 4, 32), (8, 2, 128), (6, 3, 16)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_attention_matches_reference(heads, kv_heads, dim, block_size):
    g = torch.Generator().manual_seed(heads + block_size)
    lens = [2, block_size - 1, block_size, block_size + 1, 37, 300]
    k_cache, v_cache, tables = random_paged_cache(lens, kv_heads, dim, block_size, torch.float32, "cpu", g)
    q = 3 * torch.randn(len(lens), heads, dim, generator=g)  # peaked softmax, as a trained model's
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cu = torch.arange(len(lens) + 1, dtype=torch.int32)
    meta = AttentionMetadata(torch.full((len(lens),), -1), tables, cu, seq_lens, [1] * len(lens), lens)
    got = paged_attention_cpu(q, None, None, k_cache, v_cache, meta, dim ** -0.5)
    want = decode_attention_reference(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_mixed_step_decodes_by_c_and_chunks_by_sdpa_match_reference():
    """A step with a prefill chunk over cached context, a fresh prompt and two decodes: the same as
    the all-PyTorch op."""
    g = torch.Generator().manual_seed(0)
    query_lens, lens = [1, 5, 1, 7], [40, 21, 3, 7]
    k_cache, v_cache, tables = random_paged_cache(lens, 3, 64, 16, torch.float32, "cpu", g)
    q = torch.randn(sum(query_lens), 9, 64, generator=g)
    k, v = torch.randn(7, 3, 64, generator=g), torch.randn(7, 3, 64, generator=g)  # the fresh prompt's
    cu = torch.tensor([0, 1, 6, 7, 14], dtype=torch.int32)

    def meta():
        return AttentionMetadata(torch.full((14,), -1), tables, cu, torch.tensor(lens, dtype=torch.int32), query_lens, lens)

    # the fresh prompt (no cached context) attends to this step's k, v: give the reference the same
    k_fresh, v_fresh = torch.zeros(14, 3, 64), torch.zeros(14, 3, 64)
    k_fresh[7:], v_fresh[7:] = k, v
    got = paged_attention_cpu(q, k_fresh, v_fresh, k_cache, v_cache, meta(), 0.125)
    want = paged_attention(q, k_fresh, v_fresh, k_cache, v_cache, meta(), 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_cpu_ops_use_the_c_decode_attention():
    assert cpu_ops().name == "torch+c"

"""DeepSeek's MLA (multi-head latent attention) on our paged attention: K's head dim D_K = D_V + D_PE,
V's D_V, V a cache of its own (decompressed: 192 = 128 + 64 against 128) or a view of the K cache's
first D_V dims (absorbed: one 576 = 512 + 64 entry a token, all query heads on one KV head).

Each Triton kernel (in Triton's interpreter on CPU), paged_attention_triton and the CPU op against
attention computed in fp64 from the un-paged keys and values, on small shapes: decode-only steps
(one pass and split-K), prefill with cached context and chunks, mixed steps. Cache slots no token
owns hold NaN (for the CPU op, which reads and masks whole blocks as the engine's zeroed cache
allows, finite garbage in the blocks it reads and NaN in the rest); none may leak. Then the algebra
that makes absorbed MLA right, and the KV-cache write of keys alone."""

import itertools
import os

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported (tests/conftest.py does the same)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.attention import AttentionMetadata, paged_attention, paged_attention_triton  # noqa: E402
from kernels.checks import compare  # noqa: E402
from kernels.decode_attention import decode_attention_triton  # noqa: E402
from kernels.kv_cache import store_kvcache_reference, store_kvcache_triton  # noqa: E402
from kernels.prefill_attention import prefill_attention_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
# (num_q_heads, num_kv_heads, D_K, D_V, V a view of K): absorbed (all heads on one KV head) and
# decompressed (a KV head per query head) MLA, small and at DeepSeek's dims.
ABSORBED_SMALL = [(4, 1, 80, 64, True), (16, 1, 80, 64, True)]
ABSORBED_DEEPSEEK = (16, 1, 576, 512, True)
DECOMPRESSED_SMALL = (4, 4, 48, 32, False)
DECOMPRESSED_DEEPSEEK = (2, 2, 192, 128, False)


def mla_id(shape) -> str:
    heads, kv_heads, d_k, d_v, shared = shape
    return f"{'absorbed' if shared else 'decompressed'}-{heads}/{kv_heads}-{d_k}/{d_v}"


class Step:
    """One step of sequences in a paged MLA cache, and what it takes to check it: `query_lens[i]` of
    sequence i's `seq_lens[i]` tokens are this step's queries (the rest cached context). Keys and
    values are drawn per sequence (`keys[i]`, `values[i]`, in fp64 from the `dtype`-rounded ones;
    absorbed: the values are the keys' first D_V dims), then written to blocks scattered over a
    pool. Block 0 is the tables' padding entry and no sequence's; three more blocks are spares.
    `stale`: "nan", every slot no token owns holds NaN; "finite", the tail slots of the sequences'
    blocks and block 0 hold large finite garbage (what the CPU op may read and mask), spares NaN."""

    def __init__(self, shape, query_lens, seq_lens, block_size, dtype, seed=0, stale="nan"):
        num_q_heads, num_kv_heads, d_k, d_v, shared = shape
        g = torch.Generator().manual_seed(seed)
        self.query_lens, self.seq_lens, self.dtype, self.d_v = list(query_lens), list(seq_lens), dtype, d_v
        self.group, self.scale = num_q_heads // num_kv_heads, d_k**-0.5
        blocks_per_seq = [-(-n // block_size) for n in seq_lens]
        num_blocks = 1 + sum(blocks_per_seq) + 3
        order = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
        k_cache = torch.full((num_blocks, block_size, num_kv_heads, d_k), float("nan"))
        v_cache = None if shared else torch.full((num_blocks, block_size, num_kv_heads, d_v), float("nan"))
        tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 2, dtype=torch.int32)
        self.keys, self.values = [], []
        for i, (n, count) in enumerate(zip(seq_lens, blocks_per_seq)):
            blocks = [order.pop() for _ in range(count)]
            tables[i, :count] = torch.tensor(blocks, dtype=torch.int32)
            keys = torch.randn(n, num_kv_heads, d_k, generator=g).to(dtype)
            values = keys[..., :d_v] if shared else torch.randn(n, num_kv_heads, d_v, generator=g).to(dtype)
            if stale == "finite":
                k_cache[blocks] = 1e4 * torch.randn(count, *k_cache.shape[1:], generator=g)
                if v_cache is not None:
                    v_cache[blocks] = 1e4 * torch.randn(count, *v_cache.shape[1:], generator=g)
            for t in range(n):
                k_cache[blocks[t // block_size], t % block_size] = keys[t].float()
                if v_cache is not None:
                    v_cache[blocks[t // block_size], t % block_size] = values[t].float()
            self.keys.append(keys.double())
            self.values.append(values.double())
        if stale == "finite":
            k_cache[0] = 1e4
            if v_cache is not None:
                v_cache[0] = -1e4
        self.k_cache = k_cache.to(device=DEVICE, dtype=dtype)
        self.v_cache = self.k_cache[..., :d_v] if shared else v_cache.to(device=DEVICE, dtype=dtype)
        assert self.k_cache.isnan().any(), "no stale slot to leak"
        self.block_tables = tables.to(DEVICE)
        self.q = torch.randn(sum(query_lens), num_q_heads, d_k, generator=g).to(device=DEVICE, dtype=dtype)
        # This step's new keys and values (the CPU op attends to them where a sequence has no context).
        self.new_k = torch.cat([k[n - q :] for k, n, q in zip(self.keys, seq_lens, query_lens)]).to(DEVICE, dtype)
        self.new_v = torch.cat([v[n - q :] for v, n, q in zip(self.values, seq_lens, query_lens)]).to(DEVICE, dtype)
        self.cu_seqlens_q = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32, device=DEVICE)
        self.lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)

    def meta(self) -> AttentionMetadata:
        return AttentionMetadata(
            torch.full((len(self.q),), -1, device=DEVICE),
            self.block_tables,
            self.cu_seqlens_q,
            self.lens,
            self.query_lens,
            self.seq_lens,
        )

    def brute_force(self) -> torch.Tensor:
        """fp64 causal attention from the un-paged keys and values: `[num_tokens, num_q_heads, D_V]`."""
        out = []
        q = self.q.double().cpu()
        for i, (n, q_len) in enumerate(zip(self.seq_lens, self.query_lens)):
            keys = self.keys[i].repeat_interleave(self.group, dim=1)
            values = self.values[i].repeat_interleave(self.group, dim=1)
            rows = q[int(self.cu_seqlens_q[i]) : int(self.cu_seqlens_q[i + 1])]
            scores = torch.einsum("thd,nhd->htn", rows, keys) * self.scale
            positions = torch.arange(n - q_len, n)[:, None]
            scores = scores.masked_fill(torch.arange(n)[None, :] > positions, float("-inf"))
            out.append(torch.einsum("htn,nhd->thd", scores.softmax(-1), values))
        return torch.cat(out)

    def check(self, got: torch.Tensor, what: str) -> None:
        assert got.shape == (len(self.q), self.q.shape[1], self.d_v), f"{what}: shape {list(got.shape)}"
        compare.assert_close(got.float().cpu(), self.brute_force().float(), self.dtype, what)


def decode_step(shape, context_lens, block_size, dtype, **kwargs) -> Step:
    return Step(shape, [1] * len(context_lens), context_lens, block_size, dtype, **kwargs)


# Decode-only steps


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ABSORBED_SMALL + [DECOMPRESSED_SMALL], ids=mla_id)
@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_kernel(shape, block_size, dtype):
    """One pass, split-K over 4 splits and as the launcher chooses; contexts of one key, around
    block boundaries and of several blocks."""
    step = decode_step(shape, [1, block_size - 1, block_size + 1, 3 * block_size + 5, 70], block_size, dtype)
    for num_splits in (1, 4, None):
        got = decode_attention_triton(
            step.q, step.k_cache, step.v_cache, step.block_tables, step.lens, step.scale, 70, num_splits
        )
        assert got.shape == (5, shape[0], shape[3])
        step.check(got, f"decode {mla_id(shape)} block_size={block_size} splits={num_splits}")


@pytest.mark.parametrize("num_splits", [2, 8, 16])
def test_decode_split_k_over_many_splits(num_splits):
    """Split-K where some splits hold no keys (contexts of 1 and 3) and others many (300)."""
    step = decode_step(ABSORBED_SMALL[1], [1, 3, 300, 77], 16, torch.float32, seed=num_splits)
    got = decode_attention_triton(
        step.q, step.k_cache, step.v_cache, step.block_tables, step.lens, step.scale, 300, num_splits
    )
    step.check(got, f"decode split-K splits={num_splits}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_tiles_of_query_heads(dtype):
    """A group wider than a program's tile (64 query heads on one KV head, 16 a program: 4 tiles
    a sequence), one pass and split-K; and 32 a program (as for 128 heads on a GPU)."""
    step = decode_step((64, 1, 80, 64, True), [1, 9, 40], 8, dtype)
    for block_h, num_splits in ((16, 1), (16, 4), (32, 2)):
        got = decode_attention_triton(
            step.q,
            step.k_cache,
            step.v_cache,
            step.block_tables,
            step.lens,
            step.scale,
            40,
            num_splits,
            block_h=block_h,
        )
        step.check(got, f"decode head tiles block_h={block_h} splits={num_splits}")


@pytest.mark.parametrize("shape", [ABSORBED_DEEPSEEK, DECOMPRESSED_DEEPSEEK], ids=mla_id)
def test_decode_kernel_at_deepseek_dims(shape):
    step = decode_step(shape, [1, 17, 40], 16, torch.bfloat16)
    for num_splits in (1, 2):
        got = decode_attention_triton(
            step.q, step.k_cache, step.v_cache, step.block_tables, step.lens, step.scale, 40, num_splits
        )
        step.check(got, f"decode {mla_id(shape)} splits={num_splits}")


# Prefill: whole prompts, chunks after cached context, one-token rows, a verify


PREFILL_QUERY_LENS = [9, 5, 1, 4, 1, 13]
PREFILL_SEQ_LENS = [9, 5 + 11, 1, 4 + 20, 30, 13 + 2]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ABSORBED_SMALL + [DECOMPRESSED_SMALL], ids=mla_id)
def test_prefill_kernel(shape, dtype):
    """32-row tiles of 16-key steps: several tiles a sequence, whole groups in a tile (4 or 16
    query heads, 8 or 2 tokens a tile), fully masked steps for a tile's first rows."""
    step = Step(shape, PREFILL_QUERY_LENS, PREFILL_SEQ_LENS, 4, dtype)
    got = prefill_attention_triton(
        step.q, step.k_cache, step.v_cache, step.block_tables, step.cu_seqlens_q, step.lens, step.scale, 32, 16
    )
    step.check(got, f"prefill {mla_id(shape)}")


@pytest.mark.parametrize("block_m", [16, 32])
def test_prefill_tiles_of_query_heads(block_m):
    """A group wider than a tile: 48 query heads on one KV head over tiles of 16 or 32 rows (3 or
    2 head tiles a token, the last one half padded for 32)."""
    step = Step((48, 1, 80, 64, True), PREFILL_QUERY_LENS, PREFILL_SEQ_LENS, 8, torch.float32)
    got = prefill_attention_triton(
        step.q, step.k_cache, step.v_cache, step.block_tables, step.cu_seqlens_q, step.lens, step.scale, block_m, 16
    )
    step.check(got, f"prefill head tiles block_m={block_m}")


@pytest.mark.parametrize("shape", [ABSORBED_DEEPSEEK, DECOMPRESSED_DEEPSEEK], ids=mla_id)
def test_prefill_kernel_at_deepseek_dims_default_tiles(shape):
    """The launcher's own tiles for these dims (32 x 32 absorbed, 128 x 32 decompressed)."""
    step = Step(shape, [7, 3, 1], [7, 3 + 40, 20], 16, torch.bfloat16)
    got = prefill_attention_triton(
        step.q, step.k_cache, step.v_cache, step.block_tables, step.cu_seqlens_q, step.lens, step.scale
    )
    step.check(got, f"prefill {mla_id(shape)}")


# Mixed steps: the whole op, on the Triton kernels and on CPU


MIXED_QUERY_LENS = [1, 1, 1, 4, 9, 6, 1]
MIXED_SEQ_LENS = [2, 17, 90, 40, 9, 6 + 21, 50]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ABSORBED_SMALL + [DECOMPRESSED_SMALL], ids=mla_id)
def test_mixed_step_triton(shape, dtype):
    """Leading decodes on the decode kernel, a verify, a prompt, a chunk and a one-token chunk on
    the prefill kernel; and decode-only and prefill-only steps."""
    for query_lens, seq_lens in (
        (MIXED_QUERY_LENS, MIXED_SEQ_LENS),
        (MIXED_QUERY_LENS[:3], MIXED_SEQ_LENS[:3]),
        (MIXED_QUERY_LENS[3:], MIXED_SEQ_LENS[3:]),
    ):
        step = Step(shape, query_lens, seq_lens, 8, dtype)
        got = paged_attention_triton(step.q, None, None, step.k_cache, step.v_cache, step.meta(), step.scale)
        step.check(got, f"paged_attention_triton {mla_id(shape)} {query_lens}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", ABSORBED_SMALL + [DECOMPRESSED_SMALL, ABSORBED_DEEPSEEK, DECOMPRESSED_DEEPSEEK], ids=mla_id
)
def test_mixed_step_cpu_op(shape, dtype):
    """The CPU op (SDPA) on the same steps; absorbed, this step's values given as None (the
    keys' first D_V dims) and as that view; more decodes than one SDPA group takes."""
    many_decodes = ([1] * 10 + MIXED_QUERY_LENS[3:], [3 * i + 2 for i in range(10)] + MIXED_SEQ_LENS[3:])
    for query_lens, seq_lens in ((MIXED_QUERY_LENS, MIXED_SEQ_LENS), many_decodes):
        step = Step(shape, query_lens, seq_lens, 8, dtype, stale="finite")
        new_vs = [None, step.new_k[..., : shape[3]]] if shape[4] else [step.new_v]
        for new_v in new_vs:
            got = paged_attention(step.q, step.new_k, new_v, step.k_cache, step.v_cache, step.meta(), step.scale)
            step.check(got, f"paged_attention {mla_id(shape)} {query_lens} v={'None' if new_v is None else 'given'}")


def test_cpu_op_ignores_the_decode_kernel_for_mla():
    """The CPU engine's C decode kernel takes one head dim for K and V: with MLA's the op's SDPA
    does the decodes instead."""
    step = Step(ABSORBED_SMALL[0], MIXED_QUERY_LENS, MIXED_SEQ_LENS, 8, torch.float32, stale="finite")

    def decode_kernel(*args):
        raise AssertionError("called")

    got = paged_attention(
        step.q, step.new_k, None, step.k_cache, step.v_cache, step.meta(), step.scale, decode_kernel=decode_kernel
    )
    step.check(got, "paged_attention with a decode kernel")


def test_bad_head_dims_are_refused():
    """D_V and D_PE must each be a power of two >= 16 (tl.dot), and V no wider than K."""
    step = decode_step(ABSORBED_SMALL[0], [5], 4, torch.float32)
    k_cache = step.k_cache
    for v_dim in (48, 72):  # D_V 48, D_PE 8
        with pytest.raises(ValueError, match="power of two"):
            decode_attention_triton(step.q, k_cache, k_cache[..., :v_dim], step.block_tables, step.lens, 1.0, 5)
    with pytest.raises(AssertionError, match="larger than K"):
        wide = torch.zeros(*k_cache.shape[:3], 128)
        prefill_attention_triton(step.q, k_cache, wide, step.block_tables, step.cu_seqlens_q, step.lens, 1.0)


# Absorbed MLA is decompressed MLA


def test_absorbed_attention_equals_decompressed():
    """DeepSeek's attention per head h: keys k_h = [W_UK_h c, k_pe] and values v_h = W_UV_h c from
    a latent c a token (and a rope key shared by the heads). Decompressed: softmax((q_nope .
    W_UK_h c + q_pe . k_pe) s) . W_UV_h c. Absorbed: one KV head K = [c, k_pe], V = c, queries
    q_abs = [q_nope W_UK_h, q_pe]; then W_UV_h applied to the output. Equal up to fp32 rounding,
    through both ops (CPU and Triton) on a step with decodes, a chunk after context and a prompt."""
    g = torch.Generator().manual_seed(7)
    heads, nope, rope, rank, v_dim, block_size = 4, 32, 16, 64, 32, 4
    query_lens, seq_lens = [1, 1, 5, 7], [9, 14, 12, 7]
    w_uk = torch.randn(heads, nope, rank, generator=g) / rank**0.5
    w_uv = torch.randn(heads, v_dim, rank, generator=g) / rank**0.5
    latents = [torch.randn(n, rank, generator=g) for n in seq_lens]
    rope_keys = [torch.randn(n, rope, generator=g) for n in seq_lens]
    q_nope = torch.randn(sum(query_lens), heads, nope, generator=g)
    q_pe = torch.randn(sum(query_lens), heads, rope, generator=g)
    scale = (nope + rope) ** -0.5

    # fp64, decompressed, straight from the formula
    want = []
    cu = [0, *itertools.accumulate(query_lens)]
    for i, (n, q_len) in enumerate(zip(seq_lens, query_lens)):
        c, k_pe = latents[i].double(), rope_keys[i].double()
        k_nope = torch.einsum("hdr,nr->nhd", w_uk.double(), c)
        values = torch.einsum("hdr,nr->nhd", w_uv.double(), c)
        rows = slice(cu[i], cu[i + 1])
        scores = torch.einsum("thd,nhd->htn", q_nope[rows].double(), k_nope)
        scores += torch.einsum("thd,nd->htn", q_pe[rows].double(), k_pe)
        visible = torch.arange(n)[None, :] <= torch.arange(n - q_len, n)[:, None]
        probs = (scores * scale).masked_fill(~visible, float("-inf")).softmax(-1)
        want.append(torch.einsum("htn,nhd->thd", probs, values))
    want = torch.cat(want).float()

    # The same tokens in paged caches: absorbed (one 80-dim entry) and decompressed (48 / 32 a head).
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 1
    order = torch.randperm(num_blocks - 1, generator=g) + 1
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    latent_cache = torch.zeros(num_blocks, block_size, 1, rank + rope)
    k_cache = torch.zeros(num_blocks, block_size, heads, nope + rope)
    v_cache = torch.zeros(num_blocks, block_size, heads, v_dim)
    taken = 0
    for i, n in enumerate(seq_lens):
        tables[i, : blocks_per_seq[i]] = order[taken : taken + blocks_per_seq[i]].int()
        taken += blocks_per_seq[i]
        slots = tables[i].long().repeat_interleave(block_size)[:n] * block_size + torch.arange(n) % block_size
        entries = torch.cat([latents[i], rope_keys[i]], -1)[:, None]
        store_kvcache_reference(entries, None, latent_cache, latent_cache[..., :rank], slots)
        keys = torch.cat(
            [torch.einsum("hdr,nr->nhd", w_uk, latents[i]), rope_keys[i][:, None].expand(-1, heads, -1)], -1
        )
        store_kvcache_reference(keys, torch.einsum("hdr,nr->nhd", w_uv, latents[i]), k_cache, v_cache, slots)
    meta = AttentionMetadata(
        torch.zeros(0),
        tables,
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        query_lens,
        seq_lens,
    )
    q_abs = torch.cat([torch.einsum("thd,hdr->thr", q_nope, w_uk), q_pe], -1)
    q_dec = torch.cat([q_nope, q_pe], -1)
    new = [slice(n - q, n) for n, q in zip(seq_lens, query_lens)]
    new_entries = torch.cat([torch.cat([latents[i], rope_keys[i]], -1)[s] for i, s in enumerate(new)])[:, None]
    for name, op in (("paged_attention", paged_attention), ("paged_attention_triton", paged_attention_triton)):
        meta.reference_plan = None
        latent_out = op(q_abs, new_entries, None, latent_cache, latent_cache[..., :rank], meta, scale)
        got = torch.einsum("thr,hdr->thd", latent_out, w_uv)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name} absorbed: {m}")
        new_k = torch.cat([k_cache[tables[i].long()].flatten(0, 1)[s] for i, s in enumerate(new)])
        new_v = torch.cat([v_cache[tables[i].long()].flatten(0, 1)[s] for i, s in enumerate(new)])
        got = op(q_dec, new_k, new_v, k_cache, v_cache, meta, scale)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name} decompressed: {m}")


# KV-cache write


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_store_kvcache_keys_only_and_own_value_dims(dtype):
    """Absorbed: one 80- or 576-dim entry a token and no values (the V cache is the K cache's
    view); decompressed: 48- and 32-dim (192 and 128) keys and values in caches of their own. Both
    implementations against each other (`compare.check_store_kvcache`) and against plain indexing."""
    for head_dim, v_head_dim, keys_only, kv_heads in ((80, 64, True, 1), (576, 512, True, 1), (48, 32, False, 2)):
        got, want = compare.check_store_kvcache(
            11, kv_heads, head_dim, 4, dtype, DEVICE, v_head_dim=v_head_dim, keys_only=keys_only
        )
        assert torch.equal(got, want), f"store {head_dim}/{v_head_dim} keys_only={keys_only}"
    g = torch.Generator().manual_seed(3)
    k = torch.randn(6, 1, 80, generator=g).to(device=DEVICE, dtype=dtype)
    slots = torch.tensor([5, -1, 0, 11, 2, -1], device=DEVICE)
    for store in (store_kvcache_reference, store_kvcache_triton):
        cache = torch.zeros(4, 4, 1, 80, device=DEVICE, dtype=dtype)
        store(k, None, cache, cache[..., :64], slots)
        flat = cache.view(16, 1, 80)
        kept = slots >= 0
        assert torch.equal(flat[slots[kept]], k[kept]), store.__name__
        assert int((flat.abs().sum((1, 2)) > 0).sum()) == int(kept.sum()), f"{store.__name__} wrote elsewhere"

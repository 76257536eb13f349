"""Paged attention over a block-structured KV cache: the op the model calls.

Layout (as in vLLM and flash-attn): each layer's cache is `[num_blocks, block_size, num_kv_heads,
head_dim]`; a sequence's token t lives in block `block_tables[seq, t // block_size]` at offset
`t % block_size`. Queries are flat over the batch (`cu_seqlens_q` marks where each sequence's query
tokens start); sequence i has `seq_lens[i]` tokens in all, of which the last `query_lens[i]` are
this step's queries, so query row r of it sits at position `seq_lens[i] - query_lens[i] + r` and
sees keys up to and including that position. One op serves prefill chunks and decodes alike.

`paged_attention` is the PyTorch op the engine runs on CPU (planned per step for speed there);
`paged_attention_triton` runs the Triton kernels (decode_attention.py, prefill_attention.py).
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels.decode_attention import decode_attention_triton
from kernels.prefill_attention import prefill_attention_triton

DECODE_GROUP = 8  # decodes per attention call in the CPU reference (see _plan)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot of each new token, -1 = do not store
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, tokens per sequence including this step's
    query_lens_host: list[int]  # the same lengths as Python ints, for host-side loops
    seq_lens_host: list[int]
    max_query_len: int = field(init=False)
    max_seq_len: int = field(init=False)
    num_decodes: int = field(init=False)  # the leading sequences with one query token each
    max_decode_seq_len: int = field(init=False)
    rest_cu_seqlens_q: torch.Tensor | None = field(init=False)  # cu_seqlens_q of the others, from 0
    reference_plan: list | None = field(default=None, repr=False)  # built by the first layer, reused by the rest

    def __post_init__(self):
        # Once per step, not per layer: the Triton launchers size their grids and split the rows by these.
        self.max_query_len = max(self.query_lens_host, default=0)
        self.max_seq_len = max(self.seq_lens_host, default=0)
        n = len(self.query_lens_host)
        self.num_decodes = next((i for i, q in enumerate(self.query_lens_host) if q != 1), n)
        self.max_decode_seq_len = max(self.seq_lens_host[: self.num_decodes], default=0)
        mixed = 0 < self.num_decodes < n
        self.rest_cu_seqlens_q = self.cu_seqlens_q[self.num_decodes :] - self.num_decodes if mixed else None


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    decode_kernel=None,
) -> torch.Tensor:
    """Causal attention of `q [num_tokens, num_heads, head_dim]` over each sequence's cached K/V.

    `k`, `v` are this step's new keys and values (already stored in the cache); a sequence with no
    cached context attends to them directly instead of gathering them back from the pool.
    `decode_kernel(q, out, group, k_cache, v_cache, scale)`, when given, computes all the decodes
    (one `_DecodeGroup`) into `out` in place of SDPA (the CPU engine's C kernel, sut/cpu/ops.py).
    """
    if meta.reference_plan is None:
        meta.reference_plan = _plan(meta, k_cache.shape[1], q.device, DECODE_GROUP if decode_kernel is None else None)
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    out = torch.empty_like(q)
    for item in meta.reference_plan:
        if isinstance(item, _DecodeGroup) and decode_kernel is not None:
            decode_kernel(q, out, item, k_cache, v_cache, scale)
            continue
        if isinstance(item, _DecodeGroup):
            n = len(item.q_rows)
            keys = _gather_blocks(k_cache, item.blocks).view(n, -1, kv_heads, head_dim)[:, : item.max_len]
            values = _gather_blocks(v_cache, item.blocks).view(n, -1, kv_heads, head_dim)[:, : item.max_len]
            # GQA without copying K/V per query head: the query heads sharing a KV head become
            # that head's "query tokens" (kv head j serves query heads j*group .. (j+1)*group-1).
            o = F.scaled_dot_product_attention(
                q[item.q_rows].view(n, kv_heads, -1, head_dim),
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=item.mask,
                scale=scale,
            )
            out[item.q_rows] = o.reshape(n, -1, head_dim)
            continue
        if item.blocks is None:
            keys, values = k[item.start : item.end], v[item.start : item.end]
        else:
            keys = _gather_blocks(k_cache, item.blocks)[: item.seq_len]
            values = _gather_blocks(v_cache, item.blocks)[: item.seq_len]
        # SDPA wants heads before tokens: [1, heads, tokens, head_dim].
        o = F.scaled_dot_product_attention(
            q[item.start : item.end].transpose(0, 1)[None],
            keys.transpose(0, 1)[None],
            values.transpose(0, 1)[None],
            attn_mask=item.mask,
            is_causal=item.causal,
            scale=scale,
            enable_gqa=True,
        )
        out[item.start : item.end] = o[0].transpose(0, 1)
    return out


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """`paged_attention` on the Triton kernels, split by row kind: the step's leading one-token
    queries (the scheduler puts plain decodes first) on the decode kernel (split-K over long
    contexts), the rest (prompts, chunks, verifications) on the prefill kernel, where a decode
    would fill a tile of up to 128 rows with its few heads. A one-token query further on is still
    right there, only slower."""
    d, n = meta.num_decodes, len(meta.query_lens_host)
    if d == n:
        return decode_attention_triton(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, meta.max_seq_len)
    if d == 0:
        return prefill_attention_triton(q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, scale)
    out = torch.empty_like(q)
    decode_attention_triton(
        q[:d], k_cache, v_cache, meta.block_tables[:d], meta.seq_lens[:d], scale, meta.max_decode_seq_len, out=out[:d]
    )
    prefill_attention_triton(
        q[d:], k_cache, v_cache, meta.block_tables[d:], meta.rest_cu_seqlens_q, meta.seq_lens[d:], scale, out=out[d:]
    )
    return out


@dataclass
class _DecodeGroup:
    q_rows: torch.Tensor  # query rows of these single-token sequences
    tables: torch.Tensor  # their block tables [n, blocks of the longest] int32
    seq_lens: torch.Tensor  # [n] int32
    max_len: int
    mask: torch.Tensor  # [n, 1, 1, max_len]: which gathered positions are real

    @property
    def blocks(self) -> torch.Tensor:
        return self.tables.flatten()


@dataclass
class _Sequence:
    start: int
    end: int
    seq_len: int
    blocks: torch.Tensor | None  # None: no cached context, use this step's k and v
    mask: torch.Tensor | None
    causal: bool


def _plan(meta: AttentionMetadata, block_size: int, device, group_size: int | None) -> list:
    """The per-step work list of the reference, shared by every layer: decodes in groups of
    `group_size` (all in one if None) of similar length (one SDPA call each; a group's gathered K/V
    stays small enough to be read back from cache, ~5x faster on CPU than one call for all), other
    sequences one by one."""
    plan: list = []
    decodes = [
        i
        for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host))
        if q_len == 1 and seq_len > 1
    ]
    # Grouped by length: a group gathers and attends over its longest context.
    decodes.sort(key=lambda i: meta.seq_lens_host[i])
    group_size = group_size or max(len(decodes), 1)
    for g in range(0, len(decodes), group_size):
        group = decodes[g : g + group_size]
        rows = torch.tensor(group, device=device)
        max_len = max(meta.seq_lens_host[i] for i in group)
        tables = meta.block_tables[rows, : -(-max_len // block_size)].contiguous()
        mask = torch.arange(max_len, device=device)[None, :] < meta.seq_lens[rows][:, None]
        plan.append(
            _DecodeGroup(
                meta.cu_seqlens_q[rows].long(),
                tables,
                meta.seq_lens[rows].contiguous(),
                max_len,
                mask[:, None, None, :],
            )
        )
    start = 0
    decodes = set(decodes)
    for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host)):
        if i not in decodes:
            blocks = mask = None
            if seq_len > q_len:
                blocks = meta.block_tables[i, : -(-seq_len // block_size)]
                positions = torch.arange(seq_len - q_len, seq_len, device=device)
                mask = torch.arange(seq_len, device=device)[None, :] <= positions[:, None]
            # No cached context: plain causal (SDPA then skips the masked half). A single query
            # with no context sees only itself.
            plan.append(_Sequence(start, start + q_len, seq_len, blocks, mask, causal=1 < q_len == seq_len))
        start += q_len
    return plan


def _gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The cache blocks `blocks` as one run of tokens `[len(blocks) * block_size, kv_heads, head_dim]`
    (index_select copies whole blocks; on CPU it is ~10x faster than advanced indexing)."""
    return cache.index_select(0, blocks).flatten(0, 1)

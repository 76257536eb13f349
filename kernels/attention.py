"""Paged attention over a block-structured KV cache, and the KV-cache write by slot mapping.

Layout (as in vLLM and flash-attn): each layer's cache is `[num_blocks, block_size, num_kv_heads,
head_dim]`; a sequence's token t lives in block `block_tables[seq, t // block_size]` at offset
`t % block_size`. Queries are flat over the batch (`cu_seqlens_q` marks where each sequence's query
tokens start); sequence i has `seq_lens[i]` tokens in all, of which the last `query_lens[i]` are
this step's queries, so query row r of it sits at position `seq_lens[i] - query_lens[i] + r` and
sees keys up to and including that position. One op serves prefill chunks and decodes alike.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot of each new token, -1 = do not store
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, tokens per sequence including this step's
    query_lens_host: list[int]  # the same lengths as Python ints, for host-side loops
    seq_lens_host: list[int]


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write new keys and values `[num_tokens, num_kv_heads, head_dim]` into their cache slots."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of `q [num_tokens, num_heads, head_dim]` over each sequence's cached K/V.

    `k`, `v` are this step's new keys and values (already stored in the cache); a sequence with no
    cached context attends to them directly instead of gathering them back from the pool.
    """
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    decodes = [i for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host))
               if q_len == 1 and seq_len > 1]
    if len(decodes) > 1:
        _batched_decode(q, k_cache, v_cache, meta, scale, decodes, out)
    decodes = set(decodes) if len(decodes) > 1 else set()
    starts = _prefix_sums(meta.query_lens_host)
    for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host)):
        if i in decodes:
            continue
        start, end = starts[i], starts[i] + q_len
        if seq_len == q_len:
            keys, values = k[start:end], v[start:end]
        else:
            blocks = meta.block_tables[i, : -(-seq_len // block_size)]
            keys = _gather_blocks(k_cache, blocks)[:seq_len]
            values = _gather_blocks(v_cache, blocks)[:seq_len]
        mask = None
        if q_len > 1:
            positions = torch.arange(seq_len - q_len, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]
        # SDPA wants heads before tokens: [1, heads, tokens, head_dim].
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=mask, scale=scale, enable_gqa=True,
        )
        out[start:end] = o[0].transpose(0, 1)
    return out


def _batched_decode(q, k_cache, v_cache, meta, scale, decodes, out):
    """All single-token queries in one SDPA call over their gathered, length-masked contexts
    (one call instead of one per sequence: on CPU the per-call overhead dominates decode)."""
    rows = torch.tensor(decodes, device=q.device)
    seq_lens = meta.seq_lens[rows]
    max_len = max(meta.seq_lens_host[i] for i in decodes)
    block_size = k_cache.shape[1]
    tables = meta.block_tables[rows, : -(-max_len // block_size)]
    n, kv_heads, head_dim = len(decodes), k_cache.shape[2], k_cache.shape[3]
    keys = _gather_blocks(k_cache, tables.flatten()).view(n, -1, kv_heads, head_dim)[:, :max_len]
    values = _gather_blocks(v_cache, tables.flatten()).view(n, -1, kv_heads, head_dim)[:, :max_len]
    mask = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None]
    q_rows = meta.cu_seqlens_q[rows].long()
    # GQA without copying K/V per query head: the query heads sharing a KV head become that
    # head's "query tokens" (kv head j serves query heads j*group .. (j+1)*group-1).
    grouped_q = q[q_rows].view(n, kv_heads, -1, head_dim)
    o = F.scaled_dot_product_attention(
        grouped_q, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask[:, None, None, :], scale=scale,
    )
    out[q_rows] = o.reshape(n, -1, head_dim)


def _gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The cache blocks `blocks` as one run of tokens `[len(blocks) * block_size, kv_heads, head_dim]`
    (index_select copies whole blocks; on CPU it is ~10x faster than advanced indexing)."""
    return cache.index_select(0, blocks).flatten(0, 1)


def _prefix_sums(lengths):
    sums = [0]
    for n in lengths:
        sums.append(sums[-1] + n)
    return sums

"""Paged attention over a block-structured KV cache: the op the model calls.

Layout (as in vLLM and flash-attn): each layer's cache is `[num_blocks, block_size, num_kv_heads,
head_dim]`; a sequence's token t lives in block `block_tables[seq, t // block_size]` at offset
`t % block_size`. Queries are flat over the batch (`cu_seqlens_q` marks where each sequence's query
tokens start); sequence i has `seq_lens[i]` tokens in all, of which the last `query_lens[i]` are
this step's queries, so query row r of it sits at position `seq_lens[i] - query_lens[i] + r` and
sees keys up to and including that position. One op serves prefill chunks and decodes alike.

DeepSeek's MLA: V's head dim may be smaller than K's (and q's), K's dims being V's then a rope part
(D_K = D_V + D_PE), with V a cache of its own (decompressed MLA: 192-dim keys, 128-dim values) or a
view of the K cache's first D_V dims (absorbed MLA: one 576-dim entry a token, V = k_cache[..., :512]).
The output has V's head dim.

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
    # The CPU op's plans, by sliding window (None: full attention): built by the first layer of a kind.
    reference_plan: dict | None = field(default=None, repr=False)
    # Where a model's sliding-window layers have blocks of their own: their slot mapping and block
    # tables, the rest as here (the model picks it for those layers).
    window: "AttentionMetadata | None" = field(default=None, repr=False)
    # A model's own per-step plan (DeepSeek's latent attention: which rows it decompresses), built by
    # its first layer and shared by the rest.
    model_plan: object = field(default=None, repr=False)

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
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of `q [num_tokens, num_heads, head_dim]` over each sequence's cached K/V.

    `k`, `v` are this step's new keys and values (already stored in the cache); a sequence with no
    cached context attends to them directly instead of gathering them back from the pool. `v` None:
    the values are `k`'s first `v_cache.shape[-1]` dims (absorbed MLA, where V is a view of K). The
    output `[num_tokens, num_heads, v_cache.shape[-1]]`.
    `decode_kernel(q, out, group, k_cache, v_cache, scale)`, when given, computes all the decodes
    (one `_DecodeGroup`) into `out` in place of SDPA (the CPU engine's C kernel, sut/cpu/ops.py).
    `sinks [num_heads]`: one logit per query head that joins each row's softmax denominator (not
    scaled, no value: gpt-oss). `sliding_window` W: a query at position p sees keys p - W + 1 .. p
    only; blocks wholly before the window are never read (the block manager may have reused them).
    """
    assert decode_kernel is None or (sinks is None and sliding_window is None), "the decode kernel has neither"
    head_dim, v_dim = k_cache.shape[3], v_cache.shape[3]
    if v_dim != head_dim:
        decode_kernel = None  # it takes one head dim for K and V: MLA's decodes go to SDPA
    if v is None and k is not None:
        v = k[..., :v_dim]
    plans = meta.reference_plan
    if plans is None:
        plans = meta.reference_plan = {}
    if sliding_window not in plans:
        group = DECODE_GROUP if decode_kernel is None else None
        plans[sliding_window] = _plan(meta, k_cache.shape[1], q.device, group, sliding_window)
    kv_heads = k_cache.shape[2]
    out = q.new_empty(q.shape[0], q.shape[1], v_dim)
    for item in plans[sliding_window]:
        if isinstance(item, _DecodeGroup) and decode_kernel is not None:
            decode_kernel(q, out, item, k_cache, v_cache, scale)
            continue
        if isinstance(item, _DecodeGroup):
            n = len(item.q_rows)
            keys = _gather_blocks(k_cache, item.blocks).view(n, -1, kv_heads, head_dim)[:, : item.max_len]
            values = _gather_blocks(v_cache, item.blocks).view(n, -1, kv_heads, v_dim)[:, : item.max_len]
            # GQA without copying K/V per query head: the query heads sharing a KV head become
            # that head's "query tokens" (kv head j serves query heads j*group .. (j+1)*group-1).
            queries, keys, values = (
                q[item.q_rows].view(n, kv_heads, -1, head_dim),
                keys.transpose(1, 2),
                values.transpose(1, 2),
            )
            mask = item.mask
            if sinks is not None:
                keys, values, mask = _with_sink(keys, values, mask, sinks.view(1, kv_heads, -1, 1))
            o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
            out[item.q_rows] = o.reshape(n, -1, v_dim)
            continue
        if item.blocks is None:
            keys, values = k[item.start : item.end], v[item.start : item.end]
        else:
            keys = _gather_blocks(k_cache, item.blocks)[: item.seq_len - item.first_key]
            values = _gather_blocks(v_cache, item.blocks)[: item.seq_len - item.first_key]
        # SDPA wants heads before tokens: [1, heads, tokens, head_dim].
        keys, values, mask, causal = keys.transpose(0, 1)[None], values.transpose(0, 1)[None], item.mask, item.causal
        if sinks is not None:
            if causal:
                mask, causal = torch.ones(keys.shape[2], keys.shape[2], dtype=torch.bool, device=q.device).tril(), False
            if mask is None:  # one query with no context: it sees only itself
                mask = torch.ones(1, 1, dtype=torch.bool, device=q.device)
            keys, values, mask = _with_sink(keys, values, mask, sinks.view(1, -1, 1, 1))
        o = F.scaled_dot_product_attention(
            q[item.start : item.end].transpose(0, 1)[None],
            keys,
            values,
            attn_mask=mask,
            is_causal=causal,
            scale=scale,
            enable_gqa=True,
        )
        out[item.start : item.end] = o[0].transpose(0, 1)
    return out


def _with_sink(keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor):
    """Keys, values and an additive mask with one more column whose score is each head's sink: a
    zero key and value, its logit put in by the mask (SDPA adds a float mask to the scaled
    scores), so the sink only enlarges the softmax's denominator. `sinks` broadcasts as the
    mask's head and row dimensions do."""
    key_pad = keys.new_zeros(*keys.shape[:-2], 1, keys.shape[-1])
    value_pad = values.new_zeros(*values.shape[:-2], 1, values.shape[-1])
    bias = torch.zeros(mask.shape, dtype=keys.dtype, device=keys.device).masked_fill_(~mask, float("-inf"))
    rows = torch.broadcast_shapes(bias.shape[:-1], sinks.shape[:-1])
    bias = torch.cat((bias.expand(*rows, bias.shape[-1]), sinks.to(keys.dtype).expand(*rows, 1)), dim=-1)
    return torch.cat((keys, key_pad), dim=-2), torch.cat((values, value_pad), dim=-2), bias


def paged_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`paged_attention` on the Triton kernels, split by row kind: the step's leading one-token
    queries (the scheduler puts plain decodes first) on the decode kernel (split-K over long
    contexts), the rest (prompts, chunks, verifications) on the prefill kernel, where a decode
    would fill a tile of up to 128 rows with its few heads. A one-token query further on is still
    right there, only slower. `sinks` and `sliding_window` (gpt-oss) go to both kernels as they
    are: see decode_attention.py. MLA's head dims as for `paged_attention` (`k`, `v` unused)."""
    d, n = meta.num_decodes, len(meta.query_lens_host)
    extras = dict(sinks=sinks, sliding_window=sliding_window)
    if d == n:
        return decode_attention_triton(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, meta.max_seq_len, **extras
        )
    if d == 0:
        return prefill_attention_triton(
            q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, scale, **extras
        )
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
    decode_attention_triton(
        q[:d],
        k_cache,
        v_cache,
        meta.block_tables[:d],
        meta.seq_lens[:d],
        scale,
        meta.max_decode_seq_len,
        out=out[:d],
        **extras,
    )
    prefill_attention_triton(
        q[d:],
        k_cache,
        v_cache,
        meta.block_tables[d:],
        meta.rest_cu_seqlens_q,
        meta.seq_lens[d:],
        scale,
        out=out[d:],
        **extras,
    )
    return out


@dataclass
class _DecodeGroup:
    q_rows: torch.Tensor  # query rows of these single-token sequences
    tables: torch.Tensor  # their block tables [n, blocks of the longest] int32 (from the window's first block)
    seq_lens: torch.Tensor  # [n] int32
    max_len: int  # keys gathered per sequence
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
    first_key: int = 0  # the position of the first gathered key (a sliding window skips whole blocks)


def _plan(meta: AttentionMetadata, block_size: int, device, group_size: int | None, window: int | None = None) -> list:
    """The per-step work list of the reference, shared by every layer of one kind (full attention,
    or a sliding window of `window` keys): decodes in groups of `group_size` (all in one if None) of
    similar length (one SDPA call each; a group's gathered K/V stays small enough to be read back
    from cache, ~5x faster on CPU than one call for all), other sequences one by one. With a window,
    each sequence's keys are gathered from the block holding its first visible key."""
    plan: list = []
    decodes = [
        i
        for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host))
        if q_len == 1 and seq_len > 1
    ]

    def first_block(first_query_position: int) -> int:
        return 0 if window is None else max(0, first_query_position - window + 1) // block_size

    # Grouped by length: a group gathers and attends over its longest context.
    decodes.sort(key=lambda i: meta.seq_lens_host[i])
    group_size = group_size or max(len(decodes), 1)
    for g in range(0, len(decodes), group_size):
        group = decodes[g : g + group_size]
        rows = torch.tensor(group, device=device)
        seq_lens = meta.seq_lens[rows]
        if window is None:
            max_len = max(meta.seq_lens_host[i] for i in group)
            tables = meta.block_tables[rows, : -(-max_len // block_size)].contiguous()
            mask = torch.arange(max_len, device=device)[None, :] < seq_lens[:, None]
        else:
            firsts = [first_block(meta.seq_lens_host[i] - 1) for i in group]
            max_len = max(meta.seq_lens_host[i] - f * block_size for i, f in zip(group, firsts))
            columns = torch.tensor(firsts, device=device)[:, None] + torch.arange(
                -(-max_len // block_size), device=device
            )
            # Columns past a sequence's table are masked out; clamped, they index a real block.
            columns = columns.clamp(max=meta.block_tables.shape[1] - 1)
            tables = meta.block_tables[rows[:, None], columns].contiguous()
            positions = torch.tensor(firsts, device=device)[:, None] * block_size + torch.arange(max_len, device=device)
            mask = (positions < seq_lens[:, None]) & (positions >= seq_lens[:, None] - window)
        plan.append(
            _DecodeGroup(meta.cu_seqlens_q[rows].long(), tables, seq_lens.contiguous(), max_len, mask[:, None, None, :])
        )
    start = 0
    decodes = set(decodes)
    for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host)):
        if i not in decodes:
            context = seq_len - q_len
            first_key = first_block(context) * block_size
            blocks = mask = None
            if context > first_key:  # cached keys to read
                blocks = meta.block_tables[i, first_key // block_size : -(-seq_len // block_size)]
            if context or window is not None:
                positions = torch.arange(context, seq_len, device=device)[:, None]
                keys = torch.arange(first_key if blocks is not None else context, seq_len, device=device)[None, :]
                mask = keys <= positions
                if window is not None:
                    mask &= keys > positions - window
                if blocks is None:
                    first_key = context
            # No cached context and no window: plain causal (SDPA then skips the masked half). A
            # single query with no context sees only itself.
            causal = mask is None and 1 < q_len == seq_len
            plan.append(_Sequence(start, start + q_len, seq_len, blocks, mask, causal, first_key))
        start += q_len
    return plan


def _gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The cache blocks `blocks` as one run of tokens `[len(blocks) * block_size, kv_heads, head_dim]`
    (index_select copies whole blocks; on CPU it is ~10x faster than advanced indexing)."""
    return cache.index_select(0, blocks).flatten(0, 1)

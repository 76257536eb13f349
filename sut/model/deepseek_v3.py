"""The DeepSeek-V3 architecture (DeepSeek-R1, -V3): Llama's decoder layer with multi-head latent
attention (MLA) and, after the first dense layers, a mixture of experts with group-limited routing.

MLA: queries through a low-rank bottleneck (q_a_proj, its norm, q_b_proj); keys and values from one
512-dim latent per token (kv_a_proj_with_mqa, its norm), which kv_b_proj expands per head into a
128-dim no-rope key part and a 128-dim value, plus one 64-dim rope key every head shares (rope
interleaved, on those dims only). The KV cache holds only the latent and the rope key (576 values
per token per layer). Attention runs on them in two ways, per step:
- absorbed (decodes and other short queries): kv_b_proj's key half is folded into each query
  (q_nope @ W_UK) and its value half applied after (out @ W_UV^T), so attention is multi-query over
  the cache itself: one 576-dim KV head whose value is the latent, the first 512 dims;
- decompressed (prefill rows): the sequences' cached latents are expanded by kv_b_proj into per-head
  keys (128 + 64) and values (128) for this step, and attention runs over those, which costs fewer
  FLOPs once a sequence has many query rows.
Both go through `ops.paged_attention`. The router's weight and correction bias stay fp32.

Parameter names follow transformers' DeepseekV3ForCausalLM, except that the two projections of the
input (q_a_proj, kv_a_proj_with_mqa) and gate/up are fused into one GEMM each, and the experts are
held stacked as transformers holds them (`gate_up_proj [experts, 2 * inter, hidden]`, gate rows then
up rows; `down_proj [experts, hidden, inter]`), filled from the checkpoint's per-expert tensors.
DeepSeek-R1's FP8 checkpoint is held as stored on CUDA (the loader's `keep_fp8`): its block-scaled
linears as Fp8Linear (sut/model/fp8.py), the experts in FP8 with stacked scales; kv_b_proj, which
the absorbed attention splits, dequantized."""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kernels import AttentionMetadata, KernelOps
from kernels.fp8 import FP8_BLOCK, FP8_DTYPE
from sut.config import ModelConfig
from sut.errors import CheckpointError
from sut.model.llama import FusedLinear, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel, RMSNorm
from sut.model.rope import yarn_mscale
from sut.parallel import Shard, all_reduce

# A step whose every sequence has at most this many query rows attends absorbed throughout; in other
# steps the leading decodes attend absorbed and the rest decompressed. Decompressing costs a
# kv_b_proj GEMM over each sequence's whole context, which pays back past ~100 query rows.
MAX_ABSORBED_QUERY_LEN = 16
LATENT_NORM_EPS = 1e-6  # transformers' q_a_layernorm and kv_a_layernorm take their default eps


@dataclass
class DecompressPlan:
    """A step's leading `num_absorbed` decodes (one row each) attend absorbed; for the sequences after
    them (decompressed): the cache blocks they read, in order, and their metadata, whose block tables
    index the decompressed copy of those blocks."""

    num_absorbed: int
    absorbed_meta: AttentionMetadata  # the leading decodes' (shared by the layers, as their attention plans are)
    blocks: torch.Tensor
    meta: AttentionMetadata


class DeepseekV3Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        m = config.mla
        self.num_heads, self.nope, self.rope, self.v_dim = (
            config.num_heads,
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
        )
        self.rank, self.q_lora_rank, self.interleave = m.kv_lora_rank, m.q_lora_rank, m.rope_interleave
        qk_dim = self.nope + self.rope
        # The two projections of the layer's input in one GEMM: the query's (its bottleneck, or the
        # query itself without one) and the latent's with the rope key.
        q_name, q_size = ("q_a_proj", m.q_lora_rank) if m.q_lora_rank else ("q_proj", self.num_heads * qk_dim)
        self.input_proj = FusedLinear(
            config.hidden_size,
            {q_name: q_size, "kv_a_proj_with_mqa": m.kv_lora_rank + self.rope},
            config.attention_bias,
        )
        self.input_sizes = [q_size, m.kv_lora_rank, self.rope]
        if m.q_lora_rank:
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(m.q_lora_rank, self.num_heads * qk_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, self.num_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, config.hidden_size, bias=config.attention_bias)
        self.scale = qk_dim**-0.5
        s = config.rope_scaling
        if getattr(s, "mscale_all_dim", None):
            self.scale *= yarn_mscale(s.factor, s.mscale_all_dim) ** 2
        self.k_cache = self.v_cache = torch.empty(0)  # the runner's: [blocks, block_size, 1, 576] and its latent part
        self.w_uk = self.w_uv = torch.empty(0)  # kv_b_proj's key and value halves per head (absorb_weights)
        self.tp = None  # tensor parallel: this rank's heads

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, ops: KernelOps):
        n = x.shape[0]
        q, latent, k_pe = self.input_proj(x).split(self.input_sizes, dim=-1)
        if self.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(q, None, ops)[0])
        q = q.view(n, self.num_heads, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent, None, ops)[0]
        q_pe, k_pe = ops.rotary(self._rope_order(q_pe), self._rope_order(k_pe.view(n, 1, self.rope)), *rope)
        entry = torch.cat((latent.view(n, 1, self.rank), k_pe), dim=-1)  # what the cache holds per token
        ops.store_kvcache(entry, None, self.k_cache, None, meta.slot_mapping)
        plan = self._plan(meta)
        w_uk, w_uv = self.w_uk, self.w_uv
        out = x.new_empty(n, self.num_heads, self.v_dim)
        a = n if plan is None else plan.num_absorbed
        if a:  # absorbed: multi-query attention over the latent cache
            q_latent = torch.bmm(q_nope[:a].transpose(0, 1), w_uk).transpose(0, 1)
            q_abs = torch.cat((q_latent, q_pe[:a]), dim=-1)
            absorbed_meta = meta if plan is None else plan.absorbed_meta
            o = ops.paged_attention(
                q_abs, entry[:a], entry[:a, :, : self.rank], self.k_cache, self.v_cache, absorbed_meta, self.scale
            )
            out[:a] = torch.bmm(o.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
        if plan is not None:  # decompressed: per-head keys and values of the sequences' whole context
            keys, values = self._decompress(self.k_cache.index_select(0, plan.blocks))
            k_new, v_new = self._decompress(entry[a:])
            q_full = torch.cat((q_nope[a:], q_pe[a:]), dim=-1)
            out[a:] = ops.paged_attention(q_full, k_new, v_new, keys, values, plan.meta, self.scale)
        out = self.o_proj(out.view(n, -1))
        return all_reduce(out) if self.tp else out

    def absorb_weights(self) -> None:
        """After loading, before a backend may repack kv_b_proj: its key half `[heads, nope, latent]`
        and value half `[heads, v, latent]`, as views, for the absorbed attention."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        self.w_uk, self.w_uv = w[:, : self.nope], w[:, self.nope :]

    def _rope_order(self, x: torch.Tensor) -> torch.Tensor:
        """DeepSeek's rope pairs dims (0, 1), (2, 3), ...: reordered evens then odds, it is the
        rotate-half rope (as transformers computes it; q and k alike, so their products are kept)."""
        if not self.interleave:
            return x
        return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)

    def _decompress(self, entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys `[..., heads, nope + rope]` and values `[..., heads, v]` of cache entries `[..., 1, 576]`."""
        kv = self.kv_b_proj(entries[..., 0, : self.rank]).unflatten(-1, (self.num_heads, -1))
        k_nope, values = kv.split([self.nope, self.v_dim], dim=-1)
        k_pe = entries[..., self.rank :].expand(*k_nope.shape[:-1], self.rope)
        return torch.cat((k_nope, k_pe), dim=-1), values.contiguous()

    def _plan(self, meta: AttentionMetadata) -> DecompressPlan | None:
        """Which rows this step decompresses (None: none), planned by the first layer for all."""
        if meta.max_query_len <= MAX_ABSORBED_QUERY_LEN or meta.num_decodes == len(meta.query_lens_host):
            return None
        if meta.model_plan is None:
            meta.model_plan = _decompress_plan(meta, self.k_cache.shape[1])
        return meta.model_plan


def _leading(meta: AttentionMetadata, num_seqs: int) -> AttentionMetadata:
    """The metadata of the step's first `num_seqs` sequences."""
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping[:0],
        block_tables=meta.block_tables[:num_seqs],
        cu_seqlens_q=meta.cu_seqlens_q[: num_seqs + 1],
        seq_lens=meta.seq_lens[:num_seqs],
        query_lens_host=meta.query_lens_host[:num_seqs],
        seq_lens_host=meta.seq_lens_host[:num_seqs],
    )


def _decompress_plan(meta: AttentionMetadata, block_size: int) -> DecompressPlan:
    """The step's leading decodes stay absorbed; every later sequence reads its blocks, numbered in
    the decompressed copy one sequence after the other."""
    d = meta.num_decodes
    seq_lens = np.array(meta.seq_lens_host[d:], dtype=np.int64)
    query_lens = np.array(meta.query_lens_host[d:], dtype=np.int64)
    num_blocks = -(-seq_lens // block_size)
    rows = np.repeat(np.arange(len(seq_lens)), num_blocks)
    firsts = np.cumsum(num_blocks) - num_blocks
    columns = np.arange(int(num_blocks.sum())) - np.repeat(firsts, num_blocks)
    device = meta.block_tables.device
    tables = meta.block_tables[d:]
    blocks = tables[torch.from_numpy(rows).to(device), torch.from_numpy(columns).to(device)].long()
    width = int(num_blocks.max())
    new_tables = np.minimum(firsts[:, None] + np.arange(width)[None, :], firsts[:, None] + num_blocks[:, None] - 1)
    cu = np.zeros(len(seq_lens) + 1, dtype=np.int32)
    np.cumsum(query_lens, out=cu[1:])
    sub = AttentionMetadata(
        slot_mapping=meta.slot_mapping[:0],
        block_tables=torch.from_numpy(new_tables.astype(np.int32)).to(device),
        cu_seqlens_q=torch.from_numpy(cu).to(device),
        seq_lens=meta.seq_lens[d:],
        query_lens_host=meta.query_lens_host[d:],
        seq_lens_host=meta.seq_lens_host[d:],
    )
    return DecompressPlan(d, _leading(meta, d), blocks, sub)


class DeepseekV3Router(nn.Module):
    """Group-limited routing (transformers' DeepseekV3TopkRouter), in fp32: sigmoid scores; for
    choosing only, plus the correction bias; the groups with the best sums of their top two; the top
    k experts in those; weights the unbiased scores of the chosen, normalized, times the scaling."""

    keep_fp32 = True  # the loader keeps this module's parameters in fp32 whatever the model's dtype

    def __init__(self, config: ModelConfig):
        super().__init__()
        moe = config.moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, config.hidden_size), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.empty(moe.num_experts), requires_grad=False)
        self.top_k, self.groups, self.top_groups = moe.experts_per_token, moe.num_groups, moe.topk_groups
        self.scaling, self.normalize = moe.routed_scaling_factor, moe.norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's expert weights (fp32) and expert ids, `[tokens, top_k]` each."""
        scores = torch.nn.functional.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        grouped = choice.view(x.shape[0], self.groups, -1)
        best_groups = grouped.topk(2, dim=-1)[0].sum(dim=-1).topk(self.top_groups, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best_groups, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(x.shape[0], -1)
        ids = choice.topk(self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class DeepseekV3Experts(nn.Module):
    """The routed experts, stacked: `gate_up_proj [experts, 2 * inter, hidden]` (gate rows, then up
    rows) and `down_proj [experts, hidden, inter]`, filled from the checkpoint's per-expert linears
    `experts.<e>.{gate,up,down}_proj.weight`. Run by `ops.fused_moe` with plain SwiGLU. Or, held as
    an FP8 checkpoint stores them (`keep_fp8`, how CUDA runs DeepSeek-R1), the same tensors in
    float8_e4m3fn with fp32 scales per 128 x 128 block, `gate_up_proj_scale_inv [experts, 2 * inter /
    128, hidden / 128]` and `down_proj_scale_inv [experts, hidden / 128, inter / 128]` (rounded up),
    stacked from each expert's `weight_scale_inv`; run by `ops.fused_moe_fp8`.

    Expert parallelism (a tensor-parallel rank's config, sut/parallel/): a rank holds its
    `Shard.experts` only and reads no other expert's tensors; its output is its experts' share of
    every token's (the other ranks' slots get id -1, which the op computes nothing for), which the
    MoE's all-reduce sums over the ranks."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_experts = config.moe.num_experts  # of the model; this rank's are num_experts / parallel_size
        e = config.moe.num_experts // config.moe.parallel_size
        h, i = config.hidden_size, config.moe.expert_intermediate_size
        self.fp8 = False
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(e, h, i), requires_grad=False)
        # Of the experts' weights one token reads (of this rank's too: its share of the model's).
        self.weight_share_per_token = config.moe.experts_per_token / self.num_experts

    def keep_fp8(self, prefix: str, scaled: set[str]) -> bool:
        """Before loading, on the meta device (sut/model/fp8.py's keep_checkpoint_fp8): hold the
        experts in FP8 with their block scales if the checkpoint stores every expert's weights so
        (`scaled`: its weights that have a `weight_scale_inv`); return whether it does. Each expert's
        gate and up rows stack, with their scales', so `inter` must be a multiple of 128."""
        projections = ("gate_proj", "up_proj", "down_proj")
        names = [f"{prefix}.{e}.{p}.weight" for e in range(self.num_experts) for p in projections]
        if not all(name in scaled for name in names):
            return False
        e, two_i, h = self.gate_up_proj.shape
        i = two_i // 2
        if i % FP8_BLOCK:
            raise CheckpointError(
                f"FP8 checkpoint tensor {names[0]!r} has {i} rows (moe_intermediate_size), not a multiple of its "
                f"{FP8_BLOCK}-row scale blocks: the experts' gate and up cannot be stacked in FP8"
            )

        def weight(*shape, dtype):
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        blocks_h = -(-h // FP8_BLOCK)
        self.gate_up_proj = weight(e, two_i, h, dtype=FP8_DTYPE)
        self.gate_up_proj_scale_inv = weight(e, two_i // FP8_BLOCK, blocks_h, dtype=torch.float32)
        self.down_proj = weight(e, h, i, dtype=FP8_DTYPE)
        self.down_proj_scale_inv = weight(e, blocks_h, i // FP8_BLOCK, dtype=torch.float32)
        self.fp8 = True
        return True

    def checkpoint_layout(
        self, prefix: str, shard: Shard | None = None
    ) -> dict[str, tuple[str | None, int, torch.Size]]:
        """The checkpoint's per-expert tensors -> (this module's parameter, first row in it with the
        expert dimension flattened, shape): the loader's entries for this module; parameter None for
        the experts tensor-parallel rank `shard` does not hold."""
        _, two_i, h = self.gate_up_proj.shape
        i = two_i // 2
        mine = shard.experts(self.num_experts) if shard is not None else range(self.num_experts)
        layout = {}
        for expert in range(self.num_experts):
            at, e = f"{prefix}.{expert}", expert - mine.start
            held = expert in mine
            up, down = (f"{prefix}.gate_up_proj", f"{prefix}.down_proj") if held else (None, None)
            layout[f"{at}.gate_proj.weight"] = (up, e * two_i, torch.Size([i, h]))
            layout[f"{at}.up_proj.weight"] = (up, e * two_i + i, torch.Size([i, h]))
            layout[f"{at}.down_proj.weight"] = (down, e * h, torch.Size([h, i]))
            if self.fp8:  # each weight's scales, one row per 128 of its rows, stacked as the weights are
                up, down = (f"{up}_scale_inv", f"{down}_scale_inv") if held else (None, None)
                b, blocks_h = FP8_BLOCK, -(-h // FP8_BLOCK)
                layout[f"{at}.gate_proj.weight_scale_inv"] = (up, e * two_i // b, torch.Size([i // b, blocks_h]))
                layout[f"{at}.up_proj.weight_scale_inv"] = (up, (e * two_i + i) // b, torch.Size([i // b, blocks_h]))
                layout[f"{at}.down_proj.weight_scale_inv"] = (down, e * blocks_h, torch.Size([blocks_h, i // b]))
        return layout

    def forward(self, x, weights, ids, ops: KernelOps, shard: Shard | None = None):
        if shard is not None:
            # Expert parallel: this rank's experts by their local ids; the other ranks' slots get id -1,
            # which the op computes nothing for (they add 0; their weights are zeroed too, and not read).
            held = self.gate_up_proj.shape[0]
            local = ids - shard.rank * held
            mine = (local >= 0) & (local < held)
            ids, weights = torch.where(mine, local, -1), weights * mine
        if self.fp8:  # the op takes the FP8 weights as stored, [experts, out, in]
            return ops.fused_moe_fp8(
                x,
                self.gate_up_proj,
                self.gate_up_proj_scale_inv,
                self.down_proj,
                self.down_proj_scale_inv,
                weights,
                ids,
            )
        # The op takes [experts, in, out]: views of the linear layout, read through their strides.
        return ops.fused_moe(
            x, self.gate_up_proj.transpose(1, 2), None, self.down_proj.transpose(1, 2), None, weights, ids,
            activation="silu",
        )  # fmt: skip


class DeepseekV3MoE(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        moe = config.moe
        self.gate = DeepseekV3Router(config)
        self.experts = DeepseekV3Experts(config)
        # Tensor parallel: a rank holds 1/parallel_size of the shared experts' features (Llama's MLP split).
        shared = moe.expert_intermediate_size * moe.shared_experts // moe.parallel_size
        self.shared_experts = LlamaMLP(config, shared) if moe.shared_experts else None
        self.tp: Shard | None = None  # tensor parallel: the router whole, the experts split, one all-reduce

    def forward(self, x, ops: KernelOps):
        weights, ids = self.gate(x)
        out = self.experts(x, weights, ids, ops, self.tp)
        if self.shared_experts is not None:  # its own `tp` stays None: summed over the ranks with the experts'
            out = out + self.shared_experts(x, ops)
        return all_reduce(out) if self.tp else out


class DeepseekV3DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: ModelConfig, layer: int = 0):
        nn.Module.__init__(self)
        self.self_attn = DeepseekV3Attention(config, layer)
        self.mlp = LlamaMLP(config) if layer < config.moe.first_dense_layers else DeepseekV3MoE(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV3Model(LlamaModel):
    layer_class = DeepseekV3DecoderLayer


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    model_class = DeepseekV3Model

    def finish_loading(self, device, shard) -> None:
        super().finish_loading(device, shard)
        for layer in self.model.layers:
            layer.self_attn.absorb_weights()

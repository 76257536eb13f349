"""The Llama architecture (Llama 2, Llama 3/3.1, SmolLM2): GQA attention over the paged KV cache,
SwiGLU MLP, RMSNorm, rotary embeddings with Llama 3.1's scaling. Parameter names follow Hugging
Face's, except that q/k/v and gate/up are fused into one GEMM each (FusedLinear); the loader fills
those from the checkpoint's separate tensors. Numerics follow transformers' implementation (norms in
fp32, rope tables in fp32), which is what makes greedy output token-identical to it. The norms,
rope, KV-cache write and attention go through `self.ops` (kernels.KernelOps: the PyTorch ops or
our Triton kernels, set by the runner)."""

import torch
from torch import nn

from kernels import TORCH_OPS, AttentionMetadata, KernelOps
from sut.config import ModelConfig
from sut.model.rope import RotaryEmbedding
from sut.parallel import Shard, all_reduce, embed, gather_logits


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, ops: KernelOps):
        """The norm of `x + residual` (of `x` when there is no residual yet) and the new residual."""
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps), x
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class FusedLinear(nn.Linear):
    """Several of the checkpoint's linear layers over the same input, stacked along the output:
    `shards` maps each one's name (e.g. "q_proj") to its output size, in row order."""

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool):
        super().__init__(in_features, sum(shards.values()), bias=bias)
        self.shards = shards


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0):
        """`layer`: its index, for architectures whose layers differ (gpt_oss.py's windows)."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        bias = config.attention_bias
        # q, k and v in one GEMM (one weight read, one call); the loader fills its row blocks
        # from the checkpoint's q_proj, k_proj and v_proj.
        self.qkv_sizes = [self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2
        self.qkv_proj = FusedLinear(
            config.hidden_size,
            {"q_proj": self.qkv_sizes[0], "k_proj": self.qkv_sizes[1], "v_proj": self.qkv_sizes[2]},
            bias,
        )
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.scale = self.head_dim**-0.5
        self.k_cache = self.v_cache = torch.empty(0)  # views into the runner's KV pool
        self.tp: Shard | None = None  # tensor parallel: this rank's heads, its output summed over the ranks

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, ops: KernelOps):
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        q, k = ops.rotary(q, k, *rope)
        ops.store_kvcache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        out = self.o_proj(self.attend(q, k, v, meta, ops).view(n, -1))
        return all_reduce(out) if self.tp else out

    def attend(self, q, k, v, meta: AttentionMetadata, ops: KernelOps) -> torch.Tensor:
        return ops.paged_attention(q, k, v, self.k_cache, self.v_cache, meta, self.scale)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, intermediate_size: int | None = None):
        """`intermediate_size`: another than the config's (DeepSeek's shared experts)."""
        super().__init__()
        bias, size = config.mlp_bias, intermediate_size or config.intermediate_size
        self.gate_up_proj = FusedLinear(config.hidden_size, {"gate_proj": size, "up_proj": size}, bias)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=bias)
        self.tp: Shard | None = None  # tensor parallel: this rank's features, its output summed over the ranks

    def forward(self, x, ops: KernelOps):
        out = self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))
        return all_reduce(out) if self.tp else out


class LlamaDecoderLayer(nn.Module):
    # An architecture built on Llama's layer (gpt_oss.py) names its own attention and MLP.
    attention_class = LlamaAttention
    mlp_class = LlamaMLP

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.self_attn = self.attention_class(config, layer)
        self.mlp = self.mlp_class(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, rope, meta, ops):
        """This layer's output and the residual stream before it: the add that follows each block
        is fused into the next norm (`x + residual` is the usual layer output)."""
        x, residual = self.input_layernorm(x, residual, ops)
        x = self.self_attn(x, rope, meta, ops)
        x, residual = self.post_attention_layernorm(x, residual, ops)
        return self.mlp(x, ops), residual


class LlamaModel(nn.Module):
    layer_class = LlamaDecoderLayer

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    model_class = LlamaModel  # an architecture built on Llama's (gpt_oss.py) names its own

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = self.model_class(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary: RotaryEmbedding | None = None  # built on the real device after loading
        self.ops: KernelOps = TORCH_OPS  # the runner picks the backend
        self.tp: Shard | None = None  # tensor parallel (sut/parallel/): this rank's vocabulary rows

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        aux_layers: tuple[int, ...] = (),
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Hidden states `[num_tokens, hidden]` of a flat batch of tokens. With `aux_layers` (an EAGLE3
        head's input), also the residual stream at those layer boundaries, joined in that order
        `[num_tokens, len(aux_layers) * hidden]`: boundary j is what enters layer j (0: the
        embeddings; num_layers: what leaves the last layer, before the final norm)."""
        x = self.embed(input_ids)
        rope = self.rotary(positions, x.dtype)
        residual = None
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            if i in aux_layers:
                kept[i] = x if residual is None else x + residual
            x, residual = layer(x, residual, rope, meta, self.ops)
        if aux_layers:
            if len(self.model.layers) in aux_layers:
                kept[len(self.model.layers)] = x + residual
            return self.model.norm(x, residual, self.ops)[0], torch.cat([kept[j] for j in aux_layers], dim=-1)
        return self.model.norm(x, residual, self.ops)[0]

    def finish_loading(self, device: torch.device, shard: Shard | None) -> None:
        """After the loader has put every checkpoint tensor in place: tie the LM head, build the
        rope table on `device`, and tell the layers their tensor-parallel rank."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(self.config, device)
        if shard is not None:
            self.tp = shard
            for layer in self.model.layers:
                layer.self_attn.tp = layer.mlp.tp = shard

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of `input_ids` (under tensor parallelism, a collective: every rank calls it)."""
        return embed(self.model.embed_tokens, input_ids, self.tp) if self.tp else self.model.embed_tokens(input_ids)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        return gather_logits(logits) if self.tp else logits

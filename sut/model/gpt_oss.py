"""The gpt-oss architecture (gpt-oss-120b, -20b): Llama's decoder layer with three changes. Attention
has q/k/v/o biases, one learned sink logit per head (it joins the softmax's denominator only), and a
128-token sliding window on every other layer (config.layer_types); rope is NeoX-style with YaRN.
The MLP is a mixture of experts: a linear + bias router, softmax over its top-k logits, experts whose
gate and up columns are interleaved and whose activation is the clamped SwiGLU
`gate * sigmoid(alpha * gate) * (up + 1)`. Parameter names follow transformers' GptOssForCausalLM
(experts as [experts, in, out] tensors), with q/k/v fused as in Llama. The experts run through
`ops.fused_moe` (kernels/fused_moe.py: the PyTorch op on CPU, the Triton kernel on CUDA), or from
the checkpoint's MXFP4 weights through `ops.fused_moe_mxfp4`, which is how CUDA holds them."""

import torch
from torch import nn

from kernels import KernelOps
from sut.config import ModelConfig
from sut.model.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class GptOssAttention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        self.sinks = nn.Parameter(torch.empty(config.num_heads), requires_grad=False)
        self.sliding_window = config.layer_window(layer)

    def forward(self, x, rope, meta, ops):
        # Where window layers have blocks of their own (sut/engine/block_manager.py), theirs.
        if self.sliding_window is not None and meta.window is not None:
            meta = meta.window
        return super().forward(x, rope, meta, ops)

    def attend(self, q, k, v, meta, ops):
        return ops.paged_attention(
            q, k, v, self.k_cache, self.v_cache, meta, self.scale, sinks=self.sinks, sliding_window=self.sliding_window
        )


class GptOssExperts(nn.Module):
    """The experts' weights: dense `[experts, in, out]` (transformers' layout), or with `mxfp4` as the
    checkpoint stores them, `_blocks [experts, out, in / 32, 16]` and `_scales [experts, out, in / 32]`
    (uint8; kernels/mxfp4.py), which the fused MoE kernel decodes as it goes: 4.25 bits a weight, so
    gpt-oss-120b's experts take about 61 GB instead of 230 in bf16."""

    def __init__(self, config: ModelConfig, mxfp4: bool = False):
        super().__init__()
        e, h, i = config.moe.num_experts, config.hidden_size, config.intermediate_size
        self.mxfp4 = mxfp4

        def weight(*shape, dtype=None):
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        if mxfp4:
            self.gate_up_proj_blocks = weight(e, 2 * i, h // 32, 16, dtype=torch.uint8)
            self.gate_up_proj_scales = weight(e, 2 * i, h // 32, dtype=torch.uint8)
            self.down_proj_blocks = weight(e, h, i // 32, 16, dtype=torch.uint8)
            self.down_proj_scales = weight(e, h, i // 32, dtype=torch.uint8)
        else:
            self.gate_up_proj = weight(e, h, 2 * i)  # gate and up interleaved along the last dimension
            self.down_proj = weight(e, i, h)
        self.gate_up_proj_bias = weight(e, 2 * i)
        self.down_proj_bias = weight(e, h)
        self.alpha, self.limit = config.moe.swiglu_alpha, config.moe.swiglu_limit
        self.weight_share_per_token = config.moe.experts_per_token / e  # of the experts' weights one token reads

    def forward(self, x, weights, ids, ops: KernelOps):
        if self.mxfp4:
            return ops.fused_moe_mxfp4(
                x,
                self.gate_up_proj_blocks,
                self.gate_up_proj_scales,
                self.gate_up_proj_bias,
                self.down_proj_blocks,
                self.down_proj_scales,
                self.down_proj_bias,
                weights,
                ids,
                self.alpha,
                self.limit,
            )
        return ops.fused_moe(
            x, self.gate_up_proj, self.gate_up_proj_bias, self.down_proj, self.down_proj_bias, weights, ids,
            self.alpha, self.limit,
        )  # fmt: skip


class GptOssMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        # A plain linear, so that the CPU backend packs it as any other.
        self.router = nn.Linear(config.hidden_size, config.moe.num_experts, bias=True)
        self.top_k = config.moe.experts_per_token
        self.experts = GptOssExperts(config)

    def forward(self, x, ops: KernelOps):
        # Each token's experts and their weights: the softmax of its top-k router logits.
        top, ids = torch.topk(self.router(x), self.top_k, dim=-1)
        return self.experts(x, top.softmax(dim=-1), ids, ops)


class GptOssDecoderLayer(LlamaDecoderLayer):
    attention_class = GptOssAttention
    mlp_class = GptOssMLP


class GptOssModel(LlamaModel):
    layer_class = GptOssDecoderLayer


class GptOssForCausalLM(LlamaForCausalLM):
    model_class = GptOssModel

    def keep_experts_mxfp4(self) -> None:
        """Before loading (on the meta device): hold the experts as the MXFP4 checkpoint stores them,
        for a backend whose MoE kernel decodes them (CUDA), instead of dequantizing them at load."""
        for layer in self.model.layers:
            layer.mlp.experts = GptOssExperts(self.config, mxfp4=True)

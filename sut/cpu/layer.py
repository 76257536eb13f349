"""A decode step's decoder layers on CPU in one call (layer.c's `decode_layers`): per layer
the residual add and RMSNorm, q/k/v from the GGUF blocks, rope, the KV-cache write, decode
attention over the paged cache, o_proj, residual add and RMSNorm, gate/up, SiLU-and-mul, down.

At decode batch sizes a step's arithmetic is a few milliseconds and the ~14 PyTorch calls per
layer of sut/model/llama.py's path cost as much again. This path is for the steps in which every
sequence decodes one token and every linear computes from its blocks (BlockQuantLinear's row
limit), in fp32 without biases; it runs the same kernels in the same order as the model's path
with the C ops (sut/cpu/ops.py). Every other step takes the model's own path."""

import ctypes

import torch
from torch import nn

from kernels import AttentionMetadata
from sut.cpu.quant import BlockQuantLinear


class LinearBlocks(ctypes.Structure):
    """layer.c's `struct linear`."""

    _fields_ = [
        ("kind", ctypes.c_int),
        ("codes", ctypes.c_void_p),
        ("d", ctypes.c_void_p),
        ("m", ctypes.c_void_p),
        ("rows", ctypes.c_long),
        ("cols", ctypes.c_long),
    ]

    @staticmethod
    def of(linear: BlockQuantLinear) -> "LinearBlocks":
        b = linear.blocks
        codes, d, m = b.int16_layout() if linear.int16 else (b.qs, b.d, b.m)
        kind = (0 if b.format == "Q4_1" else 1) + (2 if linear.int16 else 0)
        return LinearBlocks(kind, codes.data_ptr(), d.data_ptr(), None if m is None else m.data_ptr(), *b.shape)


class LayerWeights(ctypes.Structure):
    """layer.c's `struct layer`."""

    _fields_ = [
        ("qkv", LinearBlocks),
        ("o", LinearBlocks),
        ("gate_up", LinearBlocks),
        ("down", LinearBlocks),
        ("input_norm", ctypes.c_void_p),
        ("post_attention_norm", ctypes.c_void_p),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
    ]


def _linears(layer: nn.Module) -> list[nn.Module]:
    return [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]


class CpuDecoder:
    """`model`'s decoder layers through decode_layers on the kernels `lib`, for decode-only steps
    of at most `max_rows` sequences. Build it after the KV cache is in place: it holds pointers to
    the weights and the cache."""

    def __init__(self, model: nn.Module, lib, max_query_len: int = 1):
        self.model, self.lib = model, lib
        self.max_query_len = max_query_len
        layers = model.model.layers
        self.layers = (LayerWeights * len(layers))(
            *[
                LayerWeights(
                    *map(LinearBlocks.of, _linears(layer)),
                    layer.input_layernorm.weight.data_ptr(),
                    layer.post_attention_layernorm.weight.data_ptr(),
                    layer.self_attn.k_cache.data_ptr(),
                    layer.self_attn.v_cache.data_ptr(),
                )
                for layer in layers
            ]
        )
        self.max_rows = min(linear.block_rows for layer in layers for linear in _linears(layer))
        attn = layers[0].self_attn
        self.shape = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
        self.block_size = attn.k_cache.shape[1]
        self.eps, self.scale = layers[0].input_layernorm.eps, attn.scale

    @staticmethod
    def applies(model: nn.Module) -> bool:
        """Every layer's linears compute from their blocks, without biases, at one row or more (at
        some levels the exact Q4_1 kernel is slower than oneDNN at any size: quant.py)."""
        return model.config.architecture == "LlamaForCausalLM" and all(
            isinstance(linear, BlockQuantLinear) and linear.bias is None and linear.block_rows > 0
            for layer in model.model.layers
            for linear in _linears(layer)
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """The model's hidden states for a step of decodes (or of at most `max_query_len` query rows
        a sequence: a verification of drafts), or None for any other step."""
        n = input_ids.shape[0]
        if n > self.max_rows or meta.max_query_len > self.max_query_len:
            return None
        seq_lens, block_tables = meta.seq_lens, meta.block_tables
        if meta.max_query_len > 1 or len(meta.query_lens_host) != n:
            # Each query row as a one-token sequence over its own sequence's blocks, seeing the keys
            # up to its position: decode_layers stores every row's K/V before it attends.
            row_seq = torch.repeat_interleave(
                torch.arange(len(meta.query_lens_host)), torch.tensor(meta.query_lens_host)
            )
            seq_lens, block_tables = (positions + 1).to(torch.int32), block_tables[row_seq].contiguous()
        model = self.model
        x = model.model.embed_tokens(input_ids)
        cos, sin = (t.contiguous() for t in model.rotary(positions, x.dtype))
        out, residual = torch.empty_like(x), torch.empty_like(x)
        rows = torch.arange(n)  # sequence i's query is row i
        heads, kv_heads, dim = self.shape
        rc = self.lib.decode_layers(
            self.layers,
            len(self.layers),
            x.data_ptr(),
            out.data_ptr(),
            residual.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            meta.slot_mapping.data_ptr(),
            rows.data_ptr(),
            seq_lens.data_ptr(),
            block_tables.data_ptr(),
            block_tables.shape[1],
            self.block_size,
            n,
            heads,
            kv_heads,
            dim,
            self.eps,
            self.scale,
        )
        if rc:
            raise RuntimeError(f"sut.cpu.layer: decode_layers failed with code {rc}")
        return model.model.norm(out, residual, model.ops)[0]

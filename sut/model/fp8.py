"""FP8 weights for the model's linear layers (the engine's `quantization: fp8` setting, and
DeepSeek-R1's checkpoint, whose linears are FP8 already).

`Fp8Linear` holds an FP8 (e4m3fn) weight `[out, in]` and its scales (kernels/fp8.py): per output
channel as `weight_scale [out]`, or per 128 x 128 block as `weight_scale_inv [ceil(out/128),
ceil(in/128)]`, the name DeepSeek's checkpoint gives them, so its tensors load onto the module by
name. Its forward is `kernels.fp8.fp8_linear`: the Triton GEMM that dequantizes in its K loop on
CUDA, the PyTorch reference elsewhere.

`quantize_linears` turns a loaded bf16 model's decoder linears into FP8, one scale per output
channel. On CUDA each becomes an Fp8Linear (half the weight bytes a decode step reads); on CPU,
where the engine never computes in FP8, each stays a dense nn.Linear whose weight is replaced by
its FP8 round trip in the model's dtype ("fake quantization"): the CPU run then shows what FP8
costs in quality, not what it gains in speed. A FusedLinear (q/k/v or gate/up stacked) quantizes
as one matrix: its scales are per row, so each stacked layer keeps scales of its own rows.

`keep_checkpoint_fp8` holds DeepSeek's FP8 checkpoint as it is stored (how CUDA runs it: the 671B
model fits eight H200s only in FP8), set up on the meta device before loading: each linear whose
checkpoint weight has block scales becomes an Fp8Linear of 128 x 128 blocks, a FusedLinear too (its
shards' row blocks stacked), and the stacked experts hold FP8 weights and scales of their own.
"""

import torch
from torch import nn

from kernels.fp8 import FP8_BLOCK, FP8_DTYPE, dequantize_fp8, fp8_linear, quantize_fp8_per_channel
from sut.errors import CheckpointError

# Module names (any dot-separated part, matched whole) that keep their dtype: the LM head and the
# embeddings (outside the decoder layers anyway), gpt-oss's router and DeepSeek's (`mlp.gate`).
# Whole parts, so "gate" does not match Llama's `gate_up_proj`.
# Kept dense: the head, embeddings and routers; and DeepSeek's kv_b_proj, whose weight the latent
# attention splits into its absorbed halves.
SKIP = ("lm_head", "embed", "router", "gate", "kv_b_proj")
DECODER_LAYERS = "model.layers."


class Fp8Linear(nn.Module):
    """`y = x @ (weight * scale).T + bias` from an FP8 weight; see the module's docstring. `block`
    None: scales per output channel (`weight_scale`); else per `block x block` tile
    (`weight_scale_inv`). The bias (optional) keeps `bias_dtype`."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        block: int | None = None,
        bias_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self.in_features, self.out_features, self.block = in_features, out_features, block
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=FP8_DTYPE, device=device), requires_grad=False
        )
        if block is None:
            scale_shape = (out_features,)
        else:
            scale_shape = (-(-out_features // block), -(-in_features // block))
        scale = nn.Parameter(torch.ones(scale_shape, dtype=torch.float32, device=device), requires_grad=False)
        setattr(self, self.scale_name, scale)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @property
    def scale_name(self) -> str:
        return "weight_scale" if self.block is None else "weight_scale_inv"

    @property
    def scale(self) -> torch.Tensor:
        return getattr(self, self.scale_name)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Fp8Linear":
        """`linear` quantized per output channel (its bias kept as it is; a FusedLinear's `shards` too)."""
        w = linear.weight
        fp8 = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        q, scale = quantize_fp8_per_channel(w.detach())
        fp8.weight = nn.Parameter(q, requires_grad=False)
        fp8.weight_scale = nn.Parameter(scale, requires_grad=False)
        fp8.bias = linear.bias
        if hasattr(linear, "shards"):
            fp8.shards = linear.shards
        return fp8

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight `[out, in]` as the GEMM sees it, in `dtype`."""
        return dequantize_fp8(self.weight, self.scale, self.block, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.scale, self.bias, self.block)

    def extra_repr(self) -> str:
        scales = "per channel" if self.block is None else f"per {self.block}x{self.block} block"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, fp8 scales {scales}"
        )


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    return any(part in skip for part in name.split("."))


@torch.no_grad()
def quantize_linears(
    model: nn.Module,
    device: torch.device | str,
    dtype: torch.dtype,
    skip: tuple[str, ...] = SKIP,
    fake: bool | None = None,
) -> int:
    """Quantize every nn.Linear of the decoder layers (`model.layers.*`) to FP8 per output channel,
    but those with a name part in `skip`; return how many. `fake` (default: off CUDA) keeps each a
    dense nn.Linear of `dtype` holding its FP8 round trip; otherwise each is replaced by an
    Fp8Linear (its bias, if any, kept as it is)."""
    if fake is None:
        fake = torch.device(device).type != "cuda"
    chosen = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.startswith(DECODER_LAYERS) and not _skipped(name, skip)
    ]
    for name, linear in chosen:
        if fake:
            q, scale = quantize_fp8_per_channel(linear.weight)
            linear.weight.copy_(dequantize_fp8(q, scale, dtype=dtype))
            continue
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name), leaf, Fp8Linear.from_linear(linear))
    return len(chosen)


def keep_checkpoint_fp8(
    model: nn.Module, scaled: set[str], bias_dtype: torch.dtype, block: int = FP8_BLOCK, skip: tuple[str, ...] = SKIP
) -> list[str]:
    """Before loading, on the meta device: hold the FP8 weights of a checkpoint with `block` x `block`
    scales as stored, `scaled` naming the checkpoint's weights that have a `weight_scale_inv`. Each
    nn.Linear whose checkpoint weight is scaled becomes an Fp8Linear of block scales (bias, if any, of
    `bias_dtype`), but those with a name part in `skip` (kv_b_proj: dequantized at load). A
    FusedLinear does when all its shards are scaled; as its row blocks stack, so must their scales',
    so every shard but the last must be a multiple of `block` rows (CheckpointError naming it). A
    module with `keep_fp8(name, scaled)` (DeepSeek's stacked experts) holds its own. Returns the
    names of the modules held in FP8."""
    kept = []
    for name, module in list(model.named_modules()):
        if _skipped(name, skip):
            continue
        if hasattr(module, "keep_fp8"):
            if module.keep_fp8(name, scaled):
                kept.append(name)
            continue
        if not isinstance(module, nn.Linear):
            continue
        parent_name, _, leaf = name.rpartition(".")
        shards = getattr(module, "shards", None) or {leaf: module.out_features}
        weights = [".".join(filter(None, (parent_name, shard, "weight"))) for shard in shards]
        if not all(w in scaled for w in weights):
            continue
        for weight, rows in list(zip(weights, shards.values()))[:-1]:
            if rows % block:
                raise CheckpointError(
                    f"FP8 checkpoint tensor {weight!r} has {rows} rows, not a multiple of its {block}-row scale "
                    f"blocks: it cannot be stacked with the next in one FP8 layer {name!r}"
                )
        fp8 = Fp8Linear(module.in_features, module.out_features, module.bias is not None, block, bias_dtype)
        if hasattr(module, "shards"):
            fp8.shards = module.shards
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, fp8)
        kept.append(name)
    return kept

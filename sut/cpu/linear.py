"""Linear layers on CPU through oneDNN with weights prepacked once at load time.

torch's default CPU GEMM (MKL here) runs small-batch products, a decode step's, at a fraction of
the memory bandwidth. With weights prepacked once in oneDNN's blocked layout (and q/k/v, gate/up
fused), `python -m sut.bench.steps` on 2 cores went from 58 / 91 / 94 / 106 ms per decode step at
batch 1 / 4 / 8 / 16 to 36 / 39 / 44 / 63 ms. Packing is what torch's own compiler does for CPU
inference (inductor's weight "freezing"); these are the ops it calls.
"""

import warnings

import torch
from torch import nn


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """fp32 always; bf16 where oneDNN has a bf16 path on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT;
    without them its packing fails, and torch's own bf16 linear computes instead)."""
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


_warned_bf16 = False


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward on a oneDNN-packed copy of its weight (the dense one is dropped)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, shape[-1]).contiguous(), self.weight, self.bias, "none", [], ""
        )
        return out.view(*shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> int:
    """Replace every CPU `nn.Linear` of a packable dtype (packable_dtypes()) by a PackedLinear; return how many.
    Subclasses of nn.Linear (the fused ones) are replaced too: their shard layout was only for
    loading."""
    global _warned_bf16
    if not onednn_available():
        return 0
    dtypes = packable_dtypes()
    targets = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and m.weight.device.type == "cpu" and m.weight.dtype in dtypes
    ]
    if (
        not _warned_bf16
        and any(isinstance(m, nn.Linear) and m.weight.dtype == torch.bfloat16 for m in model.modules())
        and torch.bfloat16 not in dtypes
    ):
        _warned_bf16 = True
        warnings.warn(
            "sut.cpu.linear: oneDNN has no bf16 path on this CPU (it needs AVX-512 BW/VL/DQ or "
            "AVX-NE-CONVERT); bf16 linears run on torch's own bf16 GEMM, unpacked and slower"
        )
    for name, linear in targets:
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, PackedLinear(linear))
    return len(targets)

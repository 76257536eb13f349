"""SwiGLU's activation: `silu(gate) * up` over the gate/up projection's fused output."""

import torch
import torch.nn.functional as F


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """`gate_up [num_tokens, 2 * inter]` = [gate | up] -> `silu(gate) * up [num_tokens, inter]`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up

"""Rotary position embeddings: the inverse frequencies of each scaling scheme (none, Llama 3.1's,
YaRN) and the cos/sin table the model computes once, in fp32, as transformers does."""

import math

import torch
from torch import nn

from sut.config import ModelConfig, RopeScaling, YarnScaling


def rope_inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """The inverse frequencies of `config`'s rope and the factor its cos and sin are multiplied by."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = config.rope_scaling
    if isinstance(s, RopeScaling):
        return _llama3(inv_freq, s), 1.0
    if isinstance(s, YarnScaling):
        return _yarn(config.rope_theta, dim, s)
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


def _yarn(theta: float, dim: int, s: YarnScaling) -> tuple[torch.Tensor, float]:
    # The dimension index at which a frequency turns `rotations` times over the original context.
    def dim_of(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    # 1 where a frequency is kept (extrapolated), 0 where divided by the factor, linear between.
    keep = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    base = theta ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq = 1.0 / (s.factor * base) * (1 - keep) + 1.0 / base * keep
    factor = s.attention_factor
    if factor is None and s.mscale and s.mscale_all_dim:
        factor = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    elif factor is None:
        factor = yarn_mscale(s.factor)
    return inv_freq, float(factor)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched `factor` times: 0.1 mscale ln(factor) + 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, computed once in fp32 (rotate-half layout)."""

    def __init__(self, config: ModelConfig, device: torch.device | str):
        super().__init__()
        inv_freq, attention_factor = rope_inv_freq(config)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        emb = torch.cat((torch.outer(positions, inv_freq),) * 2, dim=-1)
        self.register_buffer("cos", (emb.cos() * attention_factor).to(device), persistent=False)
        self.register_buffer("sin", (emb.sin() * attention_factor).to(device), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[num_tokens, head_dim]` for these positions (once per step, not per layer)."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)

"""Megatron's split of a Llama checkpoint over tensor-parallel ranks: which rows or columns of each
tensor a rank holds, and the shape it holds."""

import dataclasses
from dataclasses import dataclass

import torch

from sut.config import ModelConfig
from sut.errors import ConfigError


@dataclass(frozen=True)
class Shard:
    rank: int
    size: int

    def rows(self, total: int) -> slice:
        """This rank's part of `total` rows (or columns)."""
        part = total // self.size
        return slice(self.rank * part, (self.rank + 1) * part)


def check_divides(config: ModelConfig, size: int) -> None:
    """Refuse, by name, a tensor_parallel_size that does not divide what it splits."""
    parts = {
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
    }
    bad = [f"{name} {value}" for name, value in parts.items() if value % size]
    if bad:
        raise ConfigError(f"engine setting tensor_parallel_size={size} does not divide the model's {', '.join(bad)}")


def local_config(config: ModelConfig, size: int) -> ModelConfig:
    """The shape one rank holds."""
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // size,
        num_kv_heads=config.num_kv_heads // size,
        intermediate_size=config.intermediate_size // size,
        vocab_size=config.vocab_size // size,
    )


# Checkpoint tensors by how they split: rows (the output features), columns (the input features),
# or a bias of a column split, which one rank adds; the rest (norms) are whole on every rank.
ROW_SPLIT = (
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "q_proj.bias",
    "k_proj.bias",
    "v_proj.bias",
    "gate_proj.bias",
    "up_proj.bias",
    "embed_tokens.weight",
    "lm_head.weight",
)
COLUMN_SPLIT = ("o_proj.weight", "down_proj.weight")
ONE_RANK = ("o_proj.bias", "down_proj.bias")


def split_of(name: str) -> str | None:
    """How checkpoint tensor `name` splits over the ranks: "rows", "columns", "one rank" or None (whole)."""
    if name.endswith(ROW_SPLIT):
        return "rows"
    if name.endswith(COLUMN_SPLIT):
        return "columns"
    return "one rank" if name.endswith(ONE_RANK) else None


def read_shard(f, name: str, shard: Shard | None) -> torch.Tensor:
    """This rank's part of checkpoint tensor `name` from an open safetensors file, reading only it."""
    split = split_of(name) if shard is not None else None
    if split is None:
        return f.get_tensor(name)
    view = f.get_slice(name)
    shape = view.get_shape()
    if split == "rows":
        return view[shard.rows(shape[0])]
    if split == "columns":
        return view[:, shard.rows(shape[1])]
    return view[:] if shard.rank == 0 else torch.zeros(shape)


def slice_for(name: str, tensor: torch.Tensor, shard: Shard | None) -> torch.Tensor:
    """This rank's part of a whole tensor `name` (random_model's)."""
    split = split_of(name) if shard is not None else None
    if split == "rows":
        return tensor[shard.rows(tensor.shape[0])]
    if split == "columns":
        return tensor[:, shard.rows(tensor.shape[1])]
    if split == "one rank" and shard.rank != 0:
        return torch.zeros_like(tensor)
    return tensor

"""Megatron's split of a checkpoint over tensor-parallel ranks: which rows or columns of each tensor
a rank holds, and the shape it holds. DeepSeek-V3 splits its latent attention by heads (the latent
and its cache whole on every rank) and its routed experts by expert (expert parallelism): a rank
holds `experts(total)`, whole, and reads no other expert's tensors."""

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

    def experts(self, total: int) -> range:
        """The routed experts this rank holds, of `total` (expert parallelism)."""
        part = self.rows(total)
        return range(part.start, part.stop)


def check_divides(config: ModelConfig, size: int) -> None:
    """Refuse, by name, a tensor_parallel_size that does not divide what it splits."""
    parts = {"num_attention_heads": config.num_heads}
    if config.mla is None:  # latent attention's one latent (its "KV head") is whole on every rank
        parts["num_key_value_heads"] = config.num_kv_heads
    if config.mla is None or config.moe.first_dense_layers:
        parts["intermediate_size"] = config.intermediate_size
    parts["vocab_size"] = config.vocab_size
    if config.mla is not None:  # DeepSeek: the routed experts split by expert, the shared ones by features
        parts["n_routed_experts"] = config.moe.num_experts
        if config.moe.shared_experts:
            parts["n_shared_experts x moe_intermediate_size"] = (
                config.moe.shared_experts * config.moe.expert_intermediate_size
            )
    bad = [f"{name} {value}" for name, value in parts.items() if value % size]
    if bad:
        raise ConfigError(f"engine setting tensor_parallel_size={size} does not divide the model's {', '.join(bad)}")


def fp8_slices(config: ModelConfig, size: int) -> dict[str, int]:
    """What one of `size` ranks holds of each dimension of a DeepSeek checkpoint's FP8 weights that
    tensor parallelism splits: {"<weight> rows|columns (how)": count}. The routed experts split by
    expert (whole on their rank) and the latent's projections are whole: neither appears."""
    m, heads = config.mla, config.num_heads
    qk, kv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.qk_nope_head_dim + m.v_head_dim
    q = "q_b_proj" if m.q_lora_rank else "q_proj"
    slices = {
        f"{q} rows (num_attention_heads {heads} x {qk} / {size})": heads * qk // size,
        f"kv_b_proj rows ({heads} x {kv} / {size})": heads * kv // size,
        f"o_proj columns ({heads} x v_head_dim {m.v_head_dim} / {size})": heads * m.v_head_dim // size,
    }
    if config.moe.first_dense_layers:
        dense = config.intermediate_size
        slices[f"dense MLP gate/up rows, down columns (intermediate_size {dense} / {size})"] = dense // size
    if config.moe.shared_experts:
        shared = config.moe.shared_experts * config.moe.expert_intermediate_size
        slices[f"shared experts' gate/up rows, down columns ({shared} / {size})"] = shared // size
    return slices


def check_fp8_blocks(config: ModelConfig, size: int, block: int = 128) -> None:
    """Refuse, by name, a tensor_parallel_size at which a rank's slice of an FP8 checkpoint's weights
    would cut their `block` x `block` scale blocks: each rank reads its slice's own scales."""
    if size == 1 or config.quantization != "fp8" or config.mla is None:
        return
    bad = [f"{what} = {count}" for what, count in fp8_slices(config, size).items() if count % block]
    if bad:
        raise ConfigError(
            f"engine setting tensor_parallel_size={size}: a rank's slice of the FP8 checkpoint's weights must be "
            f"whole {block}x{block} scale blocks; not a multiple of {block}: {', '.join(bad)}"
        )


def local_config(config: ModelConfig, size: int) -> ModelConfig:
    """The shape one rank holds (the same on every rank: which experts it holds is `Shard.experts`)."""
    latent = config.mla is not None
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // size,
        num_kv_heads=config.num_kv_heads if latent else config.num_kv_heads // size,
        intermediate_size=config.intermediate_size // size,
        vocab_size=config.vocab_size // size,
        moe=dataclasses.replace(config.moe, parallel_size=size) if latent else config.moe,
    )


# Checkpoint tensors by how they split: rows (the output features), columns (the input features),
# or a bias of a column split, which one rank adds; the rest (norms) are whole on every rank.
ROW_SPLIT = (
    "q_proj.weight",
    "q_b_proj.weight",  # latent attention's: each head's rows [nope + rope] in turn
    "kv_b_proj.weight",  # each head's rows [nope + v] in turn
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
    """How checkpoint tensor `name` splits over the ranks: "rows", "columns", "one rank" or None (whole).
    A routed expert's tensors (`mlp.experts.<e>.*`) are whole on the rank that holds the expert; an FP8
    weight's `weight_scale_inv` splits as its weight, which works where each rank's slice is whole
    128 x 128 blocks (`check_fp8_blocks`)."""
    if ".experts." in name:
        return None
    name = name.removesuffix("_scale_inv")  # an FP8 weight's block scales split as the weight does
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

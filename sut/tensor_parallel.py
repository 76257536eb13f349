"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on CPU), Megatron's split: each rank
holds 1/N of the attention heads (their q/k/v rows and their KV cache), 1/N of the MLP's
intermediate features (the gate/up rows, the down projection's columns) and 1/N of the vocabulary
(embedding and LM head rows); norms are whole on every rank. The attention's output projection and
the MLP's down projection each end in an all-reduce, the embedding too (each rank fills its own
vocabulary's rows), and the LM head's slices are gathered into whole logits. Each rank reads only
its slices of the checkpoint (sut/loader.py), so no rank ever holds the whole model.

Rank 0 is the engine's process: it schedules, broadcasts each step's StepInput to the other ranks
(worker processes that run `worker_main`: a forward per step input they receive, until told to
stop) and samples from the gathered logits.
"""

import dataclasses
import os
import signal
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from sut.config import ModelConfig
from sut.errors import ConfigError

COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a rank that hangs (rather than dies) fails the step after this


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


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def embed(embedding: torch.nn.Embedding, input_ids: torch.Tensor, shard: Shard) -> torch.Tensor:
    """The embedding of `input_ids` from vocabulary-split rows: each rank looks up the ids in its
    range (zeros elsewhere), and the all-reduce sums them."""
    rows = embedding.weight.shape[0]
    local = input_ids - shard.rank * rows
    mine = (local >= 0) & (local < rows)
    x = embedding(torch.where(mine, local, 0)) * mine[:, None].to(embedding.weight.dtype)
    return all_reduce(x)


def gather_logits(logits: torch.Tensor, shard: Shard) -> torch.Tensor:
    """Whole-vocabulary logits from each rank's slice (rank order is vocabulary order)."""
    parts = [torch.empty_like(logits) for _ in range(shard.size)]
    dist.all_gather(parts, logits.contiguous())
    return torch.cat(parts, dim=-1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, size: int, port: int, device: torch.device) -> None:
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=COLLECTIVE_TIMEOUT,
    )


def broadcast(obj=None):
    """Rank 0's `obj` on every rank (a StepInput, None to stop, or a setting)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def worker_main(rank: int, size: int, port: int, model: str, settings: dict, device: str) -> None:
    """A rank other than 0: its share of the model and KV cache, then a forward for each step input
    rank 0 broadcasts, until it broadcasts None (or dies: the next collective fails here too)."""
    from sut.engine import build_runner  # the engine's own construction, for this rank's shard

    # Ctrl-C reaches the whole process group: rank 0 decides what it means and ends the group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        torch.cuda.set_device(rank)
        torch_device = torch.device("cuda", rank)
    elif hasattr(os, "sched_getaffinity"):
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // size))
    init_group(rank, size, port, torch_device)
    try:
        num_blocks = broadcast()
        runner = build_runner(model, settings, torch_device, Shard(rank, size), num_blocks)
        dist.all_gather_object([None] * size, runner.weight_bytes)
        serve(runner, torch_device)
    finally:
        dist.destroy_process_group()


def serve(runner, device: torch.device) -> None:
    """A rank other than 0: the forward of each step input rank 0 broadcasts, until it sends None."""
    while (step := broadcast()) is not None:
        # Unpickled tensors land where rank 0's were: bring them to this rank's device.
        runner.execute(
            dataclasses.replace(
                step,
                **{
                    f.name: getattr(step, f.name).to(device)
                    for f in dataclasses.fields(step)
                    if isinstance(getattr(step, f.name), torch.Tensor)
                },
            )
        )

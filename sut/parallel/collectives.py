"""The collectives tensor parallelism runs on torch.distributed (NCCL on GPUs, gloo on CPU)."""

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from sut.parallel.shard import Shard

COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a rank that hangs (rather than dies) fails the step after this


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


def gather_logits(logits: torch.Tensor) -> torch.Tensor:
    """Whole-vocabulary logits from each rank's slice (rank order is vocabulary order); in a group
    of one (a rank's share benchmarked alone, sut/bench/gpu_steps.py), its slice's."""
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
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


def broadcast_tensor(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's tensor `x` into `x` on every rank (the others pass one of its shape, dtype and device)."""
    dist.broadcast(x, src=0)
    return x


def broadcast(obj=None):
    """Rank 0's `obj` on every rank (a StepInput, None to stop, or a setting)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]

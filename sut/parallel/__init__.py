"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on CPU), Megatron's split: each rank
holds 1/N of the attention heads (their q/k/v rows and their KV cache), 1/N of the MLP's
intermediate features (the gate/up rows, the down projection's columns) and 1/N of the vocabulary
(embedding and LM head rows); norms are whole on every rank. The attention's output projection and
the MLP's down projection each end in an all-reduce, the embedding too (each rank fills its own
vocabulary's rows), and the LM head's slices are gathered into whole logits. Each rank reads only
its slices of the checkpoint (sut/model/loader.py), so no rank ever holds the whole model.

Rank 0 is the engine's process: it schedules, broadcasts each step's StepInput to the other ranks
(worker processes, sut/worker/tp_worker.py: a forward per step input they receive, until told to
stop) and samples from the gathered logits. Or torchrun starts the ranks, on one node or several
(torchrun.py: rank 0 runs the program, the others serve its engines' steps). DeepSeek-V3 splits its
latent attention by heads and its routed experts by expert (expert parallelism: each rank holds
1/N of them, whole; the router runs on every rank, and a rank's experts add their share of every
token's output to the MoE's all-reduce). This package holds the split (shard.py), the collectives
(collectives.py) and torchrun's group (torchrun.py) only.
"""

from sut.parallel.collectives import (
    COLLECTIVE_TIMEOUT,
    all_reduce,
    broadcast,
    broadcast_tensor,
    embed,
    free_port,
    gather_logits,
    init_group,
)
from sut.parallel.shard import Shard, check_divides, check_fp8_blocks, local_config, read_shard, slice_for, split_of
from sut.parallel.torchrun import TorchrunGroup, join_torchrun, leave_torchrun, torchrun_group

__all__ = [
    "COLLECTIVE_TIMEOUT",
    "Shard",
    "TorchrunGroup",
    "all_reduce",
    "broadcast",
    "broadcast_tensor",
    "check_divides",
    "check_fp8_blocks",
    "embed",
    "free_port",
    "gather_logits",
    "init_group",
    "join_torchrun",
    "leave_torchrun",
    "local_config",
    "read_shard",
    "slice_for",
    "split_of",
    "torchrun_group",
]

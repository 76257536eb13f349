"""A tensor-parallel rank other than 0: a process that holds its share of the model and KV cache
and runs a forward for each step input rank 0 broadcasts (sut/parallel/ says how the model splits).
The engine spawns such processes itself (`worker_main`), or torchrun starts them, on this node and
others (`serve_torchrun`, from sut/worker/torchrun_entry.py)."""

import dataclasses
import os
import signal

import torch
import torch.distributed as dist

from sut.config.resolved import ResolvedConfig
from sut.parallel import Shard, TorchrunGroup, broadcast, broadcast_tensor, init_group
from sut.worker.model_runner import ModelRunner
from sut.worker.step_input import DraftStep, StepInput


def worker_main(rank: int, size: int, port: int, resolved: ResolvedConfig, device: str) -> None:
    """A rank other than 0: its share of the model and KV cache, then a forward for each step input
    rank 0 broadcasts, until it broadcasts None (or dies: the next collective fails here too)."""
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
        serve_engine(resolved, torch_device, Shard(rank, size))
    finally:
        dist.destroy_process_group()


def serve_torchrun(group: TorchrunGroup) -> None:
    """A rank other than 0 that torchrun started: the engines rank 0 starts, one after the other, each
    from the settings it broadcasts, until it broadcasts None."""
    while (resolved := broadcast()) is not None:
        serve_engine(resolved, group.device(torch.device(resolved.device).type), Shard(group.rank, group.size))


def serve_engine(resolved: ResolvedConfig, device: torch.device, shard: Shard) -> None:
    """One engine's life on a rank other than 0: its runner, sized as rank 0's, then its steps."""
    num_blocks = broadcast()
    if num_blocks is None:  # rank 0's own runner failed: the engine ends before it started
        return
    runner = build_runner(resolved, device, shard, num_blocks)
    dist.all_gather_object([None] * shard.size, runner.weight_bytes)
    serve(runner, device)


def serve(runner, device: torch.device) -> None:
    """A rank other than 0: the forward of each step input rank 0 broadcasts (a draft module's with
    its hidden states after it), until it sends None."""
    while (message := broadcast()) is not None:
        if isinstance(message, DraftStep):
            hidden = broadcast_tensor(torch.empty(message.hidden_shape, dtype=message.hidden_dtype, device=device))
            runner.execute_draft(on_device(message.step, device), hidden)
        else:
            runner.execute(on_device(message, device))


def on_device(step: StepInput, device: torch.device) -> StepInput:
    """`step` with its tensors on `device` (unpickled tensors land where rank 0's were)."""
    return dataclasses.replace(
        step,
        **{
            f.name: getattr(step, f.name).to(device)
            for f in dataclasses.fields(step)
            if isinstance(getattr(step, f.name), torch.Tensor)
        },
    )


def build_runner(resolved: ResolvedConfig, device: torch.device, shard: Shard, num_blocks: int) -> ModelRunner:
    """Tensor-parallel rank `shard.rank`'s runner: the engine's resolved settings and model, its part of them."""
    return ModelRunner(
        resolved.folder,
        resolved.model,
        resolved.engine,
        resolved.max_model_len,
        resolved.dtype,
        device,
        num_blocks,
        shard=shard,
    )

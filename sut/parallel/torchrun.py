"""Tensor-parallel ranks that torchrun starts, on one node or across several, in place of the
processes the engine spawns itself: every rank runs `sut/worker/torchrun_entry.py`, which joins the
group from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; `env://`).
Rank 0 runs the program it is given (the harness, a script), whose engine takes these ranks as its
own (`torchrun_group()`); the others wait for an engine's settings and serve its steps, engine after
engine, until rank 0 says there are no more.

What rank 0 broadcasts, in order: an engine's ResolvedConfig (None: no more engines), then as an
engine started by the engine itself does (sut/worker/tp_worker.py): the KV pool's size (None: the
engine failed to start), then a StepInput per step (None: the engine closed)."""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sut.errors import ConfigError
from sut.parallel.collectives import COLLECTIVE_TIMEOUT, broadcast

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class TorchrunGroup:
    """This process's place among torchrun's ranks, and on rank 0 where its engines stand."""

    rank: int
    size: int
    local_rank: int
    local_size: int  # the ranks on this node (LOCAL_WORLD_SIZE)
    serving: bool = False  # rank 0: the other ranks serve an engine's steps (until it closes)
    broken: bool = False  # rank 0: a collective failed, so nothing more is sent

    def device(self, device_type: str) -> torch.device:
        """This rank's device of `device_type`: on CUDA the LOCAL_RANK-th visible GPU."""
        if device_type != "cuda":
            return torch.device(device_type)
        device = torch.device("cuda", self.local_rank)
        torch.cuda.set_device(device)
        return device

    # Rank 0's side: the engine's view of its other ranks (as sut/engine/processes.py's WorkerGroup).
    def start_engine(self, resolved) -> None:
        """Send an engine's settings: the other ranks build their runners from them."""
        if self.serving:
            raise ConfigError(
                "under torchrun one engine at a time holds the ranks: close the engine before starting another"
            )
        self._send(resolved)
        self.serving = not self.broken

    def end_engine(self) -> None:
        """The engine closed (or failed to start): the other ranks drop its runner and wait for the next."""
        if self.serving:
            self.serving = False
            self._send(None)

    def dead(self, grace_s: float = 0.0) -> str:
        """Why a step's collective failed, for the engine's WorkerError: torchrun's ranks are not this
        process's children, so which one went is torchrun's to say (its agent then ends the others)."""
        self.broken = True
        return (
            f"the step failed on rank 0 or in a collective, so the {self.size} tensor-parallel ranks torchrun "
            "started (WORLD_SIZE) are out of step; a rank that went is named in torchrun's log"
        )

    def end(self) -> None:
        """Rank 0, at its program's end: stop an engine left open, release the other ranks, leave the group."""
        if self.rank == 0:
            self.end_engine()
            self._send(None)
        dist.destroy_process_group()

    def _send(self, obj) -> None:
        if self.broken:
            return
        try:
            broadcast(obj)
        except RuntimeError:  # a rank has gone: torchrun ends the rest
            self.broken = True


_group: TorchrunGroup | None = None


def torchrun_group() -> TorchrunGroup | None:
    """The ranks torchrun started, once this process has joined them (join_torchrun); None otherwise."""
    return _group


def join_torchrun() -> TorchrunGroup:
    """Join torchrun's process group (gloo, and NCCL for CUDA tensors where there is a GPU), from its
    environment; ConfigError naming what is missing when torchrun did not start this process."""
    global _group
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise ConfigError(
            f"environment variable(s) {', '.join(missing)} not set: torchrun sets them; start the ranks as "
            "`torchrun --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] "
            "-m sut.worker.torchrun_entry PROGRAM [ARGS...]`"
        )
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    if hasattr(os, "sched_getaffinity"):  # the node's cores shared by its ranks
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_size))
    # Objects (settings, step inputs) and CPU tensors over gloo; CUDA tensors over NCCL, whose
    # communicator starts at the first CUDA collective, after an engine on CUDA set each rank's GPU.
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)
    _group = TorchrunGroup(rank, size, local_rank, local_size)
    return _group


def leave_torchrun() -> None:
    """End this process's part in torchrun's group (join_torchrun's other half)."""
    global _group
    group, _group = _group, None
    if group is not None:
        group.end()

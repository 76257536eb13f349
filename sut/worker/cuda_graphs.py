"""Decode-only steps replayed from CUDA graphs, as nano-vllm and vLLM do it: a step of one-token
queries launches ~11 kernels a layer, each a few microseconds of host time, so on a GPU the host
would set the pace; a graph replays them all in one launch.

One graph per batch size of a ladder (1, 2, 4, 8, then steps of 16 up to max_num_seqs), each
captured over static buffers that a step's inputs are copied into. A batch runs on the graph of
the smallest size that holds it; its padding rows write nowhere (slot -1) and attend to one cached
token. Steps with prefill or drafts, and batches above the ladder, run eagerly. The decode kernel's
split count is fixed at capture (from max_model_len); each program finds its keys from the
sequence's own length at run time, so any count is right for any context, only less tuned.
"""

import dataclasses
from collections.abc import Callable

import torch

from kernels import AttentionMetadata
from sut.worker.step_input import StepInput


def graph_batch_sizes(max_batch: int) -> list[int]:
    return [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))


def capture_cuda_graph(run: Callable[[], torch.Tensor], pool) -> tuple[object, torch.Tensor, object]:
    """(graph, its output, its memory pool) of `run`, after one eager call outside the capture (which
    compiles the Triton kernels and lets cuBLAS allocate its workspace)."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out, graph.pool()


class DecodeGraphs:
    def __init__(
        self,
        model,
        max_batch: int,
        max_blocks_per_seq: int,
        max_model_len: int,
        device: torch.device,
        capture: Callable = capture_cuda_graph,
        window: bool = False,
    ):
        """`capture(run, pool) -> (graph with .replay(), output tensor, pool)`: CUDA graphs, or a
        stand-in in tests (CPU has no graphs). `window`: the model's window layers have block tables
        of their own."""
        self.sizes = graph_batch_sizes(max_batch)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=device)
        # A model with window layers beside full ones: their slots and tables (sut/engine/block_manager.py).
        self.window_slot_mapping = self.slot_mapping.clone() if window else None
        self.window_block_tables = self.block_tables.clone() if window else None
        self.graphs, self.outputs = {}, {}
        pool = None
        for size in reversed(self.sizes):  # the largest first: the smaller ones reuse its memory
            meta = AttentionMetadata(
                self.slot_mapping[:size],
                self.block_tables[:size],
                self.cu_seqlens_q[: size + 1],
                self.seq_lens[:size],
                [1] * size,
                [max_model_len] * size,
            )
            if window:
                meta.window = dataclasses.replace(
                    meta, slot_mapping=self.window_slot_mapping[:size], block_tables=self.window_block_tables[:size]
                )
            run = lambda size=size, meta=meta: model(self.input_ids[:size], self.positions[:size], meta)
            self.graphs[size], self.outputs[size], pool = capture(run, pool)

    def run(self, step: StepInput) -> torch.Tensor | None:
        """The step's hidden states from a graph, or None for a step it does not take."""
        n = len(step.query_lens_host)
        if (
            n > self.sizes[-1]
            or step.input_ids.shape[0] != n
            or step.block_tables.shape[1] > self.block_tables.shape[1]
        ):
            return None
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(step.input_ids, non_blocking=True)
        self.positions[:n].copy_(step.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(step.slot_mapping, non_blocking=True)
        self.block_tables[:n, : step.block_tables.shape[1]].copy_(step.block_tables, non_blocking=True)
        self.seq_lens[:n].copy_(step.seq_lens, non_blocking=True)
        # Padding rows: no K/V written, one token of block 0 read (the last step may have left others).
        self.slot_mapping[n:size].fill_(-1)
        self.seq_lens[n:size].fill_(1)
        self.block_tables[n:size, 0].fill_(0)
        if self.window_block_tables is not None:
            width = step.window_block_tables.shape[1]
            self.window_slot_mapping[:n].copy_(step.window_slot_mapping, non_blocking=True)
            self.window_block_tables[:n, :width].copy_(step.window_block_tables, non_blocking=True)
            self.window_slot_mapping[n:size].fill_(-1)
            self.window_block_tables[n:size, 0].fill_(0)
        self.graphs[size].replay()
        return self.outputs[size][:n]

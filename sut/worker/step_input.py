"""What one forward reads: flat token inputs and the attention's paging metadata, as plain tensors
on the engine's device and host ints, with no Sequence in it. A tensor-parallel rank receives one,
a CUDA graph reads from its buffers, and a verifier asks for several rows of logits per sequence."""

from dataclasses import dataclass

import torch


@dataclass
class StepInput:
    input_ids: torch.Tensor  # [num_tokens] int64, every sequence's new tokens in batch order
    positions: torch.Tensor  # [num_tokens] int64
    slot_mapping: torch.Tensor  # [num_tokens] int64, the KV-cache slot each new token is stored in
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32, where each sequence's new tokens start
    seq_lens: torch.Tensor  # [num_seqs] int32, tokens per sequence including this step's
    logits_indices: torch.Tensor  # [num_logits] int64, the token rows whose logits are wanted
    query_lens_host: list[int]  # new tokens per sequence, as host ints (attention plans and grids)
    seq_lens_host: list[int]
    # The sliding-window layers' slots and blocks, where the model has them beside full layers.
    window_slot_mapping: torch.Tensor | None = None
    window_block_tables: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

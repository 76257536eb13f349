"""What one forward reads: flat token inputs and the attention's paging metadata, as plain tensors
on the engine's device and host ints, with no Sequence in it. A tensor-parallel rank receives one,
a CUDA graph reads from its buffers, and a verifier asks for several rows of logits per sequence."""

import dataclasses
from dataclasses import dataclass

import torch

from kernels import AttentionMetadata


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

    def attention_metadata(self, with_window: bool = True) -> AttentionMetadata:
        """The attention's view of this step; with `with_window`, the window layers' own slots and
        tables as its `window` where the step has them (an EAGLE3 head, all full attention, asks
        without)."""
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping,
            block_tables=self.block_tables,
            cu_seqlens_q=self.cu_seqlens_q,
            seq_lens=self.seq_lens,
            query_lens_host=self.query_lens_host,
            seq_lens_host=self.seq_lens_host,
        )
        if with_window and self.window_block_tables is not None:
            meta.window = dataclasses.replace(
                meta, slot_mapping=self.window_slot_mapping, block_tables=self.window_block_tables
            )
        return meta


@dataclass
class DraftStep:
    """A forward of a draft module that runs on every tensor-parallel rank beside the target's
    (DeepSeek's MTP module, ModelRunner.execute_draft): its step input and the shape and dtype of its
    input hidden states, which follow as a tensor broadcast."""

    step: StepInput
    hidden_shape: tuple[int, ...]
    hidden_dtype: torch.dtype

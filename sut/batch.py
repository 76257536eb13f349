"""One step's work, as the scheduler hands it to the model runner."""

from dataclasses import dataclass, field

import numpy as np

from sut.sequence import Sequence


@dataclass
class ScheduledBatch:
    """One step's work: per sequence, the tokens it computes (its drafts included), whether they are
    prefill, how many rows of logits it wants (1 where its chunk reaches its last token and it
    samples, 1 + its drafts where it verifies them, else 0) and how many of its tokens are drafts."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    is_prefill: list[bool] = field(default_factory=list)
    num_logits: list[int] = field(default_factory=list)
    num_draft: list[int] = field(default_factory=list)
    block_tables: np.ndarray | None = None  # BlockManager.block_tables: row seq.block_row is seq's
    window_tables: np.ndarray | None = None  # BlockManager.window_tables, where the model has window layers

    def __len__(self):
        return len(self.seqs)

    @property
    def sampling_seqs(self) -> list[Sequence]:
        return [seq for seq, k in zip(self.seqs, self.num_logits) if k]

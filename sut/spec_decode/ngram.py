"""Proposers of draft tokens for speculative decoding, behind one interface: `propose(seqs, counts,
block_tables)` returns, per sequence, up to counts[i] draft tokens and the probabilities
`[len, vocab]` each was sampled from (None for deterministic drafts). The verifier (sut/sample/verifier.py)
sees only that, so a proposer of any kind plugs in without touching it: n-gram lookup here, a draft
model (sut/spec_decode/draft_model.py), or later a head that reads the target's hidden states (EAGLE, MTP),
which would also take the hidden rows of the target's last step.

Proposals are made at the start of a step, for the decoding sequences that have none, after the
scheduler has reserved the k + 1 slots they will be verified in."""

from typing import Protocol

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from sut.sequence import Sequence


class Proposer(Protocol):
    def propose(
        self, seqs: list[Sequence], counts: list[int], block_tables: np.ndarray
    ) -> list[tuple[list[int], torch.Tensor | None]]: ...


class NgramProposer:
    """Prompt lookup: find the sequence's last n tokens (n from `max_n` down to `min_n`) earlier in
    its prompt and output, and propose the tokens that followed the latest such match."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs, counts, block_tables=None):
        return [
            (ngram_lookup(np.asarray(seq.token_ids), self.min_n, self.max_n, k), None) for seq, k in zip(seqs, counts)
        ]


def ngram_lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
    (between min_n and max_n long) that occurs earlier; [] if none does."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows that end before the last token, so a match is followed by at least one token.
        hits = np.flatnonzero((sliding_window_view(tokens[:-1], n) == tokens[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []

"""Prompt lookup (n-gram) drafts, a Proposer (sut/spec_decode/proposer.py) that needs no model."""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


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

"""Proposers of draft tokens for speculative decoding, behind one interface: `propose(seqs, counts,
block_tables)` returns, per sequence, up to counts[i] draft tokens and the probabilities
`[len, vocab]` each was sampled from (None for deterministic drafts). The verifier (sut/sample/verifier.py)
sees only that, so a proposer of any kind plugs in without touching it: n-gram lookup
(sut/spec_decode/ngram.py), a draft model (sut/spec_decode/draft_model.py), an EAGLE3 head
(sut/spec_decode/eagle3.py) or DeepSeek-V3's MTP module (sut/spec_decode/mtp.py), which read the
target's hidden states at the layer boundaries they name (`aux_layers`): the engine's steps return
those of the step's tokens (`ModelRunner.execute(step, aux_layers)`) and the engine hands them to
the proposer after the step's update (`observe(seqs, starts, num_new_tokens, aux)`), which keeps,
per sequence, the rows of the positions the target kept. `make_proposer` (factory.py) builds the
one the settings name.

Proposals are made at the start of a step, for the decoding sequences that have none, after the
scheduler has reserved the k + 1 slots they will be verified in."""

from typing import Protocol

import numpy as np
import torch

from sut.sequence import Sequence


class Proposer(Protocol):
    def propose(
        self, seqs: list[Sequence], counts: list[int], block_tables: np.ndarray
    ) -> list[tuple[list[int], torch.Tensor | None]]: ...


def sampling_settings(seq: Sequence) -> tuple[float, int, float]:
    """(temperature, top_k, top_p) of `seq`: what a model proposer samples its drafts with, as the
    verifier will judge them."""
    return seq.params.temperature, seq.params.top_k, seq.params.top_p

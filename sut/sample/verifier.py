"""Verification of drafts, exact: turns the target's logits over each sampling sequence's drafts and
the position after them into the tokens it emits, through the rejection sampler
(kernels/rejection_sample.py: the Triton kernel on CUDA, its PyTorch reference on CPU, as the
engine's op set has it).

Greedy requests keep drafts while they equal the target's argmax (so the output is plain greedy
decoding's); sampled ones accept draft x with probability min(1, p(x)/q(x)), where q is the
distribution the draft was really sampled from (one-hot for n-gram drafts), and on rejection draw
from norm(max(p - q, 0)); either way a token of the target's follows. The uniforms come from each
request's own generator, so a seeded request emits the same tokens whatever else is in the batch.
A sequence with no drafts is sampled the same way (its one token is the "bonus" draw). A sequence
any of whose rows of logits is not all finite emits nothing (None): it fails alone (sampler.py)."""

import torch

from sut.sample.sampler import finite_rows, sampling_probs, stop_tokens, to_host
from sut.sequence import Sequence


def verify(
    logits: torch.Tensor,
    seqs: list[Sequence],
    eos_token_ids: tuple[int, ...],
    default_generator: torch.Generator,
    rejection_sample,
) -> list[list[int] | None]:
    """`logits`: `[sum(1 + drafts), vocab]`, each sampling sequence's rows in batch order (one per
    draft, then one after them); `rejection_sample`: the engine's op (KernelOps.rejection_sample).
    Returns each sequence's emitted tokens, None for one with a row of logits not all finite."""
    if not seqs:
        return []
    finite = finite_rows(logits)
    device, vocab = logits.device, logits.shape[-1]
    num_draft = [len(s.spec_token_ids) for s in seqs]
    cu = [0]
    for d in num_draft:
        cu.append(cu[-1] + d)
    row = 0
    for seq, d in zip(seqs, num_draft):
        short = seq.params.min_tokens - len(seq.output_token_ids)  # rows still under min_tokens
        if short > 0:
            stops = stop_tokens(seq, eos_token_ids)
            if stops:
                logits[row : row + min(short, d + 1), stops] = float("-inf")
        row += d + 1
    target_argmax = logits.argmax(dim=-1)
    greedy = [s.params.greedy for s in seqs]
    target_probs = draft_probs = None
    accept_uniforms = torch.zeros(cu[-1])
    sample_uniforms = torch.zeros(len(seqs))
    if not all(greedy):
        target_probs = torch.zeros(logits.shape, dtype=torch.float32, device=device)
        for i, seq in enumerate(seqs):
            if greedy[i]:
                continue
            p = seq.params
            rows = slice(cu[i] + i, cu[i + 1] + i + 1)
            target_probs[rows] = sampling_probs(logits[rows], p.temperature, p.top_k, p.top_p)
            u = torch.rand(num_draft[i] + 1, generator=seq.generator or default_generator)
            accept_uniforms[cu[i] : cu[i + 1]], sample_uniforms[i] = u[:-1], u[-1]
        if any(s.spec_probs is not None for s in seqs):
            draft_probs = torch.zeros(cu[-1], vocab, dtype=torch.float32, device=device)
            for i, seq in enumerate(seqs):
                if seq.spec_probs is not None:
                    draft_probs[cu[i] : cu[i + 1]] = seq.spec_probs
                elif not greedy[i]:  # deterministic drafts: q is one-hot
                    draft_probs[torch.arange(cu[i], cu[i + 1]), seq.spec_token_ids] = 1.0
    draft_token_ids = torch.tensor([t for s in seqs for t in s.spec_token_ids], dtype=torch.int64)
    out = rejection_sample(
        torch.tensor(cu, dtype=torch.int32, device=device),
        draft_token_ids.to(device),
        draft_probs,
        target_probs,
        target_argmax,
        torch.tensor(greedy, device=device),
        accept_uniforms.to(device),
        sample_uniforms.to(device),
        max(num_draft),
    )
    out, finite = to_host(out, finite)
    finite = finite.tolist()
    return [
        [t for t in tokens if t >= 0] if all(finite[cu[i] + i : cu[i + 1] + i + 1]) else None
        for i, tokens in enumerate(out.tolist())
    ]

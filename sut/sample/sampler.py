"""Turns each sampling sequence's logits into its next token: greedy argmax, or temperature /
top-k / top-p sampling drawn from the request's own generator (so a seeded request gives the
same tokens whatever else is in the batch). A row whose logits are not all finite gives no token:
its sequence fails with NONFINITE_LOGITS, and the others in the batch go on."""

import torch

from sut.sequence import Sequence

NONFINITE_LOGITS = "the model's logits are NaN or inf at this step (corrupt weights, or numerics out of range)"


def sample(
    logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: tuple[int, ...], default_generator: torch.Generator
) -> list[int | None]:
    """Each row's token, None for a row whose logits are not all finite."""
    if not seqs:  # a step of prefill chunks that reach no prompt's end: nothing to wait for
        return []
    finite = finite_rows(logits)
    for row, seq in enumerate(seqs):
        if len(seq.output_token_ids) < seq.params.min_tokens:  # min_tokens: no stop before then
            stops = stop_tokens(seq, eos_token_ids)
            if stops:
                logits[row, stops] = float("-inf")
    rows = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
    argmax = logits.argmax(dim=-1)
    if not rows:
        argmax, finite = to_host(argmax, finite)
        return _finite_only(argmax.tolist(), finite)
    probs = torch.stack(
        [
            sampling_probs(logits[row], seqs[row].params.temperature, seqs[row].params.top_k, seqs[row].params.top_p)
            for row in rows
        ]
    )
    argmax, finite, probs = to_host(argmax, finite, probs)
    tokens = argmax.tolist()
    for row, drawn in zip(rows, draw(probs, [seqs[row].generator or default_generator for row in rows])):
        tokens[row] = drawn
    return _finite_only(tokens, finite)


def finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """Whether each row of `logits` is all finite, as a device tensor: no wait for the device here,
    it comes to the host with the step's one copy (to_host). The other rows are zeroed in place, so
    that sampling and verification go through them harmlessly (multinomial refuses NaN) and the
    tokens drawn for them are dropped. A NaN or inf anywhere in a row makes its sum NaN or inf,
    which is one cheap reduction (a sum that overflows is numerics out of range too)."""
    finite = logits.sum(dim=-1).isfinite()
    logits.masked_fill_(~finite[:, None], 0.0)
    return finite


def _finite_only(tokens: list[int], finite: torch.Tensor) -> list[int | None]:
    return [token if ok else None for token, ok in zip(tokens, finite.tolist())]


def to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Host copies of `tensors` after one wait for the device: on CUDA the step's one sync (the
    copies go to pinned memory without blocking; the wait covers them all). On CPU, themselves."""
    if all(t.device.type == "cpu" for t in tensors):
        return list(tensors)
    copies = [t.to("cpu", non_blocking=True) for t in tensors]
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return copies


def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> list[int]:
    """One token from each row of host `probs`, each from its own generator."""
    tokens = []
    for row, generator in zip(probs, generators):
        tokens.append(int(torch.multinomial(row, 1, generator=generator)))
    return tokens


def stop_tokens(seq: Sequence, eos_token_ids: tuple[int, ...]) -> list[int]:
    """The tokens that would end `seq` (masked while it is under min_tokens)."""
    return list(seq.params.stop_token_ids) + ([] if seq.params.ignore_eos else list(eos_token_ids))


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution a sampled token is drawn from: softmax(logits / T) restricted to the top-k
    tokens and to the smallest set of top tokens whose probability reaches top_p (over the last
    dimension: one row, or the rows of one request)."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of strictly better tokens
        sorted_probs[before >= top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs

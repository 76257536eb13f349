"""The verifier of speculative decoding: exact rejection sampling of draft tokens against the
target model's probabilities (Leviathan et al. 2023, Chen et al. 2023), so the emitted tokens are
distributed exactly as the target alone would sample them.

Sequence i has k_i = cu_num_draft[i+1] - cu_num_draft[i] drafts (k_i may be 0), rows
cu[i] .. cu[i+1]-1 of `draft_token_ids [D]` (int64) and of `draft_probs [D, V]` (fp32, the q each
draft was sampled from; None for deterministic drafts such as n-gram lookup: q one-hot at the
draft). `target_probs [D + B, V]` (fp32, the already processed p) has k_i + 1 rows for it,
cu[i] + i .. cu[i+1] + i: row cu[i] + i + j scores draft j and the last is the bonus position;
`target_argmax [D + B]` (int64) is the argmax of each row's logits. target_probs may be None when
every sequence is greedy. `accept_uniforms [D]` and `sample_uniforms [B]` (fp32 in [0, 1)) are the
only randomness (the caller draws them per request), so the result is a function of the inputs.

Greedy sequence: accept draft j while it equals the row's argmax; emit the argmax at the first
mismatch, or the bonus row's argmax when all are accepted. Sampled sequence: accept draft x with
probability min(1, p[x] / q[x]), i.e. iff q[x] > 0 and u * q[x] < p[x]; at the first rejection
emit a draw from max(p - q, 0) (from p if that is all zero, which only rounding allows), and when
all are accepted a draw from the bonus row's p.

A draw from weights w >= 0 with uniform u is the smallest token t with w[t] > 0 and
cumsum(w)[t] > u * sum(w), or the last token with w[t] > 0 if rounding leaves none (0 if w is all
zero). Kernel and reference agree token for token whenever the sums are exact, e.g. when every
probability is a multiple of 2^-22 and a row's mass is at most 1 (as the tests make them).
Otherwise their summation orders differ, and a draw can differ (by a neighbouring token) where
u * sum(w) lies within fp32 rounding of a partial sum. For scale, fp32 torch.cumsum against an
exact one on softmax rows: no differing draw in 2*10^5 at vocabulary 50, about 2 in 1000 at
128256. Either is an exact sample up to that rounding.

Returns `[B, max_num_draft + 1]` int64: the accepted drafts, then the recovered or bonus token,
then -1. Inputs are never written.
"""

import torch
import triton
import triton.language as tl

BLOCK_V = 1024  # vocabulary tile of the kernel's two passes


def _accepts(u: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> bool:
    # Accept with probability min(1, p[x] / q[x]) without a division (fp32, as the kernel).
    return bool(q_x > 0) and bool(u * q_x < p_x)


def _recovery_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What to draw from after rejecting a draft sampled from q: max(p - q, 0), or p where that is
    all zero."""
    w = (p - q).clamp(min=0)
    return w if bool(w.sum() > 0) else p


def _draw(w: torch.Tensor, u: torch.Tensor) -> int:
    """The smallest token whose running sum of `w` exceeds u * sum(w) (no normalisation)."""
    hit = ((torch.cumsum(w, 0) > u * w.sum()) & (w > 0)).nonzero()
    if len(hit):
        return int(hit[0])
    positive = (w > 0).nonzero()  # rounding left no crossing: the last token that has weight
    return int(positive[-1]) if len(positive) else 0


def rejection_sample_reference(
    cu_num_draft: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor | None,
    target_argmax: torch.Tensor,
    is_greedy: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    max_num_draft: int,
) -> torch.Tensor:
    """The rule above one sequence at a time (see the module docstring for the arguments)."""
    num_seqs = is_greedy.shape[0]
    out = torch.full((num_seqs, max_num_draft + 1), -1, dtype=torch.int64, device=draft_token_ids.device)
    cu, drafts, argmax = cu_num_draft.tolist(), draft_token_ids.tolist(), target_argmax.tolist()
    for i, greedy in enumerate(is_greedy.tolist()):
        start, k = cu[i], cu[i + 1] - cu[i]
        n = 0  # drafts accepted
        while n < k:
            x, row = drafts[start + n], start + i + n
            if greedy:
                accepted = x == argmax[row]
            else:
                q_x = draft_probs[start + n, x] if draft_probs is not None else torch.tensor(1.0)
                accepted = _accepts(accept_uniforms[start + n], target_probs[row, x], q_x)
            if not accepted:
                break
            out[i, n] = x
            n += 1
        row = start + i + n  # the rejected draft's row, or the bonus row
        if greedy:
            out[i, n] = argmax[row]
            continue
        p = target_probs[row]
        if n < k:
            if draft_probs is not None:
                q = draft_probs[start + n]
            else:
                q = torch.zeros_like(p)
                q[drafts[start + n]] = 1.0
            w = _recovery_weights(p, q)
        else:
            w = p
        out[i, n] = _draw(w, sample_uniforms[i])
    return out


@triton.jit
def _block_weights(p_row, q_row, cols, vocab_size, q_len, q_token, HAS_DRAFT_PROBS: tl.constexpr):
    """One vocabulary tile of p and of the weights max(p - q, 0). q is read below `q_len` (0: q = 0)
    or, without draft probabilities, one-hot at `q_token` (-1: q = 0). Limits, not a scalar flag
    and-ed into the mask, because Triton's interpreter mishandles that mask."""
    p = tl.load(p_row + cols, mask=cols < vocab_size, other=0.0)
    if HAS_DRAFT_PROBS:
        q = tl.load(q_row + cols, mask=cols < q_len, other=0.0)
    else:
        q = tl.where(cols == q_token, 1.0, 0.0)
    return p, tl.maximum(p - q, 0.0)


@triton.jit(do_not_specialize=["out_stride"])
def _rejection_sample_kernel(
    out_ptr,
    cu_num_draft_ptr,
    draft_token_ids_ptr,
    draft_probs_ptr,
    target_probs_ptr,
    target_argmax_ptr,
    is_greedy_ptr,
    accept_uniforms_ptr,
    sample_uniforms_ptr,
    vocab_size,
    out_stride,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # One program per sequence. out is pre-filled with -1; this writes the emitted tokens only.
    seq = tl.program_id(0)
    start = tl.load(cu_num_draft_ptr + seq)
    k = tl.load(cu_num_draft_ptr + seq + 1) - start
    greedy = tl.load(is_greedy_ptr + seq)
    out_row = out_ptr + seq.to(tl.int64) * out_stride

    # Triton has no break: `still` drops to 0 at the first rejection and masks every later store.
    still = 1
    num_accepted = 0
    for j in range(0, k):
        draft = tl.load(draft_token_ids_ptr + start + j)
        row = (start + seq + j).to(tl.int64)
        if greedy:
            accept = draft == tl.load(target_argmax_ptr + row)
        else:
            p_x = tl.load(target_probs_ptr + row * vocab_size + draft)
            u = tl.load(accept_uniforms_ptr + start + j)
            if HAS_DRAFT_PROBS:
                q_x = tl.load(draft_probs_ptr + (start + j).to(tl.int64) * vocab_size + draft)
                accept = (q_x > 0) & (u * q_x < p_x)
            else:
                accept = u < p_x  # q[x] = 1
        still = still & accept.to(tl.int32)
        tl.store(out_row + j, draft, mask=still != 0)
        num_accepted += still

    row = (start + seq + num_accepted).to(tl.int64)  # the rejected draft's row, or the bonus row
    if greedy:
        token = tl.load(target_argmax_ptr + row)
    else:
        recover = num_accepted < k
        p_row = target_probs_ptr + row * vocab_size
        q_row = draft_probs_ptr + (start + num_accepted).to(tl.int64) * vocab_size
        rejected_draft = tl.load(draft_token_ids_ptr + start + num_accepted, mask=recover, other=-1)
        q_len = tl.where(recover, vocab_size, 0)
        # Pass 1: the sums of max(p - q, 0) and of p, the fallback when rounding leaves
        # max(p - q, 0) all zero.
        total_w = 0.0
        total_p = 0.0
        for v0 in range(0, vocab_size, BLOCK_V):
            p, w = _block_weights(
                p_row, q_row, v0 + tl.arange(0, BLOCK_V), vocab_size, q_len, rejected_draft, HAS_DRAFT_PROBS
            )
            total_w += tl.sum(w, axis=0)
            total_p += tl.sum(p, axis=0)
        subtract = recover & (total_w > 0)
        q_len = tl.where(subtract, vocab_size, 0)
        q_token = tl.where(subtract, rejected_draft, -1)
        threshold = tl.load(sample_uniforms_ptr + seq) * tl.where(subtract, total_w, total_p)
        # Pass 2: the first token with weight whose running sum exceeds the threshold. One min
        # finds it and the fallback: a token's key is its index where it crosses, 2V - index where
        # it only has weight (so, without a crossing, the last token with weight wins), else 3V.
        # (w > 0 as well: a scan's rounding must never pick a token without weight.)
        best = 3 * vocab_size
        running = 0.0
        for v0 in range(0, vocab_size, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            p, w = _block_weights(p_row, q_row, cols, vocab_size, q_len, q_token, HAS_DRAFT_PROBS)
            crosses = (running + tl.cumsum(w, axis=0) > threshold) & (w > 0)
            key = tl.where(crosses, cols, tl.where(w > 0, 2 * vocab_size - cols, 3 * vocab_size))
            best = tl.minimum(best, tl.min(key, axis=0))
            running += tl.sum(w, axis=0)
        token = tl.where(best < vocab_size, best, tl.where(best <= 2 * vocab_size, 2 * vocab_size - best, 0))
        token = token.to(tl.int64)
    tl.store(out_row + num_accepted, token)


def rejection_sample_triton(
    cu_num_draft: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor | None,
    target_argmax: torch.Tensor,
    is_greedy: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    max_num_draft: int,
    block_v: int = BLOCK_V,
) -> torch.Tensor:
    """The Triton kernel behind `rejection_sample_reference`'s interface: contiguous tensors of the
    dtypes in the module docstring, draft ids in [0, V); `max_num_draft` a host int that must be
    >= every k_i (not checked: that would sync; a longer row would spill into the next), one
    compilation for all values; `block_v` a power of two."""
    num_seqs = is_greedy.shape[0]
    # The kernel indexes every tensor as a contiguous one.
    tensors = (
        cu_num_draft,
        draft_token_ids,
        draft_probs,
        target_probs,
        target_argmax,
        is_greedy,
        accept_uniforms,
        sample_uniforms,
    )
    assert all(t is None or t.is_contiguous() for t in tensors)
    assert cu_num_draft.dtype == torch.int32 and cu_num_draft.shape == (num_seqs + 1,)
    assert draft_token_ids.dtype == torch.int64 and target_argmax.dtype == torch.int64
    assert is_greedy.dtype == torch.bool
    assert accept_uniforms.dtype == torch.float32 and sample_uniforms.dtype == torch.float32
    assert all(t is None or t.dtype == torch.float32 for t in (draft_probs, target_probs))
    out = torch.full((num_seqs, max_num_draft + 1), -1, dtype=torch.int64, device=draft_token_ids.device)
    if num_seqs == 0:
        return out
    # Never read where they are missing (greedy sequences, or q one-hot): any fp32 pointer will do.
    dummy = torch.empty(0, dtype=torch.float32, device=out.device)
    # 0, not 1, without probabilities: the JIT would compile a separate kernel for a 1.
    vocab_size = target_probs.shape[1] if target_probs is not None else 0
    _rejection_sample_kernel[(num_seqs,)](
        out,
        cu_num_draft,
        draft_token_ids,
        draft_probs if draft_probs is not None else dummy,
        target_probs if target_probs is not None else dummy,
        target_argmax,
        is_greedy,
        accept_uniforms,
        sample_uniforms,
        vocab_size,
        out.stride(0),
        HAS_DRAFT_PROBS=draft_probs is not None,
        BLOCK_V=block_v,
    )
    return out

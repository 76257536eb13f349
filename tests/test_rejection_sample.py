"""Speculative decoding's verifier (kernels/rejection_sample.py): the Triton kernel against its
reference token for token, greedy semantics by hand, and the statistical guarantee itself (the
emitted tokens are distributed as the target alone would sample them), with a check shown to
catch wrong rules. Without a GPU the kernel runs in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before anything imports a kernel), one program at a time, so batches are small
except in the statistical tests, which run the reference on many trials and the kernel on fewer.

Kernel and reference agree exactly when every partial sum of the weights is exact in fp32: the
inputs here are dyadic (multiples of 2^-22 or 2^-6, mass <= 1 per row), except in
test_kernel_equals_reference_on_plain_softmax_probs, where a rounding difference between their
summation orders could change a draw (fp32 against exact sums changed none in 2*10^5 draws at
vocabulary 50; the test makes at most 32 draws). Seeds are fixed (0-4 here, the first ones
tried); the reference's statistical checks also pass for seeds 0-29, at both trial counts."""

import itertools

import pytest
import torch

import kernels.rejection_sample as rs
from kernels.checks import compare
from kernels.rejection_sample import rejection_sample_reference, rejection_sample_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LARGEST_BELOW_1 = 1 - 2.0**-24


def both(args: dict, **launch) -> torch.Tensor:
    """The kernel's output, after checking that the reference gives the same."""
    got = rejection_sample_triton(**args, **launch)
    want = rejection_sample_reference(**args)
    assert got.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got.cpu(), want.cpu()), f"kernel\n{got}\nreference\n{want}"
    return got.cpu()


def batch_shape(seed: int, num_seqs: int = 16) -> tuple[list[int], list[bool]]:
    g = torch.Generator().manual_seed(1000 + seed)
    num_drafts = [[0, 1, 3, 4][i] for i in torch.randint(0, 4, (num_seqs,), generator=g)]
    return num_drafts, (torch.rand(num_seqs, generator=g) < 1 / 3).tolist()


# 1. Kernel == reference on random batches


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "ngram"])
def test_kernel_equals_reference_on_random_batches(with_draft_probs):
    """Greedy and sampled sequences mixed, k_i in {0, 1, 3, 4}, vocabulary 50: three and a bit
    16-token tiles, and one partial 1024-token tile. The inputs are left as they were."""
    emitted = []
    for seed in range(2):
        num_drafts, greedy = batch_shape(seed)
        args = compare.random_rejection_batch(
            num_drafts, greedy, 50, with_draft_probs, DEVICE, torch.Generator().manual_seed(seed)
        )
        before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
        for block_v in (16, 1024):
            out = both(args, block_v=block_v)
        for k, v in before.items():
            assert torch.equal(args[k], v), f"{k} was modified"
        emitted += [(g, k, int((row >= 0).sum()) - 1) for g, k, row in zip(greedy, num_drafts, out)]
    # The batches meet every case, greedy and sampled: all drafts accepted, none, some of 3 or 4.
    for g in (True, False):
        cases = {"all" if n == k else "none" if n == 0 else "some" for gg, k, n in emitted if gg == g and k > 0}
        assert cases == {"all", "none", "some"}, (g, cases)


def test_kernel_equals_reference_on_plain_softmax_probs():
    num_drafts, greedy = batch_shape(2)
    for with_draft_probs in (True, False):
        got, want = compare.check_rejection_sample(
            num_drafts, greedy, 50, with_draft_probs, DEVICE, seed=2, exact_sums=False, block_v=16
        )
        assert torch.equal(got, want)


def test_rejection_where_p_equals_q_draws_from_p():
    """q[x] = 0 rejects x; then max(p - q, 0) is all zero (p == q) and the draw is from p. The
    largest uniform takes the last token with weight, never token 3 (no weight)."""
    p = torch.tensor([0.25, 0.5, 0.25, 0.0])
    uniforms = [0.0, 0.6, LARGEST_BELOW_1]
    args = dict(
        cu_num_draft=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        draft_token_ids=torch.tensor([3, 3, 3]),
        draft_probs=p.repeat(3, 1),
        target_probs=p.repeat(6, 1),
        target_argmax=torch.ones(6, dtype=torch.int64),
        is_greedy=torch.zeros(3, dtype=torch.bool),
        accept_uniforms=torch.full((3,), 0.5),
        sample_uniforms=torch.tensor(uniforms),
        max_num_draft=1,
    )
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    assert both(args).tolist() == [[0, -1], [1, -1], [2, -1]]


# 2. Greedy semantics


def test_greedy_by_hand():
    """No probabilities at all (every sequence greedy): the argmax decides."""
    drafts = [[1, 2, 3], [1, 2, 3], [], [4, 4]]
    argmax = [[1, 2, 3, 4], [1, 0, 3, 4], [2], [3, 4, 0]]  # k_i + 1 rows each
    args = dict(
        cu_num_draft=torch.tensor([0, *itertools.accumulate(map(len, drafts))], dtype=torch.int32),
        draft_token_ids=torch.tensor(sum(drafts, [])),
        draft_probs=None,
        target_probs=None,
        target_argmax=torch.tensor(sum(argmax, [])),
        is_greedy=torch.ones(4, dtype=torch.bool),
        accept_uniforms=torch.zeros(7),
        sample_uniforms=torch.zeros(4),
        max_num_draft=3,
    )
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    assert both(args).tolist() == [
        [1, 2, 3, 4],  # all accepted: the bonus row's argmax follows
        [1, 0, -1, -1],  # first mismatch at draft 1: its row's argmax, then stop
        [2, -1, -1, -1],  # no drafts: plain greedy decoding
        [3, -1, -1, -1],  # mismatch at once
    ]


# 3, 4. Statistical exactness, and that the check catches wrong rules
#
# The target's distribution at position j is p_j whatever came before, and the draft model's is
# q_j (drafts d_j ~ q_j, drawn independently per trial). Then the target alone emits i.i.d.
# t_j ~ p_j, and the verifier's guarantee is, position by position: given that t_j is emitted
# (drafts 0..j-1 accepted), t_j ~ p_j. That event depends only on drafts and uniforms before j,
# which t_j does not use, so t_j's marginal among the trials that emit it must be p_j. What is
# NOT p_0 x p_1 is the pair (t_0, t_1) among trials that emit two: t_0 is then an accepted draft,
# distributed as min(p_0, q_0) normalised (accepted with probability min(p, q)(x) in all), and
# t_1 is independent of it, so the pair is norm(min(p_0, q_0)) x p_1. The checks:
#   t_j ~ p_j among trials emitting t_j, for j = 0..3 (3: the bonus token);
#   t_0 ~ norm(min(p_0, q_0)) among trials emitting two tokens;
#   emitted count: P(count > j + 1 | count > j) = alpha_j = sum(min(p_j, q_j)).
# Each is a chi-square goodness-of-fit test failing at p < 1e-6, so the six together fail by
# chance about once in 10^5 runs: a failure is a bug. Tokens that the target gives probability 0
# must never appear. With deterministic drafts q_j is one-hot at d_j.

V = 8
# Rows of 64ths: exact in fp32, zeros where the target or the draft model masks a token.
P = (
    torch.tensor(
        [
            [12, 4, 10, 6, 16, 0, 8, 8],
            [4, 14, 6, 10, 0, 12, 8, 10],
            [8, 8, 20, 4, 6, 10, 0, 8],
            [6, 10, 8, 12, 8, 4, 10, 6],
        ]
    )
    / 64
)
Q = torch.tensor([[4, 12, 6, 14, 8, 8, 0, 12], [10, 6, 6, 10, 8, 8, 12, 4], [8, 4, 12, 8, 14, 10, 4, 4]]) / 64
# n-gram drafts (q one-hot at them) and targets that like them, as n-gram hits have it
NGRAM_DRAFTS = torch.tensor([4, 1, 2])
P_NGRAM = (
    torch.tensor(
        [[4, 6, 2, 8, 32, 0, 6, 6], [2, 36, 6, 4, 0, 8, 4, 4], [6, 4, 28, 6, 6, 8, 0, 6], [6, 10, 8, 12, 8, 4, 10, 6]]
    )
    / 64
)
REFERENCE_TRIALS, KERNEL_TRIALS = 4000, 500
THRESHOLD = 1e-6


def trials(num: int, ngram: bool, seed: int) -> dict:
    """`num` independent trials of k = 3 drafts as one batch."""
    g = torch.Generator().manual_seed(seed)
    k = 3
    p = P_NGRAM if ngram else P
    if ngram:
        drafts = NGRAM_DRAFTS.repeat(num)
    else:
        drafts = torch.stack([torch.multinomial(Q[j], num, replacement=True, generator=g) for j in range(k)], 1)
    args = dict(
        cu_num_draft=torch.arange(0, k * num + 1, k, dtype=torch.int32),
        draft_token_ids=drafts.flatten(),
        draft_probs=None if ngram else Q.repeat(num, 1),
        target_probs=p.repeat(num, 1),
        target_argmax=p.argmax(-1).repeat(num),
        is_greedy=torch.zeros(num, dtype=torch.bool),
        accept_uniforms=torch.rand(k * num, generator=g),
        sample_uniforms=torch.rand(num, generator=g),
    )
    return {key: v.to(DEVICE) if v is not None else None for key, v in args.items()} | dict(max_num_draft=k)


def chi_square_p_value(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of integer samples to `probs`; 0.0 if any falls where probs is 0."""
    counts = torch.bincount(samples, minlength=len(probs)).double()
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = counts.sum() * probs[support].double()
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    if df == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def failed_checks(out: torch.Tensor, ngram: bool) -> list[str]:
    """The checks above on the emitted tokens `out [trials, 4]`: the ones that fail."""
    out = out.cpu()
    p = P_NGRAM if ngram else P
    q = torch.nn.functional.one_hot(NGRAM_DRAFTS, V).float() if ngram else Q
    count = (out >= 0).sum(1)
    alpha = torch.minimum(p[:3], q).sum(1)
    reach = torch.cat([torch.ones(1), alpha.cumprod(0)])  # P(count > j)
    p_values = {f"t_{j} ~ p_{j}": chi_square_p_value(out[count > j, j], p[j]) for j in range(4)}
    accepted = torch.minimum(p[0], q[0])
    p_values["accepted t_0 ~ norm(min(p_0, q_0))"] = chi_square_p_value(out[count > 1, 0], accepted / accepted.sum())
    p_values["emitted count"] = chi_square_p_value(count - 1, reach - torch.cat([reach[1:], torch.zeros(1)]))
    return [f"{name}: p = {pv:.2g}" for name, pv in p_values.items() if pv < THRESHOLD]


@pytest.mark.slow
@pytest.mark.parametrize("ngram", [False, True], ids=["draft_probs", "ngram"])
def test_emitted_tokens_follow_the_target_distribution(ngram):
    """The reference on many trials; the kernel on fewer (the interpreter runs a program in some
    20 ms), which must also equal the reference's tokens exactly on them."""
    assert failed_checks(rejection_sample_reference(**trials(REFERENCE_TRIALS, ngram, seed=0)), ngram) == []
    out = both(trials(KERNEL_TRIALS, ngram, seed=1))
    assert failed_checks(out, ngram) == []


def recover_from_p(p, q):
    return p


def accept_every_draft(u, p_x, q_x):
    return bool(q_x > 0)


def accept_inverted_ratio(u, p_x, q_x):
    return bool(u * p_x < q_x)


@pytest.mark.parametrize(
    "wrong",
    [
        ("_recovery_weights", recover_from_p, False),
        ("_recovery_weights", recover_from_p, True),
        ("_accepts", accept_every_draft, False),
        ("_accepts", accept_inverted_ratio, False),
    ],
    ids=["recover_from_p", "ngram_recover_from_p", "accept_every_draft", "accept_inverted_ratio"],
)
def test_statistical_check_catches_wrong_rules(monkeypatch, wrong):
    """The same check, on the reference with one rule replaced by a plausible mistake, fails."""
    name, rule, ngram = wrong
    monkeypatch.setattr(rs, name, rule)
    assert failed_checks(rejection_sample_reference(**trials(REFERENCE_TRIALS, ngram, seed=0)), ngram)


# 5. Reproducibility: a sequence's tokens depend on its own inputs only


def split_sequences(args: dict) -> list[dict]:
    cu = args["cu_num_draft"].tolist()
    seqs = []
    for i in range(len(cu) - 1):
        drafts, rows = slice(cu[i], cu[i + 1]), slice(cu[i] + i, cu[i + 1] + i + 1)
        seqs.append(
            dict(
                draft_token_ids=args["draft_token_ids"][drafts],
                draft_probs=args["draft_probs"][drafts],
                target_probs=args["target_probs"][rows],
                target_argmax=args["target_argmax"][rows],
                is_greedy=args["is_greedy"][i : i + 1],
                accept_uniforms=args["accept_uniforms"][drafts],
                sample_uniforms=args["sample_uniforms"][i : i + 1],
            )
        )
    return seqs


def join_sequences(seqs: list[dict], max_num_draft: int) -> dict:
    args = {key: torch.cat([s[key] for s in seqs]) for key in seqs[0]}
    lens = [len(s["draft_token_ids"]) for s in seqs]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=args["is_greedy"].device)
    return args | dict(cu_num_draft=cu, max_num_draft=max_num_draft)


def test_a_sequence_gets_the_same_tokens_in_any_batch():
    num_drafts, greedy = batch_shape(3, num_seqs=8)
    args = compare.random_rejection_batch(num_drafts, greedy, 50, True, DEVICE, torch.Generator().manual_seed(3))
    out = both(args, block_v=16)
    assert torch.equal(rejection_sample_triton(**args, block_v=16).cpu(), out)  # same uniforms, same tokens
    others = split_sequences(
        compare.random_rejection_batch(num_drafts, greedy, 50, True, DEVICE, torch.Generator().manual_seed(4))
    )
    seqs = split_sequences(args)
    order = [5, 0, 7, 2]
    # Other company around them, other positions, and a wider output (max_num_draft is a runtime
    # argument: no recompilation).
    mixed = join_sequences([others[1], *[seqs[i] for i in order], others[6]], args["max_num_draft"] + 2)
    got = both(mixed, block_v=16)
    width = out.shape[1]
    for row, i in enumerate(order, start=1):
        assert torch.equal(got[row, :width], out[i]) and (got[row, width:] == -1).all()


def test_empty_batch():
    args = dict(
        cu_num_draft=torch.zeros(1, dtype=torch.int32),
        draft_token_ids=torch.zeros(0, dtype=torch.int64),
        draft_probs=None,
        target_probs=None,
        target_argmax=torch.zeros(0, dtype=torch.int64),
        is_greedy=torch.zeros(0, dtype=torch.bool),
        accept_uniforms=torch.zeros(0),
        sample_uniforms=torch.zeros(0),
        max_num_draft=2,
    )
    assert both(args).shape == (0, 3)

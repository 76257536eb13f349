"""The MTP proposer (sut/spec_decode/mtp.py) on tiny DeepSeek-V3 checkpoints built with transformers'
DeepseekV3ForCausalLM (random fp32 weights) with an MTP module added under the names DeepSeek's
checkpoints use (`model.layers.<num_hidden_layers>.*`): greedy output token-identical to plain decoding
and to transformers' (k = 1 and 3, batches, chunked prefill, preemption); every proposal equal to
transformers' own MTP module (MtpModel, loaded by transformers from the same checkpoint) run densely
over the sequence as it stands, and k = 1 drafts equal to those of transformers' `generate(use_mtp=True)`;
drafts that are the target's next token accepted; the output after drafts rejected mid-chain still
plain greedy's; sampled output distributed as the target's; the target's KV cache never written; FP8
module weights dequantized; the settings and checkpoints it cannot run refused by name.

transformers hard-codes DeepSeek-V3's MTP layer as `model\\.layers\\.61.*` (the main model's
`_keys_to_ignore_on_load_unexpected`, from which MtpModel builds its weight pattern), so for these
3-layer targets `Reference` gives the main model the pattern of layer 3; nothing else is changed.
"""

import dataclasses
import shutil
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import sut.spec_decode.mtp as mtp
from kernels.fp8 import FP8_BLOCK, dequantize_fp8, quantize_fp8_block
from sut import LLM, LLMEngine, SamplingParams
from sut.config import ModelConfig
from sut.errors import ConfigError
from sut.model.deepseek_mtp import load_mtp_layer
from sut.model.fp8 import Fp8Linear
from sut.worker import model_runner
from tests.helpers import hf_greedy, random_prompts
from tests.test_deepseek_v3 import DEEPSEEK_TINY
from tests.test_speculative import chi_square_p_value

LENGTHS = [1, 5, 17, 33, 48, 7]  # the 33 and 48 prefill decompressed (over 16 query rows), as the first MTP rows


@dataclasses.dataclass
class Target:
    folder: Path
    layers: int

    def spec(self, k=3, **extra):
        return {"method": "mtp", "num_speculative_tokens": k, **extra}


def write_target(folder: Path, seed: int = 0, craft=None, **overrides) -> Target:
    """A tiny DeepSeek-V3 of DEEPSEEK_TINY's shape (and `overrides`) with an MTP module: transformers
    builds a model of one layer more, whose last layer (saved by transformers, per-expert tensors and
    all) becomes the module's decoder layer beside random enorm, hnorm, eh_proj and shared_head.norm
    and copies of the embedding and LM head, as DeepSeek's checkpoints hold them; the first layers,
    embedding, norm and head are the target, saved by transformers. `craft(model, extra, prefix)` may
    change the weights (the model's, before saving) and the module's extra tensors first."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    raw = {**DEEPSEEK_TINY, **overrides}
    n = raw["num_hidden_layers"]
    prefix = f"model.layers.{n}."
    torch.manual_seed(seed)
    both = DeepseekV3ForCausalLM(DeepseekV3Config(**{**raw, "num_hidden_layers": n + 1})).float().eval()
    h, g = raw["hidden_size"], torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in both.model.layers:  # transformers starts the correction bias at zero: a random one tests it
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0, 0.3)
        extra = {
            prefix + "enorm.weight": 1 + 0.2 * torch.randn(h, generator=g),
            prefix + "hnorm.weight": 1 + 0.2 * torch.randn(h, generator=g),
            prefix + "eh_proj.weight": 0.3 * torch.randn(h, 2 * h, generator=g),
            prefix + "shared_head.norm.weight": 1 + 0.2 * torch.randn(h, generator=g),
        }
        if craft is not None:
            craft(both, extra, prefix)
    both.save_pretrained(folder / "with-module")
    module = {k: v for k, v in load_file(folder / "with-module" / "model.safetensors").items() if k.startswith(prefix)}
    shutil.rmtree(folder / "with-module")
    target = DeepseekV3ForCausalLM(DeepseekV3Config(**raw)).float().eval()
    target.load_state_dict({k: v for k, v in both.state_dict().items() if not k.startswith(prefix)})
    target.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    copies = {
        prefix + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
        prefix + "shared_head.head.weight": tensors["lm_head.weight"].clone(),
    }
    save_file({**tensors, **module, **extra, **copies}, folder / "model.safetensors", metadata={"format": "pt"})
    return Target(folder, n)


def near_bigram(target_scale: float, module_scale: float):
    """A craft for write_target: the target's attention and MLP outputs scaled by `target_scale`
    (0: every layer adds nothing, so its next token is a function of the last token alone, a bigram
    table), and a module that computes that table for the token it reads: eh_proj passes the normed
    embedding through (its hidden-state half, the module's attention and MLP outputs scaled by
    `module_scale`), enorm 1, shared_head.norm the target's final norm. Its drafts are the target's
    next tokens when both scales are 0, and often are when they are small."""

    def craft(model, extra, prefix):
        last = len(model.model.layers) - 1
        for i, layer in enumerate(model.model.layers):
            scale = target_scale if i < last else module_scale
            layer.self_attn.o_proj.weight.mul_(scale)
            if hasattr(layer.mlp, "experts"):
                layer.mlp.experts.down_proj.mul_(scale)
                layer.mlp.shared_experts.down_proj.weight.mul_(scale)
            else:
                layer.mlp.down_proj.weight.mul_(scale)
        h = model.config.hidden_size
        extra[prefix + "enorm.weight"] = torch.ones(h)
        extra[prefix + "eh_proj.weight"][:, :h] = torch.eye(h)
        extra[prefix + "eh_proj.weight"][:, h:] *= module_scale
        extra[prefix + "shared_head.norm.weight"] = model.model.norm.weight.clone()

    return craft


class Reference:
    """transformers' DeepseekV3ForCausalLM and its MtpModel, both loaded by transformers from the
    target's folder: the MTP module run densely over a sequence (no cache), chained as this proposer
    chains it (the module's normed output of the last row as the next row's hidden state)."""

    def __init__(self, target: Target):
        from transformers.modeling_layers import MtpModel

        self.model = hf_model(target.folder)
        # transformers' pattern names layer 61, DeepSeek-V3's: this target's module is layer `target.layers`.
        self.model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{target.layers}\..*"]
        self.mtp = MtpModel.from_pretrained(self.model, device_map={"": torch.device("cpu")}).eval()
        self.sequences: list[tuple[list[int], torch.Tensor]] = []  # the target's hidden states of whole sequences

    @torch.no_grad()
    def prime(self, tokens: list[int]) -> None:
        """The target's hidden states of `tokens` (after its final norm), which every prefix's are (causal)."""
        self.sequences.append((tokens, self.model.model(torch.tensor([tokens])).last_hidden_state))

    def _hidden(self, tokens: list[int]) -> torch.Tensor:
        for whole, hidden in self.sequences:
            if whole[: len(tokens)] == tokens:
                return hidden[:, : len(tokens)]
        self.prime(tokens)
        return self.sequences[-1][1]

    @torch.no_grad()
    def drafts(self, tokens: list[int], k: int, chain: list[int] | None = None) -> tuple[list[int], torch.Tensor]:
        """Greedy drafts for a sequence whose target cache holds all but its last token: the module over
        (token p + 1, target hidden state of p) for every p, then over each draft with its own output;
        and the distribution (temperature 1) each draft position has. `chain`: drafts to chain on in
        place of the argmax (sampled ones)."""
        hidden, ids, out, probs = self._hidden(tokens[:-1]), list(tokens[1:]), [], []
        for j in range(k):
            positions = torch.arange(1, len(ids) + 1)[None]  # transformers' own: the token's position
            rows = self.mtp.forward_layer(0, hidden, positions, None, input_ids=torch.tensor([ids]))
            logits = self.mtp._project_to_logits(rows[0, -1]).float()
            out.append(int(logits.argmax()))
            probs.append(torch.softmax(logits, -1))
            ids.append(out[-1] if chain is None else chain[j])
            hidden = torch.cat([hidden, rows[:, -1:]], dim=1)
        return out, torch.stack(probs)


@pytest.fixture(scope="module")
def random_module(tmp_path_factory):
    return write_target(tmp_path_factory.mktemp("mtp-random"))


@pytest.fixture(scope="module")
def random_prompts_and_want(random_module):
    """LENGTHS' prompts and transformers' greedy continuations of them on the random-module target."""
    prompts = random_prompts(LENGTHS, seed=3)
    hf = hf_model(random_module.folder)
    return prompts, [hf_greedy(hf, p, 16) for p in prompts]


@pytest.fixture(scope="module")
def bigram(tmp_path_factory):
    return write_target(tmp_path_factory.mktemp("mtp-bigram"), seed=1, craft=near_bigram(0.0, 0.0))


@pytest.fixture(scope="module")
def near(tmp_path_factory):
    """Drafts right often, not always: chains rejected mid-way."""
    return write_target(tmp_path_factory.mktemp("mtp-near"), seed=2, craft=near_bigram(0.005, 0.01))


def hf_model(folder: Path):
    """transformers' DeepseekV3ForCausalLM from `folder` (the module's tensors left unread)."""
    import transformers
    from transformers import DeepseekV3ForCausalLM

    transformers.logging.set_verbosity_error()
    return DeepseekV3ForCausalLM.from_pretrained(folder).eval()


def generate(folder, prompts, params, **settings):
    llm = LLM(folder, device="cpu", **{"num_kv_blocks": 256, **settings})
    return [o.token_ids for o in llm.generate(prompts, params)], llm.engine


def record_proposals(monkeypatch) -> list:
    """Every proposal from now on: (request id, the sequence's tokens, its computed tokens, k, drafts)."""
    records = []
    propose = mtp.MtpProposer.propose

    def recorded(self, seqs, counts, block_tables):
        before = [(s.request_id, list(s.token_ids), s.num_computed_tokens, k) for s, k in zip(seqs, counts)]
        out = propose(self, seqs, counts, block_tables)
        records.extend((*b, drafts) for b, (drafts, _) in zip(before, out))
        return out

    monkeypatch.setattr(mtp.MtpProposer, "propose", recorded)
    return records


CHUNKED = dict(max_num_batched_tokens=16, block_size=4, num_kv_blocks=24, max_model_len=64)


# ---- greedy output ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("settings", ["batch", "chunked-preempted"])
def test_greedy_output_is_plain_decodings_and_transformers(random_module, random_prompts_and_want, k, settings):
    """Prompts up to 48 tokens (their first MTP rows decompressed, over 16 query rows), in one batch,
    or in chunks of 16 with a pool too small for the batch (preemptions while speculating)."""
    prompts, want = random_prompts_and_want
    params = SamplingParams(max_tokens=16)
    settings = CHUNKED if settings != "batch" else {}
    plain, _ = generate(random_module.folder, prompts, params, **settings)
    spec, engine = generate(random_module.folder, prompts, params, speculative_config=random_module.spec(k), **settings)
    assert spec == plain == want
    stats = engine.spec_stats()
    assert stats["method"] == "mtp" and "MTP module" in stats["description"] and f"k={k}" in stats["description"]
    assert stats["num_proposals"] > 0 and stats["num_draft_tokens"] > (k - 1) * stats["num_proposals"]
    if settings:
        assert engine.scheduler.num_preemptions > 0
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert len(engine.proposer.pending) == 0  # nothing kept for finished sequences


@pytest.mark.slow
def test_two_tensor_parallel_ranks_draft_as_one_process(near):
    """The module on both ranks of TP 2 (gloo; its heads, experts and shared-expert features split
    as the target's): greedy output token-identical to one process's with and without MTP, in
    chunks with preemptions, with as many drafts proposed and accepted as in one process."""
    prompts = random_prompts(LENGTHS, seed=3)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    settings = dict(CHUNKED, speculative_config=near.spec(3))
    plain, _ = generate(near.folder, prompts, params, **CHUNKED)
    one, engine = generate(near.folder, prompts, params, **settings)
    two = LLM(near.folder, device="cpu", tensor_parallel_size=2, **settings)
    try:
        assert [o.token_ids for o in two.generate(prompts, params)] == one == plain
        ours, theirs = two.engine.spec_stats(), engine.spec_stats()
        assert 0 < ours["num_accepted_tokens"] < ours["num_draft_tokens"]  # chains accepted and cut
        assert {k: ours[k] for k in ("num_draft_tokens", "num_accepted_tokens")} == {
            k: theirs[k] for k in ("num_draft_tokens", "num_accepted_tokens")
        }
        assert two.engine.scheduler.num_preemptions > 0
        module = two.engine.runner.mtp
        assert module.mlp.experts.gate_up_proj.shape[0] == DEEPSEEK_TINY["n_routed_experts"] // 2
    finally:
        two.engine.close()


def test_adaptive_speculation_keeps_the_output(random_module):
    """Random module weights: nearly every draft rejected, so adaptive speculation drafts about one a step."""
    prompts = random_prompts(LENGTHS[:4], seed=4)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    plain, _ = generate(random_module.folder, prompts, params)
    spec, engine = generate(
        random_module.folder, prompts, params, speculative_config=random_module.spec(3, adaptive=True)
    )
    assert spec == plain
    stats = engine.spec_stats()
    assert stats["adaptive"] and stats["num_draft_tokens"] / stats["num_proposals"] < 1.5


# ---- the drafts against transformers' MTP module ------------------------------------------------


def test_every_proposal_is_transformers_mtp_modules(random_module, monkeypatch):
    """Every greedy proposal (k = 3) of a run with batches, chunked prefill and preemptions equals
    transformers' MtpModel over the sequence as it stands: the target's hidden states after its final
    norm, the concat order, the module's decoder layer (latent attention, routed experts), its norm,
    the shared LM head, the chaining; and the module's cache holds every position's K/V (at full
    weight here: the module's attention decides its drafts) whatever was rejected or preempted."""
    records = record_proposals(monkeypatch)
    prompts = random_prompts(LENGTHS[:4], seed=5)
    _, engine = generate(
        random_module.folder,
        prompts,
        SamplingParams(max_tokens=16, ignore_eos=True),
        speculative_config=random_module.spec(3),
        **CHUNKED,
    )
    assert engine.scheduler.num_preemptions > 0
    reference = Reference(random_module)
    proposed = [r for r in records if r[4]]
    assert len(proposed) > 0.8 * len(records)
    for _, tokens, computed, k, drafts in proposed:
        assert computed == len(tokens) - 1 and len(drafts) == k
        assert drafts == reference.drafts(tokens, k)[0], (tokens, computed)


def test_drafts_are_those_of_transformers_generate_use_mtp(random_module, monkeypatch):
    """transformers' own MTP speculative decoding (`generate(use_mtp=True)`: one module, one draft a
    step) on the same checkpoint: its output, and the draft it proposes after every prefix, are ours
    with k = 1."""
    from transformers.generation import candidate_generator

    reference = Reference(random_module)
    theirs = {}
    get_candidates = candidate_generator.MTPCandidateGenerator.get_candidates

    def recorded(self, input_ids, *args, **kwargs):
        out = get_candidates(self, input_ids, *args, **kwargs)
        if out[0].shape[1] > input_ids.shape[1]:  # its first call only lets the target prefill
            theirs[tuple(input_ids[0].tolist())] = out[0][0, input_ids.shape[1] :].tolist()
        return out

    monkeypatch.setattr(candidate_generator.MTPCandidateGenerator, "get_candidates", recorded)
    prompts = random_prompts(LENGTHS[1:5], seed=6)
    want = []
    for prompt in prompts:
        with torch.no_grad():
            out = reference.model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=12, use_mtp=True, eos_token_id=2, pad_token_id=2
            )
        want.append(out[0, len(prompt) :].tolist())
    records = record_proposals(monkeypatch)
    got, _ = generate(
        random_module.folder, prompts, SamplingParams(max_tokens=12), speculative_config=random_module.spec(1)
    )
    assert got == want
    ours = {tuple(tokens): drafts for _, tokens, _, _, drafts in records if drafts}
    shared = set(ours) & set(theirs)
    assert len(shared) > 0.8 * len(theirs) > 10
    assert {p: ours[p] for p in shared} == {p: theirs[p] for p in shared}


# ---- acceptance and rollback ----------------------------------------------------------------------


def test_drafts_that_are_the_targets_next_tokens_are_accepted(bigram):
    """A target whose layers add nothing (its next token a function of the last one) and a module
    crafted to compute that function of the token it reads (token p + 1, next to the hidden state of
    p): every draft, chained ones too, is the target's next token, and is accepted, greedy and sampled
    (q ≈ p). A module fed the token of another position, or a chain fed another row's token, would
    be right only where that token's successor happens to be the same."""
    prompts = random_prompts(LENGTHS, seed=7)
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    plain, _ = generate(bigram.folder, prompts, greedy)
    spec, engine = generate(bigram.folder, prompts, greedy, speculative_config=bigram.spec(3))
    assert spec == plain
    stats = engine.spec_stats()
    assert stats["acceptance_rate"] > 0.95 and stats["accepted_at_position"][2] > 0.9 * stats["proposed_at_position"][2]
    sampled = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=i) for i in range(len(prompts))]
    _, engine = generate(bigram.folder, prompts, sampled, speculative_config=bigram.spec(3))
    assert engine.spec_stats()["acceptance_rate"] > 0.9


def after_cuts(records) -> list:
    """The proposals right after one whose chain was cut (its first drafts accepted, a later one not):
    the sequence grew by those drafts and one token of the target's."""
    found, last = [], {}
    for request_id, tokens, computed, k, drafts, q in records:
        previous = last.get(request_id)
        if previous is not None and len(previous[0]) < len(tokens):
            accepted = len(tokens) - len(previous[0]) - 1
            if 0 < accepted < len(previous[1]):
                assert tokens[len(previous[0]) : len(previous[0]) + accepted] == previous[1][:accepted]
                found.append((tokens, k, drafts, q))
        last[request_id] = (tokens, drafts)
    return found


@pytest.mark.parametrize("settings", ["batch", "chunked-preempted"])
def test_output_after_drafts_rejected_mid_chain_is_plain_greedys(near, settings, monkeypatch):
    """jundot/omlx #2506, ggml-org/llama.cpp #25618: MTP output that left greedy's after a rejected
    draft (state not rolled back). Here chains of 3 are often cut after 1 or 2 accepted drafts; the
    output stays plain greedy's, and the proposal right after each cut is transformers' module's over
    the sequence as it stands: greedy drafts equal, and sampled ones' distributions equal to 1e-5,
    which the module's attention (at 1/100 weight here, so that drafts are often right) moves by more
    than that were its cache to hold a rejected draft's K/V."""
    records = []
    propose = mtp.MtpProposer.propose

    def recorded(self, seqs, counts, block_tables):
        before = [(s.request_id, list(s.token_ids), s.num_computed_tokens, k) for s, k in zip(seqs, counts)]
        out = propose(self, seqs, counts, block_tables)
        records.extend((*b, drafts, q) for b, (drafts, q) in zip(before, out))
        return out

    monkeypatch.setattr(mtp.MtpProposer, "propose", recorded)
    prompts = random_prompts(LENGTHS, seed=8)
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    settings = CHUNKED if settings != "batch" else {}
    plain, _ = generate(near.folder, prompts, greedy, **settings)
    spec, engine = generate(near.folder, prompts, greedy, speculative_config=near.spec(3), **settings)
    assert spec == plain
    stats = engine.spec_stats()
    assert stats["accepted_at_position"][0] > stats["accepted_at_position"][2] > 0, stats
    greedy_cuts = after_cuts(records)
    records.clear()
    sampled = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=i) for i in range(len(prompts))]
    generate(near.folder, prompts, sampled, speculative_config=near.spec(3), **settings)
    sampled_cuts = after_cuts(records)
    assert len(greedy_cuts) >= 5 and len(sampled_cuts) >= 5
    reference = Reference(near)
    for tokens, k, drafts, q in greedy_cuts:
        if drafts:
            assert q is None and drafts == reference.drafts(tokens, k)[0], tokens
    for tokens, k, drafts, q in sampled_cuts:
        if drafts:
            torch.testing.assert_close(q, reference.drafts(tokens, k, chain=drafts)[1], rtol=0, atol=1e-5)


# ---- sampled output ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """12 tokens, a near-bigram target and module: drafts often accepted, often not."""
    overrides = dict(vocab_size=12, bos_token_id=0, eos_token_id=11, pad_token_id=0, initializer_range=0.15)
    target = write_target(tmp_path_factory.mktemp("mtp-small"), seed=9, craft=near_bigram(0.05, 0.05), **overrides)
    return target, hf_model(target.folder)


def exact_triples(model, prompt) -> dict:
    """P(t1, t2, t3) of the first three tokens sampled at temperature 1, from transformers' logits."""
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        vocab = first.shape[0]
        second = torch.softmax(model(torch.tensor([prompt + [a] for a in range(vocab)])).logits[:, -1].double(), -1)
        both = [prompt + [a, b] for a in range(vocab) for b in range(vocab)]
        third = torch.softmax(model(torch.tensor(both)).logits[:, -1].double(), -1).view(vocab, vocab, vocab)
    joint = first[:, None, None] * second[:, :, None] * third
    return {(a, b, c): float(joint[a, b, c]) for a in range(vocab) for b in range(vocab) for c in range(vocab)}


def sampled_triples(target: Target, prompt, n: int) -> tuple[Counter, dict]:
    """The first three tokens of n seeded requests at temperature 1, k = 2: the first verification
    checks two drafts (the second sampled from the module chained on the first), and makes t2 and,
    when the first draft is accepted, t3."""
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=s, ignore_eos=True) for s in range(n)]
    llm = LLM(target.folder, device="cpu", max_num_seqs=256, num_kv_blocks=1024, speculative_config=target.spec(2))
    outputs = llm.generate([prompt] * n, params)
    return Counter(tuple(o.token_ids[:3]) for o in outputs), llm.engine.spec_stats()


PROMPT = [3, 5, 7, 3, 5]


@pytest.mark.slow
def test_sampled_tokens_follow_the_target_distribution(small_vocab):
    """2000 seeded requests of one prompt: the first three tokens are distributed as the target's
    P(t1) P(t2 | t1) P(t3 | t1, t2), from transformers' logits, with drafts sampled from the MTP
    module at temperature 1 (chained ones too) and verified by the exact rejection sampler; chi-square
    at p > 1e-4 as tests/test_speculative.py (a correct sampler fails it 1 run in 10^4)."""
    target, model = small_vocab
    n = 2000
    counts, stats = sampled_triples(target, PROMPT, n)
    assert chi_square_p_value(counts, exact_triples(model, PROMPT), n) > 1e-4
    assert stats["proposed_at_position"][1] >= n // 2  # the first verification of each: two drafts
    assert 0 < stats["accepted_at_position"][1] < stats["accepted_at_position"][0] < stats["proposed_at_position"][0]


def test_a_wrong_verifier_fails_the_distribution_test(small_vocab, monkeypatch):
    """The test above can fail with these drafts: accepting every draft the module could sample
    gives tokens that are not distributed as the target's."""
    import kernels.rejection_sample as rs

    target, model = small_vocab
    monkeypatch.setattr(rs, "_accepts", lambda u, p_x, q_x: bool(q_x > 0))
    counts, _ = sampled_triples(target, PROMPT, 2000)
    assert chi_square_p_value(counts, exact_triples(model, PROMPT), 2000) < 1e-6


# ---- the target's KV cache, the module's weights ---------------------------------------------------


def test_the_module_never_writes_the_targets_kv_cache(near, monkeypatch):
    """Around every proposal (greedy and sampled) the target's latent cache is bit-identical while
    the module's changes, and the two share no memory (vLLM PR #25406's head wrote the target's)."""
    calls = []
    propose = mtp.MtpProposer.propose

    def checked(self, seqs, counts, block_tables):
        before, own = self.runner.kv_cache.clone(), self.runner.mtp_kv_cache.clone()
        out = propose(self, seqs, counts, block_tables)
        if any(d for d, _ in out):
            assert torch.equal(self.runner.kv_cache, before), "the module wrote the target's KV cache"
            assert not torch.equal(self.runner.mtp_kv_cache, own), "the module wrote nothing of its own"
            calls.append(len(seqs))
        return out

    monkeypatch.setattr(mtp.MtpProposer, "propose", checked)
    engine = LLMEngine(
        near.folder, device="cpu", num_kv_blocks=96, block_size=4, max_model_len=96, speculative_config=near.spec(3)
    )
    ours, theirs = engine.runner.mtp_kv_cache.untyped_storage(), engine.runner.kv_cache.untyped_storage()
    assert (
        ours.data_ptr() + ours.nbytes() <= theirs.data_ptr() or theirs.data_ptr() + theirs.nbytes() <= ours.data_ptr()
    )
    assert engine.runner.mtp_kv_cache.shape[2:] == (
        96,
        4,
        1,
        DEEPSEEK_TINY["kv_lora_rank"] + DEEPSEEK_TINY["qk_rope_head_dim"],
    )
    for i, prompt in enumerate(random_prompts(LENGTHS[:4], seed=10)):
        sampling = {"temperature": 1.0, "seed": i} if i % 2 else {}
        engine.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True, **sampling))
    while engine.has_unfinished():
        engine.step()
    assert len(calls) > 3


def test_the_module_loads_as_the_checkpoint_holds_it(random_module):
    """In bf16 the router stays fp32 (as the target's); the experts are stacked from the per-expert
    tensors; the checkpoint's copies of the embedding and LM head are not read (the target's are used)."""
    config = ModelConfig.from_folder(random_module.folder)
    layer = load_mtp_layer(random_module.folder, config, torch.bfloat16, torch.device("cpu"))
    tensors = load_file(random_module.folder / "model.safetensors")
    p = f"model.layers.{config.num_layers}."
    assert layer.mlp.gate.weight.dtype == layer.mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert torch.equal(layer.mlp.gate.weight, tensors[p + "mlp.gate.weight"])
    assert torch.equal(layer.eh_proj.weight, tensors[p + "eh_proj.weight"].bfloat16())
    assert torch.equal(layer.shared_head.norm.weight, tensors[p + "shared_head.norm.weight"].bfloat16())
    inter, last = config.moe.expert_intermediate_size, config.moe.num_experts - 1
    up = tensors[p + f"mlp.experts.{last}.up_proj.weight"].bfloat16()
    assert torch.equal(layer.mlp.experts.gate_up_proj[last, inter:], up)
    assert not any("embed" in n or n.endswith("head.weight") for n, _ in layer.named_parameters())


def test_fp8_module_weights_are_dequantized_or_kept(random_module, tmp_path, monkeypatch):
    """DeepSeek-R1's checkpoint stores its linears in FP8 with 128 x 128 block scales
    (`weight_scale_inv`): the module's are dequantized (CPU's default) or held as stored (CUDA's,
    forced here), as the target's are, with greedy output plain decoding's either way; a weight
    without its scales is refused by name."""
    folder = tmp_path / "fp8"
    shutil.copytree(random_module.folder, folder)
    tensors = load_file(folder / "model.safetensors")
    p = f"model.layers.{random_module.layers}."
    names = [p + "eh_proj.weight", p + "self_attn.q_b_proj.weight", p + "mlp.experts.3.down_proj.weight"]
    for name in names:
        tensors[name], tensors[name + "_scale_inv"] = quantize_fp8_block(tensors[name])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = ModelConfig.from_folder(folder)
    mtp.check_mtp_module(folder, config)
    layer = load_mtp_layer(folder, config, torch.float32, torch.device("cpu"))
    want = dequantize_fp8(tensors[names[0]], tensors[names[0] + "_scale_inv"], FP8_BLOCK)
    assert torch.equal(layer.eh_proj.weight, want)
    want = dequantize_fp8(tensors[names[2]], tensors[names[2] + "_scale_inv"], FP8_BLOCK)
    assert torch.equal(layer.mlp.experts.down_proj[3], want)
    kept = load_mtp_layer(folder, config, torch.float32, torch.device("cpu"), keep_fp8=True)
    assert isinstance(kept.eh_proj, Fp8Linear) and isinstance(kept.self_attn.q_b_proj, Fp8Linear)
    assert torch.equal(kept.eh_proj.weight.view(torch.uint8), tensors[names[0]].view(torch.uint8))
    assert torch.equal(kept.eh_proj.dequantized(), layer.eh_proj.weight)
    prompts, params = random_prompts([3, 20], seed=4), SamplingParams(max_tokens=8)
    plain, _ = generate(folder, prompts, params)
    out, _ = generate(folder, prompts, params, speculative_config=random_module.spec(2))
    monkeypatch.setattr(model_runner, "load_mtp_layer", partial(load_mtp_layer, keep_fp8=True))
    out_kept, engine = generate(folder, prompts, params, speculative_config=random_module.spec(2))
    assert isinstance(engine.runner.mtp.eh_proj, Fp8Linear)
    assert out == out_kept == plain
    del tensors[names[1] + "_scale_inv"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"FP8 tensor 'model.layers.3.self_attn.q_b_proj.weight' has no _scale_inv"):
        mtp.check_mtp_module(folder, config)


# ---- what it refuses ------------------------------------------------------------------------------


def refused(folder, message, spec=None, **settings):
    with pytest.raises(ConfigError, match=message):
        LLM(folder, device="cpu", speculative_config=spec or {"method": "mtp", "num_speculative_tokens": 2}, **settings)


def test_targets_it_cannot_draft_for_are_refused_by_name(tiny_llama, tmp_path):
    from tests.test_deepseek_v3 import tiny_deepseek

    refused(tiny_llama[0], r"the target .* is a LlamaForCausalLM, which has none: use method 'ngram'")
    tiny_deepseek(tmp_path / "no-module")
    refused(tmp_path / "no-module", r"holds no MTP module: no model.layers.3.\* tensors .*num_nextn_predict_layers=1")


@pytest.mark.parametrize(
    "spec, settings, message",
    [
        ({"num_speculative_tokens": 0}, {}, "num_speculative_tokens must be an integer >= 1, got 0"),
        ({"model": "/somewhere"}, {}, "model is for methods 'draft_model' and 'eagle3', not 'mtp'"),
        ({"prompt_lookup_max": 2}, {}, "prompt_lookup_max is for method 'ngram', not 'mtp'"),
        ({}, {"cuda_graphs": True}, "method 'mtp' and cuda_graphs do not go together"),
        ({}, {"enable_prefix_caching": True}, "method 'mtp' and enable_prefix_caching do not go together"),
    ],
)
def test_settings_it_cannot_run_with_are_refused_by_name(random_module, spec, settings, message):
    refused(random_module.folder, message, {"method": "mtp", "num_speculative_tokens": 2, **spec}, **settings)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t, p: t.pop(p + "hnorm.weight"), r"lacks 1 tensor\(s\), e.g. \['model.layers.3.hnorm.weight'\]"),
        (lambda t, p: t.update({p + "mlp.experts.9.up_proj.weight": torch.zeros(32, 64)}), "does not: .*experts.9"),
        (lambda t, p: t.update({p + "eh_proj.weight": torch.zeros(64, 64)}), r"eh_proj.weight' has shape \[64, 64\]"),
        (lambda t, p: t.update({p + "enorm.weight": torch.zeros(64, dtype=torch.int32)}), "has dtype I32"),
        (lambda t, p: t.update({p + "embed_tokens.weight": torch.zeros(255, 64)}), r"embed_tokens.weight' has shape"),
    ],
)
def test_a_malformed_module_is_refused_by_name(random_module, tmp_path, edit, message):
    folder = tmp_path / "bad"
    shutil.copytree(random_module.folder, folder)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors, f"model.layers.{random_module.layers}.")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    refused(folder, message)

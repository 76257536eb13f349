"""Speculative decoding in the engine: greedy output token-identical to plain greedy decoding for
both proposers (batch 1 and 8, chunked prefill, forced preemption, stops inside accepted runs),
sampled output distributed as without speculation, seeded requests reproducible whatever the batch,
the settings refused by name, and the metrics."""

import json
import shutil
from collections import Counter

import pytest
import torch

from sut import LLM, SamplingParams
from sut.errors import ConfigError
from sut.spec_decode.ngram import ngram_lookup
from sut.tools.make_draft import make_draft
from tests.helpers import TINY_CONFIG, random_prompts

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def tiny_draft(tiny_llama, tmp_path_factory):
    return make_draft(tiny_llama[0], 1, tmp_path_factory.mktemp("spec") / "draft-L1")


def repetitive_prompts(n, seed=0):
    """Prompts that repeat a random phrase, so that n-gram lookup finds matches."""
    phrases = random_prompts([5 + i % 4 for i in range(n)], seed=seed)
    return [(p * 6)[: 20 + 7 * i] for i, p in enumerate(phrases)]


def proposers(tiny_llama, tiny_draft):
    """Each proposer, by name: n-gram lookup, a 1-layer draft (low acceptance), and the target as its
    own draft (nearly every draft accepted, so runs end in bonus tokens and stops fall inside them)."""
    return {
        "ngram": NGRAM,
        "draft-L1": {"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 3},
        "self-draft": {"method": "draft_model", "model": str(tiny_llama[0]), "num_speculative_tokens": 4},
    }


def generate(folder, prompts, params, **settings):
    llm = LLM(folder, device="cpu", **{"num_kv_blocks": 512, **settings})
    return [o.token_ids for o in llm.generate(prompts, params)], llm.engine


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ngram", "draft-L1", "self-draft"])
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_speculation_is_token_identical(tiny_llama, tiny_draft, name, batch):
    folder = tiny_llama[0]
    prompts = repetitive_prompts(8)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain, _ = generate(folder, prompts, params, max_num_seqs=batch)
    spec, engine = generate(
        folder, prompts, params, max_num_seqs=batch, speculative_config=proposers(tiny_llama, tiny_draft)[name]
    )
    assert spec == plain
    stats = engine.spec_stats()
    assert stats["num_proposals"] > 0 and stats["num_draft_tokens"] >= stats["num_accepted_tokens"]
    if name == "self-draft":  # nearly all accepted: runs end in bonus tokens
        assert stats["acceptance_rate"] > 0.8, stats
    if name == "ngram":  # runs of several accepted drafts happen
        assert stats["accepted_at_position"][1] > 0, stats
    engine.block_manager.check_invariants([])


@pytest.mark.parametrize("name", ["ngram", "self-draft"])
def test_greedy_speculation_with_chunked_prefill_and_preemption(tiny_llama, tiny_draft, name):
    """Small step budget (prompts in chunks) and a KV pool too small for the batch (preemptions
    mid-speculation): the same tokens as plain decoding without either."""
    folder = tiny_llama[0]
    prompts = repetitive_prompts(8, seed=1)
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    plain, _ = generate(folder, prompts, params)
    settings = dict(max_num_batched_tokens=16, block_size=4, num_kv_blocks=32, max_model_len=128)
    spec, engine = generate(
        folder, prompts, params, speculative_config=proposers(tiny_llama, tiny_draft)[name], **settings
    )
    assert spec == plain
    assert engine.scheduler.num_preemptions > 0
    assert engine.spec_stats()["num_accepted_tokens"] > 0
    engine.block_manager.check_invariants([])


@pytest.mark.parametrize("name", ["ngram", "self-draft"])
def test_stops_and_max_tokens_inside_accepted_runs(tiny_llama, tiny_draft, name):
    """A stop token (or max_tokens) reached inside a run of accepted drafts ends the output right
    there: nothing past it is emitted, exactly as without speculation."""
    folder = tiny_llama[0]
    prompts = repetitive_prompts(8, seed=2)
    free, _ = generate(folder, prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    for i, out in enumerate(free):
        stop = out[10]  # a token the output reaches mid-way
        params = SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(stop,))
        plain, _ = generate(folder, [prompts[i]], params)
        spec, engine = generate(
            folder, [prompts[i]], params, speculative_config=proposers(tiny_llama, tiny_draft)[name]
        )
        assert spec == plain and plain[0][-1] == stop and stop not in plain[0][:-1]
    for max_tokens in (1, 2, 5, 13):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        spec, _ = generate(folder, prompts, params, speculative_config=proposers(tiny_llama, tiny_draft)[name])
        assert spec == [out[:max_tokens] for out in free]


def test_adaptive_lowers_k_where_drafts_are_rejected(tiny_llama, tiny_draft):
    """With the 1-layer draft almost every draft is rejected, so adaptive speculation proposes one
    draft a step instead of k; the output stays the plain one."""
    folder = tiny_llama[0]
    prompts = repetitive_prompts(4, seed=3)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    plain, _ = generate(folder, prompts, params)
    spec = {"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 4}
    fixed, fixed_engine = generate(folder, prompts, params, speculative_config=spec)
    adaptive, engine = generate(folder, prompts, params, speculative_config={**spec, "adaptive": True})
    assert fixed == adaptive == plain
    fixed_stats, stats = fixed_engine.spec_stats(), engine.spec_stats()
    assert stats["adaptive"] and stats["num_draft_tokens"] / stats["num_proposals"] < 2
    assert fixed_stats["num_draft_tokens"] / fixed_stats["num_proposals"] > 3.5


@pytest.mark.slow
def test_smollm2_ngram_greedy_is_token_identical(smollm2_dir):
    """The demo model on its C decode path (drafts verified as one step of k + 1 rows a sequence)."""
    data = random_prompts([60] * 8, vocab=1000, seed=4)
    prompts = [(p[:20] * 3) for p in data]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    plain, _ = generate(smollm2_dir, prompts, params)
    spec, engine = generate(smollm2_dir, prompts, params, speculative_config={**NGRAM, "num_speculative_tokens": 2})
    assert spec == plain
    assert engine.spec_stats()["num_accepted_tokens"] > 0


def test_seeded_sampled_request_is_the_same_whatever_the_batch(tiny_llama, tiny_draft):
    folder = tiny_llama[0]
    prompts = repetitive_prompts(6, seed=5)
    seeded = SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    other = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, ignore_eos=True)
    for spec in proposers(tiny_llama, tiny_draft).values():
        alone, _ = generate(folder, [prompts[0]], seeded, speculative_config=spec)
        llm = LLM(folder, device="cpu", num_kv_blocks=512, speculative_config=spec)
        batch = llm.generate(prompts, [seeded] + [other] * 5)
        assert batch[0].token_ids == alone[0]


# ---- the distribution of sampled tokens -------------------------------------------------------


def small_vocab_model(folder):
    """A tiny Llama over 12 tokens with peaked next-token distributions (drafts are often
    accepted), saved in `folder`; the transformers model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(99)
    config = LlamaConfig(
        **{
            **TINY_CONFIG,
            "vocab_size": 12,
            "bos_token_id": 0,
            "eos_token_id": 11,
            "pad_token_id": 0,
            "initializer_range": 0.15,
        }
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def small_vocab_llama(tmp_path_factory):
    """The small-vocabulary Llama and its 1-layer draft."""
    folder = tmp_path_factory.mktemp("small-vocab") / "target"
    model = small_vocab_model(folder)
    return folder, model, make_draft(folder, 1, folder.parent / "draft")


def chi_square_p_value(counts: Counter, probs: dict, n: int) -> float:
    """Pearson's chi-square test of `counts` (n draws) against `probs`, cells with under 5 expected
    draws merged into one."""
    stat, merged_obs, merged_exp, cells = 0.0, 0, 0.0, 0
    for cell, p in probs.items():
        expected, observed = n * p, counts.get(cell, 0)
        if expected < 5:
            merged_obs, merged_exp = merged_obs + observed, merged_exp + expected
            continue
        stat += (observed - expected) ** 2 / expected
        cells += 1
    if merged_exp > 0:
        stat += (merged_obs - merged_exp) ** 2 / merged_exp
        cells += 1
    assert sum(counts.values()) == n and all(c in probs for c in counts), "a draw outside the support"
    return float(
        torch.special.gammaincc(
            torch.tensor((cells - 1) / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


def exact_pairs(model, prompt, temperature):
    """P(t1, t2) of the first two sampled tokens, from transformers' logits."""
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        vocab = first.shape[0]
        both = torch.tensor([prompt + [t] for t in range(vocab)])
        second = torch.softmax(model(both).logits[:, -1] / temperature, -1)
    joint = first[:, None] * second
    return {(a, b): float(joint[a, b]) for a in range(vocab) for b in range(vocab)}


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["draft", "ngram"])
def test_sampled_tokens_follow_the_target_distribution(small_vocab_llama, spec):
    """2000 seeded requests of one prompt: the pair (first token, second token) is distributed as the
    target model's P(t1) P(t2 | t1), with speculation (its first verification makes the second
    token) as without; a chi-square test at p > 1e-4 (a correct sampler fails it 1 run in 10^4)."""
    folder, model, draft = small_vocab_llama
    prompt = [3, 5, 7, 3, 5]
    temperature = 1.0
    probs = exact_pairs(model, prompt, temperature)
    settings = {
        "draft": {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2},
        "ngram": {**NGRAM, "num_speculative_tokens": 2},
    }[spec]
    n = 2000
    params = [SamplingParams(max_tokens=3, temperature=temperature, seed=s, ignore_eos=True) for s in range(n)]
    for speculative_config in (None, settings):
        llm = LLM(folder, device="cpu", max_num_seqs=256, speculative_config=speculative_config)
        outputs = llm.generate([prompt] * n, params)
        counts = Counter((o.token_ids[0], o.token_ids[1]) for o in outputs)
        p_value = chi_square_p_value(counts, probs, n)
        assert p_value > 1e-4, (speculative_config, p_value)
    stats = llm.engine.spec_stats()
    assert stats["num_proposals"] >= n // 10 and 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]


@pytest.mark.slow
def test_a_wrong_verifier_fails_the_distribution_test(small_vocab_llama, monkeypatch):
    """The test above can fail: with drafts accepted whenever q >= p-ish (here: always), the pairs
    are not the target's."""
    import kernels.rejection_sample as rs

    folder, model, draft = small_vocab_llama
    prompt = [3, 5, 7, 3, 5]
    probs = exact_pairs(model, prompt, 1.0)
    monkeypatch.setattr(rs, "_accepts", lambda u, p_x, q_x: bool(q_x > 0))
    n = 2000
    params = [SamplingParams(max_tokens=3, temperature=1.0, seed=s, ignore_eos=True) for s in range(n)]
    llm = LLM(
        folder,
        device="cpu",
        max_num_seqs=256,
        speculative_config={"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2},
    )
    outputs = llm.generate([prompt] * n, params)
    counts = Counter((o.token_ids[0], o.token_ids[1]) for o in outputs)
    assert chi_square_p_value(counts, probs, n) < 1e-6


# ---- settings and bad input -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, message",
    [
        ({"method": "medusa", "num_speculative_tokens": 2}, "speculative_config.method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min=4 is above prompt_lookup_max=2",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown key(s) ['lookahead']"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model"),
        ({"method": "ngram", "num_speculative_tokens": 40}, "above the maximum 32"),
        ("ngram", "must be an object"),
    ],
)
def test_bad_settings_are_refused_by_name(tiny_llama, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        LLM(tiny_llama[0], device="cpu", speculative_config=value)


def test_k_too_large_for_the_model_or_the_step(tiny_llama):
    with pytest.raises(ConfigError, match="too large for max_model_len=8"):
        LLM(tiny_llama[0], device="cpu", max_model_len=8, speculative_config={**NGRAM, "num_speculative_tokens": 7})
    with pytest.raises(ConfigError, match="more than max_num_batched_tokens=4"):
        LLM(
            tiny_llama[0],
            device="cpu",
            max_num_batched_tokens=4,
            speculative_config={**NGRAM, "num_speculative_tokens": 4},
        )


def test_bad_draft_folders_are_refused_before_anything_loads(tiny_llama, tmp_path):
    """The target's weights here are corrupt: an error about the draft shows the draft was checked
    before the target loaded."""
    target = tmp_path / "target"
    shutil.copytree(tiny_llama[0], target)
    (target / "model.safetensors").write_bytes(b"corrupt")

    def refused(draft, message):
        with pytest.raises(ConfigError, match=message):
            LLM(
                target,
                device="cpu",
                speculative_config={"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2},
            )

    refused(tmp_path / "nowhere", "does not exist")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    refused(gpt2, "not a Llama-family model")
    other_vocab = tmp_path / "other-vocab"
    shutil.copytree(tiny_llama[0], other_vocab)
    config = json.loads((other_vocab / "config.json").read_text())
    (other_vocab / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    refused(other_vocab, "vocabulary of 300 tokens")
    other_tokenizer = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_llama[0], other_tokenizer)
    (other_tokenizer / "tokenizer.json").write_text("{}")
    refused(other_tokenizer, "another tokenizer")


def test_ngram_lookup():
    import numpy as np

    tokens = np.array([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    assert ngram_lookup(tokens, 1, 3, 2) == [7, 8]  # the latest earlier match of [1, 2, 3]
    assert ngram_lookup(tokens, 1, 3, 9) == [7, 8, 1, 2, 3]  # fewer than k before the end
    assert ngram_lookup(np.array([5, 6, 7]), 1, 3, 2) == []
    assert ngram_lookup(np.array([4, 5, 4]), 1, 2, 3) == [5, 4]  # the 1-gram [4]
    assert ngram_lookup(np.array([4, 5, 4]), 2, 2, 3) == []


def test_metrics_count_what_was_proposed_and_accepted(tiny_llama):
    llm = LLM(
        tiny_llama[0],
        device="cpu",
        num_kv_blocks=256,
        speculative_config={"method": "draft_model", "model": str(tiny_llama[0]), "num_speculative_tokens": 3},
    )
    out = llm.generate(repetitive_prompts(2), SamplingParams(max_tokens=20, ignore_eos=True))
    stats = llm.engine.spec_stats()
    assert stats["method"] == "draft_model" and "k=3" in stats["description"]
    assert sum(stats["proposed_at_position"]) == stats["num_draft_tokens"]
    assert sum(stats["accepted_at_position"]) == stats["num_accepted_tokens"]
    # Every emitted token after the first of each request came from a verification.
    emitted = sum(len(o.token_ids) - 1 for o in out)
    assert stats["num_proposals"] + stats["num_accepted_tokens"] <= emitted
    assert stats["acceptance_by_position"][0] >= stats["acceptance_by_position"][-1]
    assert LLM(tiny_llama[0], device="cpu").engine.spec_stats() is None


@pytest.mark.parametrize("name", ["ngram", "self-draft"])
def test_abort_mid_run_leaves_the_others_unchanged(tiny_llama, tiny_draft, name):
    """Aborting a speculating request between steps (its draft cache ahead of what the target kept)
    frees its blocks for the others, whose output stays the plain one."""
    from sut import LLMEngine

    folder = tiny_llama[0]
    prompts = repetitive_prompts(4, seed=6)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    plain, _ = generate(folder, prompts, params)
    engine = LLMEngine(
        folder, device="cpu", num_kv_blocks=64, block_size=4, speculative_config=proposers(tiny_llama, tiny_draft)[name]
    )
    ids = [engine.add_request(p, params) for p in prompts]
    outputs = {}
    for step in range(200):
        if step == 4:
            engine.abort(ids[1])
        for out in engine.step():
            outputs[out.request_id] = out
        if not engine.has_unfinished():
            break
    assert outputs[ids[1]].finish_reason == "abort"
    assert [outputs[i].token_ids for i in ids if i != ids[1]] == [plain[0], plain[2], plain[3]]
    assert engine.spec_stats()["num_accepted_tokens"] > 0
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == 64


def test_the_draft_cache_comes_out_of_the_kv_budget(tiny_llama, tiny_draft):
    """Target and draft caches together fit the KV budget (on a GPU the draft's weights too)."""
    budget = 0.002
    llm = LLM(
        tiny_llama[0],
        device="cpu",
        kv_cache_memory_gb=budget,
        speculative_config={"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 2},
    )
    target, draft = llm.engine.runner, llm.engine.proposer.runner
    assert draft.num_blocks == target.num_blocks
    used = target.kv_cache.nbytes + draft.kv_cache.nbytes
    assert budget * 2**30 - target.bytes_per_block - draft.bytes_per_block < used <= budget * 2**30

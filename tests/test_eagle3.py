"""The EAGLE3 proposer (sut/spec_decode/eagle3.py) with random heads written in the reference's
checkpoint layout (no trained head exists here, so acceptance is not measured): greedy output
token-identical to plain decoding on a tiny Llama and a tiny gpt-oss (batches, chunked prefill,
preemption), every greedy proposal equal to a dense recomputation of the head from transformers'
hidden states (so the head's cache holds what it should after rejections and preemptions, and reads
every position, not a window), sampled output distributed as the target's, the target's KV cache
never written by the head, the target's boundary states, and bad head folders refused by name
before anything loads."""

import dataclasses
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import sut.sample.sampler
import sut.spec_decode.eagle3 as eagle3
from sut import LLM, LLMEngine, SamplingParams
from sut.config import ModelConfig
from sut.errors import ConfigError
from sut.model.rope import RotaryEmbedding
from tests.helpers import random_prompts
from tests.test_gpt_oss import tiny_gpt_oss
from tests.test_speculative import chi_square_p_value, exact_pairs, generate, small_vocab_model

HEAD_SHAPE = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96)


def write_head(
    folder: Path,
    target: ModelConfig,
    aux_ids=None,
    *,
    layout="flat",
    draft_vocab=None,
    norm_before_fc=False,
    norm_before_residual=None,
    norm_output=False,
    seed=0,
    std=0.3,
    **config_overrides,
) -> Path:
    """A random EAGLE3 head for `target` in the reference layout: vLLM's llama_eagle3.py names
    (`midlayer.*` and a flat config as EAGLE and ModelOpt write them, or speculators' `layers.0.*`
    and nested config), `d2t`/`t2d` where the draft vocabulary is a subset of the target's."""
    g = torch.Generator().manual_seed(seed)
    s = HEAD_SHAPE
    h, vocab = s["hidden"], target.vocab_size
    draft_vocab = draft_vocab or vocab
    joined = len(aux_ids or eagle3.default_aux_layers(target.num_layers)) * target.hidden_size

    def w(*shape):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1 + 0.2 * torch.randn(n, generator=g)

    p = "midlayer." if layout == "flat" else "layers.0."
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    tensors = {
        "fc.weight": w(h, joined) / joined**0.5,
        f"{p}self_attn.q_proj.weight": w(q, 2 * h),
        f"{p}self_attn.k_proj.weight": w(kv, 2 * h),
        f"{p}self_attn.v_proj.weight": w(kv, 2 * h),
        f"{p}self_attn.o_proj.weight": w(h, q),
        f"{p}mlp.gate_proj.weight": w(s["inter"], h),
        f"{p}mlp.up_proj.weight": w(s["inter"], h),
        f"{p}mlp.down_proj.weight": w(h, s["inter"]),
        f"{p}hidden_norm.weight": norm(h),
        f"{p}input_layernorm.weight": norm(h),
        f"{p}post_attention_layernorm.weight": norm(h),
        "norm.weight": norm(h),
        "lm_head.weight": w(draft_vocab, h),
    }
    if norm_before_fc:
        tensors["input_norm.weight"] = norm(joined)
    if draft_vocab < vocab:  # a subset of the target's ids, in order: d2t holds the offsets
        ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
        tensors["d2t"] = ids - torch.arange(draft_vocab)
        tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    layer = {
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": s["inter"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "max_position_embeddings": 64,  # shorter than the engine's sequences: the rope table is extended
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **config_overrides,
    }
    extra = {"draft_vocab_size": draft_vocab}
    for name, value in (
        ("norm_before_fc", norm_before_fc),
        ("norm_before_residual", norm_before_residual),
        ("norm_output", norm_output),
    ):
        if value is not None:
            extra[name] = value
    if layout == "flat":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **layer, **extra, "eagle_config": {}}
        if aux_ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids), "use_aux_hidden_state": True}
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer,
            "target_hidden_size": target.hidden_size,
            **extra,
        }
        if aux_ids is not None:
            config["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@dataclasses.dataclass
class Target:
    folder: Path
    model: object  # transformers' model, for the dense reference
    head: Path

    def spec(self, k=3):
        return {"method": "eagle3", "model": str(self.head), "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def llama(tiny_llama, tmp_path_factory):
    """The tiny Llama (2 layers) and a flat-layout head reading boundaries 0 (the embeddings), 1 and
    2 (the last layer's output before the final norm), over 200 of its 256 tokens."""
    folder, model = tiny_llama
    head = write_head(
        tmp_path_factory.mktemp("eagle3") / "llama-head",
        ModelConfig.from_folder(folder),
        [0, 1, 2],
        draft_vocab=200,
        seed=1,
    )
    return Target(folder, model, head)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """A tiny gpt-oss (4 layers, window 4 on the even ones) and a speculators-layout head with vLLM's
    default boundaries (2, 2, 1), norm_before_fc and norm_before_residual (speculators' default)."""
    root = tmp_path_factory.mktemp("eagle3-gpt-oss")
    model = tiny_gpt_oss(root / "target", seed=4, sliding_window=4)
    head = write_head(
        root / "head", ModelConfig.from_folder(root / "target"), layout="speculators", norm_before_fc=True, seed=2
    )
    return Target(root / "target", model, head)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """The small-vocabulary Llama of test_speculative.py and a head over 8 of its 12 tokens that
    feeds its normed output back (EAGLE 3.1's norm_output)."""
    root = tmp_path_factory.mktemp("eagle3-small")
    model = small_vocab_model(root / "target")
    head = write_head(
        root / "head", ModelConfig.from_folder(root / "target"), [1, 2, 2], draft_vocab=8, norm_output=True, seed=3
    )
    return Target(root / "target", model, head)


TARGETS = ["llama", "gpt_oss", "small_vocab"]


def prompts_for(name, n, seed=0):
    vocab = 12 if name == "small_vocab" else 256
    return random_prompts([3 + (11 * i) % 29 for i in range(n)], vocab=vocab, seed=seed)


# ---- greedy output --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", TARGETS)
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_output_is_plain_decodings(request, name, batch):
    target = request.getfixturevalue(name)
    prompts = prompts_for(name, 8)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain, _ = generate(target.folder, prompts, params, max_num_seqs=batch)
    spec, engine = generate(target.folder, prompts, params, max_num_seqs=batch, speculative_config=target.spec())
    assert spec == plain
    stats = engine.spec_stats()
    assert stats["method"] == "eagle3" and "EAGLE3 head" in stats["description"]
    assert stats["num_proposals"] > 0 and stats["num_draft_tokens"] > stats["num_proposals"]
    if name == "small_vocab":  # runs of accepted drafts happen
        assert stats["accepted_at_position"][1] > 0, stats
    engine.block_manager.check_invariants([])
    assert len(engine.proposer.pending) == 0  # nothing kept for finished sequences


@pytest.mark.slow
@pytest.mark.parametrize("name", TARGETS)
def test_greedy_with_chunked_prefill_and_preemption(request, name):
    """A small step budget (prompts in chunks, the head's rows arriving chunk by chunk) and a pool too
    small for the batch (preemptions while speculating): plain decoding's tokens."""
    target = request.getfixturevalue(name)
    prompts = prompts_for(name, 8, seed=1)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain, _ = generate(target.folder, prompts, params)
    settings = dict(max_num_batched_tokens=16, block_size=4, num_kv_blocks=40, max_model_len=96)
    spec, engine = generate(target.folder, prompts, params, speculative_config=target.spec(), **settings)
    assert spec == plain
    assert engine.scheduler.num_preemptions > 0
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == 40


# ---- the head against a dense recomputation ------------------------------------------------------


def rms(x, weight, eps=1e-5):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def boundary_states(model, tokens, ids):
    """transformers' residual stream at layer boundaries `ids` (0: the embeddings, j: the output of
    layer j - 1, before the final norm) for `tokens`, joined in that order."""
    found = {}
    hooks = [model.model.embed_tokens.register_forward_hook(lambda m, i, o: found.__setitem__(0, o))]
    for j, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(lambda m, i, o, j=j: found.__setitem__(j + 1, o)))
    with torch.no_grad():
        model(torch.tensor([tokens]))
    for hook in hooks:
        hook.remove()
    return torch.cat([found[j][0] for j in ids], dim=-1).double()


class DenseHead:
    """EAGLE3's head written out densely (float64, a growing K/V list, rotate-half rope), from the
    checkpoint tensors: the reference the paged proposer is held to."""

    def __init__(self, folder: Path, head, target: ModelConfig):
        self.t = {k: v.double() for k, v in load_file(folder / "model.safetensors").items() if k not in ("d2t", "t2d")}
        raw = load_file(folder / "model.safetensors")
        vd = head.draft_vocab_size
        self.ids = torch.arange(vd) + raw["d2t"] if "d2t" in raw else torch.arange(vd)
        self.head, self.p = head, head.layer_prefix
        self.rope = RotaryEmbedding(head.layer, "cpu")
        self.k, self.v = [], []

    def row(self, embed, hidden, position):
        """One row (causal over every row before it); returns (LM-head logits over the target's ids, next hidden)."""
        t, p, c = self.t, self.p, self.head.layer
        e = rms(embed, t[f"{p}input_layernorm.weight"])
        normed = rms(hidden, t[f"{p}hidden_norm.weight"])
        residual = normed if self.head.norm_before_residual else hidden
        x = torch.cat([e, normed])
        q = (t[f"{p}self_attn.q_proj.weight"] @ x).view(c.num_heads, c.head_dim)
        k = (t[f"{p}self_attn.k_proj.weight"] @ x).view(c.num_kv_heads, c.head_dim)
        v = (t[f"{p}self_attn.v_proj.weight"] @ x).view(c.num_kv_heads, c.head_dim)
        cos, sin = self.rope.cos[position].double(), self.rope.sin[position].double()

        def rotate(y):
            half = y.shape[-1] // 2
            return y * cos + torch.cat([-y[..., half:], y[..., :half]], -1) * sin

        self.k.append(rotate(k))
        self.v.append(v)
        keys, values = torch.stack(self.k, 1), torch.stack(self.v, 1)  # [kv_heads, rows, dim]
        group = c.num_heads // c.num_kv_heads
        keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
        weights = torch.softmax((keys @ rotate(q)[:, :, None])[..., 0] * c.head_dim**-0.5, -1)
        attn = (weights[:, None, :] @ values)[:, 0].reshape(-1)
        x = t[f"{p}self_attn.o_proj.weight"] @ attn + residual
        residual = x
        x = rms(x, t[f"{p}post_attention_layernorm.weight"])
        gate, up = t[f"{p}mlp.gate_proj.weight"] @ x, t[f"{p}mlp.up_proj.weight"] @ x
        x = t[f"{p}mlp.down_proj.weight"] @ (torch.nn.functional.silu(gate) * up) + residual
        out = rms(x, t["norm.weight"])
        logits = torch.full((self.head.layer.vocab_size,), float("-inf"), dtype=torch.float64)
        logits[self.ids] = t["lm_head.weight"] @ out
        return logits, out if self.head.norm_output else x


def dense_drafts(target: Target, head, tokens, computed, k):
    """Greedy drafts for a sequence of `tokens` whose target cache holds `computed` of them: the head
    over every verified position (the target's hidden states), then chained on its own."""
    config = ModelConfig.from_folder(target.folder)
    dense = DenseHead(target.head, head, config)
    aux = boundary_states(target.model, tokens[:computed], head.aux_layer_ids)
    if head.norm_before_fc:
        aux = rms(aux, dense.t["input_norm.weight"])
    hidden = aux @ dense.t["fc.weight"].T
    embeds = target.model.model.embed_tokens.weight.double()
    for pos in range(computed):
        logits, out = dense.row(embeds[tokens[pos + 1]], hidden[pos], pos)
    drafts = []
    for pos in range(computed, computed + k):
        drafts.append(int(logits.argmax()))
        if len(drafts) < k:
            logits, out = dense.row(embeds[drafts[-1]], out, pos)
    return drafts


@pytest.mark.slow
@pytest.mark.parametrize("name", TARGETS)
def test_every_proposal_is_the_dense_heads(request, name, monkeypatch):
    """Greedy drafts of every proposal, in a run with batches, chunked prefill, rejections and
    preemptions, equal the dense head's over the sequence as it stands (transformers' hidden states
    for the verified positions): the head's cache holds the target-fed K/V of every position before
    it, whatever was rejected or preempted; on gpt-oss (window 4, prompts up to 34 tokens) it reads
    the full-attention table, not a window."""
    target = request.getfixturevalue(name)
    records = []
    propose = eagle3.Eagle3Proposer.propose

    def recorded(self, seqs, counts, block_tables):
        before = [(list(s.token_ids), s.num_computed_tokens, k) for s, k in zip(seqs, counts)]
        out = propose(self, seqs, counts, block_tables)
        records.extend((tokens, computed, k, drafts) for (tokens, computed, k), (drafts, _) in zip(before, out))
        return out

    monkeypatch.setattr(eagle3.Eagle3Proposer, "propose", recorded)
    prompts = prompts_for(name, 6, seed=2)
    settings = dict(max_num_batched_tokens=16, block_size=4, num_kv_blocks=36, max_model_len=80)
    _, engine = generate(
        target.folder,
        prompts,
        SamplingParams(max_tokens=30, ignore_eos=True),
        speculative_config=target.spec(),
        **settings,
    )
    assert engine.scheduler.num_preemptions > 0
    head = engine.proposer.model.head
    proposed = [r for r in records if r[3]]
    assert len(proposed) > 0.8 * len(records)  # only a sequence just admitted with its K/V elsewhere would wait
    for tokens, computed, k, drafts in proposed:
        assert computed == len(tokens) - 1 and len(drafts) == k
        assert drafts == dense_drafts(target, head, tokens, computed, k), (tokens, computed)


# ---- the target's boundary states and KV cache ---------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "gpt_oss"])
def test_the_target_keeps_the_heads_boundary_states(request, name, monkeypatch):
    """What the engine hands the head after a step is transformers' residual stream at the head's
    boundaries, row for row (a prompt in two chunks)."""
    target = request.getfixturevalue(name)
    seen = []
    observe = eagle3.Eagle3Proposer.observe

    def recorded(self, seqs, starts, num_new_tokens, aux):
        seen.append((starts[0], num_new_tokens[0], aux.clone()))
        return observe(self, seqs, starts, num_new_tokens, aux)

    monkeypatch.setattr(eagle3.Eagle3Proposer, "observe", recorded)
    prompt = random_prompts([27], seed=7)[0]
    llm = LLM(
        target.folder, device="cpu", num_kv_blocks=64, max_num_batched_tokens=16, speculative_config=target.spec()
    )
    llm.generate([prompt], SamplingParams(max_tokens=1))
    ids = llm.engine.proposer.aux_layers
    want = boundary_states(target.model, prompt, ids)
    assert [(s, n) for s, n, _ in seen] == [(0, 16), (16, 11)]
    got = torch.cat([aux for _, _, aux in seen]).double()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_no_hidden_states_are_kept_without_an_eagle3_head(llama, monkeypatch):
    llm = LLM(
        llama.folder,
        device="cpu",
        num_kv_blocks=64,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2},
    )
    execute, asked = llm.engine.runner.execute, []
    monkeypatch.setattr(llm.engine.runner, "execute", lambda step, *aux: asked.append(aux) or execute(step, *aux))
    llm.generate([[5, 6, 7, 5, 6]], SamplingParams(max_tokens=4))
    assert llm.engine.aux_layers == () and asked and not any(asked)  # no step was asked for hidden states


@pytest.mark.parametrize("name", ["llama", "gpt_oss"])
def test_the_head_never_writes_the_targets_kv_cache(request, name, monkeypatch):
    """vLLM PR #25406: a gpt-oss head that wrote into the target's cache. Around every proposal (greedy
    and sampled, after warm-up) the target's KV cache is bit-identical while the head's changes, and
    the two share no memory."""
    target = request.getfixturevalue(name)
    calls = []
    propose = eagle3.Eagle3Proposer.propose

    def checked(self, seqs, counts, block_tables):
        runner = self.runner
        before, head_before = runner.kv_cache.clone(), self.kv_cache.clone()
        out = propose(self, seqs, counts, block_tables)
        if any(d for d, _ in out):
            assert torch.equal(runner.kv_cache, before), "the head wrote the target's KV cache"
            assert not torch.equal(self.kv_cache, head_before), "the head wrote nothing of its own"
            calls.append(len(seqs))
        return out

    monkeypatch.setattr(eagle3.Eagle3Proposer, "propose", checked)
    engine = LLMEngine(
        target.folder, device="cpu", num_kv_blocks=96, block_size=4, max_model_len=96, speculative_config=target.spec()
    )
    runner, proposer = engine.runner, engine.proposer
    ours = proposer.kv_cache.untyped_storage()
    theirs = runner.kv_cache.untyped_storage()
    assert (
        ours.data_ptr() + ours.nbytes() <= theirs.data_ptr() or theirs.data_ptr() + theirs.nbytes() <= ours.data_ptr()
    )
    engine.warmup()
    prompts = prompts_for(name, 4, seed=3)
    params = [
        SamplingParams(max_tokens=12, ignore_eos=True, **({"temperature": 1.0, "seed": i} if i % 2 else {}))
        for i in range(4)
    ]
    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    while engine.has_unfinished():
        engine.step()
    assert len(calls) > 3


# ---- sampled output -------------------------------------------------------------------------------


@pytest.mark.slow
def test_sampled_tokens_follow_the_target_distribution(small_vocab):
    """2000 seeded requests of one prompt: the pair (first token, second token, which the first
    verification makes) is distributed as the target's P(t1) P(t2 | t1), the head drafting from 8 of
    the 12 tokens (q is zero on the others); chi-square at p > 1e-4 as tests/test_speculative.py."""
    prompt = [3, 5, 7, 3, 5]
    probs = exact_pairs(small_vocab.model, prompt, 1.0)
    n = 2000
    params = [SamplingParams(max_tokens=3, temperature=1.0, seed=s, ignore_eos=True) for s in range(n)]
    llm = LLM(small_vocab.folder, device="cpu", max_num_seqs=256, speculative_config=small_vocab.spec(k=2))
    outputs = llm.generate([prompt] * n, params)
    counts = Counter((o.token_ids[0], o.token_ids[1]) for o in outputs)
    assert chi_square_p_value(counts, probs, n) > 1e-4
    stats = llm.engine.spec_stats()
    assert stats["num_proposals"] >= n // 2 and 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]


def test_sampled_drafts_carry_the_distribution_they_came_from(small_vocab, monkeypatch):
    """A sampled draft comes with q over the target's vocabulary: a distribution, zero off the draft
    vocabulary and on what top-k cuts, positive at the draft; greedy drafts carry none."""
    seen = []
    propose = eagle3.Eagle3Proposer.propose

    def recorded(self, seqs, counts, block_tables):
        out = propose(self, seqs, counts, block_tables)
        seen.extend((seq.params.greedy, drafts, q) for seq, (drafts, q) in zip(seqs, out) if drafts)
        return out

    monkeypatch.setattr(eagle3.Eagle3Proposer, "propose", recorded)
    llm = LLM(small_vocab.folder, device="cpu", num_kv_blocks=128, speculative_config=small_vocab.spec())
    off_draft = torch.ones(12, dtype=torch.bool).index_fill_(0, llm.engine.proposer.model.draft_to_target, False)
    params = [
        SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.7, top_k=4, seed=1),
        SamplingParams(max_tokens=16),
    ]
    llm.generate(prompts_for("small_vocab", 2, seed=8), params)
    sampled = [(d, q) for greedy, d, q in seen if not greedy]
    assert sampled and all(q is None for greedy, _, q in seen if greedy)
    for drafts, q in sampled:
        assert q.shape == (len(drafts), 12)
        torch.testing.assert_close(q.sum(-1), torch.ones(len(drafts)))
        assert (q[:, off_draft] == 0).all() and ((q > 0).sum(-1) <= 4).all()
        assert (q[torch.arange(len(drafts)), drafts] > 0).all()


def test_seeded_sampled_request_is_the_same_whatever_the_batch(llama):
    prompts = prompts_for("llama", 6, seed=5)
    seeded = SamplingParams(max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)
    other = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, top_k=50, ignore_eos=True)
    alone, _ = generate(llama.folder, [prompts[0]], seeded, speculative_config=llama.spec())
    batch, engine = generate(llama.folder, prompts, [seeded] + [other] * 5, speculative_config=llama.spec())
    assert batch[0] == alone[0]
    assert engine.spec_stats()["num_draft_tokens"] > 0


@pytest.mark.slow
def test_each_head_forward_reads_the_device_once(llama, monkeypatch):
    """On the op set CUDA runs (Triton, interpreted here), the proposer reads the device only through
    to_host (tests/test_step_syncs.py's count)."""
    from tests.test_step_syncs import count_host_reads

    llm = LLM(
        llama.folder,
        kernels="triton",
        num_kv_blocks=32,
        block_size=8,
        max_num_batched_tokens=16,
        device="cpu",
        speculative_config=llama.spec(k=2),
    )
    reads, syncs, _ = count_host_reads(monkeypatch)
    monkeypatch.setattr(eagle3, "to_host", sut.sample.sampler.to_host)
    params = [SamplingParams(max_tokens=6, ignore_eos=True), SamplingParams(max_tokens=6, temperature=0.9, seed=3)]
    llm.generate(prompts_for("llama", 2, seed=6), params)
    assert llm.engine.spec_stats()["num_draft_tokens"] > 0
    assert reads == [], "host reads of tensors outside sut.sample.sampler.to_host:\n" + "\n".join(reads)


# ---- settings and bad head folders ----------------------------------------------------------------


def test_bad_head_folders_are_refused_before_anything_loads(llama, tmp_path):
    """The target's weights here are corrupt: an error about the head shows it was checked before
    the target loaded."""
    target = tmp_path / "target"
    shutil.copytree(llama.folder, target)
    (target / "model.safetensors").write_bytes(b"corrupt")
    config = ModelConfig.from_folder(llama.folder)

    def refused(head, message, **settings):
        with pytest.raises(ConfigError, match=message):
            LLM(
                target,
                device="cpu",
                speculative_config={"method": "eagle3", "model": str(head), "num_speculative_tokens": 2},
                **settings,
            )

    def variant(name, edit_config=None, edit_tensors=None, **head_args):
        folder = write_head(tmp_path / name, config, head_args.pop("aux_ids", [0, 1, 2]), **head_args)
        if edit_config:
            raw = json.loads((folder / "config.json").read_text())
            edit_config(raw)
            (folder / "config.json").write_text(json.dumps(raw))
        if edit_tensors:
            tensors = load_file(folder / "model.safetensors")
            edit_tensors(tensors)
            save_file(tensors, folder / "model.safetensors")
        return folder

    refused(tmp_path / "nowhere", "EAGLE3 head folder .* does not exist")
    no_config = variant("no-config")
    (no_config / "config.json").unlink()
    refused(no_config, "has no config.json")
    refused(llama.folder, r"is not an EAGLE3 head \(architectures \['LlamaForCausalLM'\].*method 'draft_model'")
    refused(variant("eagle1", lambda c: c["eagle_config"].update(use_aux_hidden_state=False)), "not an EAGLE3 head")
    refused(variant("two-layers", lambda c: c.update(num_hidden_layers=2)), "num_hidden_layers=2")
    refused(variant("vocab", lambda c: c.update(vocab_size=300)), "vocabulary of 300 tokens, the target 256")
    refused(
        variant("width", lambda c: c.update(target_hidden_size=128)), "hidden states 128 wide .* the target's are 64"
    )
    refused(variant("boundary", aux_ids=[0, 1, 3]), r"\[3\] lie outside the target's 0..2")
    refused(variant("default", aux_ids=None), r"names none, and vLLM's default .* \[-1\] lie outside")
    refused(
        variant("speculators-kind", lambda c: c.update(speculators_model_type="eagle"), layout="speculators"),
        "not an EAGLE3 head",
    )
    refused(
        variant("missing", edit_tensors=lambda t: t.pop("midlayer.hidden_norm.weight")), "lacks 1 tensor.*hidden_norm"
    )
    refused(
        variant("extra", edit_tensors=lambda t: t.update({"midlayer.self_attn.sinks": torch.zeros(4)})),
        "does not: .*sinks",
    )
    refused(
        variant("fc-shape", edit_tensors=lambda t: t.update({"fc.weight": torch.zeros(64, 128)})),
        r"'fc.weight' has shape \[64, 128\].* implies \[64, 192\]",
    )
    refused(
        variant("q-shape", edit_tensors=lambda t: t.update({"midlayer.self_attn.q_proj.weight": torch.zeros(64, 64)})),
        r"q_proj.weight' has shape \[64, 64\].* implies \[64, 128\]",
    )
    refused(
        variant("lm-head", draft_vocab=200, edit_tensors=lambda t: t.update({"lm_head.weight": torch.zeros(256, 64)})),
        r"'lm_head.weight' has shape \[256, 64\].* implies \[200, 64\]",
    )
    refused(variant("no-d2t", draft_vocab=200, edit_tensors=lambda t: (t.pop("d2t"), t.pop("t2d"))), "no d2t tensor")
    refused(
        variant("d2t-dtype", draft_vocab=200, edit_tensors=lambda t: t.update(d2t=t["d2t"].float())),
        "'d2t' has dtype F32",
    )
    refused(
        variant("d2t-range", draft_vocab=200, edit_tensors=lambda t: t.update(d2t=t["d2t"] + 100)),
        "d2t maps draft ids outside the target's 256 tokens",
    )
    refused(
        variant("wide", lambda c: c.update(hidden_size=128, target_hidden_size=64)),
        "128 wide and the target 64: it cannot share the target's embedding",
    )
    refused(variant("window", lambda c: c.update(layer_types=["sliding_attention"])), "sliding-window layer")
    # A buffer some checkpoints carry is passed over, as the model loader does.
    inv_freq = variant(
        "inv-freq", edit_tensors=lambda t: t.update({"midlayer.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    )
    assert eagle3.check_eagle3_folder(inv_freq, config, 64).layer_prefix == "midlayer."
    good = variant("good")
    refused(good, "'eagle3' and cuda_graphs", cuda_graphs=True)
    refused(good, "'eagle3' and enable_prefix_caching", enable_prefix_caching=True)
    refused(good, r"'eagle3' and tensor_parallel_size > 1", tensor_parallel_size=2)


def test_eagle3_settings_are_refused_by_name(llama):
    with pytest.raises(ConfigError, match="model must be a non-empty string .the EAGLE3 head's folder."):
        LLM(llama.folder, device="cpu", speculative_config={"method": "eagle3", "num_speculative_tokens": 2})
    with pytest.raises(ConfigError, match="prompt_lookup_min is for method 'ngram', not 'eagle3'"):
        LLM(llama.folder, device="cpu", speculative_config={**llama.spec(), "prompt_lookup_min": 2})


def test_the_head_checked_is_the_head_loaded(llama, gpt_oss):
    """The layouts the check reads: flat with midlayer.* and d2t; speculators with layers.0.*,
    norm_before_fc and its norm_before_residual default; vLLM's default boundaries."""
    flat = eagle3.check_eagle3_folder(llama.head, ModelConfig.from_folder(llama.folder), 128)
    assert flat.layer_prefix == "midlayer." and flat.has_d2t and flat.draft_vocab_size == 200
    assert flat.aux_layer_ids == (0, 1, 2) and not flat.norm_before_residual and not flat.norm_before_fc
    assert flat.layer.max_position_embeddings == 128  # extended from the head's 64
    spec = eagle3.check_eagle3_folder(gpt_oss.head, ModelConfig.from_folder(gpt_oss.folder), 32)
    assert spec.layer_prefix == "layers.0." and not spec.has_d2t and spec.norm_before_fc and spec.norm_before_residual
    assert spec.aux_layer_ids == (2, 2, 1) == eagle3.default_aux_layers(4)

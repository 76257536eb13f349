"""Greedy output of our engine is token-identical to transformers' generate on the same weights."""

import pytest
import torch

from sut import LLM, SamplingParams
from tests.helpers import hf_greedy, random_prompts

LENGTHS = [1, 5, 17, 33, 64, 100, 7, 48]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def expected(tiny_llama):
    _, model = tiny_llama
    prompts = random_prompts(LENGTHS)
    return prompts, [hf_greedy(model, p, NEW_TOKENS) for p in prompts]


def record_batches(llm):
    """Wrap the scheduler so the test sees every step's (sequence, new tokens, uncomputed before) list."""
    steps = []
    schedule = llm.engine.scheduler.schedule

    def recording(now):
        batch = schedule(now)
        steps.append([(s.request_id, n, s.num_uncomputed_tokens) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        return batch

    llm.engine.scheduler.schedule = recording
    return steps


def test_plain_batch_matches_transformers(tiny_llama, expected):
    prompts, want = expected
    llm = LLM(tiny_llama[0], num_kv_blocks=256)
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))]
    assert got == want


def test_chunked_prefill_matches_transformers(tiny_llama, expected):
    prompts, want = expected
    llm = LLM(tiny_llama[0], num_kv_blocks=256, max_num_batched_tokens=16, block_size=8)
    steps = record_batches(llm)
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))]
    assert got == want
    chunks = [n for step in steps for _, n, left in step if n < left]
    assert chunks, "no prompt was split into chunks"
    mixed = [step for step in steps if any(left == 1 for _, _, left in step) and any(left > 1 for _, _, left in step)]
    assert mixed, "no step mixed decodes with prefill"
    assert all(sum(n for _, n, _ in step) <= 16 for step in steps)


def test_preemption_keeps_output_unchanged(tiny_llama, expected):
    prompts, want = expected
    # 32 blocks of 4 tokens hold one 128-token sequence but not the whole batch at once.
    llm = LLM(tiny_llama[0], num_kv_blocks=32, block_size=4, max_model_len=128, max_num_batched_tokens=64)
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == want
    assert llm.kv_cache_stats()["num_preemptions"] > 0
    assert any(o.num_preemptions > 0 for o in outs)
    engine = llm.engine
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == 32


def test_bf16_close_to_fp32(tiny_llama, expected):
    """Lower precision runs and mostly agrees (bf16 numerics differ, so no exactness claim)."""
    prompts, want = expected
    llm = LLM(tiny_llama[0], num_kv_blocks=256, dtype="bfloat16")
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))]
    first_tokens_equal = sum(g[0] == w[0] for g, w in zip(got, want))
    assert first_tokens_equal >= len(want) - 2


def test_sharded_checkpoint_and_tied_embeddings(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers import TINY_CONFIG

    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_CONFIG, "tie_word_embeddings": True})).eval()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    prompts = random_prompts([9, 30], seed=3)
    want = [hf_greedy(model, p, 12) for p in prompts]
    got = [o.token_ids for o in LLM(tmp_path, num_kv_blocks=64).generate(prompts, SamplingParams(max_tokens=12))]
    assert got == want


def test_llama31_rope_scaling_matches_transformers(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers import TINY_CONFIG

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    torch.manual_seed(11)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_CONFIG, "rope_parameters": rope})).eval()
    model.save_pretrained(tmp_path)
    prompts = random_prompts([150, 20], seed=5)  # past the original 64-position window
    want = [hf_greedy(model, p, 16) for p in prompts]
    got = [o.token_ids for o in LLM(tmp_path, num_kv_blocks=128).generate(prompts, SamplingParams(max_tokens=16))]
    assert got == want


def test_prefix_caching_reuses_blocks_and_keeps_output(tiny_llama):
    _, model = tiny_llama
    shared = random_prompts([40], seed=8)[0]
    tails = random_prompts([3, 9, 1], seed=9)
    prompts = [shared + t for t in tails]
    want = [hf_greedy(model, p, 12) for p in prompts]
    llm = LLM(tiny_llama[0], num_kv_blocks=128, block_size=8, enable_prefix_caching=True)
    first = llm.generate(prompts[:1], SamplingParams(max_tokens=12))
    rest = llm.generate(prompts[1:], SamplingParams(max_tokens=12))
    assert [o.token_ids for o in first + rest] == want
    # The 40-token prefix is 5 full blocks of 8; both later prompts take them from the cache.
    assert llm.kv_cache_stats()["num_prefix_hit_tokens"] == 2 * 40
    llm.engine.block_manager.check_invariants([])


def test_prefix_caching_is_off_by_default(tiny_llama):
    shared = random_prompts([40], seed=8)[0]
    llm = LLM(tiny_llama[0], num_kv_blocks=128, block_size=8)
    llm.generate([shared + [5]], SamplingParams(max_tokens=4))
    llm.generate([shared + [6]], SamplingParams(max_tokens=4))
    assert llm.kv_cache_stats()["num_prefix_hit_tokens"] == 0

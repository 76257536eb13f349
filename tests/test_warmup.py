"""The engine's warm-up runs before a timed run and leaves nothing behind: no cached prefix, no
step timings for the TPOT guard, no counts; outputs afterwards are a fresh engine's."""

import pytest

from sut import LLM, SamplingParams
from sut.errors import ConfigError
from tests.helpers import random_prompts


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 2}], ids=["plain", "ngram"])
def test_warmup_leaves_the_engine_as_new(tiny_llama, spec):
    settings = dict(
        num_kv_blocks=64,
        block_size=8,
        max_num_batched_tokens=32,
        enable_prefix_caching=True,
        tpot_target_ms=50,
        speculative_config=spec,
    )
    prompts = random_prompts([5, 40, 17], seed=2)
    params = [
        SamplingParams(max_tokens=8),
        SamplingParams(max_tokens=8, temperature=0.8, seed=1),
        SamplingParams(max_tokens=8, ignore_eos=True),
    ]
    fresh = [o.token_ids for o in LLM(tiny_llama[0], **settings).generate(prompts, params)]
    llm = LLM(tiny_llama[0], **settings)
    engine = llm.engine
    assert engine.warmup() > 0
    scheduler, blocks = engine.scheduler, engine.block_manager
    assert not scheduler.costs.decode_steps and not scheduler.costs.chunk_steps and scheduler.num_preemptions == 0
    assert blocks.num_free_blocks == blocks.num_blocks and not blocks.hash_to_block_id
    assert engine.spec_stats() is None or engine.spec_stats()["num_proposals"] == 0
    assert [o.token_ids for o in llm.generate(prompts, params)] == fresh
    assert engine.kv_cache_stats()["num_prefix_hit_tokens"] == 0  # nothing of the warm-up's was reused


def test_warmup_refuses_a_busy_engine(tiny_llama):
    llm = LLM(tiny_llama[0], num_kv_blocks=32)
    llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="idle engine"):
        llm.engine.warmup()

"""The batching the report's ablation takes away features with (sut/engine/scheduler.py): static batching
as the MLPerf reference SUTs do it, and continuous batching without chunked prefill. Both give the
same greedy tokens as the default engine; what differs is which step computes what."""

import pytest

from sut import ConfigError, LLMEngine, SamplingParams
from tests.helpers import random_prompts

BASE = dict(device="cpu", kernels="torch", num_kv_blocks=128, block_size=8, max_model_len=128)


def run(engine, prompts, params):
    """Every output by request id, and the step (counting from 1) in which each request finished."""
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    outputs, finished_at, step = {}, {}, 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            outputs[out.request_id] = out
            finished_at[out.request_id] = step
    return [outputs[i] for i in ids], [finished_at[i] for i in ids]


def test_static_batching_gives_the_same_tokens_in_batches_that_run_to_their_longest_row(tiny_llama):
    prompts = random_prompts([9, 30, 17, 5, 22])
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (4, 12, 7, 9, 3)]
    plain, _ = run(LLMEngine(tiny_llama[0], **BASE, max_num_batched_tokens=128), prompts, params)
    engine = LLMEngine(tiny_llama[0], **BASE, max_num_batched_tokens=128, max_num_seqs=2, static_batching=True)
    static, finished_at = run(engine, prompts, params)
    assert [o.token_ids for o in static] == [o.token_ids for o in plain]
    assert [o.finish_reason for o in static] == [o.finish_reason for o in plain]
    # Batches of two, each ended by its longest row (tokens 4 and 12, then 7 and 9, then 3): every
    # row of a batch is returned in the step its last row finishes, the next batch starts after.
    assert finished_at[0] == finished_at[1] == 12
    assert finished_at[2] == finished_at[3] == 12 + 9
    assert finished_at[4] == 12 + 9 + 3


def test_a_static_row_that_stops_early_is_cut_where_it_stopped(tiny_llama):
    prompts = random_prompts([12, 12], seed=3)
    first = run(LLMEngine(tiny_llama[0], **BASE), prompts[:1], [SamplingParams(max_tokens=10, ignore_eos=True)])
    first = first[0][0].token_ids
    stop = first[3]  # row 0 stops by its 4th token; row 1 runs on to 10
    params = [
        SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=[stop]),
        SamplingParams(max_tokens=10, ignore_eos=True),
    ]
    plain, _ = run(LLMEngine(tiny_llama[0], **BASE), prompts, params)
    static, finished_at = run(LLMEngine(tiny_llama[0], **BASE, static_batching=True), prompts, params)
    assert static[0].token_ids == plain[0].token_ids == first[: first.index(stop) + 1]
    assert static[0].finish_reason == "stop"
    assert static[1].token_ids == plain[1].token_ids
    assert finished_at == [10, 10]


def test_static_batching_streams_each_first_token_when_it_is_sampled(tiny_llama):
    engine = LLMEngine(tiny_llama[0], **BASE, static_batching=True)
    seen = []
    for i, prompt in enumerate(random_prompts([6, 6])):
        engine.add_request(
            prompt, SamplingParams(max_tokens=5, ignore_eos=True), request_id=i, on_token=lambda t, i=i: seen.append(i)
        )
    engine.step()
    assert seen == [0, 1]  # the batch's prefill step sampled both first tokens
    while engine.has_unfinished():
        engine.step()
    assert len(seen) == 10  # and only the tokens each returns: none from the rows' padding steps


def test_aborting_the_last_running_row_of_a_static_batch_returns_the_finished_ones(tiny_llama):
    engine = LLMEngine(tiny_llama[0], **BASE, static_batching=True)
    prompts = random_prompts([6, 6], seed=7)
    engine.add_request(prompts[0], SamplingParams(max_tokens=3, ignore_eos=True), request_id="short")
    engine.add_request(prompts[1], SamplingParams(max_tokens=20, ignore_eos=True), request_id="long")
    for _ in range(4):  # "short" has its 3 tokens and waits for its batch, no longer computing
        assert engine.step() == []
    engine.abort("long")
    outputs = {o.request_id: o for o in engine.step()}
    assert outputs["short"].finish_reason == "length" and len(outputs["short"].token_ids) == 3
    assert outputs["long"].finish_reason == "abort"
    assert not engine.has_unfinished()


def test_without_chunked_prefill_a_prompt_waits_for_a_step_it_fits_whole(tiny_llama):
    prompts = random_prompts([40, 40], seed=5)
    params = [SamplingParams(max_tokens=3)] * 2
    first_step = {}
    for chunked in (True, False):  # a budget of 64: room for one prompt and part of the other
        engine = LLMEngine(
            tiny_llama[0], **{**BASE, "max_num_batched_tokens": 64, "max_model_len": 64}, enable_chunked_prefill=chunked
        )
        for prompt, p in zip(prompts, params):
            engine.add_request(prompt, p)
        engine._take_inbox()
        first_step[chunked] = engine.scheduler.schedule().num_new_tokens
    assert first_step == {True: [40, 24], False: [40]}
    plain, _ = run(LLMEngine(tiny_llama[0], **BASE), prompts, params)
    whole, _ = run(
        LLMEngine(
            tiny_llama[0], **{**BASE, "max_num_batched_tokens": 64, "max_model_len": 64}, enable_chunked_prefill=False
        ),
        prompts,
        params,
    )
    assert [o.token_ids for o in whole] == [o.token_ids for o in plain]


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"static_batching": True, "max_num_batched_tokens": 64},
            "max_model_len 128 exceeds max_num_batched_tokens 64",
        ),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 64}, "max_model_len 128 exceeds"),
        ({"static_batching": "yes"}, "static_batching must be true or false"),
        (
            {"static_batching": True, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
            "static_batching and speculative_config do not go together",
        ),
    ],
)
def test_bad_batching_settings_are_refused_by_name(tiny_llama, settings, message):
    with pytest.raises(ConfigError, match=message):
        LLMEngine(tiny_llama[0], **{**BASE, **settings})

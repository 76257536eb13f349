"""The step input: ModelRunner.prepare builds with array operations exactly what a per-token loop
builds, holds only tensors and host ints (what a tensor-parallel rank will receive), and gives any
number of logits rows per sequence."""

import pickle
from dataclasses import fields

import torch

from sut import LLMEngine, SamplingParams
from sut.batch import ScheduledBatch
from sut.worker.step_input import StepInput
from tests.helpers import random_prompts


def reference_step_input(batch: ScheduledBatch, block_size: int) -> dict:
    """The step input built token by token (the way the runner did before the step seam)."""
    ids, positions, slots, seq_lens, cu, rows = [], [], [], [], [0], []
    for seq, n, k in zip(batch.seqs, batch.num_new_tokens, batch.num_logits):
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        for p in range(start, end):
            ids.append(seq.token_ids[p])
            positions.append(p)
            slots.append(seq.block_table[p // block_size] * block_size + p % block_size)
        cu.append(cu[-1] + n)
        seq_lens.append(end)
        rows += range(cu[-1] - k, cu[-1])
    width = max(len(s.block_table) for s in batch.seqs)
    tables = [s.block_table + [0] * (width - len(s.block_table)) for s in batch.seqs]
    return dict(
        input_ids=ids,
        positions=positions,
        slot_mapping=slots,
        block_tables=tables,
        cu_seqlens_q=cu,
        seq_lens=seq_lens,
        logits_indices=rows,
    )


def test_prepare_matches_the_per_token_reference_over_chunks_decodes_and_preemption(tiny_llama):
    engine = LLMEngine(tiny_llama[0], num_kv_blocks=40, block_size=4, max_num_batched_tokens=24, max_model_len=128)
    for i, prompt in enumerate(random_prompts([1, 5, 17, 33, 64, 9])):
        engine.add_request(prompt, SamplingParams(max_tokens=20), request_id=i)
    prepare, checked = engine.runner.prepare, []

    def checking(batch):
        step = prepare(batch)
        want = reference_step_input(batch, 4)
        for name, values in want.items():
            assert getattr(step, name).tolist() == values, name
        assert step.query_lens_host == batch.num_new_tokens and step.seq_lens_host == want["seq_lens"]
        checked.append(batch)
        return step

    engine.runner.prepare = checking
    while engine.has_unfinished():
        engine.step()
    assert engine.scheduler.num_preemptions > 0, "the pool is small enough to preempt"
    assert any(any(b.is_prefill) and not all(b.is_prefill) for b in checked), "no mixed step"


def test_any_number_of_logits_rows_per_sequence_and_nothing_but_tensors_and_ints(tiny_llama):
    engine = LLMEngine(tiny_llama[0], num_kv_blocks=64, block_size=4)
    for i, prompt in enumerate(random_prompts([7, 3, 12])):
        engine.scheduler.add(engine.make_sequence(prompt, SamplingParams(max_tokens=4), request_id=i))
    batch = engine.scheduler.schedule()  # the three prompts whole: 7, 3 and 12 token rows
    # As a verifier will ask: several rows for one sequence, none for another.
    batch.num_logits = [3, 0, 1]
    step = engine.runner.prepare(batch)
    assert step.logits_indices.tolist() == [4, 5, 6, 21]
    assert engine.runner.execute(step).shape == (4, engine.model_config.vocab_size)
    for f in fields(StepInput):
        value = getattr(step, f.name)
        if f.name.startswith("window_"):  # only a model with window layers beside full ones has them
            assert value is None, f.name
            continue
        assert isinstance(value, torch.Tensor) or all(isinstance(v, int) for v in value), f.name
    assert pickle.loads(pickle.dumps(step)).input_ids.tolist() == step.input_ids.tolist()

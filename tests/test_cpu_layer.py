"""The CPU decode path (sut/cpu/layer.py, all layers of a decode-only step in one C call)
computes what the model's own path computes with the same C ops, at every instruction-set level
this CPU runs, exact and with int16 inputs: the hidden states and the keys and values written to
the cache; and the engine takes it for decode-only steps within its row limit only."""

import pytest
import torch
from test_cpu_quant import blockify

from kernels import AttentionMetadata
from sut import LLM, SamplingParams
from sut.cpu.build import library
from sut.cpu.layer import CpuDecoder
from sut.cpu.ops import c_ops
from sut.cpu.quant import BLOCK_ROWS_MAX, INT16_ROWS_MAX, write_gguf_blocks
from tests.helpers import LEVELS, TINY_CONFIG, hf_greedy, random_prompts

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler to build the CPU kernels")


@pytest.fixture(scope="module")
def blocks_folder(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(11)
    model = LlamaForCausalLM(
        LlamaConfig(
            **{
                **TINY_CONFIG,
                "num_attention_heads": 6,
                "num_key_value_heads": 2,
                "hidden_size": 192,
                "intermediate_size": 256,
            }
        )
    ).eval()
    tensors = blockify(model)
    folder = tmp_path_factory.mktemp("tiny-blocks-layer")
    model.save_pretrained(folder)
    write_gguf_blocks(tensors, folder)
    return folder, model


def step_metadata(query_lens, seq_lens, block_size):
    """Sequence i's blocks are i*8 .. i*8+7; its new tokens go to the slots after its context."""
    slots, tables = [], torch.arange(len(seq_lens) * 8, dtype=torch.int32).view(-1, 8)
    for i, (q, n) in enumerate(zip(query_lens, seq_lens)):
        slots += [i * 8 * block_size + p for p in range(n - q, n)]
    cu = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
    return AttentionMetadata(
        torch.tensor(slots), tables, cu, torch.tensor(seq_lens, dtype=torch.int32), list(query_lens), list(seq_lens)
    )


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("int16", [False, True])
@pytest.mark.parametrize("seq_lens", [[1], [9, 30, 2], [20, 4, 7, 60, 1, 33, 12, 5]])
def test_decoder_matches_the_models_path(blocks_folder, level, int16, seq_lens):
    runner = LLM(blocks_folder[0], dtype="float32", num_kv_blocks=64, cpu={"int16_activations": int16}).engine.runner
    model, lib = runner.model, library(level)
    model.ops = c_ops(lib)
    for layer in model.model.layers:  # the model's path on the same level's kernels, the blocks' at any batch here
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            linear.lib = lib
            linear.int16_rows, linear.exact_rows = (64, 0) if int16 else (0, 64)
    decoder = CpuDecoder(model, lib)
    g = torch.Generator().manual_seed(sum(seq_lens))
    n = len(seq_lens)
    ids = torch.randint(3, model.config.vocab_size, (n,), generator=g)
    positions = torch.tensor(seq_lens) - 1
    outputs, caches = [], []
    for forward in (decoder.forward, model.forward):
        runner.kv_cache.normal_(generator=torch.Generator().manual_seed(1))  # the same context for both
        outputs.append(forward(ids, positions, step_metadata([1] * n, seq_lens, runner.block_size)))
        caches.append(runner.kv_cache.clone())
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[0], caches[1], rtol=1e-5, atol=1e-5)
    # a step with a prompt chunk is not the decoder's
    assert decoder.forward(ids[:2], positions[:2], step_metadata([1, 2], [5, 2], runner.block_size)) is None


@pytest.mark.parametrize("int16", [False, True])
def test_engine_decodes_in_one_call_within_the_row_limit(blocks_folder, monkeypatch, int16):
    """Greedy output matches transformers' (with int16 inputs: the model's own path's); the decoder
    runs the decode steps of a batch within its row limit, and the model's path every prefill step
    and every decode step above the limit. At a level whose kernel for these layers never beats
    oneDNN there is no decoder."""
    folder, model = blocks_folder
    llm = LLM(folder, dtype="float32", num_kv_blocks=64, cpu={"int16_activations": int16})
    decoder = llm.engine.runner.cpu_decoder
    if int16:
        plain = LLM(folder, dtype="float32", num_kv_blocks=64, cpu={"int16_activations": True})
        plain.engine.runner.cpu_decoder = None
        expected = lambda batch: [o.token_ids for o in plain.generate(batch, SamplingParams(max_tokens=6))]
    else:
        expected = lambda batch: [hf_greedy(model, p, 6) for p in batch]
    limit = (INT16_ROWS_MAX if int16 else BLOCK_ROWS_MAX)[library().level]["Q4_1"]
    if limit == 0:
        assert decoder is None
        prompts = random_prompts([3, 5, 2])
        assert [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=6))] == expected(prompts)
        return
    assert decoder.max_rows == limit
    calls = []
    forward = decoder.forward
    monkeypatch.setattr(
        decoder, "forward", lambda ids, *a: calls.append((len(ids), forward(ids, *a) is not None)) or forward(ids, *a)
    )
    # One row past a limit; a level without one (avx512's int16 kernels) takes a batch of 32 in one call.
    bounded = decoder.max_rows < 32
    num_prompts = decoder.max_rows + 1 if bounded else 32
    prompts = random_prompts([3, 5, 2, 7] * ((num_prompts + 3) // 4))[:num_prompts]
    for batch in (prompts[:1], prompts):
        outputs = llm.generate(batch, SamplingParams(max_tokens=6))
        assert [o.token_ids for o in outputs] == expected(batch)
    taken = {n for n, used in calls if used}
    assert 1 in taken and max(taken) <= decoder.max_rows
    if bounded:
        assert (decoder.max_rows + 1, False) in calls
    else:  # decodes of more rows than any bounded level allows (a few sequences end early at EOS)
        assert max(taken) > 16, sorted(set(calls))


def test_no_decoder_without_the_c_ops(blocks_folder):
    assert LLM(blocks_folder[0], dtype="float32", num_kv_blocks=64, kernels="torch").engine.runner.cpu_decoder is None

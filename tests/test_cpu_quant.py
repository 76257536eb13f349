"""Small-batch CPU linears from GGUF blocks (sut/cpu/quant.py): the kernels compute the product
with the weights the blocks rebuild; the blocks of the converted SmolLM2 rebuild its fp32
checkpoint exactly, so the engine's output does not change; bad block files are refused by name."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from torch import nn

from kernels import AttentionMetadata
from sut import LLM, SamplingParams
from sut.cpu.build import library
from sut.cpu.quant import (
    BLOCK,
    BLOCK_BYTES,
    BLOCK_ROWS_MAX,
    GGUF_BLOCKS_FILE,
    INT16_ROWS_MAX,
    BlockQuantLinear,
    BlockWeights,
    write_gguf_blocks,
)
from sut.errors import CheckpointError
from tests.helpers import LEVELS, hf_greedy, random_prompts

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler to build sut/cpu/quant.c")


def random_blocks(rows: int, cols: int, fmt: str, seed: int = 0, scale: float = 0.02) -> torch.Tensor:
    """Raw GGUF blocks, uint8 [rows, cols / 32, bytes]: random codes, scales like a real model's."""
    g = torch.Generator().manual_seed(seed)
    nb = cols // BLOCK
    d = ((torch.rand(rows, nb, 1, generator=g) + 0.05) * scale).half().view(torch.uint8)
    codes = torch.randint(
        0, 256, (rows, nb, BLOCK_BYTES[fmt] - (4 if fmt == "Q4_1" else 2)), generator=g, dtype=torch.uint8
    )
    if fmt == "Q4_1":
        m = (-torch.rand(rows, nb, 1, generator=g) * 8 * scale).half().view(torch.uint8)
        return torch.cat((d, m, codes), dim=2)
    return torch.cat((d, codes), dim=2)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_dequantize_matches_gguf_exactly(fmt):
    raw = random_blocks(6, 96, fmt)
    expected = quants.dequantize(raw.numpy().reshape(6, -1), GGMLQuantizationType[fmt])
    assert np.array_equal(BlockWeights.from_raw(raw, fmt).dequantize().numpy(), expected)


@pytest.mark.slow
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows_out, cols", [(1, 32), (7, 96), (64, 576), (130, 1536)])
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 8, 9, 17])
def test_kernel_matches_dense_product(level, fmt, rows_out, cols, batch):
    blocks = BlockWeights.from_raw(random_blocks(rows_out, cols, fmt, seed=rows_out + batch), fmt)
    x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(batch))
    w = blocks.dequantize().double()
    error = (blocks.matmul(x, library(level)).double() - x.double() @ w.T).abs()
    # fp32 sums of `cols` terms: rounding error within a small multiple of eps * sum |x * w|
    assert (error <= 1e-5 * (x.double().abs() @ w.abs().T)).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows_out, cols", [(1, 32), (7, 96), (40, 576), (130, 1536)])
@pytest.mark.parametrize("batch", [1, 3, 4, 5, 8, 17, 64])
def test_int16_kernel_error_is_that_of_rounding_x_to_int16(level, fmt, rows_out, cols, batch):
    """x is rounded per block of 32 to a multiple of s = max|x| / 32767: each element moves by at
    most s / 2, so y moves by at most sum_k s_k / 2 * |w_k| (plus fp32 rounding of the sums)."""
    blocks = BlockWeights.from_raw(random_blocks(rows_out, cols, fmt, seed=rows_out + batch), fmt)
    x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(batch)).double()
    x[:, :BLOCK] *= 50  # a block with outliers, as activations have
    w = blocks.dequantize().double()
    half_step = (
        (x.view(batch, -1, BLOCK).abs().amax(-1, keepdim=True) / 32767 / 2).expand(-1, -1, BLOCK).reshape(batch, cols)
    )
    bound = half_step @ w.abs().T + 1e-5 * (x.abs() @ w.abs().T)
    error = (blocks.matmul_int16(x.float(), library(level)).double() - x @ w.T).abs()
    assert (error <= bound).all()
    assert (error > 0).any()  # not the exact path by mistake


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("int16", [False, True])
def test_block_linear_takes_each_kernel_up_to_its_levels_row_limits(monkeypatch, level, fmt, int16):
    dense = nn.Linear(64, 40, bias=True)
    blocks = BlockWeights.from_raw(random_blocks(40, 64, fmt), fmt)
    dense.weight.data = blocks.dequantize()
    layer = BlockQuantLinear(dense, blocks, int16, library(level))
    int16_rows = INT16_ROWS_MAX[level][fmt] if int16 else 0
    exact_rows = BLOCK_ROWS_MAX[level][fmt]
    assert (layer.int16_rows, layer.exact_rows) == (int16_rows, exact_rows)
    assert (layer.dense is None) == (max(int16_rows, exact_rows) >= 1 << 30)
    calls = []
    for name in ("matmul_int16", "matmul"):
        kernel = getattr(BlockWeights, name)
        monkeypatch.setattr(
            BlockWeights,
            name,
            lambda self, x, lib, kernel=kernel, name=name: calls.append((name, x.shape[0])) or kernel(self, x, lib),
        )
    rows_tried = sorted({0, 1, *(min(n, 300) for n in (int16_rows, int16_rows + 1, exact_rows, exact_rows + 1)), 300})
    for rows in rows_tried:
        x = torch.randn(rows, 64)
        torch.testing.assert_close(layer(x), dense(x), rtol=1e-3 if int16 else 1e-5, atol=1e-3 if int16 else 1e-5)
    expected = [
        ("matmul_int16", n) if n <= int16_rows else ("matmul", n)
        for n in rows_tried
        if n <= max(int16_rows, exact_rows)
    ]
    assert calls == expected
    assert layer(torch.randn(2, 3, 64)).shape == (2, 3, 40)


def blockify(model: nn.Module) -> dict:
    """Give every linear of a transformers Llama weights that Q4_1 blocks hold exactly; return the
    blocks as convert_gguf writes them."""
    tensors = {}
    for i, (name, module) in enumerate(model.named_modules()):
        if isinstance(module, nn.Linear):
            rows, cols = module.weight.shape
            raw = random_blocks(rows, cols, "Q4_1", seed=i, scale=0.1)  # large weights: logits far apart
            module.weight.data = BlockWeights.from_raw(raw, "Q4_1").dequantize()
            tensors[f"{name}.weight"] = (raw, "Q4_1")
    return tensors


@pytest.fixture(scope="module")
def tiny_blocks_model(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers import TINY_CONFIG

    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_CONFIG, "hidden_size": 64, "intermediate_size": 128})).eval()
    tensors = blockify(model)
    folder = tmp_path_factory.mktemp("tiny-blocks")
    model.save_pretrained(folder)
    write_gguf_blocks(tensors, folder)
    return folder, model, tensors


def test_engine_on_blocks_matches_transformers(tiny_blocks_model):
    folder, model, _ = tiny_blocks_model
    llm = LLM(folder, dtype="float32", kv_cache_memory_gb=0.01)
    assert sum(isinstance(m, BlockQuantLinear) for m in llm.engine.runner.model.modules()) == 2 * 4 + 1
    prompts = random_prompts([5, 9, 13, 3, 20, 7])
    outputs = llm.generate(prompts, SamplingParams(max_tokens=12))
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == hf_greedy(model, prompt, 12)


def test_mismatched_blocks_are_refused_by_name(tiny_blocks_model, tmp_path):
    folder, _, tensors = tiny_blocks_model
    for f in folder.iterdir():
        if f.is_file():  # the blocks' subfolder is written below
            (tmp_path / f.name).write_bytes(f.read_bytes())
    bad = dict(tensors)
    raw = bad["model.layers.1.mlp.down_proj.weight"][0].clone()
    raw[0, 0, 4] ^= 1  # one code of one weight
    bad["model.layers.1.mlp.down_proj.weight"] = (raw, "Q4_1")
    write_gguf_blocks(bad, tmp_path)
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.down_proj\.weight.*do not rebuild"):
        LLM(tmp_path, dtype="float32", kv_cache_memory_gb=0.01)
    (tmp_path / GGUF_BLOCKS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=GGUF_BLOCKS_FILE):
        LLM(tmp_path, dtype="float32", kv_cache_memory_gb=0.01)


def test_without_kernels_the_engine_runs_on_fp32_weights(tiny_blocks_model, monkeypatch):
    folder, model, _ = tiny_blocks_model
    monkeypatch.setattr("sut.cpu.quant.library", lambda: None)
    llm = LLM(folder, dtype="float32", kv_cache_memory_gb=0.01)
    assert not any(isinstance(m, BlockQuantLinear) for m in llm.engine.runner.model.modules())
    prompt = random_prompts([9])[0]
    assert llm.generate([prompt], SamplingParams(max_tokens=8))[0].token_ids == hf_greedy(model, prompt, 8)


@pytest.mark.slow
def test_smollm2_blocks_rebuild_its_checkpoint_and_keep_its_output(smollm2_dir):
    """Every linear of the converted SmolLM2 (30 layers x 4, and the tied LM head in Q8_0) gets
    its blocks, which the loader checks against the fp32 weights bit for bit; greedy output at
    batch sizes on both sides of BLOCK_ROWS_MAX is the same with and without them."""
    with_blocks = LLM(smollm2_dir, dtype="float32", kv_cache_memory_gb=0.05, max_model_len=512)
    layers = [m for m in with_blocks.engine.runner.model.modules() if isinstance(m, BlockQuantLinear)]
    assert len(layers) == 30 * 4 + 1
    assert with_blocks.engine.runner.model.lm_head.blocks.format == "Q8_0"
    dense = LLM(
        smollm2_dir, dtype="float32", kv_cache_memory_gb=0.05, max_model_len=512, cpu={"quantized_weights": False}
    )
    prompts = [[1] + p for p in random_prompts([12, 30, 7, 19, 25, 9, 40, 16, 22, 11], vocab=40000, seed=3)]
    params = SamplingParams(max_tokens=16)
    for batch in (prompts[:1], prompts[:4], prompts):
        got = [o.token_ids for o in with_blocks.generate(batch, params)]
        assert got == [o.token_ids for o in dense.generate(batch, params)]


def prefill_metadata(n: int) -> AttentionMetadata:
    """One sequence of n new tokens, nothing cached, nothing stored."""
    i32 = torch.int32
    return AttentionMetadata(
        torch.full((n,), -1),
        torch.zeros(1, 1, dtype=i32),
        torch.tensor([0, n], dtype=i32),
        torch.tensor([n], dtype=i32),
        [n],
        [n],
    )


@pytest.mark.slow
def test_smollm2_int16_activations_stay_close_to_exact(smollm2_dir):
    """With cpu.int16_activations every linear, prefill included, computes with int16 inputs: the
    last-token logits of real prompts stay within a small fraction of their spread of the exact
    ones, and the greedy choice is the same."""
    kwargs = dict(dtype="float32", kv_cache_memory_gb=0.05, max_model_len=512)
    exact = LLM(smollm2_dir, **kwargs).engine.runner
    approx = LLM(smollm2_dir, cpu={"int16_activations": True}, **kwargs).engine.runner
    assert all(m.int16 for m in approx.model.modules() if isinstance(m, BlockQuantLinear))
    for prompt in [[1] + p for p in random_prompts([12, 30, 70], vocab=40000, seed=5)]:
        ids, positions = torch.tensor(prompt), torch.arange(len(prompt))
        logits = [
            runner.model.compute_logits(runner.model(ids, positions, prefill_metadata(len(prompt)))[-1:])[0]
            for runner in (exact, approx)
        ]
        assert (logits[0] - logits[1]).abs().max() < 0.01 * (logits[0].max() - logits[0].min())
        assert logits[0].argmax() == logits[1].argmax()

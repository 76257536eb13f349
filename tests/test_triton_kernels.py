"""Every Triton kernel against its PyTorch reference (kernels/compare.py), in Triton's interpreter
on CPU (tests/conftest.py sets TRITON_INTERPRET=1 before anything imports a kernel; on a CUDA
machine they run compiled on the GPU). Shapes are small: the interpreter runs each program in
Python. Tolerances per dtype are `kernels.checks.compare.TOLERANCES`: fp32 1e-4; fp16 2e-3; bf16 2e-2
(absolute and relative), the last because the interpreter rounds fp32 to bf16 toward zero."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.checks import compare
from kernels.checks.compare import assert_close, ragged_lengths
from kernels.decode_attention import choose_num_splits, decode_attention_reference
from kernels.prefill_attention import prefill_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GQA_RATIOS = [1, 2, 4, 8]
BLOCK_SIZES = [8, 16, 32, 64, 128]
REPO = Path(__file__).resolve().parents[1]


def block_size_for(gqa: int, dtype: torch.dtype) -> int:
    """Spread the block sizes over the dtype x GQA grid (each size meets each dtype)."""
    return BLOCK_SIZES[(GQA_RATIOS.index(gqa) + DTYPES.index(dtype)) % len(BLOCK_SIZES)]


# Decode attention


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gqa", GQA_RATIOS)
def test_decode_attention_ragged_gqa(dtype, gqa):
    block_size = block_size_for(gqa, dtype)
    lens = ragged_lengths(block_size)
    for num_splits in (1, 4):  # one pass, and split-K with the reduction kernel
        got, want = compare.check_decode_attention(lens, 2 * gqa, 2, 64, block_size, dtype, DEVICE, num_splits)
        assert_close(got, want, dtype, f"decode gqa={gqa} block_size={block_size} splits={num_splits}")


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_decode_attention_head_dim_128(block_size):
    got, want = compare.check_decode_attention(
        ragged_lengths(block_size), 8, 2, 128, block_size, torch.bfloat16, DEVICE, num_splits=2
    )
    assert_close(got, want, torch.bfloat16, f"decode head_dim=128 block_size={block_size}")


def test_decode_attention_empty_splits_give_no_nan():
    """Contexts far shorter than the splits: most splits see only masked keys (their partial
    results are empty and must weigh nothing), and the padded head rows of the tile too."""
    got, want = compare.check_decode_attention([1, 2, 3], 2, 2, 64, 16, torch.float32, DEVICE, num_splits=16)
    assert_close(got, want, torch.float32, "decode with empty splits")


def test_decode_attention_chooses_splits_itself():
    got, want = compare.check_decode_attention([700, 5], 8, 2, 64, 16, torch.float16, DEVICE)
    assert_close(got, want, torch.float16, "decode with chosen splits")
    cpu = torch.device("cpu")
    assert choose_num_splits(256, 8, 8192, cpu) == 1  # a big batch fills the GPU by itself
    assert choose_num_splits(1, 8, 100, cpu) == 1  # too short to split
    splits = choose_num_splits(1, 1, 8192, cpu)
    assert splits > 1 and splits & (splits - 1) == 0


# Prefill attention (varlen, paged, causal with the cached-context offset)


# (query_len, seq_len) per sequence: whole prompts of ragged lengths, chunked-prefill chunks after
# cached context, one-token decodes, a 4-token verify, a one-token prompt.
def prefill_batch(block_size: int) -> tuple[list[int], list[int]]:
    pairs = [(n, n) for n in ragged_lengths(block_size)[1:4]]
    pairs += [
        (7, 7 + block_size),
        (block_size + 1, 3 * block_size + 2),
        (1, block_size + 1),
        (4, 2 * block_size),
        (1, 1),
    ]
    return [q for q, _ in pairs], [s for _, s in pairs]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gqa", GQA_RATIOS)
def test_prefill_attention_varlen_chunked(dtype, gqa):
    block_size = block_size_for(gqa, dtype)
    query_lens, seq_lens = prefill_batch(block_size)
    # 32-row tiles: a few query tokens already span several tiles, and with 16-key steps the
    # first rows of a tile meet key steps that are entirely masked for them.
    got, want = compare.check_prefill_attention(
        query_lens, seq_lens, 2 * gqa, 2, 64, block_size, dtype, DEVICE, block_m=32, block_n=16
    )
    assert_close(got, want, dtype, f"prefill gqa={gqa} block_size={block_size}")


@pytest.mark.parametrize("block_size", [16, 128])
def test_prefill_attention_head_dim_128_default_tiles(block_size):
    query_lens, seq_lens = [40, 3, 1], [40, 3 + 2 * block_size, 130]
    got, want = compare.check_prefill_attention(query_lens, seq_lens, 8, 2, 128, block_size, torch.bfloat16, DEVICE)
    assert_close(got, want, torch.bfloat16, f"prefill head_dim=128 block_size={block_size}")


# A mixed step: decode rows on the decode kernel, the rest on the prefill kernel


@pytest.mark.parametrize("gqa, head_dim", [(4, 64), (8, 128), (4, 128), (8, 64)])
def test_mixed_step_splits_rows_by_kind(gqa, head_dim):
    """Decodes (one of them the first token after a one-token prompt, one past a split-worthy
    context), then a verification of 3 drafts, a prefill chunk after cached context, a whole
    prompt and a one-token chunk that is not leading (the prefill kernel takes it)."""
    block_size = 16
    query_lens = [1, 1, 1, 1, 4, 9, 21, 1]
    seq_lens = [2, 17, 600, 33, 40, 9 + 2 * block_size, 21, 50]
    got, want, num_decodes = compare.check_mixed_step_attention(
        query_lens, seq_lens, 2 * gqa, 2, head_dim, block_size, torch.bfloat16, DEVICE
    )
    assert num_decodes == 4
    assert_close(got, want, torch.bfloat16, f"mixed step gqa={gqa} head_dim={head_dim}")


@pytest.mark.parametrize("query_lens, num_decodes", [([1, 1, 1], 3), ([3, 1, 1], 0), ([1, 2], 1)])
def test_mixed_step_all_decodes_or_none_leading(query_lens, num_decodes):
    seq_lens = [q + 20 for q in query_lens]
    got, want, found = compare.check_mixed_step_attention(query_lens, seq_lens, 4, 1, 64, 8, torch.float32, DEVICE)
    assert found == num_decodes
    assert_close(got, want, torch.float32, f"step {query_lens}")


# gpt-oss: attention sinks and a sliding window. With a window, the checks free the blocks before
# each sequence's window (kernels.checks.compare.free_blocks_before_window): NaN-filled, half their table
# entries pointing at arbitrary blocks, so a kernel that reads any of them fails.

# (sinks, sliding_window): sinks alone; a window alone and with sinks, of 13 keys (no multiple of
# any block size, so windows start and end inside blocks and cross their boundaries); a window of
# the query's own key only; and one wider than every context (nothing freed, the plain masks).
SINK_WINDOW_CASES = [(True, None), (False, 13), (True, 13), (True, 1), (True, 1000)]


def small_block_size_for(gqa: int, dtype: torch.dtype) -> int:
    """8, 16 or 32 over the dtype x GQA grid: windows of 13 keys then span block boundaries, and
    the contexts stay short enough for the interpreter."""
    return (8, 16, 32)[(gqa + DTYPES.index(dtype)) % 3]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gqa", [1, 8])
def test_decode_attention_sinks_and_window(dtype, gqa):
    block_size = small_block_size_for(gqa, dtype)
    lens = ragged_lengths(block_size)
    for sinks, window in SINK_WINDOW_CASES + [(True, block_size + 3)]:
        # Split-K where it has keys to split: not for a one-key window, or one as wide as none.
        for num_splits in (1, 4) if window not in (1, 1000) else (1,):
            got, want = compare.check_decode_attention(
                lens, 2 * gqa, 2, 64, block_size, dtype, DEVICE, num_splits, sinks=sinks, sliding_window=window
            )
            case = f"decode gqa={gqa} block_size={block_size} sinks={sinks} window={window} splits={num_splits}"
            assert_close(got, want, dtype, case)


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 200])
def test_decode_attention_split_k_carries_the_sink_once(window):
    """Several splits hold keys (4 or 8 of them over 300 and 700 tokens, or over a 200-key window),
    others none (contexts of 1 and 2): the sink must count once, in split 0."""
    for num_splits in (4, 8):
        got, want = compare.check_decode_attention(
            [1, 2, 300, 700], 8, 2, 64, 16, torch.float32, DEVICE, num_splits, sinks=True, sliding_window=window
        )
        assert_close(got, want, torch.float32, f"decode split-K splits={num_splits} window={window}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gqa", [1, 8])
def test_prefill_attention_sinks_and_window(dtype, gqa):
    """The varlen batch (prompts, chunks after cached context, one-token rows, a verify) plus a
    chunk after a long context whose first blocks have left the window. 32-row tiles of 16-key
    steps: with GQA 1 a tile's 32 tokens span more than a 13-key window, so its keys come in all
    three runs (the window's ragged start, keys every row sees, the causal end)."""
    block_size = small_block_size_for(gqa, dtype)
    query_lens, seq_lens = prefill_batch(block_size)
    query_lens, seq_lens = query_lens + [5], seq_lens + [6 * block_size + 5]
    for sinks, window in SINK_WINDOW_CASES:
        got, want = compare.check_prefill_attention(
            query_lens,
            seq_lens,
            2 * gqa,
            2,
            64,
            block_size,
            dtype,
            DEVICE,
            sinks=sinks,
            sliding_window=window,
            block_m=32,
            block_n=16,
        )
        assert_close(got, want, dtype, f"prefill gqa={gqa} block_size={block_size} sinks={sinks} window={window}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_prefill_attention_sinks_and_window_default_tiles(dtype):
    """gpt-oss's heads (GQA 8, head_dim 64) on the GPU's tiles (128 rows: 16 tokens; 64-key steps)
    with its 128-key window: a 300-token prompt, and chunks after 200 and 1000 cached tokens."""
    query_lens, seq_lens = [300, 40, 7], [300, 240, 1007]
    got, want = compare.check_prefill_attention(
        query_lens, seq_lens, 16, 2, 64, 16, dtype, DEVICE, sinks=True, sliding_window=128
    )
    assert_close(got, want, dtype, "prefill gpt-oss tiles, window 128")


@pytest.mark.slow
@pytest.mark.parametrize("sinks, window", [(True, 13), (True, 1000), (False, 13), (True, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mixed_step_sinks_and_window(sinks, window, dtype):
    """A step of decodes (one past a long context whose first blocks left the window) and prefill
    rows through paged_attention_triton, which passes both extras to both kernels."""
    query_lens = [1, 1, 1, 1, 4, 9, 21, 1]
    seq_lens = [2, 17, 600, 33, 40, 41, 21, 50]
    got, want, num_decodes = compare.check_mixed_step_attention(
        query_lens, seq_lens, 16, 2, 64, 16, dtype, DEVICE, sinks=sinks, sliding_window=window
    )
    assert num_decodes == 4
    assert_close(got, want, dtype, f"mixed step sinks={sinks} window={window}")


def test_attention_references_match_transformers_gpt_oss():
    """Both references with sinks and a window against transformers' gpt-oss eager attention (the
    sinks' softmax) under its sliding-window causal mask, on one sequence: a 6-token chunk after 14
    cached tokens (prefill) and its last token alone (decode)."""
    from types import SimpleNamespace

    from transformers.masking_utils import sliding_window_causal_mask_function
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    num_q_heads, num_kv_heads, head_dim, block_size, n, query_len, window = 8, 2, 16, 4, 20, 6, 5
    q = torch.randn(query_len, num_q_heads, head_dim, generator=g)
    k = torch.randn(n, num_kv_heads, head_dim, generator=g)
    v = torch.randn(n, num_kv_heads, head_dim, generator=g)
    sinks = 3 * torch.randn(num_q_heads, generator=g)
    scale = head_dim**-0.5

    positions = torch.arange(n - query_len, n)
    visible = sliding_window_causal_mask_function(window)(0, 0, positions[:, None], torch.arange(n)[None, :])
    mask = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))[None, None]
    module = SimpleNamespace(num_key_value_groups=num_q_heads // num_kv_heads, sinks=sinks, training=False)
    want, _ = eager_attention_forward(
        module, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, scale
    )
    want = want[0]  # [query_len, num_q_heads, head_dim]

    # The same keys in a paged cache, blocks in reverse order.
    num_blocks = n // block_size
    k_cache = k.view(num_blocks, block_size, num_kv_heads, head_dim).flip(0).contiguous()
    v_cache = v.view(num_blocks, block_size, num_kv_heads, head_dim).flip(0).contiguous()
    block_tables = torch.arange(num_blocks - 1, -1, -1, dtype=torch.int32)[None]
    seq_lens = torch.tensor([n], dtype=torch.int32)
    extras = dict(sinks=sinks, sliding_window=window)
    cu_seqlens_q = torch.tensor([0, query_len], dtype=torch.int32)
    got = prefill_attention_reference(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, **extras)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got = decode_attention_reference(q[-1:], k_cache, v_cache, block_tables, seq_lens, scale, **extras)
    torch.testing.assert_close(got, want[-1:], atol=1e-5, rtol=1e-5)


# KV-cache write, RMSNorm, rotary


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [8, 128])
def test_store_kvcache(dtype, block_size):
    got, want = compare.check_store_kvcache(20, 2, 64, block_size, dtype, DEVICE)
    assert torch.equal(got, want)  # a copy: exact


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    got, want = compare.check_rms_norm(6, 96, dtype, DEVICE, with_residual)  # 96: a row narrower than its block
    assert_close(got, want, dtype, f"rms_norm residual={with_residual}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gqa", [1, 4])
def test_rotary(dtype, gqa):
    got, want = compare.check_rotary(5, 3 * gqa, 3, 64, dtype, DEVICE)  # 3 KV heads: a padded head tile
    assert_close(got, want, dtype, f"rotary gqa={gqa}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rotary_with_llama31_scaled_table(dtype):
    """The table as the model builds it, Llama 3.1 rope scaling included."""
    from sut.config import ModelConfig
    from sut.model.llama import RotaryEmbedding

    config = ModelConfig.from_dict(
        dict(
            architectures=["LlamaForCausalLM"],
            vocab_size=32,
            hidden_size=512,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
        )
    )
    assert config.rope_scaling is not None and config.head_dim == 128
    rotary = RotaryEmbedding(config, "cpu")
    positions = torch.tensor([0, 1, 2047, 4096, 8191])
    cos, sin = rotary(positions, torch.float32)
    got, want = compare.check_rotary(5, 4, 2, 128, dtype, DEVICE, cos=cos, sin=sin)
    assert_close(got, want, dtype, "rotary with the Llama 3.1 table")


# The engine on the Triton kernels


@pytest.mark.slow
def test_engine_with_triton_kernels_matches_torch_ops(tiny_llama, monkeypatch):
    """Chunked prefill (prefill chunks after cached context), mixed steps (decode rows on the decode
    kernel, chunks on the prefill kernel) and decode-only steps: the same greedy tokens as the
    PyTorch ops."""
    import kernels.attention
    from sut import LLM, SamplingParams
    from tests.helpers import random_prompts

    split_steps = []
    decode = kernels.attention.decode_attention_triton

    def counting_decode(q, *args, out=None, **kwargs):
        if out is not None:  # only a mixed step passes a slice of its output
            split_steps.append(len(q))
        return decode(q, *args, out=out, **kwargs)

    monkeypatch.setattr(kernels.attention, "decode_attention_triton", counting_decode)
    prompts = random_prompts([1, 9, 30])
    settings = dict(num_kv_blocks=32, max_num_batched_tokens=16, block_size=8, device=DEVICE)
    outputs = {}
    for name in ("torch", "triton"):
        llm = LLM(tiny_llama[0], kernels=name, **settings)
        assert llm.engine.runner.model.ops.name == name
        outputs[name] = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8))]
    assert outputs["triton"] == outputs["torch"]
    assert split_steps, "no step mixed decodes with a prefill chunk"


@pytest.mark.slow
def test_engine_speculating_on_triton_kernels_matches_torch_ops(tiny_llama):
    """Verification steps (k + 1 query rows a sequence, through the prefill kernel) and the
    rejection-sampling kernel in the engine: greedy and seeded sampled requests give the same
    tokens as on the PyTorch ops and their reference."""
    from sut import LLM, SamplingParams
    from tests.helpers import random_prompts

    prompts = [(p * 4)[:24] for p in random_prompts([5, 6, 7], seed=3)]
    params = [
        SamplingParams(max_tokens=10, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=1.0, seed=1, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.7, top_p=0.9, seed=2, ignore_eos=True),
    ]
    spec = {"method": "draft_model", "model": str(tiny_llama[0]), "num_speculative_tokens": 3}
    outputs = {}
    for kernels in ("torch", "triton"):
        llm = LLM(
            tiny_llama[0], kernels=kernels, num_kv_blocks=32, block_size=8, device=DEVICE, speculative_config=spec
        )
        want = "rejection_sample_reference" if kernels == "torch" else "rejection_sample_triton"
        assert llm.engine.runner.model.ops.rejection_sample.__name__ == want
        outputs[kernels] = [o.token_ids for o in llm.generate(prompts, params)]
        assert llm.engine.spec_stats()["num_accepted_tokens"] > 0
    assert outputs["triton"] == outputs["torch"]


def test_engine_default_is_torch_ops_on_cpu(tiny_llama):
    """The CPU backend's C ops where they can be built (sut/cpu/ops.py), else the PyTorch ops;
    kernels="torch" asks for the PyTorch ops alone."""
    from sut import LLM
    from sut.cpu.build import library
    from sut.cpu.ops import c_ops

    llm = LLM(tiny_llama[0], num_kv_blocks=32, device="cpu")
    assert llm.engine.runner.model.ops.name == (c_ops(library()).name if library() else "torch")
    assert LLM(tiny_llama[0], num_kv_blocks=32, device="cpu", kernels="torch").engine.runner.model.ops.name == "torch"


# Compiling for a GPU without one


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """The interpreter does not compile; this runs Triton's compiler (to sm_90 cubins, with the
    ptxas that ships in the triton wheel) on exactly what the launchers launch."""
    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip("this triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "compile_for_gpu.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "kernel variants compiled for sm_90" in out.stdout


# make gpu-check


def triton_kernels_defined_in_kernels() -> set[str]:
    names = set()
    for path in (REPO / "kernels").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).startswith("triton.jit") for d in node.decorator_list
            ):
                names.add(node.name)
    return names


def test_gpu_check_covers_every_triton_kernel():
    from kernels.checks.gpu_cases import CHECKS

    covered = {kernel.fn.__name__ for _, _, kernels in CHECKS for kernel in kernels}
    defined = triton_kernels_defined_in_kernels()
    assert len(defined) >= 8
    assert covered == defined, f"not in gpu_check: {defined - covered}; not in kernels/: {covered - defined}"

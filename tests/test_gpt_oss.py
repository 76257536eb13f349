"""gpt-oss (sut/model/gpt_oss.py): greedy output token-identical to transformers' GptOssForCausalLM
in fp32 on random tiny configurations (windows smaller and larger than the prompts, prompts
crossing the window, 4 to 16 experts, top-1 to top-4, YaRN past its original context), with
chunked prefill, preemption and batches; its MXFP4 checkpoints loaded as transformers dequantizes them."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels.attention import AttentionMetadata, paged_attention
from kernels.mxfp4 import quantize_mxfp4
from sut import LLM, SamplingParams
from sut.config import ModelConfig
from sut.errors import CheckpointError, ConfigError
from sut.model.loader import load_model
from tests.helpers import hf_greedy, random_prompts

GPT_OSS_TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=64,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=4,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=8,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    # Large random weights give well-separated logits, so greedy ties cannot hide a real difference.
    initializer_range=0.3,
)


def yarn(original_context: int) -> dict:
    """gpt-oss's YaRN rope settings with a short original context, so that tiny prompts cross it."""
    return {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": original_context,
    }


# (window, experts, top-k, yarn's original context): the window inside every prompt but the
# shortest, one longer than any sequence, one of 4 with top-4 of 16 experts and YaRN's ramp crossed.
CONFIGS = {
    "window-8": dict(sliding_window=8),
    "window-larger": dict(sliding_window=128, num_local_experts=4, num_experts_per_tok=1),
    "window-4-top4-yarn": dict(
        sliding_window=4,
        num_local_experts=16,
        num_experts_per_tok=4,
        rope_parameters=yarn(32),
    ),
}
LENGTHS = [1, 5, 17, 33, 48, 7]
NEW_TOKENS = 16


def tiny_gpt_oss(folder, seed: int = 0, **overrides):
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    config = GptOssConfig(**{**GPT_OSS_TINY, **overrides})
    model = GptOssForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():  # transformers starts the experts' biases at zero: random ones test them
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj_bias.normal_(0, 0.3)
            layer.mlp.experts.down_proj_bias.normal_(0, 0.3)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny_gpt_oss(folder, seed=len(request.param), **CONFIGS[request.param])
    prompts = random_prompts(LENGTHS, seed=3)
    return folder, prompts, [hf_greedy(model, p, NEW_TOKENS) for p in prompts]


def generate(folder, prompts, **settings):
    llm = LLM(folder, **settings)
    return llm, [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))]


def test_batch_matches_transformers(tiny):
    folder, prompts, want = tiny
    assert generate(folder, prompts, num_kv_blocks=256)[1] == want


def test_chunked_prefill_matches_transformers(tiny):
    folder, prompts, want = tiny
    llm, got = generate(folder, prompts, num_kv_blocks=256, block_size=4, max_num_batched_tokens=16)
    assert got == want


def test_preemption_matches_transformers(tiny):
    folder, prompts, want = tiny
    # 40 blocks of 4 tokens hold one 64-token sequence (in both tables) but not the batch at once.
    llm, got = generate(folder, prompts, num_kv_blocks=40, block_size=4, max_model_len=64, max_num_batched_tokens=64)
    assert got == want
    assert llm.kv_cache_stats()["num_preemptions"] > 0
    llm.engine.block_manager.check_invariants([])
    assert llm.engine.block_manager.num_free_blocks == 40


def test_one_at_a_time_matches_transformers(tiny):
    folder, prompts, want = tiny
    assert generate(folder, prompts, num_kv_blocks=64, max_num_seqs=1)[1] == want


def test_config_reads_gpt_oss_fields(tiny):
    config = ModelConfig.from_folder(tiny[0])
    assert config.architecture == "GptOssForCausalLM" and config.attention_sinks
    assert config.layer_types == ("sliding_attention", "full_attention") * 2
    assert [config.layer_window(i) for i in range(4)] == [config.sliding_window, None] * 2
    assert config.moe.swiglu_alpha == 1.702 and config.moe.swiglu_limit == 7.0


def mxfp4_checkpoint(folder, dest):
    """`folder`'s checkpoint with its experts in MXFP4, as openai/gpt-oss ships them, and the
    dequantized dense weights a transformers model loads for the reference."""
    tensors = load_file(folder / "model.safetensors")
    dense = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        # The checkpoint holds [experts, out, in]; transformers' parameter is [experts, in, out].
        blocks, scales = quantize_mxfp4(tensors.pop(name).transpose(1, 2).contiguous())
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        dense[name] = (blocks, scales)
    dest.mkdir()
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (dest / "config.json").write_text(json.dumps(config))
    return dense


def test_mxfp4_checkpoint_loads_as_transformers_dequantizes_it(tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = tiny_gpt_oss(tmp_path / "dense", seed=5)
    packed = mxfp4_checkpoint(tmp_path / "dense", tmp_path / "mxfp4")
    config = ModelConfig.from_folder(tmp_path / "mxfp4")
    assert config.quantization == "mxfp4"
    ours = load_model(tmp_path / "mxfp4", config, torch.float32, torch.device("cpu"))
    params = dict(ours.named_parameters())
    for name, (blocks, scales) in packed.items():
        want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [experts, in, out]
        assert torch.equal(params[name], want), name
    # The engine on the MXFP4 checkpoint against transformers on the same (dequantized) weights.
    with torch.no_grad():
        for name, (blocks, scales) in packed.items():
            model.get_parameter(name).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    prompts = random_prompts([9, 30], seed=4)
    want = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    assert generate(tmp_path / "mxfp4", prompts, num_kv_blocks=64)[1] == want


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_experts_kept_in_mxfp4_match_transformers(tmp_path, monkeypatch, kernels):
    """As CUDA runs gpt-oss: the experts held as the checkpoint's MXFP4 bytes and decoded by the MoE
    op (the PyTorch one, or the Triton kernel in the interpreter), not dequantized at load."""
    from functools import partial

    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    import sut.worker.model_runner

    model = tiny_gpt_oss(tmp_path / "dense", seed=5)
    packed = mxfp4_checkpoint(tmp_path / "dense", tmp_path / "mxfp4")
    with torch.no_grad():
        for name, (blocks, scales) in packed.items():
            model.get_parameter(name).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    prompts = random_prompts([9, 30], seed=4)
    want = [hf_greedy(model, p, 8) for p in prompts]
    monkeypatch.setattr(sut.worker.model_runner, "load_model", partial(load_model, keep_mxfp4=True))
    llm = LLM(tmp_path / "mxfp4", num_kv_blocks=64, kernels=kernels)
    experts = llm.engine.runner.model.model.layers[0].mlp.experts
    assert experts.mxfp4 and experts.gate_up_proj_blocks.dtype == torch.uint8
    assert [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8))] == want


def test_mxfp4_checkpoint_errors_name_the_tensor(tmp_path):
    tiny_gpt_oss(tmp_path / "dense", seed=6)
    mxfp4_checkpoint(tmp_path / "dense", tmp_path / "mxfp4")
    path = tmp_path / "mxfp4" / "model.safetensors"
    tensors = load_file(path)
    name = "model.layers.1.mlp.experts.down_proj_scales"
    save_file({**tensors, name: tensors[name].float()}, path)
    config = ModelConfig.from_folder(tmp_path / "mxfp4")
    with pytest.raises(CheckpointError, match=f"MXFP4 tensor '{name}' has dtype torch.float32, not uint8"):
        load_model(tmp_path / "mxfp4", config, torch.float32, torch.device("cpu"))
    del tensors[name]
    save_file(tensors, path)
    with pytest.raises(CheckpointError, match="checkpoint lacks 1 tensor"):
        load_model(tmp_path / "mxfp4", config, torch.float32, torch.device("cpu"))


def test_malformed_gpt_oss_config_is_refused_by_key(tmp_path):
    raw = {**GPT_OSS_TINY, "architectures": ["GptOssForCausalLM"]}
    with pytest.raises(ConfigError, match="num_experts_per_tok 9 exceeds num_local_experts 8"):
        ModelConfig.from_dict({**raw, "num_experts_per_tok": 9})
    with pytest.raises(ConfigError, match="layer_types must name one of"):
        ModelConfig.from_dict({**raw, "layer_types": ["sliding_attention"] * 3})
    with pytest.raises(ConfigError, match="quantization 'fp8' is not supported"):
        ModelConfig.from_dict({**raw, "quantization_config": {"quant_method": "fp8"}})


def brute_force_attention(q, keys, values, first_position, sinks, window, scale):
    """fp64 attention of queries at `first_position`.. over keys 0..n-1, as transformers' eager
    gpt-oss attention: scaled scores, masked, the sink's column appended, softmax, the column dropped."""
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.double().repeat_interleave(group, 1), values.double().repeat_interleave(group, 1)
    scores = torch.einsum("thd,nhd->htn", q.double(), keys) * scale
    rows = torch.arange(first_position, first_position + q.shape[0])[:, None]
    cols = torch.arange(keys.shape[0])[None, :]
    visible = (cols <= rows) & ((cols > rows - window) if window else True)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.double()[:, None, None].expand(-1, scores.shape[1], 1)], -1)
    return torch.einsum("htn,nhd->thd", scores.softmax(-1)[..., : keys.shape[0]], values)


@pytest.mark.parametrize("window", [None, 1, 3, 5, 8, 100])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_paged_attention_reference_sinks_and_window(window, with_sinks):
    """The CPU op against a brute-force fp64 one, on decodes, whole prompts and chunks in one step;
    blocks wholly before a sequence's window hold NaN and stale table entries, as after the block
    manager freed them: they must not be read."""
    heads, kv_heads, dim, block_size, num_blocks = 4, 2, 16, 4, 96
    g = torch.Generator().manual_seed(hash((window, with_sinks)) % 1000)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    # decodes first (the scheduler's order), then a whole prompt, a chunk, a one-token prompt
    seq_lens, query_lens = [23, 9, 2, 30, 26, 1], [1, 1, 1, 30, 7, 1]
    # Block 0 stays unused: table padding points at it, and the CPU op reads (then masks) a padded
    # entry's block, which in the engine's zeroed cache always holds finite values.
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables, keys, values = [], [], []
    for n, q_len in zip(seq_lens, query_lens):
        blocks = [free.pop() for _ in range(-(-n // block_size))]
        keys.append(torch.randn(n, kv_heads, dim, generator=g))
        values.append(torch.randn(n, kv_heads, dim, generator=g))
        for t in range(n):
            k_cache[blocks[t // block_size], t % block_size] = keys[-1][t]
            v_cache[blocks[t // block_size], t % block_size] = values[-1][t]
        for b in range(max(0, n - q_len - (window or n) + 1) // block_size):
            k_cache[blocks[b]] = v_cache[blocks[b]] = float("nan")
            blocks[b] = free[b]  # a stale entry: some other block
        tables.append(blocks + [0] * (8 - len(blocks)))
    q = torch.randn(sum(query_lens), heads, dim, generator=g)
    sinks = torch.randn(heads, generator=g) if with_sinks else None
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        torch.zeros(0), torch.tensor(tables, dtype=torch.int32), cu, torch.tensor(seq_lens, dtype=torch.int32),
        query_lens, seq_lens,
    )  # fmt: skip
    new_k = torch.cat([k[n - q_len :] for k, n, q_len in zip(keys, seq_lens, query_lens)])
    new_v = torch.cat([v[n - q_len :] for v, n, q_len in zip(values, seq_lens, query_lens)])
    out = paged_attention(q, new_k, new_v, k_cache, v_cache, meta, 0.25, sinks=sinks, sliding_window=window)
    for i, (n, q_len) in enumerate(zip(seq_lens, query_lens)):
        want = brute_force_attention(q[cu[i] : cu[i + 1]], keys[i], values[i], n - q_len, sinks, window, 0.25)
        torch.testing.assert_close(out[cu[i] : cu[i + 1]].double(), want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def long_prompts(tmp_path_factory):
    """The window-8 model with prompts far past its window, and transformers' output for them."""
    folder = tmp_path_factory.mktemp("long")
    model = tiny_gpt_oss(folder, seed=9, **CONFIGS["window-8"])
    prompts = random_prompts([200, 90, 3], seed=10)
    return folder, prompts, [hf_greedy(model, p, NEW_TOKENS) for p in prompts]


def test_long_prompt_window_blocks_are_freed(long_prompts):
    """A 216-token sequence holds its 54 full-layer blocks and only its window's few window-layer
    blocks (not 54 more), and the output stays token-identical."""
    folder, prompts, want = long_prompts
    llm, got = generate(
        folder, prompts[:1], num_kv_blocks=128, block_size=4, max_num_batched_tokens=16, max_model_len=256
    )
    assert got == want[:1]
    # window 8 + a chunk of 16: at most 7 window blocks at once
    assert 54 < llm.kv_cache_stats()["peak_blocks_used"] <= 54 + 7
    llm.engine.block_manager.check_invariants([])


def test_window_tables_stay_consistent_step_by_step(long_prompts):
    folder, prompts, want = long_prompts
    llm = LLM(folder, num_kv_blocks=160, block_size=4, max_num_batched_tokens=32, max_model_len=256)
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=NEW_TOKENS), request_id=i)
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out.token_ids
        live = engine.scheduler.running
        engine.block_manager.check_invariants(live)
        for seq in live:  # nothing before the next query's window is held
            first_needed = max(0, seq.num_computed_tokens - 8 + 1) // 4
            assert seq.window_table[:first_needed] == [-1] * min(first_needed, len(seq.window_table))
    assert [outputs[i] for i in range(len(prompts))] == want


def test_speculative_decoding_on_gpt_oss_matches_transformers(long_prompts):
    folder, prompts, want = long_prompts
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm, got = generate(folder, prompts, num_kv_blocks=256, block_size=4, speculative_config=spec)
    assert got == want
    assert llm.engine.scheduler.spec_metrics.num_draft_tokens > 0


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"enable_prefix_caching": True}, "enable_prefix_caching: not for a model with sliding-window layers"),
        ({"tensor_parallel_size": 2}, "a mixture-of-experts model"),
    ],
)
def test_what_gpt_oss_does_not_do_yet_is_refused_by_name(long_prompts, setting, message):
    with pytest.raises(ConfigError, match=message):
        LLM(long_prompts[0], num_kv_blocks=64, **setting)


@pytest.mark.slow
def test_triton_kernels_run_gpt_oss_as_the_torch_ops_do(long_prompts):
    """The engine on our Triton kernels (in the interpreter here: sinks, windows with blocks freed,
    the fused MoE) gives the torch ops' tokens, which are transformers'."""
    folder, prompts, want = long_prompts
    llm = LLM(folder, kernels="triton", num_kv_blocks=128, block_size=16, max_num_batched_tokens=64)
    got = [o.token_ids for o in llm.generate(prompts[1:], SamplingParams(max_tokens=6))]
    assert got == [w[:6] for w in want[1:]]

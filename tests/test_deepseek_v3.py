"""DeepSeek-V3 (sut/model/deepseek_v3.py): greedy output token-identical to transformers'
DeepseekV3ForCausalLM in fp32 on random tiny configurations (with and without the query bottleneck,
several group and top-k settings, dense-first layers, shared experts, YaRN with its softmax mscale),
with chunked prefill, preemption and batches; latent attention both absorbed and decompressed; the
router against transformers'; the per-expert checkpoint tensors loaded into stacked experts."""

import json

import pytest
import torch

from sut import LLM, SamplingParams
from sut.config import ModelConfig
from sut.errors import CheckpointError, ConfigError, UnsupportedModelError
from sut.model import deepseek_v3
from sut.model.loader import load_model
from tests.helpers import hf_greedy, random_prompts

DEEPSEEK_TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=24,
    routed_scaling_factor=2.5,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    # Large random weights give well-separated logits, so greedy ties cannot hide a real difference.
    initializer_range=0.3,
)

# (query bottleneck, experts, groups, top-k, dense-first layers, shared experts, rope)
CONFIGS = {
    "q-lora-2-groups": {},
    "no-q-lora-16-experts-top4": dict(
        q_lora_rank=None, n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4, first_k_dense_replace=0,
        n_shared_experts=2,
    ),
    "yarn-mscale-dense-first-2": dict(
        first_k_dense_replace=2,
        num_experts_per_tok=3,
        n_group=1,
        topk_group=1,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        },
    ),
}  # fmt: skip
LENGTHS = [1, 5, 17, 33, 48, 7]
NEW_TOKENS = 16


def tiny_deepseek(folder, seed: int = 0, **overrides):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV3Config(**{**DEEPSEEK_TINY, **overrides})
    model = DeepseekV3ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():  # transformers starts the correction bias at zero: a random one tests it
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0, 0.3)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny_deepseek(folder, seed=len(request.param), **CONFIGS[request.param])
    prompts = random_prompts(LENGTHS, seed=3)
    return folder, prompts, [hf_greedy(model, p, NEW_TOKENS) for p in prompts]


def generate(folder, prompts, **settings):
    llm = LLM(folder, **settings)
    return llm, [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))]


def test_batch_matches_transformers(tiny):
    """Prompts longer than MAX_ABSORBED_QUERY_LEN prefill decompressed; decodes attend absorbed."""
    folder, prompts, want = tiny
    assert max(len(p) for p in prompts) > deepseek_v3.MAX_ABSORBED_QUERY_LEN
    assert generate(folder, prompts, num_kv_blocks=256)[1] == want


def test_chunked_prefill_matches_transformers(tiny):
    """Chunks of 16 tokens over cached context: every step absorbed; and chunks of 24: steps mixing
    absorbed decodes with decompressed chunks that read their cached latents."""
    folder, prompts, want = tiny
    for budget in (16, 24):
        assert generate(folder, prompts, num_kv_blocks=256, block_size=4, max_num_batched_tokens=budget)[1] == want


def test_everything_absorbed_or_decompressed_matches_transformers(tiny, monkeypatch):
    folder, prompts, want = tiny
    for threshold in (0, 10_000):  # every step decompressed (but its leading decodes); every step absorbed
        monkeypatch.setattr(deepseek_v3, "MAX_ABSORBED_QUERY_LEN", threshold)
        assert generate(folder, prompts, num_kv_blocks=256, block_size=4)[1] == want


def test_preemption_matches_transformers(tiny):
    folder, prompts, want = tiny
    llm, got = generate(folder, prompts, num_kv_blocks=24, block_size=4, max_model_len=64, max_num_batched_tokens=64)
    assert got == want
    assert llm.kv_cache_stats()["num_preemptions"] > 0
    llm.engine.block_manager.check_invariants([])
    assert llm.engine.block_manager.num_free_blocks == 24


def test_one_at_a_time_matches_transformers(tiny):
    folder, prompts, want = tiny
    assert generate(folder, prompts, num_kv_blocks=64, max_num_seqs=1)[1] == want


def test_speculative_decoding_matches_transformers(tiny):
    folder, prompts, want = tiny
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    llm, got = generate(folder, prompts, num_kv_blocks=256, block_size=4, speculative_config=spec)
    assert got == want


def test_router_matches_transformers():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    raw = {**DEEPSEEK_TINY, "n_routed_experts": 32, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 6}
    torch.manual_seed(0)
    theirs = DeepseekV3TopkRouter(DeepseekV3Config(**raw))
    with torch.no_grad():
        theirs.weight.normal_(0, 0.3)
        theirs.e_score_correction_bias.normal_(0, 0.3)
    config = ModelConfig.from_dict({"architectures": ["DeepseekV3ForCausalLM"], **raw})
    ours = deepseek_v3.DeepseekV3Router(config)
    ours.weight.data, ours.e_score_correction_bias.data = theirs.weight.data, theirs.e_score_correction_bias.data
    x = torch.randn(50, raw["hidden_size"])
    _, want_weights, want_ids = theirs(x)
    weights, ids = ours(x)
    order, want_order = ids.sort(dim=-1)[1], want_ids.sort(dim=-1)[1]
    assert torch.equal(ids.gather(1, order), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_weights.gather(1, want_order))
    # The bias chooses, and only chooses: the weights are the unbiased scores', scaled by 2.5.
    assert torch.allclose(weights.sum(-1), torch.full((50,), 2.5))


def test_config_and_loading(tiny):
    folder = tiny[0]
    config = ModelConfig.from_folder(folder)
    assert config.architecture == "DeepseekV3ForCausalLM" and config.num_kv_heads == 1
    assert config.mla.cache_dim == config.mla.kv_lora_rank + config.mla.qk_rope_head_dim
    model = load_model(folder, config, torch.bfloat16, torch.device("cpu"))
    moe = next(layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate"))
    # The router stays fp32 in a bf16 model; the experts are stacked from the per-expert tensors.
    assert moe.gate.weight.dtype == moe.gate.e_score_correction_bias.dtype == torch.float32
    assert moe.experts.gate_up_proj.dtype == torch.bfloat16
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    layer = config.moe.first_dense_layers
    prefix = f"model.layers.{layer}.mlp.experts"
    inter = config.moe.expert_intermediate_size
    for e in (0, config.moe.num_experts - 1):
        stacked = model.model.layers[layer].mlp.experts
        assert torch.equal(stacked.gate_up_proj[e, :inter], tensors[f"{prefix}.{e}.gate_proj.weight"].bfloat16())
        assert torch.equal(stacked.gate_up_proj[e, inter:], tensors[f"{prefix}.{e}.up_proj.weight"].bfloat16())
        assert torch.equal(stacked.down_proj[e], tensors[f"{prefix}.{e}.down_proj.weight"].bfloat16())


def test_mtp_layer_in_the_checkpoint_is_left_to_the_proposer(tiny, tmp_path):
    """DeepSeek's checkpoints store the MTP module as the layer after the last: the model skips it;
    a tensor of its own layers that does not belong is still refused by name."""
    from safetensors.torch import load_file, save_file

    folder, prompts, want = tiny
    tensors = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    last = config["num_hidden_layers"]
    extra = {
        f"model.layers.{last}.{k.split('.', 3)[3]}": v.clone()
        for k, v in tensors.items()
        if k.startswith("model.layers.1.")
    }
    save_file(
        {**tensors, **extra, "model.layers.0.self_attn.q_proj_extra.weight": torch.zeros(2)},
        tmp_path / "model.safetensors",
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.self_attn.q_proj_extra.weight'"):
        LLM(tmp_path, num_kv_blocks=64)
    save_file({**tensors, **extra}, tmp_path / "model.safetensors")
    assert generate(tmp_path, prompts[:2], num_kv_blocks=64)[1] == want[:2]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_group": 3}, "n_routed_experts 8 is not a multiple of n_group 3"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok 5 from topk_group 1 of n_group 2 groups of 4 experts"),
        ({"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer"),
        ({"first_k_dense_replace": 9}, "first_k_dense_replace must be an integer in 0..3"),
        ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}, "weight_block_size"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization 'awq' is not supported"),
    ],
)
def test_malformed_deepseek_config_is_refused_by_key(change, message):
    raw = {"architectures": ["DeepseekV3ForCausalLM"], **DEEPSEEK_TINY, **change}
    with pytest.raises((ConfigError, UnsupportedModelError), match=message):
        ModelConfig.from_dict(raw)


FP8_SKIPPED = ("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight")


def fp8_checkpoint(folder, dest):
    """`folder`'s checkpoint as DeepSeek ships its weights: every linear's weight in e4m3 with one
    `weight_scale_inv` per 128 x 128 block (norms, embeddings, head and router kept); and the
    dequantized weights, computed block by block here, for the reference."""
    from safetensors.torch import load_file, save_file

    from kernels.fp8 import quantize_fp8_block

    tensors, dense = load_file(folder / "model.safetensors"), {}
    linears = [n for n in tensors if n.endswith(("proj.weight", "proj_with_mqa.weight"))]
    for name in [n for n in linears if not n.endswith(FP8_SKIPPED)]:
        w8, scale = quantize_fp8_block(tensors[name])
        tensors[name], tensors[name + "_scale_inv"] = w8, scale
        by_hand = w8.float().clone()
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                by_hand[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] *= scale[i, j]
        dense[name] = by_hand
    save_file(tensors, dest / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (dest / "config.json").write_text(json.dumps(config))
    return dense


def test_fp8_block_scaled_checkpoint_loads_as_dequantized_by_hand(tmp_path):
    """A 160-wide tiny model, so blocks are whole and ragged (128 + 32), loads each FP8 linear as its
    blocks times their scales; the engine's greedy output is transformers' on those weights."""
    src, dest = tmp_path / "bf16", tmp_path / "fp8"
    src.mkdir(), dest.mkdir()
    model = tiny_deepseek(src, seed=5, hidden_size=160, kv_lora_rank=144, moe_intermediate_size=136)
    dense = fp8_checkpoint(src, dest)
    config = ModelConfig.from_folder(dest)
    assert config.quantization == "fp8"
    ours = load_model(dest, config, torch.float32, torch.device("cpu"))
    attn = ours.model.layers[1].self_attn
    q_a = dense["model.layers.1.self_attn.q_a_proj.weight"]
    assert torch.equal(attn.input_proj.weight[: q_a.shape[0]], q_a)
    assert torch.equal(attn.kv_b_proj.weight, dense["model.layers.1.self_attn.kv_b_proj.weight"])
    assert torch.equal(
        ours.model.layers[1].mlp.experts.down_proj[3], dense["model.layers.1.mlp.experts.3.down_proj.weight"]
    )
    prompts = random_prompts([3, 20, 9], seed=4)
    want = [hf_greedy(dequantized_reference(model, dense), p, 8) for p in prompts]
    llm = LLM(dest, num_kv_blocks=64)
    assert [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8))] == want


def dequantized_reference(model, dense):
    """transformers' `model` with the FP8 checkpoint's dequantized weights `dense` (fp8_checkpoint's)."""
    from transformers import DeepseekV3ForCausalLM

    reference = DeepseekV3ForCausalLM(model.config).eval()
    loaded = {name: t.clone() for name, t in model.state_dict().items()}  # `model` itself left as it is
    for name, w in dense.items():
        if ".experts." in name:
            layer, e, proj = name.split(".")[2], int(name.split(".")[5]), name.split(".")[6]
            key = f"model.layers.{layer}.mlp.experts."
            inter = w.shape[0] if proj != "down_proj" else w.shape[1]
            if proj == "down_proj":
                loaded[key + "down_proj"][e] = w
            else:
                rows = slice(0, inter) if proj == "gate_proj" else slice(inter, 2 * inter)
                loaded[key + "gate_up_proj"][e, rows] = w
        else:
            loaded[name] = w
    reference.load_state_dict(loaded)
    return reference


def test_fp8_checkpoint_errors_name_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    src, dest = tmp_path / "bf16", tmp_path / "fp8"
    src.mkdir(), dest.mkdir()
    tiny_deepseek(src, seed=6)
    fp8_checkpoint(src, dest)
    tensors = load_file(dest / "model.safetensors")
    name = "model.layers.1.self_attn.o_proj.weight_scale_inv"
    good = tensors[name]
    save_file({**tensors, name: torch.ones(3, 3)}, dest / "model.safetensors")
    with pytest.raises(CheckpointError, match="o_proj.weight_scale_inv' must be floating point of shape \\[1, 1\\]"):
        LLM(dest, num_kv_blocks=64)
    save_file(
        {
            **tensors,
            name: good,
            "model.layers.1.self_attn.o_proj.weight": tensors["model.layers.1.self_attn.o_proj.weight"].float(),
        },
        dest / "model.safetensors",
    )
    with pytest.raises(CheckpointError, match="o_proj.weight' has dtype torch.float32, not float8_e4m3fn"):
        LLM(dest, num_kv_blocks=64)
    del tensors["model.layers.1.self_attn.o_proj.weight"]
    save_file(tensors, dest / "model.safetensors")
    with pytest.raises(CheckpointError, match="lacks 1 tensor"):
        LLM(dest, num_kv_blocks=64)

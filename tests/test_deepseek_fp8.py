"""DeepSeek's FP8 checkpoint held as stored (load_model's keep_fp8, the default on CUDA; forced here
on CPU): each block-scaled linear an Fp8Linear (the fused ones too), the routed experts FP8 with
stacked block scales run by `ops.fused_moe_fp8`, kv_b_proj dense. Greedy output token-identical to
the engine that dequantizes at load and to transformers on the dequantized weights, with the torch
ops and with the Triton kernels in the interpreter; over 2 tensor-parallel ranks on gloo in both
modes, each rank's slices of the weights and of their scales; what cannot be held or split in FP8
refused by name; DeepSeek-R1's real shapes at 8 ranks checked on the meta device."""

from functools import partial

import pytest
import torch
from safetensors.torch import load_file

import sut.engine.llm_engine
import sut.model.fp8
import sut.worker.model_runner
from kernels.fp8 import fp8_linear_reference, fp8_linear_triton
from kernels.fused_moe import fused_moe_fp8_triton
from sut import LLM, LLMEngine, SamplingParams
from sut.config import ModelConfig
from sut.errors import CheckpointError, ConfigError
from sut.model.fp8 import Fp8Linear, keep_checkpoint_fp8
from sut.model.loader import checkpoint_layout, forward_weight_bytes, load_model
from sut.model.registry import model_class
from sut.parallel import Shard, check_fp8_blocks, local_config
from sut.parallel.shard import fp8_slices
from sut.worker.tp_worker import worker_main
from tests.helpers import hf_greedy, random_prompts
from tests.test_deepseek_v3 import dequantized_reference, fp8_checkpoint, tiny_deepseek

# Every dimension that stacks or splits FP8 blocks a multiple of 128, at 1 rank and at 2: the fused
# q_a (128) + kv_a (128 + 64), q_b rows 4 x 128 (2 x 256 at 2 ranks), kv_b rows 4 x 128, o_proj
# columns 4 x 64 (2 x 128), dense intermediate 256, experts' 128, shared experts' 2 x 128.
FP8_TINY = dict(
    hidden_size=256,
    intermediate_size=256,
    moe_intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=128,
    qk_nope_head_dim=64,
    qk_rope_head_dim=64,
    v_head_dim=64,
    n_shared_experts=2,
)
PROMPTS = random_prompts([3, 20, 9], seed=4)  # 20 > MAX_ABSORBED_QUERY_LEN: a decompressed prefill
NEW_TOKENS = 8
PARAMS = SamplingParams(max_tokens=NEW_TOKENS)
CPU = torch.device("cpu")


def generate(folder, prompts=PROMPTS, **settings):
    llm = LLM(folder, num_kv_blocks=64, **settings)
    return llm, [o.token_ids for o in llm.generate(prompts, PARAMS)]


def fp8_folder(tmp_path, seed: int = 7, **overrides):
    """A tiny DeepSeek saved as an FP8 checkpoint: (folder, transformers' model, dequantized weights)."""
    src, dest = tmp_path / "bf16", tmp_path / "fp8"
    src.mkdir(), dest.mkdir()
    model = tiny_deepseek(src, seed=seed, **overrides)
    return dest, model, fp8_checkpoint(src, dest)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The FP8 folder, its checkpoint's tensors and transformers' greedy tokens on its dequantized weights."""
    folder, model, dense = fp8_folder(tmp_path_factory.mktemp("deepseek-fp8"), **FP8_TINY)
    reference = dequantized_reference(model, dense)
    want = [hf_greedy(reference, p, NEW_TOKENS) for p in PROMPTS]
    return folder, load_file(folder / "model.safetensors"), want


@pytest.fixture
def keep_fp8(monkeypatch):
    """The engine loads as CUDA does, keeping the FP8 weights (this process, and its tensor-parallel
    ranks); Fp8Linear computes with the PyTorch reference, as it does off CUDA outside Triton's
    interpreter (which the tests run in)."""
    monkeypatch.setattr(sut.worker.model_runner, "load_model", partial(load_model, keep_fp8=True))
    monkeypatch.setattr(sut.model.fp8, "fp8_linear", fp8_linear_reference)
    monkeypatch.setattr(sut.engine.llm_engine, "worker_main", keep_fp8_rank)


def keep_fp8_rank(*args):
    """A spawned tensor-parallel rank (sut/worker/tp_worker.py) set up as `keep_fp8` sets up this process."""
    sut.worker.model_runner.load_model = partial(load_model, keep_fp8=True)
    sut.model.fp8.fp8_linear = fp8_linear_reference
    worker_main(*args)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_dequantized_at_load_matches_transformers(tiny):
    folder, _, want = tiny
    llm, got = generate(folder)  # CPU's default
    assert got == want
    assert not any(isinstance(m, Fp8Linear) for m in llm.engine.runner.model.modules())


def test_kept_fp8_matches_transformers(tiny, keep_fp8):
    """With the PyTorch references: Fp8Linear's and the torch fused_moe_fp8."""
    folder, _, want = tiny
    llm, got = generate(folder, kernels="torch")
    assert got == want
    layers = llm.engine.runner.model.model.layers
    assert isinstance(layers[1].self_attn.input_proj, Fp8Linear) and layers[1].mlp.experts.fp8
    assert not isinstance(layers[1].self_attn.kv_b_proj, Fp8Linear)  # dense (here packed by the CPU backend)


@pytest.mark.slow
def test_kept_fp8_with_the_triton_kernels_in_the_interpreter(tiny, keep_fp8, monkeypatch):
    """Fp8Linear through the Triton GEMM (with the 16 x 64 x 128 tiles a bf16 decode gets: fewer
    programs for the interpreter than fp32's) and the experts through the Triton fused_moe_fp8;
    two prompts, the prefill's and three decodes' tokens."""
    tiles = dict(block_m=16, block_n=64, block_k=128, split_k=1)
    monkeypatch.setattr(sut.model.fp8, "fp8_linear", partial(fp8_linear_triton, config=tiles))
    folder, _, want = tiny
    llm = LLM(folder, num_kv_blocks=64, kernels="triton")
    assert llm.engine.runner.model.ops.fused_moe_fp8 is fused_moe_fp8_triton
    got = [o.token_ids for o in llm.generate(PROMPTS[:2], SamplingParams(max_tokens=4))]
    assert got == [w[:4] for w in want[:2]]


@pytest.mark.slow
def test_parameters_are_the_checkpoints_fp8_bytes_and_scales(tiny):
    """In a bf16 model: e4m3 weights and fp32 scales as stored, the fused layers' and the stacked
    experts' at their row offsets; kv_b_proj dequantized to bf16; the router fp32."""
    folder, tensors, _ = tiny
    config = ModelConfig.from_folder(folder)
    model = load_model(folder, config, torch.bfloat16, CPU, keep_fp8=True)
    at = "model.layers.1"
    layer = model.model.layers[1]
    attn, moe = layer.self_attn, layer.mlp

    def ckpt(name):
        return tensors[f"{at}.{name}.weight"], tensors[f"{at}.{name}.weight_scale_inv"]

    for module, parts in (
        (attn.input_proj, ["self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"]),
        (attn.q_b_proj, ["self_attn.q_b_proj"]),
        (attn.o_proj, ["self_attn.o_proj"]),
        (moe.shared_experts.gate_up_proj, ["mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"]),
        (moe.shared_experts.down_proj, ["mlp.shared_experts.down_proj"]),
    ):
        assert isinstance(module, Fp8Linear) and module.weight_scale_inv.dtype == torch.float32
        weights, scales = zip(*map(ckpt, parts))
        assert same_bytes(module.weight, torch.cat(weights))
        assert same_bytes(module.weight_scale_inv, torch.cat(scales))
    assert attn.input_proj.weight_scale_inv.shape == (1 + 2, 2)  # q_a's 128 rows, then kv_a's 192
    dense = load_model(folder, config, torch.bfloat16, CPU)  # dequantized at load
    assert attn.kv_b_proj.weight.dtype == torch.bfloat16
    assert torch.equal(attn.kv_b_proj.weight, dense.model.layers[1].self_attn.kv_b_proj.weight)
    assert moe.gate.weight.dtype == torch.float32
    experts, inter = moe.experts, config.moe.expert_intermediate_size
    assert experts.fp8 and experts.gate_up_proj.shape == (8, 2 * inter, 256)
    for e in (0, 5, 7):
        (gate, gate_s), (up, up_s), (down, down_s) = (
            ckpt(f"mlp.experts.{e}.{p}") for p in ("gate_proj", "up_proj", "down_proj")
        )
        assert same_bytes(experts.gate_up_proj[e], torch.cat([gate, up]))
        assert same_bytes(experts.gate_up_proj_scale_inv[e], torch.cat([gate_s, up_s]))
        assert same_bytes(experts.down_proj[e], down) and same_bytes(experts.down_proj_scale_inv[e], down_s)


def test_weight_bytes_of_the_kept_model(tiny):
    """FP8 linears at 1 byte a weight plus 4 a scale; the experts by their share per token (2 of 8)."""
    folder = tiny[0]
    config = ModelConfig.from_folder(folder)
    model = load_model(folder, config, torch.bfloat16, CPU, keep_fp8=True)
    want = 0
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            want += module.weight.numel() + 4 * module.weight_scale_inv.numel()
        elif type(module) is torch.nn.Linear:  # kv_b_proj and the LM head, in bf16
            want += 2 * module.weight.numel()
    experts = model.model.layers[1].mlp.experts
    held = sum(p.numel() * p.element_size() for p in experts.parameters())
    assert held == 8 * (256 * 256 + 256 * 128) + 4 * 8 * (2 * 2 + 2 * 1)
    want += int(2 / 8 * held)
    assert forward_weight_bytes(model) == want
    assert forward_weight_bytes(load_model(folder, config, torch.bfloat16, CPU)) > want


# ---- tensor parallel -----------------------------------------------------------------------------

TP_SETTINGS = dict(num_kv_blocks=64, block_size=4, max_model_len=64, max_num_batched_tokens=24, device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("kept", [False, True])
def test_two_ranks_give_one_rank_greedy_tokens(tiny, kept, request):
    """Dequantized at load, and kept in FP8, on each rank; chunks of 24 tokens: steps mixing absorbed
    decodes with decompressed chunks."""
    if kept:
        request.getfixturevalue("keep_fp8")
    folder, _, want = tiny
    assert [o.token_ids for o in LLM(folder, **TP_SETTINGS).generate(PROMPTS, PARAMS)] == want
    two = LLM(folder, tensor_parallel_size=2, **TP_SETTINGS)
    try:
        assert [o.token_ids for o in two.generate(PROMPTS, PARAMS)] == want
        assert isinstance(two.engine.runner.model.model.layers[0].self_attn.o_proj, Fp8Linear) == kept
        held = two.engine.rank_weight_bytes  # the same on rank 1: its weights held as rank 0's are
        assert held[0] == held[1]
    finally:
        two.engine.close()


def test_each_rank_holds_its_slices_of_the_weights_and_scales(tiny):
    """Rows split (q_b_proj, the MLPs' gate and up) take their scale rows, columns split (o_proj,
    down_proj) their scale columns; the fused input projection and the experts' whole; kv_b_proj
    dequantized from its rows' scales."""
    folder, tensors, _ = tiny
    config = ModelConfig.from_folder(folder)
    whole = load_model(folder, config, torch.float32, CPU)
    for rank in range(2):
        model = load_model(folder, config, torch.float32, CPU, Shard(rank, 2), keep_fp8=True)
        dense = load_model(folder, config, torch.float32, CPU, Shard(rank, 2))
        for layer in range(2):
            at = f"model.layers.{layer}"

            def ckpt(name, rows=None, columns=None):
                weight, scale = tensors[f"{at}.{name}.weight"], tensors[f"{at}.{name}.weight_scale_inv"]
                if rows is not None:
                    weight, scale = weight[rank * rows : (rank + 1) * rows], scale[rank * rows // 128 :][: rows // 128]
                if columns is not None:
                    part = slice(rank * columns, (rank + 1) * columns)
                    weight, scale = weight[:, part], scale[:, rank * columns // 128 :][:, : columns // 128]
                return weight, scale

            ours = model.model.layers[layer]
            mlp = ours.mlp if layer == 0 else ours.mlp.shared_experts
            mlp_name = "mlp" if layer == 0 else "mlp.shared_experts"
            for module, parts in (
                (ours.self_attn.q_b_proj, [ckpt("self_attn.q_b_proj", rows=256)]),
                (ours.self_attn.o_proj, [ckpt("self_attn.o_proj", columns=128)]),
                (mlp.gate_up_proj, [ckpt(f"{mlp_name}.gate_proj", rows=128), ckpt(f"{mlp_name}.up_proj", rows=128)]),
                (mlp.down_proj, [ckpt(f"{mlp_name}.down_proj", columns=128)]),
                (ours.self_attn.input_proj, [ckpt("self_attn.q_a_proj"), ckpt("self_attn.kv_a_proj_with_mqa")]),
            ):
                weights, scales = zip(*parts)
                assert same_bytes(module.weight, torch.cat(weights)) and same_bytes(module.scale, torch.cat(scales))
            kv_b = whole.model.layers[layer].self_attn.kv_b_proj.weight
            assert torch.equal(ours.self_attn.kv_b_proj.weight, kv_b[rank * 256 : (rank + 1) * 256])
            # Dequantized at load, each slice is the whole model's dequantized slice.
            o_proj = whole.model.layers[layer].self_attn.o_proj.weight
            assert torch.equal(
                dense.model.layers[layer].self_attn.o_proj.weight, o_proj[:, rank * 128 : (rank + 1) * 128]
            )
        experts = model.model.layers[1].mlp.experts
        assert experts.gate_up_proj.shape[0] == 4
        e = 4 * rank + 3
        down, down_s = (
            tensors[f"model.layers.1.mlp.experts.{e}.down_proj.weight"],
            tensors[f"model.layers.1.mlp.experts.{e}.down_proj.weight_scale_inv"],
        )
        assert same_bytes(experts.down_proj[3], down) and same_bytes(experts.down_proj_scale_inv[3], down_s)


# ---- what is refused -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({}, "'model.layers.0.self_attn.q_a_proj.weight' has 48 rows, not a multiple of its 128-row scale blocks"),
        (dict(q_lora_rank=128, intermediate_size=100), "'model.layers.0.mlp.gate_proj.weight' has 100 rows"),
        (
            dict(q_lora_rank=128, first_k_dense_replace=0),
            r"'model.layers.0.mlp.experts.0.gate_proj.weight' has 32 rows \(moe_intermediate_size\)",
        ),
    ],
)
def test_a_stacked_fp8_shard_not_whole_blocks_is_refused_by_name(tmp_path, overrides, message):
    """Only when kept in FP8: dequantized at load, the same checkpoint loads."""
    folder = fp8_folder(tmp_path, seed=3, **overrides)[0]
    config = ModelConfig.from_folder(folder)
    with pytest.raises(CheckpointError, match=message):
        load_model(folder, config, torch.float32, CPU, keep_fp8=True)
    load_model(folder, config, torch.float32, CPU)


def test_a_fused_layer_with_a_dense_shard_is_dequantized(tiny, tmp_path):
    """A checkpoint whose kv_a_proj_with_mqa is not FP8: the fused input projection is dequantized
    (q_a_proj's blocks times their scales), the other linears still held in FP8."""
    from safetensors.torch import save_file

    folder, tensors, _ = tiny
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    changed = dict(tensors)
    weight, scale = changed.pop(name), changed.pop(name + "_scale_inv")
    changed[name] = weight.float() * scale.repeat_interleave(128, 0)[: weight.shape[0]].repeat_interleave(128, 1)
    save_file(changed, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    config = ModelConfig.from_folder(tmp_path)
    attn = load_model(tmp_path, config, torch.float32, CPU, keep_fp8=True).model.layers[1].self_attn
    want = load_model(folder, config, torch.float32, CPU).model.layers[1].self_attn
    assert not isinstance(attn.input_proj, Fp8Linear) and isinstance(attn.q_b_proj, Fp8Linear)
    assert torch.equal(attn.input_proj.weight, want.input_proj.weight)


def test_a_tensor_parallel_slice_not_whole_blocks_is_refused_by_name(tmp_path):
    """2 heads of v_head_dim 64: o_proj's 128 columns split in two of 64, which would cut its scale
    blocks. Refused with the settings (before any process starts) and by the loader, kept or not."""
    folder = fp8_folder(tmp_path, seed=4, **{**FP8_TINY, "num_attention_heads": 2, "num_key_value_heads": 2})[0]
    with pytest.raises(ConfigError, match=r"not a multiple of 128: o_proj columns \(2 x v_head_dim 64 / 2\) = 64$"):
        LLMEngine(folder, tensor_parallel_size=2, **TP_SETTINGS)
    config = ModelConfig.from_folder(folder)
    for keep in (False, True):
        with pytest.raises(
            CheckpointError,
            match="'model.layers.0.self_attn.o_proj.weight': tensor-parallel rank 1/2's slice has 64 columns",
        ):
            load_model(folder, config, torch.float32, CPU, Shard(1, 2), keep_fp8=keep)


# ---- DeepSeek-R1's shapes ------------------------------------------------------------------------

R1 = dict(
    architectures=["DeepseekV3ForCausalLM"],
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=61,
    num_attention_heads=128,
    num_key_value_heads=128,
    n_routed_experts=256,
    num_experts_per_tok=8,
    n_shared_experts=1,
    n_group=8,
    topk_group=4,
    first_k_dense_replace=3,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    max_position_embeddings=163840,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
    quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
)


def test_deepseek_r1_splits_in_whole_blocks_over_8_ranks():
    config = ModelConfig.from_dict(R1)
    assert list(fp8_slices(config, 8).values()) == [128 * 192 // 8, 128 * 256 // 8, 16384 // 8, 18432 // 8, 2048 // 8]
    assert list(fp8_slices(config, 8).values()) == [3072, 4096, 2048, 2304, 256]
    check_fp8_blocks(config, 8)
    check_fp8_blocks(config, 16)
    with pytest.raises(ConfigError, match=r"shared experts' gate/up rows, down columns \(2048 / 32\) = 64"):
        check_fp8_blocks(config, 32)


def test_deepseek_r1_kept_in_fp8_on_8_ranks_fits_an_h200():
    """Rank 0 of 8 on the meta device, every linear the checkpoint stores in FP8 held so: its slices'
    shapes, whole scale blocks each, and 86 GB of weights (of an H200's 141)."""
    config = ModelConfig.from_dict(R1)
    shard = Shard(0, 8)
    with torch.device("meta"):
        whole = checkpoint_layout(model_class(config)(config))
        model = model_class(config)(local_config(config, 8))
    scaled = {n for n in whole if n.endswith(("proj.weight", "proj_with_mqa.weight"))}  # as the checkpoint has them
    with torch.device("meta"):
        keep_checkpoint_fp8(model, scaled, torch.bfloat16)
    layout = checkpoint_layout(model, shard)
    at = "model.layers.3"
    assert layout[f"{at}.self_attn.q_b_proj.weight"][2] == (3072, 1536)
    assert layout[f"{at}.self_attn.q_b_proj.weight_scale_inv"][2] == (24, 12)
    assert layout[f"{at}.self_attn.o_proj.weight_scale_inv"][2] == (56, 16)
    assert layout[f"{at}.self_attn.kv_a_proj_with_mqa.weight_scale_inv"][1:] == (12, (5, 56))  # 576 rows after 1536
    assert layout[f"{at}.mlp.shared_experts.gate_proj.weight_scale_inv"][1:] == (0, (2, 56))
    assert layout[f"{at}.mlp.shared_experts.up_proj.weight_scale_inv"][1:] == (2, (2, 56))
    assert layout["model.layers.0.mlp.down_proj.weight_scale_inv"][2] == (56, 18)
    assert layout[f"{at}.mlp.experts.31.up_proj.weight_scale_inv"] == (
        f"{at}.mlp.experts.gate_up_proj_scale_inv",
        31 * 32 + 16,
        (16, 56),
    )
    assert layout[f"{at}.mlp.experts.32.up_proj.weight"][0] is None  # rank 1's
    experts = model.model.layers[3].mlp.experts
    assert experts.gate_up_proj.shape == (32, 4096, 7168) and experts.down_proj_scale_inv.shape == (32, 56, 16)
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    assert 80e9 < held < 90e9, held

"""DeepSeek-V3/R1's multi-token-prediction (MTP) module (DeepSeek-V3 technical report §2.2;
DeepSeek-V3 README_WEIGHTS.md), as the checkpoint stores it: the layer after the last,
`model.layers.<num_hidden_layers>.*`:

- `enorm`, `hnorm` (RMSNorms) and `eh_proj` [H, 2H]: the module's input is
  `eh_proj(cat[enorm(embedding of token p + 1), hnorm(h_p)])`, the embedding first (transformers'
  MtpLayer, vLLM's and TensorRT-LLM's DeepSeek MTP: the order the trained eh_proj expects);
- a whole decoder layer under the usual names (self_attn, mlp, input_layernorm,
  post_attention_layernorm): latent attention and, after the dense-first layers as layer 61 is,
  the routed experts;
- `shared_head.norm`, the norm before the LM head. `embed_tokens` and `shared_head.head`, where the
  checkpoint has them, are copies of the target's embedding and LM head, which the module shares:
  they are not read.

Under tensor parallelism every rank holds its part of the module as of the target's layers (heads,
experts, shared-expert features split; eh_proj and the norms whole) and runs its forwards with the
target's (sut/worker/model_runner.py `execute_draft`). The proposer (sut/spec_decode/mtp.py) checks
the module's tensors before any model loads and drives it."""

import json
from pathlib import Path

import torch
from torch import nn

from kernels.fp8 import FP8_BLOCK, dequantize_fp8
from sut.config import ModelConfig
from sut.errors import CheckpointError
from sut.model.deepseek_v3 import DeepseekV3DecoderLayer
from sut.model.fp8 import keep_checkpoint_fp8
from sut.model.llama import RMSNorm
from sut.model.loader import IGNORED_SUFFIXES, _put, checkpoint_layout, read_header, weight_files
from sut.parallel import Shard, local_config, read_shard

# Copies of the target's embedding and LM head that DeepSeek's checkpoints store in the module.
SHARED_COPIES = ("embed_tokens.weight", "shared_head.head.weight")
SCALE_SUFFIX = "_scale_inv"  # an FP8 weight's block scales, beside it


class SharedHead(nn.Module):
    """The module's `shared_head`: its norm. Its `head` is the target's LM head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV3MTPLayer(DeepseekV3DecoderLayer):
    """The MTP module as the checkpoint holds it: the decoder layer of index `num_hidden_layers`
    (latent attention, routed experts) with enorm, hnorm, eh_proj and shared_head.norm beside it, so
    that its parameter names are the checkpoint's after `model.layers.<num_hidden_layers>.`."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, config.num_layers)
        h = config.hidden_size
        self.enorm = RMSNorm(h, config.rms_norm_eps)
        self.hnorm = RMSNorm(h, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.shared_head = SharedHead(config)

    def forward(self, embeds, hidden, rope, meta, ops):
        """The normed outputs of rows (embedding of token p + 1, target-normed hidden state of p)."""
        joined = torch.cat([self.enorm(embeds, None, ops)[0], self.hnorm(hidden, None, ops)[0]], dim=-1)
        x, residual = super().forward(self.eh_proj(joined), None, rope, meta, ops)
        return self.shared_head.norm(x, residual, ops)[0]


def mtp_prefix(config: ModelConfig) -> str:
    return f"model.layers.{config.num_layers}."


def mtp_tensors(folder: Path, prefix: str) -> dict[str, tuple[Path, dict]]:
    """The checkpoint's tensors under `prefix` (name after it -> (file, header entry)), read from
    the safetensors headers of the files the index names for them (all files without an index)."""
    files = weight_files(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # weight_files checked it
        weight_map = json.loads(index.read_text())["weight_map"]
        holding = {weight_map[name] for name in weight_map if name.startswith(prefix)}
        files = [f for f in files if f.name in holding]
    found = {}
    for file in files:
        header, _ = read_header(file)
        for name, entry in header.items():
            if name.startswith(prefix) and not name.endswith(IGNORED_SUFFIXES):
                found[name[len(prefix) :]] = (file, entry)
    return found


def load_mtp_layer(
    folder: Path,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard | None = None,
    keep_fp8: bool | None = None,
) -> DeepseekV3MTPLayer:
    """The MTP module's weights from the target's checkpoint (checked by the proposer's
    check_mtp_module), in `dtype` on `device` (the router's in fp32, as the target's); only its
    tensors are read, and of those only tensor-parallel rank `shard`'s part. FP8 weights are held
    as stored with `keep_fp8` (by default on CUDA, as the target's: sut/model/fp8.py), else
    dequantized. CheckpointError for a tensor that is unreadable or holds NaN or inf."""
    from safetensors import SafetensorError, safe_open

    whole = config
    if shard is not None:
        config = local_config(config, shard.size)
    prefix = mtp_prefix(whole)
    found = mtp_tensors(folder, prefix)
    scaled = {name for name in found if name + SCALE_SUFFIX in found}
    with torch.device("meta"):
        layer = DeepseekV3MTPLayer(config)
        if scaled and (device.type == "cuda" if keep_fp8 is None else keep_fp8):
            keep_checkpoint_fp8(layer, scaled, dtype)
    layout = checkpoint_layout(layer, shard)

    def read(name: str) -> torch.Tensor:
        file = found[name][0]
        try:
            with safe_open(file, framework="pt", device="cpu") as f:  # one tensor an opening, as the model loader
                return read_shard(f, prefix + name, shard)
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file, truncated or corrupt ({e})") from e

    loaded = set()
    for name in sorted(found):
        if name in SHARED_COPIES or name.endswith(SCALE_SUFFIX):
            continue
        param, row, _ = layout[name]
        if param is None:  # another tensor-parallel rank's (its expert): not read here
            loaded.add(name)
            continue
        # A rank's slices of an FP8 weight and of its scales are whole blocks (check_fp8_blocks).
        tensor = read(name)
        scale = read(name + SCALE_SUFFIX).float() if name in scaled else None
        held = dtype  # what the parameter holds
        if scale is not None and name + SCALE_SUFFIX in layout:  # held as stored
            if not scale.isfinite().all() or ((tensor.view(torch.uint8) & 0x7F) == 0x7F).any():  # e4m3 NaN bytes
                raise CheckpointError(f"{found[name][0]}: FP8 tensor {prefix + name!r} or its scales hold NaN or inf")
            scale_param, scale_row, _ = layout[name + SCALE_SUFFIX]
            _put(layer, scale_param, scale_row, scale, device, torch.float32)
            loaded.add(name + SCALE_SUFFIX)
            held = tensor.dtype
        elif scale is not None:
            tensor = dequantize_fp8(tensor, scale, FP8_BLOCK)
        if held == dtype and not tensor.isfinite().all():
            raise CheckpointError(
                f"{found[name][0]}: tensor {prefix + name!r} holds NaN or inf values (a corrupt checkpoint)"
            )
        _put(layer, param, row, tensor, device, held)
        loaded.add(name)
    missing = sorted(set(layout) - loaded)
    if missing:
        raise CheckpointError(f"{folder}: the MTP module lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
    layer.self_attn.absorb_weights()
    if shard is not None:
        layer.self_attn.tp = layer.mlp.tp = shard
    return layer.eval()

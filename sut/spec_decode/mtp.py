"""DeepSeek-V3/R1's multi-token-prediction (MTP) module as proposer (DeepSeek-V3 technical report
§2.2; DeepSeek-V3 README_WEIGHTS.md). The checkpoint stores one module as the layer after the last,
`model.layers.<num_hidden_layers>.*`:

- `enorm`, `hnorm` (RMSNorms) and `eh_proj` [H, 2H]: the module's input is
  `eh_proj(cat[enorm(embedding of token p + 1), hnorm(h_p)])`, the embedding first (transformers'
  MtpLayer, vLLM's and TensorRT-LLM's DeepSeek MTP: the order the trained eh_proj expects);
- a whole decoder layer under the usual names (self_attn, mlp, input_layernorm,
  post_attention_layernorm): latent attention and, after the dense-first layers as layer 61 is,
  the routed experts;
- `shared_head.norm`, the norm before the LM head. `embed_tokens` and `shared_head.head`, where the
  checkpoint has them, are copies of the target's embedding and LM head, which the module shares:
  they are checked and not read.

h_p is the target's hidden state of position p after its final norm (what the target's LM head
reads: transformers' `hidden_states[-1]`, TensorRT-LLM's and vLLM's model output). The module's own
output after `shared_head.norm` is both what the LM head reads for its draft and, chained, the
hidden state of the next row (TensorRT-LLM's "MTP Eagle", as the MLPerf DeepSeek-R1 submissions run
it with 3 drafts; transformers' MtpModel passes the same from one MTP layer to the next). vLLM feeds
back the output before that norm instead, and zeroes the embedding at position 0: neither is done here.

The bookkeeping is the EAGLE3 head's (sut/spec_decode/eagle3.py), which this proposer inherits: row p
of the module reads (token p + 1, h_p) at position p and predicts the token at p + 2; a proposal
first runs the module over the positions it has not consumed (the verified tokens of the last step,
or the whole prompt), which gives draft 1, then once per draft on its own output. The target's
hidden states arrive through `observe` after each step: the runner keeps the residual stream leaving
its last layer (the boundary `num_hidden_layers` of `aux_layers`), and the final norm is applied here;
each sequence keeps the rows of the positions the target kept, so a rejected draft's row is dropped
and its K/V in the module's cache is overwritten before anything reads it. The module has its own
one-layer latent KV cache (576 values a token for DeepSeek-V3) of the target's pool size, indexed by
the target's block tables and slot mapping. Drafts are greedy or sampled with the request's settings
from the module's distribution, which the verifier receives, so rejection sampling stays exact."""

import dataclasses
import json
import weakref
from pathlib import Path

import torch
from torch import nn

from kernels.fp8 import FP8_BLOCK, dequantize_fp8
from sut.config import ModelConfig
from sut.errors import CheckpointError, ConfigError
from sut.model.deepseek_v3 import DeepseekV3DecoderLayer
from sut.model.llama import RMSNorm
from sut.model.loader import IGNORED_SUFFIXES, _put, checkpoint_layout, read_header, weight_files
from sut.spec_decode.eagle3 import Eagle3Proposer

WHERE = "engine setting speculative_config (method 'mtp')"
ARCHITECTURE = "DeepseekV3ForCausalLM"
# Copies of the target's embedding and LM head that DeepSeek's checkpoints store in the module.
SHARED_COPIES = ("embed_tokens.weight", "shared_head.head.weight")
FLOAT_DTYPES = ("F32", "F16", "BF16")
FP8_DTYPE = "F8_E4M3"
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


class MtpHead:
    """The MTP module with what it shares with the target (final norm, rope, LM head, op set), in
    the EAGLE3 head's interface: `combine` turns the runner's kept hidden states into the module's
    input, a call runs rows, `compute_logits` gives draft logits."""

    def __init__(self, layer: DeepseekV3MTPLayer, target: nn.Module):
        self.layer, self.target = layer, target

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """What leaves the target's last layer `[n, H]`, through its final norm: h_p."""
        return self.target.model.norm(aux, None, self.target.ops)[0]

    def __call__(self, embeds, hidden, positions, meta):
        out = self.layer(embeds, hidden, self.target.rotary(positions, hidden.dtype), meta, self.target.ops)
        return out, out  # the LM head's input and, chained, the next row's hidden state

    def compute_logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(out)


# ---- the module in the target's checkpoint, checked before any model loads ---------------------------


def held_bytes(layer: nn.Module, dtype: torch.dtype) -> int:
    """The bytes `layer`'s parameters take loaded in `dtype` (a router's in fp32, as the loader keeps them)."""
    return sum(
        p.numel() * (4 if getattr(module, "keep_fp32", False) else dtype.itemsize)
        for module in layer.modules()
        for p in module.parameters(recurse=False)
    )


def _prefix(config: ModelConfig) -> str:
    return f"model.layers.{config.num_layers}."


def _module_tensors(folder: Path, prefix: str) -> dict[str, tuple[Path, dict]]:
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


def check_mtp_module(folder: Path, target: ModelConfig, dtype: torch.dtype) -> tuple[ModelConfig, int]:
    """For method 'mtp': check that the target at `folder` is a DeepSeek-V3 model whose checkpoint
    holds the MTP module, every tensor by name, shape and dtype (reading only headers); return the
    config the KV pool's sizing counts for the module's cache (one layer of the target's) and the
    bytes its weights take loaded in `dtype` (FP8 ones dequantized). ConfigError naming what does
    not fit."""
    if target.architecture != ARCHITECTURE:
        raise ConfigError(
            f"{WHERE}: the MTP module is DeepSeek-V3/R1's ({ARCHITECTURE}); the target {folder} is a "
            f"{target.architecture}, which has none: use method 'ngram', 'draft_model' or 'eagle3'"
        )
    prefix = _prefix(target)
    try:
        found = _module_tensors(folder, prefix)
    except CheckpointError as e:
        raise ConfigError(f"{WHERE}: {e}") from None
    if not found:
        declared = json.loads((folder / "config.json").read_text()).get("num_nextn_predict_layers")
        raise ConfigError(
            f"{WHERE}: the target checkpoint {folder} holds no MTP module: no {prefix}* tensors (the layer after "
            f"its {target.num_layers}; config.json num_nextn_predict_layers={declared}), so it cannot draft for itself"
        )
    with torch.device("meta"):
        layer = DeepseekV3MTPLayer(target)
    layout = checkpoint_layout(layer)
    expected = {name: (shape, FLOAT_DTYPES) for name, (_, _, shape) in layout.items()}
    for name in SHARED_COPIES:
        expected[name] = (torch.Size([target.vocab_size, target.hidden_size]), FLOAT_DTYPES)
    for name, (_, entry) in found.items():  # FP8 weights and their block scales
        weight = name.removesuffix(SCALE_SUFFIX)
        if name.endswith(SCALE_SUFFIX) and weight in layout and len(layout[weight][2]) == 2:
            shape = layout[weight][2]
            expected[name] = (torch.Size([-(-d // FP8_BLOCK) for d in shape]), ("F32", "BF16"))
            expected[weight] = (shape, (FP8_DTYPE,))
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise ConfigError(
            f"{WHERE}: {folder} holds tensor(s) the MTP module does not: {[prefix + n for n in unexpected[:5]]}"
        )
    missing = sorted(set(layout) - set(found))
    if missing:
        raise ConfigError(
            f"{WHERE}: the MTP module in {folder} lacks {len(missing)} tensor(s), "
            f"e.g. {[prefix + n for n in missing[:3]]}"
        )
    orphans = sorted(n for n, (_, e) in found.items() if e.get("dtype") == FP8_DTYPE and n + SCALE_SUFFIX not in found)
    if orphans:
        raise ConfigError(f"{WHERE}: {folder}: FP8 tensor {prefix + orphans[0]!r} has no {SCALE_SUFFIX} beside it")
    for name, (file, entry) in found.items():
        shape, dtypes = expected[name]
        if list(entry.get("shape", ())) != list(shape):
            raise ConfigError(
                f"{WHERE}: {file}: tensor {prefix + name!r} has shape {entry.get('shape')}, and the target's "
                f"config.json implies {list(shape)}"
            )
        if entry.get("dtype") not in dtypes:
            raise ConfigError(
                f"{WHERE}: {file}: tensor {prefix + name!r} has dtype {entry.get('dtype')}, not one of {list(dtypes)}"
            )
    return dataclasses.replace(target, num_layers=1), held_bytes(layer, dtype)


def load_mtp_layer(folder: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> DeepseekV3MTPLayer:
    """The MTP module's weights from the target's checkpoint (checked by check_mtp_module), in
    `dtype` on `device` (the router's in fp32, as the target's; FP8 weights dequantized); only its
    tensors are read. CheckpointError for a tensor that is unreadable or holds NaN or inf."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):
        layer = DeepseekV3MTPLayer(config)
    layout = checkpoint_layout(layer)
    prefix = _prefix(config)
    found = _module_tensors(folder, prefix)
    loaded = set()
    for name, (file, _) in sorted(found.items()):
        if name in SHARED_COPIES or name.endswith(SCALE_SUFFIX):
            continue
        try:
            with safe_open(file, framework="pt", device="cpu") as f:  # one tensor an opening, as the model loader
                tensor = f.get_tensor(prefix + name)
                if name + SCALE_SUFFIX in found:
                    scale = f.get_tensor(prefix + name + SCALE_SUFFIX).float()
                    tensor = dequantize_fp8(tensor, scale, FP8_BLOCK)
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file, truncated or corrupt ({e})") from e
        if not tensor.isfinite().all():
            raise CheckpointError(f"{file}: tensor {prefix + name!r} holds NaN or inf values (a corrupt checkpoint)")
        param, row, _ = layout[name]
        _put(layer, param, row, tensor, device, dtype)
        loaded.add(name)
    missing = sorted(set(layout) - loaded)
    if missing:
        raise CheckpointError(f"{folder}: the MTP module lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
    layer.self_attn.absorb_weights()
    return layer.eval()


# ---- the proposer ------------------------------------------------------------------------------------


class MtpProposer(Eagle3Proposer):
    """EAGLE3's proposer (observe, propose: the pending hidden states, the chained drafts) over the
    target's own MTP module."""

    def __init__(self, folder: Path, runner, dtype: torch.dtype, device: torch.device, default_generator):
        """`folder`: the target's (its checkpoint holds the module); `runner`: the target's
        ModelRunner, whose model (embedding, final norm, rope, LM head, op set), block size, pool
        size and step inputs the module uses. Eagle3Proposer.__init__ loads a head folder: not called."""
        self.runner, self.default_generator = runner, default_generator
        target = runner.model
        c = target.config
        self.aux_layers = (c.num_layers,)  # what leaves the target's last layer, before its final norm
        self.model = MtpHead(load_mtp_layer(folder, c, dtype, device), target)
        self.embed = target.model.embed_tokens
        # Its own latent cache, laid out as one layer of the target's pool: the target's block ids index it.
        self.kv_cache = torch.zeros(
            1, 1, runner.num_blocks, runner.block_size, 1, c.mla.cache_dim, dtype=dtype, device=device
        )
        attn = self.model.layer.self_attn
        attn.k_cache = self.kv_cache[0, 0]
        attn.v_cache = attn.k_cache[..., : c.mla.kv_lora_rank]
        self.pending = weakref.WeakKeyDictionary()

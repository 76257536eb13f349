"""Load a Llama checkpoint from a local Hugging Face folder (single or sharded safetensors).

The model is built on the meta device and each tensor is read and put in place one at a time,
so peak memory is about one copy of the weights. Every problem with the files is a
CheckpointError naming the file and what is wrong with it.
"""

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from sut.config import ModelConfig
from sut.errors import CheckpointError
from sut.model import LlamaForCausalLM, RotaryEmbedding

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e!r})") from e
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are missing: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors checkpoint in the model folder")
    return files


def load_model(folder: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    folder = Path(folder)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = {name: p.shape for name, p in model.named_parameters()}
    if config.tie_word_embeddings:
        del expected["lm_head.weight"]
    loaded: set[str] = set()
    for file in weight_files(folder):
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name.endswith(IGNORED_SUFFIXES) or (config.tie_word_embeddings and name == "lm_head.weight"):
                        continue
                    if name not in expected:
                        raise CheckpointError(f"{file}: unexpected tensor {name!r} for a Llama model")
                    tensor = f.get_tensor(name)
                    if tensor.shape != expected[name]:
                        raise CheckpointError(f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                                              f"config.json implies {tuple(expected[name])}")
                    module_name, _, leaf = name.rpartition(".")
                    param = nn.Parameter(tensor.to(device=device, dtype=dtype), requires_grad=False)
                    setattr(model.get_submodule(module_name), leaf, param)
                    loaded.add(name)
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file, truncated or corrupt ({e})") from e
    missing = sorted(set(expected) - loaded)
    if missing:
        raise CheckpointError(f"{folder}: checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rotary = RotaryEmbedding(config, device)
    return model.eval()

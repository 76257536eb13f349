"""The engine's settings resolved against its model: what every process of one engine (rank 0, the
other tensor-parallel ranks, each data-parallel replica) is built from, made once, before any
process starts, by sut/engine/resolve.py."""

from dataclasses import dataclass
from pathlib import Path

import torch

from sut.config.engine import EngineConfig
from sut.config.model import ModelConfig


@dataclass(frozen=True)
class DraftModel:
    """A draft model for speculative decoding, checked against the target."""

    folder: Path
    config: ModelConfig
    weight_bytes: int  # its safetensors files' size, which the KV pool's sizing leaves room for


@dataclass(frozen=True)
class ResolvedConfig:
    folder: Path  # the model folder
    engine: EngineConfig  # the typed settings
    model: ModelConfig  # the checkpoint's config.json
    max_model_len: int  # the setting, else the model's maximum
    dtype: torch.dtype  # the setting, else the checkpoint's
    device: str  # "cpu", "cuda" or "cuda:N" (never "auto")
    draft: DraftModel | None = None

"""The engine's settings resolved against its model: what every process of one engine (rank 0, the
other tensor-parallel ranks, each data-parallel replica) is built from, made once, before any
process starts, by sut/engine/resolve.py."""

from dataclasses import dataclass
from pathlib import Path

import torch

from sut.config.engine import EngineConfig
from sut.config.model import ModelConfig


@dataclass(frozen=True)
class Eagle3Head:
    """What an EAGLE3 head folder holds, checked against its target (sut/spec_decode/eagle3.py says
    what each part does)."""

    layer: ModelConfig  # its one decoder layer's shape (num_layers 1) and rope, as a Llama config
    aux_layer_ids: tuple[int, ...]  # the target's layer boundaries whose hidden states it reads
    target_hidden_size: int
    draft_vocab_size: int
    norm_before_residual: bool
    norm_before_fc: bool  # an RMSNorm (input_norm) on the joined hidden states before fc
    norm_output: bool  # feeds its normed output back (EAGLE 3.1) rather than the one before the norm
    layer_prefix: str  # "midlayer." or "layers.0." in its checkpoint
    own_embedding: bool  # embed_tokens of its own, else the target's
    has_d2t: bool  # a draft-to-target id map (a draft vocabulary smaller than the target's, or reordered)


@dataclass(frozen=True)
class DraftModel:
    """A draft model or EAGLE3 head for speculative decoding, checked against the target."""

    folder: Path
    config: ModelConfig  # a head's: its decoder layer's (the KV pool's sizing counts its one layer)
    weight_bytes: int  # its safetensors files' size, which the KV pool's sizing leaves room for
    eagle3: Eagle3Head | None = None  # method eagle3: the head's layout


@dataclass(frozen=True)
class ResolvedConfig:
    folder: Path  # the model folder
    engine: EngineConfig  # the typed settings
    model: ModelConfig  # the checkpoint's config.json
    max_model_len: int  # the setting, else the model's maximum
    dtype: torch.dtype  # the setting, else the checkpoint's
    device: str  # "cpu", "cuda" or "cuda:N" (never "auto")
    draft: DraftModel | None = None

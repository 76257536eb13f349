"""The model layer: one file per architecture (llama.py), the registry that maps a checkpoint's
`architectures` to its class (registry.py), the checkpoint loader (loader.py) and the checksum
check run before loading (checksums.py)."""

from sut.model.registry import MODELS, model_class

__all__ = ["MODELS", "model_class"]

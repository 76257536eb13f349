"""The model layer: one file per architecture (llama.py; gpt_oss.py and deepseek_v3.py, DeepSeek-V3's
MTP module in deepseek_mtp.py), the registry that maps a checkpoint's `architectures` to its class
(registry.py), rope's scalings (rope.py), FP8 linears (fp8.py), the checkpoint loader (loader.py)
and the checksum check run before loading (checksums.py)."""

from sut.model.registry import MODELS, model_class

__all__ = ["MODELS", "model_class"]

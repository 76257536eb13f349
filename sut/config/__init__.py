"""Configuration: the checkpoint's model configuration (model.py) and the engine's settings
(engine.py, with the CPU backend's in cpu.py, speculative decoding's in speculative.py and
disaggregated serving's in disaggregation.py)."""

from sut.config.cpu import CpuSettings
from sut.config.disaggregation import DisaggregationConfig
from sut.config.engine import EngineConfig
from sut.config.model import DTYPES, SUPPORTED_ARCHITECTURES, ModelConfig, MoEConfig, RopeScaling, YarnScaling
from sut.config.speculative import SpeculativeConfig

__all__ = [
    "DTYPES",
    "SUPPORTED_ARCHITECTURES",
    "CpuSettings",
    "DisaggregationConfig",
    "EngineConfig",
    "ModelConfig",
    "MoEConfig",
    "RopeScaling",
    "SpeculativeConfig",
    "YarnScaling",
]

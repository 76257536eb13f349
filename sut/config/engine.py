"""The engine's settings, typed and checked before anything loads."""

import math
import re
import typing
from dataclasses import dataclass, fields

from sut.config.cpu import CpuSettings
from sut.config.disaggregation import DisaggregationConfig
from sut.config.model import DTYPES
from sut.config.speculative import SpeculativeConfig
from sut.errors import ConfigError


@dataclass
class EngineConfig:
    """Engine settings. Unknown keys and bad values fail with the key's name and what is allowed."""

    max_num_batched_tokens: int = 2048  # token budget of one step (prefill chunks + decodes)
    max_num_seqs: int = 64  # running sequences at most
    # Off: a prompt is computed whole in one step or waits (vLLM's enable_chunked_prefill=False).
    enable_chunked_prefill: bool = True
    # The MLPerf reference SUTs' batching, as a baseline (scheduler.py): a batch of up to max_num_seqs
    # is admitted only when the last one has ended, and runs until all of its rows have.
    static_batching: bool = False
    tpot_target_ms: float | None = None  # no prefill in a step that could push a decode's TPOT past it (scheduler.py)
    tpot_cap_ms: float | None = None  # with ttft_patience_ms: the TPOT bound once a prompt has waited that long
    ttft_patience_ms: float | None = None
    max_model_len: int | None = None  # prompt + output tokens; default: the model's maximum
    block_size: int = 16  # tokens per KV-cache block
    num_kv_blocks: int | None = None  # pool size; default: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float | None = None  # default: the CPU backend's on CPU, 90% of free memory on CUDA
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False  # MLPerf forbids reuse across queries: off unless asked
    # The model (and draft) folder's SHA256SUMS checked before loading (sut/model/checksums.py); false for a
    # large checkpoint already verified.
    verify_checksums: bool = True
    dtype: str = "auto"  # "auto" = the checkpoint's dtype
    # "fp8": the decoder's linears quantized to FP8 at load, one scale per output channel (sut/model/fp8.py):
    # FP8 weights and a Triton GEMM on CUDA; on CPU the FP8 round trip in `dtype` (its quality cost only).
    quantization: str | None = None
    device: str = "auto"  # "auto" = cuda when available, else cpu
    kernels: str = (
        "auto"  # "auto": Triton on CUDA, the CPU backend's C ops on CPU (kernels.select_ops); "triton", "torch"
    )
    seed: int = 0  # for sampled requests without their own seed
    # Decode-only steps from CUDA graphs (sut/worker/cuda_graphs.py); off until a GPU run has verified them.
    cuda_graphs: bool = False
    data_parallel_size: int = 1  # engine replicas, each a process on its own GPU or cores (sut/engine/replicas.py)
    tensor_parallel_size: int = 1  # ranks one model is split over, each a process (sut/parallel/)
    cpu: CpuSettings = CpuSettings()  # the CPU backend's own settings (sut/config/cpu.py), given as a dict
    speculative_config: SpeculativeConfig | None = None  # speculative decoding (config/speculative.py), a dict
    # Prefill and decode workers in place of one engine (config/disaggregation.py), a dict.
    disaggregation: DisaggregationConfig | None = None

    @staticmethod
    def from_kwargs(**kwargs) -> "EngineConfig":
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown engine setting(s) {unknown}; known settings: {sorted(known)}")
        config = EngineConfig(
            **{
                **kwargs,
                "cpu": CpuSettings.from_value(kwargs.get("cpu", {})),
                "speculative_config": SpeculativeConfig.from_value(kwargs.get("speculative_config")),
                "disaggregation": DisaggregationConfig.from_value(kwargs.get("disaggregation")),
            }
        )
        config.validate()
        return config

    def validate(self) -> None:
        """Every setting's type and range, then what settings ask of each other: before anything loads."""
        for f in fields(self):
            kind, optional = _kind_of(f.type)
            value = getattr(self, f.name)
            if kind not in KIND_WORDS or (optional and value is None):
                continue  # cpu, speculative_config, disaggregation: checked by their own classes (from_kwargs)
            what, test = RANGES.get(f.name, (KIND_WORDS[kind], None))
            if not _is_kind(value, kind) or (test is not None and not test(value)):
                raise ConfigError(
                    f"engine setting {f.name} must be {what}{' or None' if optional else ''}, got {value!r}"
                )
        if (self.tpot_cap_ms is None) != (self.ttft_patience_ms is None):
            raise ConfigError("engine settings tpot_cap_ms and ttft_patience_ms go together: set both or neither")
        if self.tpot_cap_ms is not None and (self.tpot_target_ms is None or self.tpot_cap_ms < self.tpot_target_ms):
            raise ConfigError(
                f"engine setting tpot_cap_ms ({self.tpot_cap_ms!r}) needs a tpot_target_ms at most as large, "
                f"got {self.tpot_target_ms!r}"
            )
        if self.block_size & (self.block_size - 1):
            raise ConfigError(f"engine setting block_size must be a power of two, got {self.block_size}")
        if self.static_batching and self.speculative_config is not None:
            raise ConfigError("engine settings static_batching and speculative_config do not go together")
        if self.quantization is not None and self.cpu.int16_activations:
            # int16 activations compute from the checkpoint's GGUF blocks, which FP8's rounded weights replace
            raise ConfigError(
                f"engine settings quantization={self.quantization!r} and cpu.int16_activations do not go together"
            )
        if self.disaggregation is not None:
            if self.static_batching:
                raise ConfigError("engine settings static_batching and disaggregation do not go together")
            if self.data_parallel_size > 1:
                raise ConfigError(
                    "engine settings data_parallel_size > 1 and disaggregation do not go together: the prefill "
                    "and decode workers are the replicas"
                )
            if self.tensor_parallel_size > 1:
                raise ConfigError("engine settings tensor_parallel_size > 1 and disaggregation do not go together yet")
        if self.speculative_config is not None:
            self.speculative_config.check_fits(self.max_model_len or 2**31, self.max_num_batched_tokens)


# What each setting's annotation says it is, in words; `float` means a finite real number (an int
# will do: JSON and YAML write 4.0 as 4), and no kind but bool takes a bool (True is an int to Python).
KIND_WORDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}


QUANTIZATIONS = ("fp8",)  # the `quantization` setting's values (None: the checkpoint's weights as they are)

# Settings whose values are narrower than their kind: (what the error says they must be, the test).
RANGES = {
    **dict.fromkeys(
        (
            "max_num_batched_tokens",
            "max_num_seqs",
            "max_model_len",
            "block_size",
            "num_kv_blocks",
            "data_parallel_size",
            "tensor_parallel_size",
        ),
        ("a positive integer", lambda v: v >= 1),
    ),
    **dict.fromkeys(
        ("tpot_target_ms", "tpot_cap_ms", "ttft_patience_ms", "kv_cache_memory_gb"),
        ("a positive finite number", lambda v: v > 0),
    ),
    "gpu_memory_utilization": ("a number in (0, 1]", lambda v: 0 < v <= 1),
    "seed": ("an integer in [0, 2**63)", lambda v: 0 <= v < 2**63),
    "dtype": (f"'auto' or one of {list(DTYPES)}", lambda v: v == "auto" or v in DTYPES),
    "device": ("'auto', 'cpu', 'cuda' or 'cuda:N'", lambda v: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None),
    "kernels": ("'auto', 'triton' or 'torch'", lambda v: v in ("auto", "triton", "torch")),
    "quantization": (f"one of {list(QUANTIZATIONS)}", lambda v: v in QUANTIZATIONS),
}


def _kind_of(annotation) -> tuple[type, bool]:
    """A setting's kind from its annotation, and whether it may be None: `float | None` -> (float, True)."""
    args = typing.get_args(annotation)
    if not args:
        return annotation, False
    return next(a for a in args if a is not type(None)), type(None) in args


def _is_kind(value, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)

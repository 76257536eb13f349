"""A checkpoint's model configuration, read from its Hugging Face config.json (and
generation_config.json for the end-of-sequence ids)."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from sut.errors import ConfigError, UnsupportedModelError

# What ModelConfig can read; sut/model/registry.py maps each to its model class.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "GptOssForCausalLM")
LAYER_TYPES = ("full_attention", "sliding_attention")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's frequency-dependent rope scaling ("rope_type": "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class YarnScaling:
    """YaRN ("rope_type": "yarn", gpt-oss): frequencies between the beta_fast and beta_slow
    rotation counts blended from interpolated (divided by `factor`) to kept; cos and sin multiplied
    by `attention_factor` (by default 0.1 ln(factor) + 1)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts MLP in every layer (gpt-oss): a linear + bias router, the top
    `experts_per_token` logits softmaxed, experts of `intermediate_size` with gpt-oss's clamped
    SwiGLU (`swiglu_alpha`, `swiglu_limit`)."""

    num_experts: int
    experts_per_token: int
    swiglu_alpha: float
    swiglu_limit: float


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # the config.json `architectures` entry sut/model/registry.py builds
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | YarnScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    # gpt-oss: a sliding window of `sliding_window` keys on the layers layer_types names so (None: every
    # layer full), one learned sink logit per head, experts, and its expert weights' format ("mxfp4").
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    attention_sinks: bool = False
    moe: MoEConfig | None = None
    quantization: str | None = None

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer `layer` in keys, or None for full attention."""
        if self.layer_types is None or self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window

    @staticmethod
    def from_folder(folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no config.json in the model folder")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from e
        eos = set(_as_list(raw.get("eos_token_id")))
        gen_path = Path(folder) / "generation_config.json"
        if gen_path.is_file():
            eos |= set(_as_list(json.loads(gen_path.read_text()).get("eos_token_id")))
        return ModelConfig.from_dict(raw, str(path), tuple(sorted(eos)))

    @staticmethod
    def from_dict(raw: dict, where: str = "config.json", eos_token_ids: tuple[int, ...] = ()) -> "ModelConfig":
        archs = raw.get("architectures") or [raw.get("model_type", "unknown")]
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise UnsupportedModelError(
                f"{where}: architecture {archs} is not supported; supported: {list(SUPPORTED_ARCHITECTURES)}"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"{where}: hidden_act {raw['hidden_act']!r} is not supported; supported: 'silu'"
            )

        def need(key):
            if key not in raw:
                raise ConfigError(f"{where}: missing required key {key!r}")
            value = raw[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
            return value

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ConfigError(
                f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        # transformers 5 nests rope settings under rope_parameters; older files keep rope_theta/rope_scaling.
        rope = dict(raw.get("rope_parameters") or {})
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = raw.get("rope_scaling") or rope
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "llama3":
            rope_scaling = RopeScaling(
                float(scaling["factor"]),
                float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]),
                int(scaling["original_max_position_embeddings"]),
            )
        elif rope_type == "yarn":
            rope_scaling = YarnScaling(
                float(scaling["factor"]),
                int(scaling["original_max_position_embeddings"]),
                float(scaling.get("beta_fast") or 32.0),
                float(scaling.get("beta_slow") or 1.0),
                bool(scaling.get("truncate", True)),
                scaling.get("attention_factor"),
            )
        elif rope_type == "default":
            rope_scaling = None
        else:
            raise UnsupportedModelError(
                f"{where}: rope type {rope_type!r} is not supported; supported: default, llama3, yarn"
            )
        dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if dtype_name not in DTYPES:
            raise ConfigError(f"{where}: dtype {dtype_name!r} is not one of {list(DTYPES)}")
        if not eos_token_ids:
            eos_token_ids = tuple(_as_list(raw.get("eos_token_id")))
        architecture = next(a for a in archs if a in SUPPORTED_ARCHITECTURES)
        gpt_oss = architecture == "GptOssForCausalLM" and _gpt_oss_fields(raw, where, need)
        return ModelConfig(
            architecture=architecture,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=need("max_position_embeddings"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            dtype=DTYPES[dtype_name],
            eos_token_ids=eos_token_ids,
            **(gpt_oss or {}),
        )


def _gpt_oss_fields(raw: dict, where: str, need) -> dict:
    """What a gpt-oss config.json adds: layer types and window, sinks, experts, MXFP4."""
    layers = need("num_hidden_layers")
    layer_types = raw.get("layer_types") or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
    ]
    if len(layer_types) != layers or any(t not in LAYER_TYPES for t in layer_types):
        raise ConfigError(f"{where}: layer_types must name one of {list(LAYER_TYPES)} for each of the {layers} layers")
    quant = raw.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method not in (None, "mxfp4"):
        raise UnsupportedModelError(f"{where}: quantization {method!r} is not supported; supported: mxfp4")
    experts = raw.get("num_local_experts")
    per_token = raw.get("num_experts_per_tok", raw.get("experts_per_token"))
    for key, value in (("num_local_experts", experts), ("num_experts_per_tok", per_token)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    if per_token > experts:
        raise ConfigError(f"{where}: num_experts_per_tok {per_token} exceeds num_local_experts {experts}")
    return dict(
        layer_types=tuple(layer_types),
        sliding_window=need("sliding_window") if "sliding_attention" in layer_types else None,
        attention_sinks=True,
        moe=MoEConfig(experts, per_token, float(raw.get("swiglu_alpha", 1.702)), float(raw.get("swiglu_limit", 7.0))),
        quantization=method,
    )


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]

"""A checkpoint's model configuration, read from its Hugging Face config.json (and
generation_config.json for the end-of-sequence ids)."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from sut.errors import ConfigError, UnsupportedModelError

# What ModelConfig can read; sut/model/registry.py maps each to its model class.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "GptOssForCausalLM", "DeepseekV3ForCausalLM")
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
    # DeepSeek-V3: with both set (and no attention_factor), cos/sin are multiplied by
    # mscale(factor, mscale) / mscale(factor, mscale_all_dim), and the softmax scale by
    # mscale(factor, mscale_all_dim)^2.
    mscale: float | None = None
    mscale_all_dim: float | None = None


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts MLP. gpt-oss (in every layer): a linear + bias router, the top
    `experts_per_token` logits softmaxed, experts of `intermediate_size` with gpt-oss's clamped
    SwiGLU (`swiglu_alpha`, `swiglu_limit`). DeepSeek-V3 (`num_groups` set; after `first_dense_layers`
    dense layers): sigmoid scores, the correction bias used for choosing only, the top `topk_groups`
    of `num_groups` expert groups by the sum of each group's top-2, the top `experts_per_token` in those,
    weights the unbiased scores normalized and times `routed_scaling_factor`; experts of
    `expert_intermediate_size` with plain SwiGLU, beside `shared_experts` always-on experts."""

    num_experts: int
    experts_per_token: int
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    num_groups: int | None = None
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    expert_intermediate_size: int | None = None
    shared_experts: int = 0
    first_dense_layers: int = 0
    # A tensor-parallel rank's config (sut/parallel/shard.py's local_config): the routed experts split
    # over this many ranks (each holds num_experts / parallel_size of them, whole), and the shared
    # experts' features too; the router stays whole.
    parallel_size: int = 1


@dataclass(frozen=True)
class MLAConfig:
    """DeepSeek's multi-head latent attention: queries through a `q_lora_rank` bottleneck (None: one
    q_proj), keys and values from a `kv_lora_rank` latent shared by the heads plus a
    `qk_rope_head_dim` rope key shared by the heads; per head `qk_nope_head_dim` + rope dims of
    query and key, `v_head_dim` of value. The KV cache holds the latent and the rope key."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True

    @property
    def cache_dim(self) -> int:
        """Values cached per token per layer: the latent, then the rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


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
    # DeepSeek-V3: latent attention (head_dim is then its rope dims, num_kv_heads 1: the latent).
    mla: MLAConfig | None = None

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
                scaling.get("mscale"),
                scaling.get("mscale_all_dim"),
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
        extra = {}
        if architecture == "GptOssForCausalLM":
            extra = _gpt_oss_fields(raw, where, need)
        elif architecture == "DeepseekV3ForCausalLM":
            extra = _deepseek_fields(raw, where, need)
        fields = dict(
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
        )
        return ModelConfig(**(fields | extra))


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


def _deepseek_fields(raw: dict, where: str, need) -> dict:
    """What a DeepSeek-V3 config.json adds: latent attention, group-routed experts after the dense
    layers, FP8 block-scaled weights."""
    quant = raw.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method not in (None, "fp8"):
        raise UnsupportedModelError(f"{where}: quantization {method!r} is not supported; supported: fp8")
    if method == "fp8" and list(quant.get("weight_block_size") or [128, 128]) != [128, 128]:
        raise UnsupportedModelError(
            f"{where}: fp8 weight_block_size {quant['weight_block_size']} is not supported; supported: [128, 128]"
        )
    q_lora = raw.get("q_lora_rank")
    if q_lora is not None:
        q_lora = need("q_lora_rank")
    mla = MLAConfig(
        q_lora,
        need("kv_lora_rank"),
        need("qk_nope_head_dim"),
        need("qk_rope_head_dim"),
        need("v_head_dim"),
        bool(raw.get("rope_interleave", True)),
    )
    experts, groups = need("n_routed_experts"), need("n_group")
    per_token, topk_groups = need("num_experts_per_tok"), need("topk_group")
    if experts % groups:
        raise ConfigError(f"{where}: n_routed_experts {experts} is not a multiple of n_group {groups}")
    if topk_groups > groups or per_token > topk_groups * (experts // groups):
        raise ConfigError(
            f"{where}: num_experts_per_tok {per_token} from topk_group {topk_groups} of n_group {groups} groups of "
            f"{experts // groups} experts cannot be chosen"
        )
    if experts // groups < 2:
        raise ConfigError(f"{where}: groups of {experts // groups} expert(s); a group's score sums its top 2")
    layers = need("num_hidden_layers")
    dense = raw.get("first_k_dense_replace", 0)
    if not isinstance(dense, int) or isinstance(dense, bool) or not 0 <= dense <= layers:
        raise ConfigError(f"{where}: first_k_dense_replace must be an integer in 0..{layers}, got {dense!r}")
    moe = MoEConfig(
        experts,
        per_token,
        num_groups=groups,
        topk_groups=topk_groups,
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        expert_intermediate_size=need("moe_intermediate_size"),
        shared_experts=raw.get("n_shared_experts") or 0,
        first_dense_layers=dense,
    )
    return dict(mla=mla, moe=moe, num_kv_heads=1, head_dim=mla.qk_rope_head_dim, quantization=method)


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]

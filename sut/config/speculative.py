"""The engine setting `speculative_config`, spelled as vLLM spells it:
`{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b}`,
`{"method": "draft_model", "model": FOLDER, "num_speculative_tokens": k}` or
`{"method": "eagle3", "model": HEAD_FOLDER, "num_speculative_tokens": k}` or
`{"method": "mtp", "num_speculative_tokens": k}` (DeepSeek-V3/R1's own multi-token-prediction module,
read from the target's folder), plus our `"adaptive": true` (lower k for a sequence whose recent
drafts were rejected).

Checked here without reading any file; sut/spec_decode/draft_model.py checks a draft folder,
sut/spec_decode/eagle3.py an EAGLE3 head folder, and sut/spec_decode/mtp.py the target's MTP module,
against the target's before any model loads."""

from dataclasses import dataclass, fields
from pathlib import Path

from sut.errors import ConfigError

METHODS = ("ngram", "draft_model", "eagle3", "mtp")
MAX_SPECULATIVE_TOKENS = 32  # drafts per sequence and step at most (vLLM's MAX_SPEC_LEN)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1  # ngram: the shortest suffix matched
    prompt_lookup_max: int = 3  # ngram: the longest, tried first
    model: str | None = None  # draft_model: its folder; eagle3: the head's; mtp: none (the target's)
    adaptive: bool = False

    @staticmethod
    def from_value(value) -> "SpeculativeConfig | None":
        if value is None:
            return None
        if isinstance(value, SpeculativeConfig):  # checked as the dict of what it sets
            value = {f.name: getattr(value, f.name) for f in fields(value) if getattr(value, f.name) != f.default}
        known = [f.name for f in fields(SpeculativeConfig)]
        if not isinstance(value, dict):
            raise ConfigError(
                f"engine setting speculative_config must be an object with keys {known} or null, got {value!r}"
            )
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} in engine setting speculative_config; known keys: {known}")
        method = value.get("method")
        if method not in METHODS:
            raise ConfigError(
                f"engine setting speculative_config.method must be one of {list(METHODS)}, got {method!r}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            v = value.get(name, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"engine setting speculative_config.{name} must be an integer >= 1, got {v!r}")
        if "num_speculative_tokens" not in value:
            raise ConfigError("engine setting speculative_config needs num_speculative_tokens (drafts per step)")
        k = value["num_speculative_tokens"]
        if k > MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"engine setting speculative_config.num_speculative_tokens={k} is above the "
                f"maximum {MAX_SPECULATIVE_TOKENS}"
            )
        if not isinstance(value.get("adaptive", False), bool):
            raise ConfigError(
                f"engine setting speculative_config.adaptive must be true or false, got {value['adaptive']!r}"
            )
        if method == "ngram":
            if "model" in value:
                raise ConfigError(
                    "engine setting speculative_config.model is for methods 'draft_model' and 'eagle3', not 'ngram'"
                )
            config = SpeculativeConfig(**value)
            if config.prompt_lookup_min > config.prompt_lookup_max:
                raise ConfigError(
                    f"engine setting speculative_config.prompt_lookup_min={config.prompt_lookup_min} "
                    f"is above prompt_lookup_max={config.prompt_lookup_max}"
                )
            return config
        extra = sorted({"prompt_lookup_min", "prompt_lookup_max"} & set(value))
        if extra:
            raise ConfigError(f"engine setting speculative_config.{extra[0]} is for method 'ngram', not {method!r}")
        if method == "mtp":
            if "model" in value:
                raise ConfigError(
                    "engine setting speculative_config.model is for methods 'draft_model' and 'eagle3', not 'mtp': "
                    "the MTP module is read from the target model's own folder"
                )
            return SpeculativeConfig(**value)
        what = "the draft model's folder" if method == "draft_model" else "the EAGLE3 head's folder"
        if not isinstance(value.get("model"), str) or not value["model"]:
            raise ConfigError(
                f"engine setting speculative_config.model must be a non-empty string ({what}) for method "
                f"{method!r}, got {value.get('model')!r}"
            )
        return SpeculativeConfig(**value)

    def check_fits(self, max_model_len: int, max_num_batched_tokens: int) -> None:
        """A sequence verifies k + 1 tokens in one step and needs room for them in the model."""
        k = self.num_speculative_tokens
        if k + 1 > max_num_batched_tokens:
            raise ConfigError(
                f"engine setting speculative_config.num_speculative_tokens={k}: a step verifies k + 1 "
                f"tokens, more than max_num_batched_tokens={max_num_batched_tokens}"
            )
        if k + 2 > max_model_len:
            raise ConfigError(
                f"engine setting speculative_config.num_speculative_tokens={k} is too large for "
                f"max_model_len={max_model_len}"
            )

    def describe(self) -> str:
        """One line for run records and system descriptions."""
        k = self.num_speculative_tokens
        adaptive = ", adaptive" if self.adaptive else ""
        if self.method == "ngram":
            match = f"{self.prompt_lookup_max}..{self.prompt_lookup_min}"
            return f"n-gram prompt lookup (k={k}, match {match} tokens{adaptive})"
        if self.method == "eagle3":
            return f"EAGLE3 head {Path(self.model).name} (k={k}{adaptive})"
        if self.method == "mtp":
            return f"the model's own MTP module, chained (k={k}{adaptive})"
        return f"draft model {Path(self.model).name} (k={k}{adaptive})"

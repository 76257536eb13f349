"""The engine setting `disaggregation`: `{"prefill": P, "decode": D}` runs P prefill workers and D
decode workers, each a whole engine on its own GPU or cores (sut/engine/disaggregated.py). Checked
here without looking at the machine; sut/engine/resolve.py checks that the devices are there."""

from dataclasses import dataclass

from sut.errors import ConfigError

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class DisaggregationConfig:
    prefill: int  # prefill workers: each computes prompts and their first tokens
    decode: int  # decode workers: each continues the prompts whose KV blocks it receives

    @property
    def num_workers(self) -> int:
        return self.prefill + self.decode

    @staticmethod
    def from_value(value) -> "DisaggregationConfig | None":
        if value is None or isinstance(value, DisaggregationConfig):
            return value
        if not isinstance(value, dict):
            raise ConfigError(
                f"engine setting disaggregation must be an object like {{'prefill': 1, 'decode': 1}} or null, "
                f"got {value!r}"
            )
        unknown = sorted(set(value) - set(ROLES))
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} in engine setting disaggregation; known keys: {list(ROLES)}")
        for role in ROLES:
            n = value.get(role)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"engine setting disaggregation.{role} must be an integer >= 1 (workers), got {n!r}")
        return DisaggregationConfig(value["prefill"], value["decode"])

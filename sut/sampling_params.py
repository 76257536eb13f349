"""Per-request sampling settings, each checked for its type and range when made: a bad one is an
InvalidRequestError naming the field, before the request reaches the engine."""

import math
import operator
from dataclasses import dataclass

from sut.errors import InvalidRequestError


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # per-request seed: the same output whatever the batch
    max_tokens: int = 16
    min_tokens: int = 0  # EOS and stop tokens are masked until this many tokens exist
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()  # given as a list or tuple; checked against the vocabulary by the engine

    def __post_init__(self):
        _require("max_tokens", self.max_tokens, "an integer >= 1", _is_int(self.max_tokens) and self.max_tokens >= 1)
        _require(
            "min_tokens",
            self.min_tokens,
            f"an integer in [0, max_tokens={self.max_tokens}]",
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
        )
        _require(
            "temperature",
            self.temperature,
            "a finite number >= 0 (0: greedy)",
            _is_real(self.temperature) and self.temperature >= 0,
        )
        _require("top_k", self.top_k, "an integer >= 0 (0: off)", _is_int(self.top_k) and self.top_k >= 0)
        _require("top_p", self.top_p, "a number in (0, 1] (1: off)", _is_real(self.top_p) and 0 < self.top_p <= 1)
        _require(
            "seed",
            self.seed,
            "None or an integer in [0, 2**63)",
            self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**63),
        )
        _require("ignore_eos", self.ignore_eos, "true or false", isinstance(self.ignore_eos, bool))
        # A bare int is a likely slip for [int]: refused rather than guessed at.
        _require(
            "stop_token_ids", self.stop_token_ids, "a list of token ids", isinstance(self.stop_token_ids, (list, tuple))
        )
        self.stop_token_ids = tuple(_stop_token_id(t, i) for i, t in enumerate(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _require(name: str, value, what: str, ok: bool) -> None:
    if not ok:
        raise InvalidRequestError(f"{name} must be {what}, got {value!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python, not a count


def _is_real(value) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _stop_token_id(value, index: int) -> int:
    """A stop token id as a plain int (numpy integers too; bools are refused); the engine checks it
    against the vocabulary, which it alone knows."""
    try:
        if isinstance(value, bool):
            raise TypeError
        token = operator.index(value)
    except TypeError:
        token = None
    _require(f"stop_token_ids[{index}]", value, "a token id (an integer >= 0)", token is not None and token >= 0)
    return token

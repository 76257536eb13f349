"""A request checked and turned into its sequence: the prompt (text through the tokenizer) and its
stop tokens against the vocabulary, max_tokens clamped to what max_model_len leaves. Shared by the
engine and the replica pool, which checks requests before sending them to a replica."""

import operator
from pathlib import Path

import torch

from sut.errors import InvalidRequestError
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence


def make_sequence(
    prompt: str | list[int],
    params: SamplingParams | None,
    request_id,
    on_token,
    tokenizer,
    vocab_size: int,
    max_model_len: int,
    arrival_time: float | None = None,
) -> Sequence:
    """A request's sequence, after checking its prompt (text needs `tokenizer`) and its stop tokens
    against the vocabulary, and clamping max_tokens to what max_model_len leaves: InvalidRequestError
    naming what is wrong."""
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
    for t in params.stop_token_ids:  # the sampler masks them by index while min_tokens holds
        if t >= vocab_size:
            raise InvalidRequestError(f"stop token id {t} is outside the vocabulary [0, {vocab_size})")
    if isinstance(prompt, str):
        if tokenizer is None:
            raise InvalidRequestError("a text prompt needs a tokenizer, and the model folder has none")
        token_ids = tokenizer.encode(prompt) if prompt else []
    else:
        token_ids = [as_token_id(t, pos) for pos, t in enumerate(prompt)]
    if not token_ids:
        raise InvalidRequestError("prompt is empty")
    for pos, t in enumerate(token_ids):
        if not 0 <= t < vocab_size:
            raise InvalidRequestError(
                f"prompt token id {t} at position {pos} is outside the vocabulary [0, {vocab_size})"
            )
    if len(token_ids) >= max_model_len:
        raise InvalidRequestError(
            f"prompt has {len(token_ids)} tokens; the maximum is {max_model_len - 1} "
            f"(max_model_len={max_model_len}, with room for one new token)"
        )
    max_tokens = min(params.max_tokens, max_model_len - len(token_ids))
    generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
    return Sequence(request_id, token_ids, params, max_tokens, on_token, generator, arrival_time)


def as_token_id(value, pos: int) -> int:
    """An int, numpy integer or 0-d integer tensor as a plain int (bools are refused)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise InvalidRequestError(f"prompt token {value!r} at position {pos} is not an integer token id") from None


def load_tokenizer(folder: Path):
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)

"""What the engine returns for each finished request."""

from dataclasses import dataclass


@dataclass
class RequestOutput:
    request_id: object
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens, including a final EOS
    text: str | None  # detokenized, special tokens skipped (None without a tokenizer)
    finish_reason: str  # "stop", "length", "abort" or "error"
    error: str | None = None
    num_preemptions: int = 0

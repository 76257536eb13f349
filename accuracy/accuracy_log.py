"""Reading LoadGen's mlperf_log_accuracy.json: a JSON list of {"seq_id", "qsl_idx", "data" (hex of
the response bytes), "token_count"}. Entries are de-duplicated by qsl_idx (the first one wins, as
in the reference scripts) and the bytes decoded as token ids (int32 for our SUT)."""

import json
from pathlib import Path

import numpy as np


class AccuracyLogError(ValueError):
    pass


def read_accuracy_log(path: str | Path, dtype=np.int32) -> dict[int, list[int]]:
    """qsl_idx -> generated token ids, in the order the samples first appear."""
    path = Path(path)
    if not path.is_file():
        raise AccuracyLogError(f"{path}: accuracy log not found")
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise AccuracyLogError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(entries, list):
        raise AccuracyLogError(f"{path}: expected a JSON list of responses")
    tokens: dict[int, list[int]] = {}
    itemsize = np.dtype(dtype).itemsize
    for n, entry in enumerate(entries):
        try:
            qsl_idx, data = int(entry["qsl_idx"]), bytes.fromhex(entry["data"])
        except (KeyError, TypeError, ValueError) as e:
            raise AccuracyLogError(f"{path}: entry {n} lacks a valid qsl_idx or hex data ({e!r})") from e
        if len(data) % itemsize:
            raise AccuracyLogError(f"{path}: entry {n} has {len(data)} bytes, not a whole number of {np.dtype(dtype)}")
        if qsl_idx not in tokens:
            tokens[qsl_idx] = np.frombuffer(data, dtype).tolist()
    return tokens

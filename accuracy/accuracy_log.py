"""Reading LoadGen's mlperf_log_accuracy.json: a JSON list of {"seq_id", "qsl_idx", "data" (hex of
the response bytes), "token_count"}, plus "token_data" (the first-token response) in non-Offline
runs. The bytes are decoded as token ids (int32 for our SUT). For scoring, entries are
de-duplicated by qsl_idx (the first one wins, as in the reference scripts); TEST06 reads them all."""

import json
from pathlib import Path

import numpy as np


class AccuracyLogError(ValueError):
    pass


def read_accuracy_entries(path: str | Path, dtype=np.int32, data: bytes | None = None) -> list[dict]:
    """Every entry, in log order, as {"seq_id", "qsl_idx", "data": token ids, "token_count", and (non-Offline
    runs) "token_data": the first-token response's ids}. `data`: the file's bytes, already read."""
    path = Path(path)
    if data is None and not path.is_file():
        raise AccuracyLogError(f"{path}: accuracy log not found")
    try:
        raw = json.loads(path.read_bytes() if data is None else data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AccuracyLogError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(raw, list):
        raise AccuracyLogError(f"{path}: expected a JSON list of responses")
    entries = []
    for n, entry in enumerate(raw):
        where = f"{path}: entry {n}"
        try:
            decoded = {
                "seq_id": entry.get("seq_id"),
                "qsl_idx": int(entry["qsl_idx"]),
                "token_count": entry.get("token_count"),
                "data": _decode_ids(entry["data"], dtype, where),
            }
            if "token_data" in entry:
                decoded["token_data"] = _decode_ids(entry["token_data"], dtype, where)
        except AccuracyLogError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise AccuracyLogError(f"{where} lacks a valid qsl_idx or hex data ({e!r})") from e
        entries.append(decoded)
    return entries


def _decode_ids(hex_data: str, dtype, where: str) -> list[int]:
    data = bytes.fromhex(hex_data)
    if len(data) % np.dtype(dtype).itemsize:
        raise AccuracyLogError(f"{where} has {len(data)} bytes, not a whole number of {np.dtype(dtype)}")
    return np.frombuffer(data, dtype).tolist()


def read_accuracy_log(path: str | Path, dtype=np.int32, data: bytes | None = None) -> dict[int, list[int]]:
    """qsl_idx -> generated token ids, in the order the samples first appear."""
    tokens: dict[int, list[int]] = {}
    for entry in read_accuracy_entries(path, dtype, data):
        tokens.setdefault(entry["qsl_idx"], entry["data"])
    return tokens

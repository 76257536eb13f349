"""LoadGen's logs as data: the detail log's `:::MLLOG` entries and the accuracy log's samples."""

import json
from pathlib import Path

import numpy as np

MLLOG_MARKER = ":::MLLOG"


def read_detail_log(path: Path) -> tuple[dict, list[str]]:
    """`(values by key, messages of every entry LoadGen flagged is_error)`."""
    values, errors = {}, []
    for line in Path(path).read_text().splitlines():
        if not line.startswith(MLLOG_MARKER):
            continue
        entry = json.loads(line[len(MLLOG_MARKER):])
        values[entry["key"]] = entry["value"]
        if entry.get("metadata", {}).get("is_error"):
            errors.append(f"{entry['key']}: {entry['value']}")
    return values, errors


def read_accuracy_samples(path: Path) -> list[dict]:
    """The accuracy log's entries with `data` and `token_data` (when present) decoded to int32 ids."""
    samples = []
    for entry in json.loads(Path(path).read_text()):
        sample = {"qsl_idx": entry["qsl_idx"], "token_count": entry.get("token_count"),
                  "data": np.frombuffer(bytes.fromhex(entry["data"]), dtype=np.int32).tolist()}
        if "token_data" in entry:
            sample["token_data"] = np.frombuffer(bytes.fromhex(entry["token_data"]), dtype=np.int32).tolist()
        samples.append(sample)
    return samples

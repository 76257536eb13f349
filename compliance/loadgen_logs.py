"""LoadGen's detail log as data: its `:::MLLOG` entries."""

import json
from pathlib import Path

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

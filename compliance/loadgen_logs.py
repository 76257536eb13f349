"""LoadGen's detail log as data: its `:::MLLOG` entries, read as the official checker reads them
(tools/submission/submission_checker/parsers/loadgen_parser.py): a key LoadGen logged more than
once (`generic_message`, a repeated `error_runtime`) takes the value of its first entry, and every
entry flagged `is_error` counts, repeated keys included."""

import json
from pathlib import Path

MLLOG_MARKER = ":::MLLOG"
# Written by the harness beside a run's LoadGen logs when the engine speculated: its metrics and
# a "description" of the proposer (sut.config.speculative.SpeculativeConfig.describe).
SPEC_METRICS_FILE = "speculative_decoding.json"
# Written by the harness beside every run's LoadGen logs: its conditions (harness/run.py).
RUN_RECORD = "run.json"
STEPS_FILE = "steps.json"  # beside them: the engine's steps, each its terms and seconds (harness/run.py)


def read_detail_log(path: Path) -> tuple[dict, list[str]]:
    """`(values by key, first entry wins; messages of every entry LoadGen flagged is_error)`."""
    values, errors = {}, []
    for line in Path(path).read_text().splitlines():
        if not line.startswith(MLLOG_MARKER):
            continue
        entry = json.loads(line[len(MLLOG_MARKER) :])
        values.setdefault(entry["key"], entry["value"])
        if entry.get("metadata", {}).get("is_error"):
            errors.append(f"{entry['key']}: {entry['value']}")
    return values, errors

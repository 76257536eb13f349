"""What gpt-oss-120b's and DeepSeek-R1's accuracy scripts (accuracy/gpt_oss.py,
accuracy/deepseek_r1.py) read before they grade: the reference's dataset table (parquet, or a
pickled pandas table, as the references read them) cell by cell, and an accuracy log's responses
decoded with the model folder's tokenizer, with the LiveCodeBench problems those responses are
graded on (accuracy/code_sandbox.py)."""

import math
import pickle
from collections.abc import Mapping
from pathlib import Path

from accuracy.code_sandbox import CodeTests, load_lcb_problems


def read_frame(path: Path, error: type[Exception]):
    """The pandas table in a parquet or pickle file (by its suffix; else parquet, then pickle, as the
    references read them); `error` naming the file and what each reader said where none gives one."""
    import pandas as pd

    def parquet():
        return pd.read_parquet(path)

    def pickled():
        with path.open("rb") as f:
            return pickle.load(f)

    if path.suffix == ".parquet":
        readers = [parquet]
    elif path.suffix in (".pkl", ".pickle"):
        readers = [pickled]
    else:
        readers = [parquet, pickled]  # as the reference: parquet first, then pickle
    errors = []
    for read in readers:
        try:
            frame = read()
        except Exception as e:  # noqa: BLE001 - pyarrow and pickle share no error base
            errors.append(f"{type(e).__name__}: {e}")
            continue
        if isinstance(frame, pd.DataFrame):
            return frame
        errors.append(f"holds a {type(frame).__name__}, not a table")
    raise error(f"{path}: not a parquet or pickled pandas table ({'; '.join(errors)})")


def plain_cell(value):
    """A table cell as a plain Python value; None where it is missing (None, NaN, pandas NA)."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType":
        return None
    return value


def logged_responses(
    log_path: str | Path,
    dataset_path: str | Path,
    records: list[dict],
    tokenizer_dir: str | Path,
    lcb_problems: str | Path | Mapping[str, CodeTests] | None,
    *,
    skip_special_tokens: bool,
    every_entry: bool = False,
) -> tuple[list[tuple[int, str, int]], Mapping[str, CodeTests] | None, int]:
    """An accuracy log's responses to the dataset's `records` (gpt-oss's and DeepSeek-R1's): each
    qsl_idx once, its first entry (`every_entry`: every entry), as (qsl_idx, text decoded with the
    local tokenizer, tokens logged); the LiveCodeBench problems they need (read from `lcb_problems`
    where it is a folder, else as given); and how many entries were left out."""
    from accuracy.accuracy_log import AccuracyLogError, read_accuracy_entries
    from accuracy.evaluate import load_tokenizer

    entries = read_accuracy_entries(log_path)
    if not entries:
        raise AccuracyLogError(f"{log_path}: the accuracy log holds no responses")
    kept, seen = [], set()
    for entry in entries:
        qsl_idx = entry["qsl_idx"]
        if not 0 <= qsl_idx < len(records):
            raise AccuracyLogError(
                f"{log_path}: qsl_idx {qsl_idx} is outside the dataset {dataset_path} of {len(records)} samples"
            )
        if every_entry or qsl_idx not in seen:
            kept.append(entry)
        seen.add(qsl_idx)
    if isinstance(lcb_problems, (str, Path)):
        wanted = {
            str(records[e["qsl_idx"]]["ground_truth"])
            for e in kept
            if "livecodebench" in str(records[e["qsl_idx"]]["dataset"]).lower()
        }
        lcb_problems = load_lcb_problems(lcb_problems, wanted) if wanted else {}
    tokenizer = load_tokenizer(Path(tokenizer_dir))
    texts = tokenizer.batch_decode([e["data"] for e in kept], skip_special_tokens=skip_special_tokens)
    responses = [(e["qsl_idx"], text, len(e["data"])) for e, text in zip(kept, texts)]
    return responses, lcb_problems, len(entries) - len(kept)

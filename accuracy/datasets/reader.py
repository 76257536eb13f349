"""Benchmark datasets in the form the reference implementations read: `cnn_eval.json` for
llama3.1-8b (a JSON list of records with `tok_input`, the prompt's token ids, and `output`, the
reference summary; `input` holds the prompt text). The CPU demo's XSum stand-in is written in the
same form (xsum_demo.py beside it), and so is llama2-70b's OpenOrca set, converted once from its
pickle (openorca.py). A `.parquet` file, as the newer references ship theirs (gpt-oss-120b's), is
read with Hugging Face `datasets` (its Arrow reader, no hub), its prompt in `input_tokens` (or
`tok_input`, which the reference prefers where both are); in a table the reference text `output` is
optional: gpt-oss-120b's sets carry `ground_truth` and `dataset` instead, which its accuracy script
reads from the file itself (accuracy/gpt_oss.py), and so does deepseek-r1's table, written once from
the reference's pickle with its prompts tokenized (deepseek_r1.py beside it; scored by
accuracy/deepseek_r1.py). A pickled table (`.pkl`, which gpt-oss-120b's reference also reads) is
refused by name: unpickling runs code stored in the file, so the harness never reads one at run time
(as for llama2-70b's, openorca.py); the gpt-oss reference now distributes its sets as parquet (its
README).
Every problem names the file, the sample and the field. It lives in accuracy, which owns the
references, so that the reference run and the submission chain read it without the harness."""

import json
from dataclasses import dataclass
from pathlib import Path


class DatasetError(ValueError):
    pass


@dataclass
class Dataset:
    path: Path
    input_ids: list[list[int]]  # QSL index -> prompt token ids
    references: list[str | None]  # QSL index -> reference output text (None: a table without `output`)
    # QSL index -> the response's length to generate (a user's traffic sample that gives lengths,
    # harness/measure/traffic.py); None where the benchmark's generation settings decide, as for every benchmark
    output_tokens: list[int | None] | None = None

    def __len__(self):
        return len(self.input_ids)


def load_dataset(path: str | Path) -> Dataset:
    """The dataset at `path`: a JSON list of samples, or a parquet table with the same fields."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: dataset file not found (for the demo, run `make data`)")
    if path.suffix == ".parquet":
        return _checked(path, _parquet_records(path), needs_output=False)
    if path.suffix in (".pkl", ".pickle"):
        raise DatasetError(
            f"{path}: a pickled table, and unpickling runs code stored in the file, so the harness never "
            "reads one at run time: use the reference's parquet file of the same set (gpt-oss-120b's sets are "
            "distributed as parquet), or convert this one once, if you trust it: "
            "python -c 'import pandas, sys; pandas.read_pickle(sys.argv[1]).to_parquet(sys.argv[2])' IN.pkl OUT.parquet"
            " (deepseek-r1's, whose prompts are text: python -m accuracy.datasets.deepseek_r1 convert)"
        )
    return _checked(path, _json_records(path))


def _parquet_records(path: Path) -> list[dict]:
    from datasets import Dataset as ArrowTable

    try:
        table = ArrowTable.from_parquet(str(path), keep_in_memory=True)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors name no common base
        raise DatasetError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None
    if "tok_input" not in table.column_names and "input_tokens" in table.column_names:
        table = table.rename_column("input_tokens", "tok_input")
    if not len(table):
        raise DatasetError(f"{path}: expected a non-empty table of samples")
    return table.to_list()


def _json_records(path: Path) -> list:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}: not a UTF-8 text file (binary data at byte {e.start}); the dataset is a JSON list "
            "of samples (for llama2-70b's pickle, convert it first: `python -m accuracy.datasets.openorca "
            "convert`)"
        ) from None
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(records, list) or not records:
        raise DatasetError(f"{path}: expected a non-empty JSON list of samples")
    return records


def _checked(path: Path, records: list, needs_output: bool = True) -> Dataset:
    input_ids, references, lengths = [], [], []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise DatasetError(f"{path}: sample {i} is not an object")
        for field in ("tok_input", "output") if needs_output else ("tok_input",):
            if field not in record:
                raise DatasetError(f"{path}: sample {i} has no {field!r} field")
        ids = record["tok_input"]
        if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
            raise DatasetError(f"{path}: sample {i} field 'tok_input' must be a non-empty list of token ids")
        if not isinstance(record.get("output"), str) and (needs_output or record.get("output") is not None):
            raise DatasetError(f"{path}: sample {i} field 'output' must be a string")
        length = record.get("output_tokens")
        if length is not None and (type(length) is not int or length < 1):
            raise DatasetError(f"{path}: sample {i} field 'output_tokens' must be a positive integer")
        input_ids.append(ids)
        references.append(record.get("output"))
        lengths.append(length)
    return Dataset(path, input_ids, references, lengths if any(n is not None for n in lengths) else None)

"""The llama2-70b-99.9 dataset: MLPerf's OpenOrca pickle, converted once into the cnn_eval.json form
that `accuracy.datasets.reader.load_dataset` reads, so that no pickle is loaded at run time.

    python -m accuracy.datasets.openorca convert --pickle open_orca_gpt4_tokenized_llama.sampled_24576.pkl \\
        --out open_orca_24576.json [--trust-pickle]

The official file is a pandas DataFrame written by the reference's processorca.py
(INF:language/llama2-70b/processorca.py): one row per sample, with columns `id`, `system_prompt`,
`question`, `output` (the GPT-4 response: the accuracy reference), `input` (the prompt in Llama-2 chat
form), `tok_input` (its token ids, ending with 29871), `tok_output`, `tok_input_length`,
`tok_output_length` and `origin`. The reference SUT sends `tok_input` to the model and
evaluate-accuracy.py scores against `output`; row i is QSL index i. MLCommons also serves it gzipped
(`.pkl.gz`); both forms are accepted.

Unpickling runs whatever code the file names. The file is unpickled only when its SHA-256 is in
OFFICIAL_SHA256, or with --trust-pickle. The bytes are hashed and unpickled from the same read, so the
file cannot change between the check and the load."""

import argparse
import gzip
import hashlib
import io
import json
import sys
from pathlib import Path

from accuracy.datasets.reader import DatasetError, load_dataset

# SHA-256 digests of the official file as MLCommons publishes them. None is published: as of
# mlcommons/inference b66003e (2026-08-20), language/llama2-70b/README.md gives only download
# commands (the MLC R2 downloader, rclone) and processorca.py; the MLC automation scripts
# (mlperf-automations get-preprocessed-dataset-openorca) carry no checksum either, not even an md5.
# The R2 downloader's metadata file (inference.mlcommons-storage.org) could not be checked from here.
# Add a digest only from an MLCommons source; until then conversion needs --trust-pickle.
OFFICIAL_SHA256: set[str] = set()

REQUIRED_COLUMNS = ("input", "tok_input", "output")


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_trusted_bytes(
    path: Path, trust_pickle: bool, official: set[str] | None = None, what: str = "OpenOrca pickle"
) -> tuple[bytes, str]:
    """The file's bytes and SHA-256, once they are known to be safe to unpickle: its digest is one of
    `official` (default OFFICIAL_SHA256), or the user trusts it. `what`: the file's name in errors."""
    official = OFFICIAL_SHA256 if official is None else official
    if not path.is_file():
        raise DatasetError(f"{path}: {what} not found")
    data = path.read_bytes()
    digest = file_sha256(data)
    if digest not in official and not trust_pickle:
        known = "no official SHA-256 is published" if not official else "it matches no official SHA-256"
        raise DatasetError(
            f"{path}: SHA-256 {digest}: {known}, and unpickling runs code stored in the file, "
            "so it was not loaded; if you trust this file, convert it with --trust-pickle"
        )
    return data, digest


def unpickle_frame(path: Path, data: bytes, columns: tuple[str, ...] = REQUIRED_COLUMNS):
    """The pandas DataFrame pickled in `data` (gzipped for a .gz name), with every one of `columns`
    and at least one row."""
    import pandas as pd

    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DatasetError(f"{path}: not a valid gzip file ({e})") from e
    try:
        frame = pd.read_pickle(io.BytesIO(data))
    except Exception as e:  # a pickle can fail in any way
        raise DatasetError(f"{path}: could not unpickle ({e!r})") from e
    if not isinstance(frame, pd.DataFrame):
        raise DatasetError(f"{path}: expected a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DatasetError(f"{path}: the DataFrame has no {missing[0]!r} column (columns: {list(frame.columns)})")
    if frame.empty:
        raise DatasetError(f"{path}: the DataFrame has no rows")
    return frame


def token_ids(value) -> list[int] | None:
    """A list of non-negative ints from a list, tuple or numpy array of integers; None otherwise."""
    import numpy as np

    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            return None
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    ids = [int(t) for t in value if isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0]
    return ids if len(ids) == len(value) else None


def frame_to_records(path: Path, frame) -> list[dict]:
    records = []
    for i, (text, ids, output) in enumerate(zip(frame["input"], frame["tok_input"], frame["output"])):
        checked_ids = token_ids(ids)
        if checked_ids is None:
            raise DatasetError(
                f"{path}: row {i} field 'tok_input' must be a non-empty list of token ids, got {str(ids)[:80]}"
            )
        for field, value in (("input", text), ("output", output)):
            if not isinstance(value, str):
                raise DatasetError(f"{path}: row {i} field {field!r} must be a string, got {type(value).__name__}")
        records.append({"input": text, "tok_input": checked_ids, "output": output})
    return records


def convert(pickle_path: str | Path, out_path: str | Path, trust_pickle: bool = False) -> str:
    """Write the pickle's samples to out_path as cnn_eval.json records and load them back; return a
    one-line summary with the source's SHA-256."""
    pickle_path, out_path = Path(pickle_path), Path(out_path)
    data, digest = read_trusted_bytes(pickle_path, trust_pickle)
    records = frame_to_records(pickle_path, unpickle_frame(pickle_path, data))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(records))
    dataset = load_dataset(out_path)
    return f"wrote {len(dataset)} samples to {out_path} from {pickle_path} (SHA-256 {digest})"


def converter_args(prog: str, description: str, command_help: str, required: dict[str, str]) -> argparse.Namespace:
    """A pickle converter's command line (this one's and deepseek_r1.py's): `convert`, its `required`
    options (flag -> help, in order) and --trust-pickle."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    convert_parser = sub.add_parser("convert", help=command_help)
    for flag, text in required.items():
        convert_parser.add_argument(flag, required=True, help=text)
    convert_parser.add_argument(
        "--trust-pickle",
        action="store_true",
        help="unpickle even though the file's SHA-256 is not a known official one",
    )
    return parser.parse_args()


def main() -> None:
    args = converter_args(
        "python -m accuracy.datasets.openorca",
        "Convert the llama2-70b OpenOrca pickle into cnn_eval.json form.",
        "pickle -> JSON, once",
        {"--pickle": "open_orca_gpt4_tokenized_llama.sampled_24576.pkl[.gz]", "--out": "the JSON file to write"},
    )
    try:
        print(convert(args.pickle, args.out, args.trust_pickle))
    except DatasetError as e:
        sys.exit(f"openorca: {e}")


if __name__ == "__main__":
    main()

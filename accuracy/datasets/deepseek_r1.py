"""The deepseek-r1 dataset: MLPerf's pickle, its prompts tokenized once with the model folder's
tokenizer and written as a parquet table that `accuracy.datasets.reader.load_dataset` reads, so that no
pickle is loaded at run time.

    python -m accuracy.datasets.deepseek_r1 convert --pickle mlperf_deepseek_r1_dataset_4388_fp8_eval.pkl \\
        --model MODEL_DIR --out deepseek_r1_4388.parquet [--trust-pickle]

The official file (INF:language/deepseek-r1/README.md, "Dataset Download"; the 500-sample calibration
pickle has the same form) is a pandas DataFrame, one row per sample, row i being QSL index i:
`text_input` (the question as the model is asked it), `ground_truth`, `dataset` (aime, math500, gpqa,
mmlu_pro or livecodebench: which grader scores it) and `question`. The reference tokenizes each
prompt as one user turn of the model's chat template with the assistant's turn opened
(`apply_chat_template([{"role": "user", "content": text_input}], add_generation_prompt=True)`,
utils/tokenization.py); the same is done here. Its questions are at most MAX_ISL = 3136 tokens, and it
allows the chat template MAX_TEMPLATE_TOKS = 4 more (utils/backend_registry.py: vLLM's max_input_len is
their sum; systems/benchmarks.py), so a templated prompt longer than that is refused, naming the row.

The table written holds `tok_input` (the prompt's ids), `text_input`, `dataset`, `ground_truth` (as
text: the accuracy script reads it, accuracy/deepseek_r1.py) and `question`. As for llama2-70b's
pickle (openorca.py beside it), the file is unpickled only when its SHA-256 is in OFFICIAL_SHA256, or
with --trust-pickle."""

import math
import sys
from pathlib import Path

from accuracy.datasets.openorca import converter_args, read_trusted_bytes, unpickle_frame
from accuracy.datasets.reader import DatasetError, load_dataset
from systems.benchmarks import BENCHMARKS

# SHA-256 digests of the official file as MLCommons publishes them: none is published in
# mlcommons/inference b66003e (language/deepseek-r1/README.md gives the R2 downloader's command only).
# Add one only from an MLCommons source; until then conversion needs --trust-pickle.
OFFICIAL_SHA256: set[str] = set()

REQUIRED_COLUMNS = ("text_input", "dataset", "ground_truth")
BENCHMARK = BENCHMARKS["deepseek-r1"]


def chat_prompt(tokenizer, text: str) -> list[int]:
    """The prompt's ids as the reference makes them: one user turn, the assistant's turn opened."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding unless told otherwise
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType"


def truth_text(value) -> str | None:
    """A ground truth as text (the table's column holds one type): integers plainly ("204", also for a
    float 204.0, which the reference's int() reads as 204), None where it is missing."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if _missing(value):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def tokenized_records(path: Path, frame, tokenizer, max_tokens: int) -> list[dict]:
    """One record per row: the templated prompt's ids and the columns the accuracy script reads.
    DatasetError naming the row for an empty prompt, or one over `max_tokens` tokens."""
    from tqdm import tqdm

    questions = frame["question"] if "question" in frame.columns else [None] * len(frame)
    records = []
    rows = zip(frame["text_input"], frame["dataset"], frame["ground_truth"], questions)
    for i, (text, name, truth, question) in enumerate(tqdm(rows, total=len(frame), desc="tokenizing", disable=None)):
        if _missing(text) or not isinstance(text, str) or not text.strip():
            raise DatasetError(f"{path}: row {i} field 'text_input' is empty: every sample needs a prompt")
        if _missing(name) or not str(name).strip():
            raise DatasetError(f"{path}: row {i} field 'dataset' is empty: it names the grader that scores the sample")
        ids = chat_prompt(tokenizer, text)
        if len(ids) > max_tokens:
            raise DatasetError(
                f"{path}: row {i}: its prompt is {len(ids)} tokens with the chat template, over {max_tokens}, "
                f"deepseek-r1's maximum input length ({BENCHMARK.max_input_tokens} tokens and "
                f"{BENCHMARK.chat_template_tokens} for the template)"
            )
        records.append(
            {
                "tok_input": ids,
                "text_input": text,
                "dataset": str(name),
                "ground_truth": truth_text(truth),
                "question": None if _missing(question) else str(question),
            }
        )
    return records


def convert(
    pickle_path: str | Path,
    model_dir: str | Path,
    out_path: str | Path,
    trust_pickle: bool = False,
    max_tokens: int | None = None,
) -> str:
    """Write the pickle's samples, tokenized with `model_dir`'s tokenizer, to out_path as parquet and
    load them back; return a one-line summary with the source's SHA-256. `max_tokens`: the longest
    templated prompt allowed (default: deepseek-r1's, 3136 + 4)."""
    import pandas as pd

    from accuracy.evaluate import TokenizerError, load_tokenizer

    pickle_path, out_path = Path(pickle_path), Path(out_path)
    data, digest = read_trusted_bytes(pickle_path, trust_pickle, OFFICIAL_SHA256, "deepseek-r1 dataset pickle")
    frame = unpickle_frame(pickle_path, data, REQUIRED_COLUMNS)
    try:
        tokenizer = load_tokenizer(Path(model_dir))
    except TokenizerError as e:
        raise DatasetError(str(e)) from None
    records = tokenized_records(pickle_path, frame, tokenizer, max_tokens or BENCHMARK.max_prompt_tokens)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame.from_records(records).to_parquet(out_path, index=False)
    dataset = load_dataset(out_path)
    longest = max(len(ids) for ids in dataset.input_ids)
    return (
        f"wrote {len(dataset)} samples to {out_path} from {pickle_path} (SHA-256 {digest}), "
        f"prompts up to {longest} tokens"
    )


def main() -> None:
    args = converter_args(
        "python -m accuracy.datasets.deepseek_r1",
        "Tokenize the deepseek-r1 dataset pickle into a parquet table the harness reads.",
        "pickle -> parquet, once",
        {
            "--pickle": "mlperf_deepseek_r1_dataset_4388_fp8_eval.pkl",
            "--model": "the model folder whose tokenizer makes the prompts",
            "--out": "the parquet file to write",
        },
    )
    try:
        print(convert(args.pickle, args.model, args.out, args.trust_pickle))
    except DatasetError as e:
        sys.exit(f"deepseek_r1: {e}")


if __name__ == "__main__":
    main()

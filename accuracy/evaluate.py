"""Score an accuracy-mode run the way the MLPerf summarization scripts do: decode the accuracy
log's token ids (int32), detokenize with special tokens skipped, ROUGE against the dataset's
references, and write accuracy.txt, ending, as the official truncation step leaves it, with the
`hash=` line of the accuracy log it was computed from (the packager checks the two agree).
gpt-oss-120b's and deepseek-r1's runs are scored by their own scripts, accuracy/gpt_oss.py and
accuracy/deepseek_r1.py (harness/run.py score)."""

import hashlib
import re
from pathlib import Path

from accuracy.accuracy_log import AccuracyLogError, read_accuracy_log
from accuracy.report import format_accuracy_txt, summarization_accuracy

HASH_LINE = re.compile(r"^hash=([0-9a-f]{64})$", re.MULTILINE)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class TokenizerError(ValueError):
    """A model folder whose tokenizer, which scoring needs, is missing or does not load."""


def load_tokenizer(model_dir: Path):
    """The model folder's tokenizer; TokenizerError in one line when it has none or it fails to load
    (before a run that will need it, not after)."""
    model_dir = Path(model_dir)
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise TokenizerError(
            f"{model_dir}: the model folder has no tokenizer ({' or '.join(TOKENIZER_FILES)}), "
            "which scoring an accuracy run needs"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the first line says which
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TokenizerError(f"{model_dir}: its tokenizer does not load ({type(e).__name__}: {first})") from None


def accuracy_log_hash(accuracy_txt: str) -> str | None:
    """The SHA-256 that accuracy.txt's `hash=` line gives, or None."""
    match = HASH_LINE.search(accuracy_txt)
    return match.group(1) if match else None


def evaluate_summarization(log_path: Path, references: list[str], tokenizer, out_path: Path) -> dict:
    data = Path(log_path).read_bytes()  # hashed and parsed from one read: the score is of these bytes
    tokens = read_accuracy_log(log_path, data=data)
    unknown = [i for i in tokens if not 0 <= i < len(references)]
    if unknown:
        raise AccuracyLogError(f"{log_path}: qsl_idx {unknown[:3]} outside the dataset of {len(references)} samples")
    order = sorted(tokens)
    predictions = tokenizer.batch_decode([tokens[i] for i in order], skip_special_tokens=True)
    result = summarization_accuracy(predictions, [references[i] for i in order], [len(tokens[i]) for i in order])
    out_path.write_text(format_accuracy_txt(result) + f"hash={hashlib.sha256(data).hexdigest()}\n")
    return result

"""Score an accuracy-mode run the way the MLPerf summarization scripts do: decode the accuracy
log's token ids (int32), detokenize with special tokens skipped, ROUGE against the dataset's
references, and write accuracy.txt."""

from pathlib import Path

from accuracy.accuracy_log import AccuracyLogError, read_accuracy_log
from accuracy.report import format_accuracy_txt, summarization_accuracy


def evaluate_summarization(log_path: Path, references: list[str], tokenizer, out_path: Path) -> dict:
    tokens = read_accuracy_log(log_path)
    unknown = [i for i in tokens if not 0 <= i < len(references)]
    if unknown:
        raise AccuracyLogError(f"{log_path}: qsl_idx {unknown[:3]} outside the dataset of {len(references)} samples")
    order = sorted(tokens)
    predictions = tokenizer.batch_decode([tokens[i] for i in order], skip_special_tokens=True)
    result = summarization_accuracy(predictions, [references[i] for i in order], [len(tokens[i]) for i in order])
    out_path.write_text(format_accuracy_txt(result))
    return result

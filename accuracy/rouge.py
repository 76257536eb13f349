"""ROUGE as the MLPerf summarization scripts compute it: strip, one sentence per line (for
rougeLsum), google-research rouge_score with the Porter stemmer, F-measure per sample, mean x 100
rounded to 4 places; gen_len is the total characters of the post-processed predictions."""

from rouge_score.rouge_scorer import RougeScorer

from accuracy.sentences import sent_tokenize

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def postprocess(texts: list[str]) -> list[str]:
    return ["\n".join(sent_tokenize(text.strip())) for text in texts]


def rouge_scores(predictions: list[str], references: list[str]) -> dict:
    """{'rouge1', 'rouge2', 'rougeL', 'rougeLsum', 'gen_len', 'gen_num'} with plain float/int values."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    preds, refs = postprocess(predictions), postprocess(references)
    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for pred, ref in zip(preds, refs):
        scores = scorer.score(ref, pred)  # (target, prediction), as HF evaluate calls it
        for key in ROUGE_TYPES:
            totals[key] += scores[key].fmeasure
    result = {key: round(float(total / len(preds) * 100), 4) for key, total in totals.items()}
    result["gen_len"] = int(sum(len(p) for p in preds))
    result["gen_num"] = len(preds)
    return result

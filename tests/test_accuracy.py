"""Accuracy scripts: sentence splitting, ROUGE, the accuracy log, accuracy.txt and targets."""

import json
import re

import numpy as np
import pytest
from rouge_score.rouge_scorer import RougeScorer

from accuracy.accuracy_log import AccuracyLogError, read_accuracy_log
from accuracy.report import check_targets, format_accuracy_txt, reference_targets, summarization_accuracy, targets_for
from accuracy.rouge import postprocess, rouge_scores
from accuracy.sentences import sent_tokenize

TEXTS = [
    "Mr. Smith went to Washington. He arrived at 5 p.m. on Jan. 3. It was cold.",
    'The U.S. economy grew 2.5% in Q3, said Dr. Jones of the Fed. Markets rose. "Good news," she said.',
    "  A single sentence without a final stop  ",
    "Prices fell 3.5 per cent. Ltd. firms in the U.K. were hit hardest... Analysts expect more cuts!",
]
PREDICTIONS = [
    "The cat sat on the mat. It was happy.",
    "Stocks fell sharply on Monday after the report.",
    "Rain is expected in the north. Winds will be strong.",
    "Nothing to see here.",
]
REFERENCES = [
    "A cat sat on a mat and was happy.",
    "Shares dropped on Monday following the jobs report.",
    "Heavy rain and strong winds are forecast for northern areas.",
    "The council met on Tuesday.",
]


def test_sentence_split_matches_the_punkt_packages_own_splitter():
    import punkt

    for text in TEXTS:
        assert sent_tokenize(text) == punkt.sent_tokenize(text)
    assert sent_tokenize(TEXTS[0]) == [
        "Mr. Smith went to Washington.",
        "He arrived at 5 p.m. on Jan. 3.",
        "It was cold.",
    ]


def test_rouge_equals_rouge_scores_own_scorer():
    scorer = RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    preds, refs = postprocess(PREDICTIONS), postprocess(REFERENCES)
    per_sample = [scorer.score(r, p) for p, r in zip(preds, refs)]
    ours = rouge_scores(PREDICTIONS, REFERENCES)
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        expected = float(np.mean([s[key].fmeasure for s in per_sample]) * 100)
        assert ours[key] == pytest.approx(expected, abs=5e-5)
    assert ours["gen_len"] == sum(len(p) for p in preds) and ours["gen_num"] == 4


def test_rouge_on_hand_checked_cases():
    assert rouge_scores(["the cat sat"], ["the cat sat on the mat"])["rouge1"] == 66.6667  # P=1, R=1/2
    assert rouge_scores(["a b c"], ["a b c"])["rougeLsum"] == 100.0
    assert rouge_scores(["x y"], ["a b"])["rouge2"] == 0.0
    # rougeLsum scores per sentence line: splitting changes it, plain rougeL does not.
    two = rouge_scores(["It rained. The match was off."], ["The match was off. It rained."])
    assert two["rougeLsum"] == 100.0 and two["rougeL"] < 100.0


def write_log(path, entries):
    path.write_text(
        json.dumps(
            [
                {
                    "seq_id": i,
                    "qsl_idx": q,
                    "data": np.array(ids, dtype=np.int32).tobytes().hex(),
                    "token_count": len(ids),
                }
                for i, (q, ids) in enumerate(entries)
            ]
        )
    )


def test_accuracy_log_decodes_int32_and_dedupes_by_qsl_idx(tmp_path):
    log = tmp_path / "mlperf_log_accuracy.json"
    write_log(log, [(3, [5, 6, 2]), (0, [49151, 7]), (3, [9, 9])])
    assert read_accuracy_log(log) == {3: [5, 6, 2], 0: [49151, 7]}


def test_accuracy_log_errors(tmp_path):
    with pytest.raises(AccuracyLogError, match="accuracy log not found"):
        read_accuracy_log(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"qsl_idx": 1, "data": "0a0b0c"}]')
    with pytest.raises(AccuracyLogError, match="3 bytes, not a whole number of int32"):
        read_accuracy_log(bad)
    bad.write_text('[{"data": "00000000"}]')
    with pytest.raises(AccuracyLogError, match="entry 0 lacks a valid qsl_idx"):
        read_accuracy_log(bad)


def test_accuracy_txt_matches_the_checker_patterns():
    result = summarization_accuracy(PREDICTIONS, REFERENCES, [12, 10, 14, 5])
    result["rouge1"] = np.float64(result["rouge1"])  # what numpy would leave there
    result["gen_len"] = np.int64(result["gen_len"])
    text = format_accuracy_txt(result)
    assert "np." not in text
    assert text.startswith("\nResults\n\n{'rouge1': ")
    assert float(re.search(r"'rouge1':\s+'?([\d.]+)", text).group(1)) == pytest.approx(float(result["rouge1"]))
    assert int(re.search(r"'gen_len':\s([\d.]+)", text).group(1)) == result["gen_len"]
    assert float(re.search(r"'tokens_per_sample':\s([\d.]+)", text).group(1)) == 10.2


def test_targets():
    targets = targets_for("llama3.1-8b")
    good = {"rouge1": 38.5, "rouge2": 15.8, "rougeL": 24.3, "rougeLsum": 35.5, "gen_len": 8_000_000}
    assert check_targets(targets, good) == []
    low = {**good, "rouge2": 15.0, "gen_len": 9_500_000}
    failures = check_targets(targets, low)
    assert len(failures) == 2 and failures[0].startswith("rouge2 = 15.0 is not >= 15.7484")
    assert check_targets(targets_for("llama2-70b-99.9"), {"rouge1": 45, "rouge2": 23, "rougeL": 29}) == [
        "tokens_per_sample: missing from the result"
    ]
    with pytest.raises(KeyError, match="no accuracy targets for benchmark 'gptj'"):
        targets_for("gptj")


def test_reference_targets_are_99_percent_of_the_reference():
    reference = {"rouge1": 20.0, "rouge2": 5.0, "rougeL": 15.0, "rougeLsum": 16.0, "gen_len": 1000}
    targets = reference_targets(reference)
    assert targets["rouge1"] == (19.8, None) and targets["gen_len"] == (900.0, 1100.0)
    assert check_targets(targets, {**reference, "rouge2": 4.96}) == []
    assert check_targets(targets, {**reference, "rouge2": 4.94}) == ["rouge2 = 4.94 is not >= 4.9500"]

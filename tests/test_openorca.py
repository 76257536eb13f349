"""llama2-70b-99.9: the OpenOrca pickle converted once into cnn_eval.json form (never unpickled
before its hash is checked or the user opts in), the benchmark's LoadGen settings, and its accuracy
result as llama2's evaluate-accuracy.py prints it."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from accuracy.datasets import openorca
from accuracy.datasets.reader import DatasetError, load_dataset
from tests.test_kernels_name import REPO


def official_frame() -> pd.DataFrame:
    """Two rows with the columns processorca.py writes."""
    prompts = ["<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nName a colour. [/INST]", "<s>[INST] Count to two. [/INST]"]
    return pd.DataFrame(
        {
            "id": ["flan.1", "cot.7"],
            "system_prompt": ["Be brief.", ""],
            "question": ["Name a colour.", "Count to two."],
            "output": ["Blue is a colour.", "One, two."],
            "input": prompts,
            "tok_input": [[1, 518, 25580, 29871], np.array([1, 518, 3917, 29871], dtype=np.int64)],
            "tok_output": [[10, 11, 12], [13, 14]],
            "tok_input_length": [4, 4],
            "tok_output_length": [3, 2],
            "origin": ["flan", "cot"],
        }
    )


@pytest.fixture
def official_pickle(tmp_path):
    path = tmp_path / "open_orca_gpt4_tokenized_llama.sampled_24576.pkl"
    official_frame().to_pickle(path)
    return path


@pytest.mark.parametrize("name", ["orca.pkl", "orca.pkl.gz"])
def test_converted_samples_load_with_the_json_loader(tmp_path, name):
    path = tmp_path / name
    official_frame().to_pickle(path)  # pandas gzips a .gz name, as MLCommons serves the file
    out = tmp_path / "json" / "open_orca.json"
    summary = openorca.convert(path, out, trust_pickle=True)
    assert summary.startswith(f"wrote 2 samples to {out}")
    data = load_dataset(out)
    assert data.input_ids == [[1, 518, 25580, 29871], [1, 518, 3917, 29871]]
    assert data.references == ["Blue is a colour.", "One, two."]
    assert [r["input"] for r in json.loads(out.read_text())] == list(official_frame()["input"])


def test_unknown_hash_is_refused_without_the_opt_in(official_pickle, tmp_path):
    out = tmp_path / "out.json"
    with pytest.raises(
        DatasetError,
        match=f"{official_pickle}: SHA-256 [0-9a-f]{{64}}: no official SHA-256 "
        "is published.*convert it with --trust-pickle",
    ):
        openorca.convert(official_pickle, out)
    assert not out.exists()


def test_a_file_with_an_official_hash_needs_no_opt_in(official_pickle, tmp_path, monkeypatch):
    digest = hashlib.sha256(official_pickle.read_bytes()).hexdigest()
    monkeypatch.setattr(openorca, "OFFICIAL_SHA256", {"0" * 64})
    with pytest.raises(DatasetError, match="it matches no official SHA-256"):
        openorca.convert(official_pickle, tmp_path / "out.json")
    monkeypatch.setattr(openorca, "OFFICIAL_SHA256", {digest})
    assert f"(SHA-256 {digest})" in openorca.convert(official_pickle, tmp_path / "out.json")


class MakesMarker:
    """Unpickling this runs os.mkdir(marker): the code a hostile pickle could run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_nothing_is_unpickled_before_the_hash_check(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "hostile.pkl"
    pd.to_pickle(MakesMarker(marker), path)
    with pytest.raises(DatasetError, match="hostile.pkl: SHA-256"):
        openorca.convert(path, tmp_path / "out.json")
    assert not marker.exists()
    # The payload is real: with the opt-in it runs, and what it returns is not a DataFrame.
    with pytest.raises(DatasetError, match="hostile.pkl: expected a pandas DataFrame, got NoneType"):
        openorca.convert(path, tmp_path / "out.json", trust_pickle=True)
    assert marker.is_dir()


def test_missing_file_and_missing_column(tmp_path):
    with pytest.raises(DatasetError, match="none.pkl: OpenOrca pickle not found"):
        openorca.convert(tmp_path / "none.pkl", tmp_path / "out.json", trust_pickle=True)
    path = tmp_path / "orca.pkl"
    official_frame().drop(columns=["output"]).to_pickle(path)
    with pytest.raises(DatasetError, match=r"orca.pkl: the DataFrame has no 'output' column \(columns: \['id'"):
        openorca.convert(path, tmp_path / "out.json", trust_pickle=True)


@pytest.mark.parametrize("ids", [[], [1, -2], [1, "2"], [1, 2.5], [True, 1], np.array([1.0, 2.0])])
def test_bad_token_ids_name_the_row(tmp_path, ids):
    frame = official_frame()
    frame.at[1, "tok_input"] = ids
    path = tmp_path / "orca.pkl"
    frame.to_pickle(path)
    with pytest.raises(DatasetError, match="orca.pkl: row 1 field 'tok_input' must be a non-empty list of token ids"):
        openorca.convert(path, tmp_path / "out.json", trust_pickle=True)


def test_cli(official_pickle, tmp_path):
    out = tmp_path / "out.json"
    module = "accuracy.datasets.openorca"
    command = [sys.executable, "-m", module, "convert", "--pickle", str(official_pickle), "--out", str(out)]
    refused = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert refused.returncode != 0 and f"openorca: {official_pickle}: SHA-256" in refused.stderr
    done = subprocess.run(command + ["--trust-pickle"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and f"wrote 2 samples to {out}" in done.stdout


def test_llama2_benchmark_uses_loadgens_llama2_settings(tmp_path):
    import mlperf_loadgen as lg

    from systems.benchmarks import BENCHMARKS

    benchmark = BENCHMARKS["llama2-70b-99.9"]
    assert benchmark.max_new_tokens == 1024
    assert benchmark.loadgen_name("Interactive") == "llama2-70b-interactive"
    user_conf = tmp_path / "user.conf"
    user_conf.write_text("llama2-70b.Offline.target_qps = 1\n")
    settings = lg.TestSettings()
    # mlperf.conf named, as harness/run.py does: LoadGen loads it by itself on a process's first
    # FromConfig only, and another test in this process may have made that call.
    assert settings.FromConfig("", benchmark.loadgen_name("Offline"), "Offline", 0) == 0
    assert settings.FromConfig(str(user_conf), benchmark.loadgen_name("Offline"), "Offline") == 0
    assert settings.min_query_count == 24576 and settings.performance_sample_count_override == 24576


class WordTokenizer:
    """Token id i decodes to the word w<i>."""

    def batch_decode(self, ids, skip_special_tokens):
        return [" ".join(f"w{i}" for i in sample) for sample in ids]


def test_llama2_accuracy_result_is_what_evaluate_accuracy_prints(tmp_path):
    from accuracy.evaluate import evaluate_summarization
    from accuracy.report import check_targets, targets_for

    log = tmp_path / "mlperf_log_accuracy.json"
    entries = [(1, [3, 4, 5]), (0, [1, 2]), (1, [9])]  # qsl_idx 1 twice: the first one counts
    log.write_text(
        json.dumps(
            [
                {"seq_id": n, "qsl_idx": q, "data": np.array(ids, np.int32).tobytes().hex()}
                for n, (q, ids) in enumerate(entries)
            ]
        )
    )
    result = evaluate_summarization(log, ["w1 w2", "w3 w4 w6"], WordTokenizer(), tmp_path / "accuracy.txt")
    assert list(result) == [
        "rouge1",
        "rouge2",
        "rougeL",
        "rougeLsum",
        "gen_len",
        "gen_num",
        "gen_tok_len",
        "tokens_per_sample",
    ]
    assert (result["rouge1"], result["gen_len"], result["gen_num"], result["gen_tok_len"]) == (83.3333, 13, 2, 5)
    assert result["tokens_per_sample"] == 2.5
    assert "'tokens_per_sample': 2.5}" in (tmp_path / "accuracy.txt").read_text()
    failures = check_targets(targets_for("llama2-70b-99.9"), result)
    assert failures[-1] == "tokens_per_sample = 2.5 is not in [265.0050, 323.8950]"

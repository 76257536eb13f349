"""A user's traffic sample (harness/traffic.py): the example file converted with the model's
tokenizer, every bad line refused by name, and a LoadGen run on it through `harness run --dataset`
whose responses have exactly the lengths the sample gives."""

import json
import subprocess
import sys

import pytest

from accuracy.dataset import load_dataset
from harness.traffic import EXAMPLE, TrafficError, convert, mean_interval_s, read_lines
from systems.schema import REPO
from tests.helpers import SMOLLM2_DIR, tiny_model_and_dataset


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2_DIR)


def test_the_example_converts_to_a_dataset_with_its_lengths_references_and_arrivals(tokenizer, tmp_path):
    lines = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    arrivals = convert(EXAMPLE, tokenizer, tmp_path / "traffic.json")
    dataset = load_dataset(tmp_path / "traffic.json")
    assert len(dataset) == len(lines) == 12
    for line, ids, reference, length in zip(lines, dataset.input_ids, dataset.references, dataset.output_tokens):
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": line["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        assert ids == tokenizer.encode(chat, add_special_tokens=False)
        assert reference == line.get("reference", "") and length == line["output_tokens"]
    assert arrivals == [line["arrival_s"] for line in lines]
    assert mean_interval_s(arrivals) == pytest.approx(6.3 / 11)


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 2: not JSON"),
        ('{"prompt": "a", "prompt_token_ids": [1], "output_tokens": 3}', "line 2: give the prompt as 'prompt'"),
        ('{"prompt": "a"}', "line 2: give the response's 'output_tokens'"),
        ('{"prompt": "a", "output_tokens": 0}', "line 2: 'output_tokens' must be a positive integer"),
        ('{"prompt": "a", "output_tokens": 3, "arrival": 1}', "line 2: unknown fields \\['arrival'\\]"),
        ('{"prompt": "a", "output_tokens": 3, "arrival_s": -1}', "line 2: 'arrival_s' must be a number"),
        ('{"prompt": "a", "output_tokens": 3}', "line 2 has no 'arrival_s' where others do"),
        ('{"prompt": "a", "output_tokens": 3, "arrival_s": 0.5}', "'arrival_s' goes back in time"),
        ('{"prompt_token_ids": [1, 99999999], "output_tokens": 3, "arrival_s": 2}', "line 2: 'prompt_token_ids'"),
        ('{"prompt": " ", "output_tokens": 3, "arrival_s": 2}', "line 2: 'prompt' must be non-empty text"),
    ],
)
def test_a_bad_traffic_line_is_refused_by_its_number_and_field(tokenizer, tmp_path, line, message):
    path = tmp_path / "traffic.jsonl"
    path.write_text('{"prompt": "hello", "output_tokens": 4, "arrival_s": 1.0}\n' + line + "\n")
    with pytest.raises(TrafficError, match=message):
        convert(path, tokenizer, tmp_path / "out.json")


def test_an_empty_or_missing_file_is_refused(tmp_path):
    with pytest.raises(TrafficError, match="traffic file not found"):
        read_lines(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TrafficError, match="no requests in it"):
        read_lines(tmp_path / "empty.jsonl")


def test_a_run_on_the_traffic_generates_each_response_to_its_given_length(tiny_llama, tokenizer, tmp_path):
    model_dir, _, _, dataset = tiny_model_and_dataset(tiny_llama[0], tmp_path, 4, seed=3)
    (tmp_path / "systems").mkdir()
    system = {
        "division": "open",
        "saaf_harness": {
            "model": str(model_dir),
            "datasets": {"llama3.1-8b": str(dataset)},
            "engine": {"num_kv_blocks": 512},
            "scenarios": ["Offline"],
            "demo": True,
        },
    }
    (tmp_path / "systems" / "tiny.json").write_text(json.dumps(system))
    # Token ids the tiny model knows (its vocabulary is 256), lengths of the example's.
    lengths = [json.loads(line)["output_tokens"] for line in EXAMPLE.read_text().splitlines()]
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text(
        "".join(
            json.dumps({"prompt_token_ids": [(7 * i + j) % 250 + 1 for j in range(5 + i)], "output_tokens": n}) + "\n"
            for i, n in enumerate(lengths)
        )
    )
    assert convert(traffic, tokenizer, tmp_path / "traffic.json") is None  # no arrival times
    conf = tmp_path / "user.conf"
    conf.write_text(
        "llama3_1-8b.Offline.min_duration = 0\nllama3_1-8b.Offline.min_query_count = 12\n"
        "llama3_1-8b.Offline.performance_sample_count_override = 12\n"
        "llama3_1-8b.Offline.sample_concatenate_permutation = 1\n"
    )
    logs = tmp_path / "logs"
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "harness", "run", "--system", "tiny", "--root", str(tmp_path), "--scenario", "Offline"),
            *("--user-conf", str(conf), "--dataset", str(tmp_path / "traffic.json"), "--log-dir", str(logs)),
            "--log-responses",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    entries = json.loads((logs / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in entries) == list(range(12))
    assert all(e["token_count"] == lengths[e["qsl_idx"]] for e in entries)
    assert json.loads((logs / "run.json").read_text())["dataset"] == str(tmp_path / "traffic.json")

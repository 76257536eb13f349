"""A user's traffic sample (harness/measure/traffic.py): the example file converted with the model's
tokenizer, every bad line refused by name, and a LoadGen run on it through `harness run --dataset`
whose responses have exactly the lengths the sample gives."""

import json
import subprocess
import sys

import pytest

from accuracy.datasets.reader import load_dataset
from harness.measure.replay import scaled_arrivals
from harness.measure.run_logs import RunLogError, loadgen_percentile, read_run
from harness.measure.traffic import EXAMPLE, TrafficError, convert, mean_interval_s, read_lines
from systems.benchmarks import BENCHMARKS
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


LENGTHS = [json.loads(line)["output_tokens"] for line in EXAMPLE.read_text().splitlines()]
ARRIVALS = [json.loads(line)["arrival_s"] for line in EXAMPLE.read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_root(tiny_llama, tmp_path_factory):
    """A repository-like folder with the tiny system, and the example's traffic in token ids the tiny
    model knows (its vocabulary is 256), with the example's lengths and arrival times."""
    root = tmp_path_factory.mktemp("traffic-repo")
    model_dir, _, _, dataset = tiny_model_and_dataset(tiny_llama[0], root, 4, seed=3)
    (root / "systems").mkdir()
    system = {
        "division": "open",
        "saaf_harness": {
            "model": str(model_dir),
            "datasets": {"llama3.1-8b": str(dataset)},
            "engine": {"num_kv_blocks": 512},
            "scenarios": ["Offline", "Server"],
            "demo": True,
            "report": {"samples": 12, "max_trials": 2, "price_per_hour": 1.0},
        },
    }
    (root / "systems" / "tiny.json").write_text(json.dumps(system))
    traffic = root / "traffic.jsonl"
    traffic.write_text(
        "".join(
            json.dumps(
                {"prompt_token_ids": [(7 * i + j) % 250 + 1 for j in range(5 + i)], "output_tokens": n, "arrival_s": a}
            )
            + "\n"
            for i, (n, a) in enumerate(zip(LENGTHS, ARRIVALS))
        )
    )
    return root, traffic


@pytest.mark.slow
def test_a_run_on_the_traffic_generates_each_response_to_its_given_length(tiny_root, tokenizer, tmp_path):
    root, traffic = tiny_root
    assert convert(traffic, tokenizer, tmp_path / "traffic.json") == ARRIVALS
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
            *("-m", "harness", "run", "--system", "tiny", "--root", str(root), "--scenario", "Offline"),
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
    assert all(e["token_count"] == LENGTHS[e["qsl_idx"]] for e in entries)
    assert json.loads((logs / "run.json").read_text())["dataset"] == str(tmp_path / "traffic.json")


def test_arrivals_are_scaled_to_the_mean_rate_asked_for():
    times = scaled_arrivals([10.0, 10.5, 10.6, 13.0], 2.0)  # 3 intervals over 3 s: 1 q/s as sampled
    assert times == pytest.approx([0.0, 0.25, 0.3, 1.5])
    with pytest.raises(ValueError, match="at least two arrival times"):
        scaled_arrivals([1.0], 1.0)


def run_replay(root, folder, arrivals, qps):
    """`python -m harness.measure.replay` of folder/traffic.json at `arrivals` scaled to `qps`, into folder/replay."""
    (folder / "arrivals.json").write_text(json.dumps(arrivals))
    return subprocess.run(
        [sys.executable, "-m", "harness.measure.replay", "--system", "tiny", "--root", str(root)]
        + ["--dataset", str(folder / "traffic.json"), "--arrivals", str(folder / "arrivals.json")]
        + ["--qps", str(qps), "--log-dir", str(folder / "replay")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.slow
def test_a_replay_issues_each_request_at_its_scaled_time_and_is_read_as_a_loadgen_run(tiny_root, tokenizer, tmp_path):
    root, traffic = tiny_root
    convert(traffic, tokenizer, tmp_path / "traffic.json")
    logs = tmp_path / "replay"
    done = run_replay(root, tmp_path, ARRIVALS, 4)
    assert done.returncode == 0, done.stderr[-2000:]
    log = json.loads((logs / "replay.json").read_text())
    expected = scaled_arrivals(ARRIVALS, 4.0)
    assert [q["scheduled_ns"] for q in log["queries"]] == [round(t * 1e9) for t in expected]
    assert [q["sample"] for q in log["queries"]] == list(range(12))
    assert [len(q["tokens"]) for q in log["queries"]] == LENGTHS  # every request answered, at its length
    assert all(0 < q["ttft_ns"] <= q["latency_ns"] for q in log["queries"])
    run = read_run(logs)
    ttfts = [q["ttft_ns"] for q in log["queries"]]
    tpots = [(q["latency_ns"] - q["ttft_ns"]) / (len(q["tokens"]) - 1) for q in log["queries"]]
    assert run.detail["result_first_token_99.00_percentile_latency_ns"] == loadgen_percentile(ttfts, 0.99)
    assert run.detail["result_time_per_output_token_99.00_percentile_ns"] == loadgen_percentile(tpots, 0.99)
    limits = BENCHMARKS["llama3.1-8b"].latency_limits_ms["Server"]
    assert run.detail["result_perf_constraints_met"] == (
        loadgen_percentile(ttfts, 0.99) <= limits[0] * 1e6 and loadgen_percentile(tpots, 0.99) <= limits[1] * 1e6
    )
    end_s = max(q["scheduled_ns"] + q["latency_ns"] for q in log["queries"]) / 1e9
    assert run.duration_s == pytest.approx(end_s)
    assert run.goodput(*limits)[0] == sum(
        1 for t, p in zip(ttfts, tpots) if t <= limits[0] * 1e6 and p <= limits[1] * 1e6
    )


@pytest.mark.slow
def test_the_report_on_traffic_with_arrival_times_searches_by_replays(tiny_root, tmp_path):
    root, traffic = tiny_root
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "harness.measure.report", "--system", "tiny", "--root", str(root), "--out", str(out)]
        + ["--traffic", str(traffic)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["traffic"]["replayed"] and report["traffic"]["mean_interval_s"] == pytest.approx(6.3 / 11)
    for config in report["configurations"]:
        search = json.loads((out / "runs" / config["folder"] / "capacity.json").read_text())
        assert len(search["trials"]) == 2
        for trial in search["trials"]:
            log = json.loads((out / "runs" / trial["logs"] / "replay.json").read_text())
            assert log["qps"] == pytest.approx(trial["qps"], rel=1e-3)
            assert [len(q["tokens"]) for q in log["queries"]] == LENGTHS
    assert "are replayed, scaled to each trial's mean rate" in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_refused_request_ends_the_replay_with_an_error_naming_it(tiny_root, tokenizer, tmp_path):
    root, _ = tiny_root
    traffic = tmp_path / "traffic.jsonl"
    lengths = [(5, 0.0), (400, 0.1), (5, 0.2)]  # the second prompt is longer than the tiny model's 256 positions
    traffic.write_text(
        "".join(
            json.dumps({"prompt_token_ids": [3] * n, "output_tokens": 4, "arrival_s": a}) + "\n" for n, a in lengths
        )
    )
    done = run_replay(root, tmp_path, convert(traffic, tokenizer, tmp_path / "traffic.json"), 10)
    assert done.returncode != 0 and "error: replay:" in done.stderr and "request 1" in done.stderr, done.stderr[-2000:]
    with pytest.raises(RunLogError, match="failed"):
        read_run(tmp_path / "replay")

"""The run CLI's configuration fails with a clear error before LoadGen starts."""

import json
import subprocess
import sys

import pytest

from harness.config import HarnessConfigError, RunConfig, check_user_conf
from systems.schema import System
from tests.test_kernels_name import REPO


def test_demo_configuration_resolves():
    cfg = RunConfig.resolve("cpu-demo", "llama3.1-8b", "Offline", "performance")
    assert cfg.user_conf == REPO / "measurements/cpu-demo/llama3.1-8b/Offline/user.conf"
    assert cfg.log_dir == REPO / "build/logs/cpu-demo/llama3.1-8b/Offline/performance"
    assert cfg.system.model_for("llama3.1-8b").name == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "args, message",
    [
        (("cpu-demo", "gptj", "Offline", "performance"), "unknown benchmark 'gptj'"),
        (("nosuch", "llama3.1-8b", "Offline", "performance"), "unknown system 'nosuch'"),
        (("cpu-demo", "llama3.1-8b", "MultiStream", "performance"), "unknown scenario 'MultiStream'"),
        (("cpu-demo", "llama3.1-8b", "Offline", "fast"), "unknown mode 'fast'"),
        (("cpu-demo", "llama3.1-8b", "SingleStream", "performance"), "SingleStream/user.conf: user.conf not found"),
    ],
)
def test_unknown_names(args, message):
    with pytest.raises(HarnessConfigError, match=message):
        RunConfig.resolve(*args)


@pytest.mark.parametrize(
    "line, message",
    [
        ("llama3_1-8b.Offline.target_qsp = 3", r":1: unknown key 'target_qsp'"),
        ("llama3_1-8b.Offline.min_duration = ten", r":1: min_duration must be a number, got 'ten'"),
        ("llama3_1-8b.Offline.min_duration = -5", r":1: min_duration must not be negative"),
        ("llama3_1-8b.Ofline.min_duration = 5", r":1: unknown scenario 'Ofline'"),
        ("target_qps 3", r":1: expected 'model.scenario.key = value'"),
    ],
)
def test_bad_user_conf(tmp_path, line, message):
    path = tmp_path / "user.conf"
    path.write_text(line + "\n# a comment\n")
    with pytest.raises(HarnessConfigError, match=message):
        check_user_conf(path)


def test_cli_reports_a_missing_dataset_before_loadgen(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--system", "cpu-demo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"SAAF_CACHE": str(tmp_path), "PATH": ""},
    )
    assert out.returncode != 0
    assert "xsum-100x128.json: dataset file not found (for the demo, run `make data`)" in out.stderr
    assert "mlperf_log" not in out.stdout


def test_missing_accuracy_reference_is_caught_before_an_accuracy_run(monkeypatch, tmp_path):
    demo = System.load("cpu-demo")
    demo.accuracy_reference = tmp_path / "none.json"
    monkeypatch.setattr(System, "load", staticmethod(lambda name, root: demo))
    with pytest.raises(HarnessConfigError, match="names accuracy reference .*none.json, which does not exist"):
        RunConfig.resolve("cpu-demo", "llama3.1-8b", "Offline", "accuracy")
    RunConfig.resolve("cpu-demo", "llama3.1-8b", "Offline", "performance")  # performance runs need no reference


def test_accuracy_reference_of_another_dataset_is_refused(monkeypatch, tmp_path):
    demo = System.load("cpu-demo")
    dataset = tmp_path / "data.json"
    dataset.write_text("[]")
    demo.datasets = {"llama3.1-8b": dataset}
    demo.accuracy_reference = tmp_path / "reference.json"
    demo.accuracy_reference.write_text(json.dumps({"scores": {}, "dataset_sha256": "0" * 64}))
    monkeypatch.setattr(System, "load", staticmethod(lambda name, root: demo))
    with pytest.raises(HarnessConfigError, match="data.json is not the dataset accuracy reference .* was recorded on"):
        RunConfig.resolve("cpu-demo", "llama3.1-8b", "Offline", "accuracy")


def test_a_prompt_with_room_for_one_new_token_is_refused_before_loadgen(tiny_llama, tmp_path):
    """A 1-token response makes LoadGen log an error (token latencies on), so a prompt that leaves
    room for fewer than 2 new tokens in max_model_len is refused up front."""
    system = {
        "saaf_harness": {
            "model": str(tiny_llama[0]),
            "datasets": {"llama3.1-8b": str(tmp_path / "data.json")},
            "engine": {"max_model_len": 32, "num_kv_blocks": 64},
            "scenarios": ["Offline"],
        }
    }
    (tmp_path / "systems").mkdir()
    (tmp_path / "systems" / "t.json").write_text(json.dumps(system))
    (tmp_path / "data.json").write_text(
        json.dumps([{"tok_input": [5] * 10, "output": "a"}, {"tok_input": [5] * 31, "output": "b"}])
    )
    conf = tmp_path / "measurements" / "t" / "llama3.1-8b" / "Offline" / "user.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("llama3_1-8b.Offline.min_duration = 0\n")
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--system", "t", "--root", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "data.json: samples [1] leave room for fewer than 2 new tokens in max_model_len 32" in out.stderr
    assert not (
        tmp_path / "build" / "logs" / "t" / "llama3.1-8b" / "Offline" / "performance" / "mlperf_log_detail.txt"
    ).exists()


@pytest.mark.parametrize(
    "division, scenario, message",
    [
        (
            "closed",
            "Server",
            "closed division allows speculative decoding only for deepseek-r1 Interactive, gpt-oss-120b Interactive",
        ),
        ("closed", "Offline", "llama3.1-8b Offline set speculative_config"),
        ("open", "Server", None),
    ],
)
def test_speculation_refused_in_the_closed_division_outside_its_benchmarks(monkeypatch, division, scenario, message):
    demo = System.load("cpu-demo")
    demo.division = division
    demo.engine = {**demo.engine, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    monkeypatch.setattr(System, "load", staticmethod(lambda name, root: demo))
    if message is None:
        assert RunConfig.resolve("cpu-demo", "llama3.1-8b", scenario, "performance").system.division == "open"
        return
    with pytest.raises(HarnessConfigError, match=message):
        RunConfig.resolve("cpu-demo", "llama3.1-8b", scenario, "performance")


def test_bad_speculative_config_is_caught_before_a_run(monkeypatch):
    demo = System.load("cpu-demo")
    demo.engine = {**demo.engine, "speculative_config": {"method": "eagle", "num_speculative_tokens": 3}}
    monkeypatch.setattr(System, "load", staticmethod(lambda name, root: demo))
    with pytest.raises(HarnessConfigError, match="speculative_config.method must be one of"):
        RunConfig.resolve("cpu-demo", "llama3.1-8b", "Server", "performance")


def test_engine_settings_given_for_one_run_override_the_system_and_are_checked(tmp_path):
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    cfg = RunConfig.resolve(
        "cpu-demo",
        "llama3.1-8b",
        "Server",
        "performance",
        engine={"speculative_config": spec, "max_num_batched_tokens": 512},
        log_dir=tmp_path,
    )
    settings = cfg.system.engine_settings("Server")
    assert settings["speculative_config"] == spec and settings["max_num_batched_tokens"] == 512
    assert settings["cpu"] == {"int16_activations": True}  # the rest of the system's settings stay
    assert cfg.log_dir == tmp_path
    with pytest.raises(HarnessConfigError, match="speculative_config.num_speculative_tokens"):
        RunConfig.resolve(
            "cpu-demo",
            "llama3.1-8b",
            "Server",
            "performance",
            engine={"speculative_config": {"method": "ngram", "num_speculative_tokens": 0}},
        )
    with pytest.raises(HarnessConfigError, match="must be a JSON object"):
        RunConfig.resolve("cpu-demo", "llama3.1-8b", "Server", "performance", engine=[1])


def test_cli_refuses_engine_settings_that_are_not_json():
    result = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--scenario", "Server", "--engine", "{oops"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode != 0 and "--engine is not JSON" in result.stderr

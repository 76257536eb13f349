"""The run CLI's configuration fails with a clear error before LoadGen starts."""

import json
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_cli_refuses_engine_settings_that_are_not_json():
    result = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--scenario", "Server", "--engine", "{oops"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode != 0 and "--engine is not JSON" in result.stderr


# ---- gpt-oss-120b: its sets by mode, its compliance modes, its speculation rule, its sampling


def gpt_oss_system(tmp_path, datasets, division="closed", engine=None, **harness) -> Path:
    """A closed system with gpt-oss-120b under tmp_path (its model folder need not exist to resolve
    a performance or compliance run); `harness`: more of its saaf_harness keys."""
    system = {
        "division": division,
        "saaf_harness": {
            "model": str(tmp_path / "gpt-oss-120b"),
            "datasets": {"gpt-oss-120b": datasets},
            "engine": engine or {},
            "scenarios": ["Offline", "Interactive"],
            **harness,
        },
    }
    (tmp_path / "systems").mkdir(exist_ok=True)
    (tmp_path / "systems" / "g.json").write_text(json.dumps(system))
    for scenario in ("Offline", "Interactive"):
        conf = tmp_path / "measurements" / "g" / "gpt-oss-120b" / scenario / "user.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("gpt-oss-120b.Offline.target_qps = 1\n")
    return tmp_path


def test_each_gpt_oss_mode_reads_its_own_set(tmp_path):
    sets = {"performance": "/d/perf.parquet", "accuracy": "/d/acc.parquet", "TEST07": "/d/gpqa.parquet"}
    root = gpt_oss_system(tmp_path, sets)
    got = {mode: RunConfig.resolve("g", "gpt-oss-120b", "Offline", mode, root).dataset for mode in ("TEST07", "TEST09")}
    assert got == {"TEST07": Path("/d/gpqa.parquet"), "TEST09": Path("/d/perf.parquet")}
    system = System.load("g", root)
    assert system.dataset_for("gpt-oss-120b", "accuracy") == Path("/d/acc.parquet")
    assert system.dataset_for("gpt-oss-120b") == system.datasets["gpt-oss-120b"] == Path("/d/perf.parquet")
    system.use_dataset("gpt-oss-120b", Path("/d/traffic.json"))  # --dataset: every mode on it
    assert system.dataset_for("gpt-oss-120b", "TEST07") == Path("/d/traffic.json")


@pytest.mark.parametrize(
    "datasets, mode, message",
    [
        (
            "/d/perf.parquet",
            "TEST07",
            r"names no 'TEST07' set: gpt-oss-120b's TEST07 runs read their own "
            r"\(acc/acc_eval_compliance_gpqa.parquet of the reference's download, 990 samples\)",
        ),
        (
            {"performance": "/d/p.parquet", "TEST07": "/d/t.parquet"},
            "accuracy",
            r"names no 'accuracy' set: .*acc/acc_eval_inputs.parquet .* 4395 samples",
        ),
        (
            {"performance": "/d/p.parquet", "TEST07": "/d/t.parquet"},
            "TEST06",
            "compliance tests are TEST07, TEST09, not TEST06",
        ),
        ({"accuracy": "/d/a.parquet"}, "performance", r"saaf_harness.datasets.gpt-oss-120b names no 'performance' set"),
        ({"performance": "/d/p.parquet", "TEST08": "/d/t.parquet"}, "performance", r"unknown key\(s\) \['TEST08'\]"),
    ],
)
def test_a_gpt_oss_mode_without_its_set_is_refused_by_name(tmp_path, datasets, mode, message):
    root = gpt_oss_system(tmp_path, datasets)
    with pytest.raises(HarnessConfigError, match=message):
        RunConfig.resolve("g", "gpt-oss-120b", "Offline", mode, root)


def test_compliance_modes_are_performance_runs_under_their_audit_configs():
    from compliance.audit_config import AUDIT_CONFIGS
    from harness.config import MODES
    from harness.run import unique_issue, validity

    assert set(MODES) == {"performance", "accuracy", "TEST06", "TEST07", "TEST09"} and set(AUDIT_CONFIGS) <= set(MODES)
    assert [m for m in MODES if unique_issue(m)] == ["TEST07", "TEST09"]
    met = dict.fromkeys(("result_perf_constraints_met", "result_min_duration_met", "result_min_queries_met"), True)
    detail = {**met, "result_validity": "INVALID", "early_stopping_met": False, "result_query_count": 990}
    for mode in ("TEST06", "TEST07", "TEST09"):
        assert validity(detail, mode) == f"INVALID by early stopping alone (990 queries; not a {mode} criterion)"
    assert validity(detail, "performance") == "INVALID"
    assert validity({**detail, "result_min_queries_met": False}, "TEST07") == "INVALID"


SPEC = {"method": "eagle3", "model": "/m/gpt-oss-120b-Eagle3-long-context", "num_speculative_tokens": 3}


@pytest.mark.parametrize(
    "scenario, spec, message",
    [
        ("Interactive", SPEC, None),
        ("Offline", SPEC, "allows speculative decoding only for deepseek-r1 Interactive, gpt-oss-120b Interactive"),
        ("Interactive", {**SPEC, "num_speculative_tokens": 4}, "not with num_speculative_tokens 4"),
        ("Interactive", {**SPEC, "method": "ngram"}, "method 'eagle3', head nvidia/gpt-oss-120b-Eagle3-long-context"),
        ("Interactive", {**SPEC, "model": "/m/my-eagle3"}, "must be named 'gpt-oss-120b-Eagle3-long-context'"),
        ("Interactive", {**SPEC, "adaptive": True}, "not with adaptive drafting"),
    ],
)
def test_closed_gpt_oss_speculates_only_with_the_references_eagle3_in_interactive(tmp_path, scenario, spec, message):
    from harness.config import check_speculation_allowed
    from systems.benchmarks import BENCHMARKS

    system = System.load("g", gpt_oss_system(tmp_path, "/d/p.parquet", engine={"speculative_config": spec}))
    if message is None:
        check_speculation_allowed(system, BENCHMARKS["gpt-oss-120b"], scenario)
        system.division = "open"
        return
    with pytest.raises(HarnessConfigError, match=message):
        check_speculation_allowed(system, BENCHMARKS["gpt-oss-120b"], scenario)
    system.division = "open"  # the open division may speculate as it likes
    check_speculation_allowed(system, BENCHMARKS["gpt-oss-120b"], scenario)


# ---- engine settings in four levels: engine, benchmark_engine[b], scenario_engine[s], and the
# benchmark's own benchmark_engine[b]["scenario_engine"][s], each over the one before


def write_levels(tmp_path, benchmark_engine, scenario_engine=None) -> Path:
    """A system with two benchmarks, gpt-oss-120b and llama3.1-8b, and these engine settings."""
    root = gpt_oss_system(
        tmp_path,
        "/d/p.parquet",
        engine={"max_num_seqs": 256, "max_num_batched_tokens": 8192, "dtype": "bfloat16"},
        benchmark_engine=benchmark_engine,
        scenario_engine=scenario_engine or {},
    )
    system = json.loads((root / "systems" / "g.json").read_text())
    system["saaf_harness"]["datasets"]["llama3.1-8b"] = "/d/cnn.json"
    (root / "systems" / "g.json").write_text(json.dumps(system))
    return root


def test_engine_settings_merge_engine_benchmark_scenario_and_the_benchmarks_own_scenario(tmp_path):
    levels = {
        "gpt-oss-120b": {
            "max_num_seqs": 60,
            "max_num_batched_tokens": 4096,
            "scenario_engine": {"Interactive": {"max_num_seqs": 8, "speculative_config": SPEC}},
        },
    }
    root = write_levels(tmp_path, levels, {"Interactive": {"max_num_seqs": 32, "max_num_batched_tokens": 1024}})
    system = System.load("g", root)
    assert "scenario_engine" not in system.benchmark_engine["gpt-oss-120b"]  # settings of its own, not engine's
    got = {
        (b, s): system.engine_settings(s, b)
        for b in ("gpt-oss-120b", "llama3.1-8b")
        for s in ("Offline", "Interactive")
    }
    # engine, under the benchmark's, under the scenario's, under the benchmark's own scenario's
    assert got["llama3.1-8b", "Offline"] == {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "dtype": "bfloat16"}
    assert got["gpt-oss-120b", "Offline"] == {"max_num_seqs": 60, "max_num_batched_tokens": 4096, "dtype": "bfloat16"}
    assert got["llama3.1-8b", "Interactive"] == {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 1024,
        "dtype": "bfloat16",
    }
    assert got["gpt-oss-120b", "Interactive"] == {
        "max_num_seqs": 8,  # the benchmark's own Interactive setting over the scenario's and the benchmark's
        "max_num_batched_tokens": 1024,  # the scenario's over the benchmark's
        "dtype": "bfloat16",
        "speculative_config": SPEC,  # only here: no other benchmark or scenario speculates
    }
    assert system.scenario_setting_keys("gpt-oss-120b") == {
        "max_num_seqs",
        "max_num_batched_tokens",
        "speculative_config",
    }
    assert system.scenario_setting_keys("llama3.1-8b") == {"max_num_seqs", "max_num_batched_tokens"}


def test_a_runs_engine_settings_go_over_the_benchmarks_own_scenario_settings(tmp_path):
    """`--engine` is the most specific of all: over the benchmark's own scenario settings too; and the
    closed division's check reads the benchmark's own scenario settings (speculation in Offline)."""
    levels = {"gpt-oss-120b": {"scenario_engine": {"Interactive": {"max_num_seqs": 8, "speculative_config": SPEC}}}}
    root = write_levels(tmp_path, levels)
    cfg = RunConfig.resolve("g", "gpt-oss-120b", "Interactive", "performance", root, engine={"max_num_seqs": 2})
    settings = cfg.system.engine_settings("Interactive", "gpt-oss-120b")
    assert settings["max_num_seqs"] == 2 and settings["speculative_config"] == SPEC
    assert "speculative_config" not in RunConfig.resolve(
        "g", "gpt-oss-120b", "Offline", "performance", root
    ).system.engine_settings("Offline", "gpt-oss-120b")
    levels["gpt-oss-120b"]["scenario_engine"]["Offline"] = {"speculative_config": SPEC}
    root = write_levels(tmp_path, levels)
    with pytest.raises(HarnessConfigError, match="engine settings for gpt-oss-120b Offline set speculative_config"):
        RunConfig.resolve("g", "gpt-oss-120b", "Offline", "performance", root)


@pytest.mark.parametrize(
    "benchmark_engine, message",
    [
        (
            {"gpt-oss-120b": {"scenario_engine": {"Interactve": {"max_num_seqs": 8}}}},
            r"g.json: saaf_harness.benchmark_engine.gpt-oss-120b.scenario_engine names unknown scenarios "
            r"\['Interactve'\]",
        ),
        (
            {"gpt-oss-120b": {"scenario_engine": ["Interactive"]}},
            r"g.json: saaf_harness.benchmark_engine.gpt-oss-120b.scenario_engine must be an object of scenario -> "
            r"engine settings, got \['Interactive'\]",
        ),
        (
            {"gpt-oss-120b": {"scenario_engine": {"Interactive": 8}}},
            r"saaf_harness.benchmark_engine.gpt-oss-120b.scenario_engine.Interactive must be an object of engine "
            r"settings, got 8",
        ),
        ({"gpt-oss-120b": 8}, r"saaf_harness.benchmark_engine.gpt-oss-120b must be an object of engine settings"),
        (
            {"deepseek-r1": {"max_num_seqs": 8}},
            r"g.json: saaf_harness.benchmark_engine names benchmarks \['deepseek-r1'\] that saaf_harness.datasets "
            r"does not; its benchmarks: \['gpt-oss-120b', 'llama3.1-8b'\]",
        ),
    ],
)
def test_a_bad_benchmark_engine_is_refused_by_name(tmp_path, benchmark_engine, message):
    from systems.schema import SystemConfigError

    root = write_levels(tmp_path, benchmark_engine)
    with pytest.raises(SystemConfigError, match=message):
        System.load("g", root)


def test_a_speculative_config_model_is_a_path_as_model_folders_are(tmp_path, monkeypatch):
    """`${SAAF_CACHE}` in a speculative_config.model (a draft's or head's folder) is expanded at every
    level, as in the model folders: the engine reads the folder with expanduser alone."""
    monkeypatch.setenv("SAAF_CACHE", str(tmp_path / "cache"))
    head = {**SPEC, "model": "${SAAF_CACHE}/models/gpt-oss-120b-Eagle3-long-context"}
    root = write_levels(tmp_path, {"gpt-oss-120b": {"scenario_engine": {"Interactive": {"speculative_config": head}}}})
    system = System.load("g", root)
    want = str(tmp_path / "cache" / "models" / "gpt-oss-120b-Eagle3-long-context")
    assert system.engine_settings("Interactive", "gpt-oss-120b")["speculative_config"] == {**head, "model": want}
    system = System.load("g", gpt_oss_system(tmp_path, "/d/p.parquet", engine={"speculative_config": head}))
    assert system.engine_settings("Offline", "gpt-oss-120b")["speculative_config"]["model"] == want
    ngram = {"method": "ngram", "num_speculative_tokens": 2}  # no model: as written
    system = System.load(
        "g", gpt_oss_system(tmp_path, "/d/p.parquet", scenario_engine={"Offline": {"speculative_config": ngram}})
    )
    assert system.engine_settings("Offline", "gpt-oss-120b")["speculative_config"] == ngram


def test_gpt_oss_samples_as_the_reference_with_a_seed_per_sample(tmp_path):
    from accuracy.datasets.reader import Dataset
    from harness.run import sampling_params

    root = gpt_oss_system(tmp_path, {"performance": "/d/p.parquet", "accuracy": "/d/a.parquet"})
    data = Dataset(Path("/d/p.parquet"), [[1], [2], [3]], [None] * 3)
    cfg = RunConfig.resolve("g", "gpt-oss-120b", "Offline", "performance", root)
    params = sampling_params(cfg, data)
    assert [(p.temperature, p.top_p, p.top_k, p.min_tokens, p.max_tokens, p.seed) for p in params] == [
        (1.0, 1.0, 0, 1, 10240, i) for i in range(3)
    ]
    cfg.mode = "accuracy"
    assert {p.max_tokens for p in sampling_params(cfg, data)} == {32768}
    demo = RunConfig.resolve("cpu-demo", "llama3.1-8b", "Offline", "performance")
    greedy = sampling_params(demo, data)  # one for all: greedy, 128 new tokens, as before
    assert greedy.greedy and greedy.seed is None and (greedy.max_tokens, greedy.min_tokens) == (128, 1)


def test_a_closed_run_whose_max_model_len_would_cut_responses_is_refused(tmp_path):
    """The rules forbid lowering the maximum output length: a closed gpt-oss accuracy run needs room
    for 32768 new tokens after each prompt, a performance run for 10240."""
    from types import SimpleNamespace

    from accuracy.datasets.reader import Dataset
    from harness.run import check_room

    root = gpt_oss_system(tmp_path, {"performance": "/d/p.parquet", "accuracy": "/d/a.parquet"})
    data = Dataset(Path("/d/a.parquet"), [[1] * 100, [1] * 2871], [None] * 2)
    engine = SimpleNamespace(max_model_len=20480)
    cfg = RunConfig.resolve("g", "gpt-oss-120b", "Offline", "performance", root)
    check_room(cfg, engine, data)
    cfg.mode = "accuracy"
    with pytest.raises(
        HarnessConfigError,
        match=r"samples \[0, 1\] \(the longest 2871 tokens\) leave room for fewer "
        r"than the 32768 new tokens of gpt-oss-120b's accuracy runs in max_model_len 20480: raise "
        r"max_model_len to at least 35639",
    ):
        check_room(cfg, engine, data)
    check_room(cfg, SimpleNamespace(max_model_len=36864), data)
    cfg.system.division = "open"  # a substituted model's own limits
    check_room(cfg, engine, data)


def test_a_gpt_oss_accuracy_run_checks_its_scoring_needs_before_it_starts(tmp_path):
    """An accuracy set with LiveCodeBench samples needs LiveCodeBench's problems named, and one with a
    sub-dataset the script cannot grade is refused, before the hours of the run."""
    import pandas as pd

    from accuracy.datasets.reader import load_dataset
    from harness.run import check_scoring

    acc = tmp_path / "acc.parquet"
    frame = pd.DataFrame(
        {"input_tokens": [[1, 2], [3]], "ground_truth": ["B", "q1"], "dataset": ["gpqa_diamond", "livecodebench_v6"]}
    )
    frame.to_parquet(acc)
    sets = {"performance": "/d/p.parquet", "accuracy": str(acc)}
    cfg = RunConfig.resolve("g", "gpt-oss-120b", "Offline", "performance", gpt_oss_system(tmp_path, sets))
    cfg.mode = "accuracy"
    with pytest.raises(HarnessConfigError, match=r"acc.parquet: its LiveCodeBench samples .* saaf_harness.datasets."):
        check_scoring(cfg, load_dataset(acc))
    (tmp_path / "lcb").mkdir()
    cfg.system.mode_datasets["gpt-oss-120b"]["lcb_problems"] = tmp_path / "lcb"
    check_scoring(cfg, load_dataset(acc))
    frame.assign(dataset=["gpqa_diamond", "math500"]).to_parquet(acc)
    with pytest.raises(HarnessConfigError, match=r"sample 1: dataset 'math500' is graded with PRM800K's math grader"):
        check_scoring(cfg, load_dataset(acc))

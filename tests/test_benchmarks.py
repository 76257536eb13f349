"""The benchmark registry (systems/benchmarks.py): the v6.1 facts every package reads from it."""

from compliance import test07, test09
from systems.benchmarks import BENCHMARKS, ENTRIES, SCENARIOS, loadgen_double


def test_targets_are_the_checkers_bounds():
    assert BENCHMARKS["llama3.1-8b"].targets() == {
        "rouge1": (38.7792 * 0.99, None),
        "rouge2": (15.9075 * 0.99, None),
        "rougeL": (24.4957 * 0.99, None),
        "rougeLsum": (35.793 * 0.99, None),
        "gen_len": (8167644 * 0.9, 8167644 * 1.1),
    }
    assert BENCHMARKS["llama2-70b-99.9"].targets()["tokens_per_sample"] == (294.45 * 0.9, 294.45 * 1.1)


def test_latency_limits_and_loadgen_names():
    llama = BENCHMARKS["llama3.1-8b"]
    assert llama.latency_limits_ms == {"Server": (2000, 100), "Interactive": (500, 30)}
    assert (
        llama.loadgen_name("Interactive") == "llama3_1-8b-interactive" and llama.loadgen_name("Server") == "llama3_1-8b"
    )
    assert BENCHMARKS["llama3.1-8b-edge"].latency_limits_ms == {} and not BENCHMARKS["llama3.1-8b-edge"].test06


def test_every_entry_is_run():
    assert {b.name for b in ENTRIES if not b.ready} == set() and set(BENCHMARKS) == {b.name for b in ENTRIES}


def test_deepseek_r1_is_the_references_benchmark():
    """deepseek-r1 as mlcommons/inference sets it (loadgen/mlperf.conf; the v6.1 checker's constants:
    accuracy-target, accuracy-upper-limit, LLM_LATENCY_LIMITS, models_TEST06, the scenario lists;
    language/deepseek-r1/utils/backend_registry.py; deepseek-ai/DeepSeek-R1's EOS)."""
    d = BENCHMARKS["deepseek-r1"]
    assert d.loadgen_name("Server") == "deepseek-r1" and d.loadgen_name("Interactive") == "deepseek-r1-interactive"
    assert d.dataset_size == d.accuracy_dataset_size == 4388 and not d.mode_datasets
    assert (d.max_input_tokens, d.chat_template_tokens, d.max_prompt_tokens) == (3136, 4, 3140)
    assert d.max_tokens("accuracy") == d.max_tokens("performance") == 20000
    assert d.generation("performance") == {
        "max_tokens": 20000,
        "min_tokens": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
    }
    assert d.latency_limits_ms == {"Server": (2000, 80), "Interactive": (1500, 15)}
    assert d.targets() == {
        "exact_match": (81.3582 * 0.99, None),
        "tokens_per_sample": (3886.2274 * 0.9, 3886.2274 * 1.1),
    }
    assert d.compliance_tests == ("TEST06",) and d.test06 and d.eos_token_ids == {1}
    assert d.scenarios == {"datacenter": ({"Offline"}, {"Server", "Interactive"})}
    assert d.scorer == "deepseek_r1" and d.skip_special_tokens
    assert d.speculative_scenarios == ("Interactive",) and d.speculation.head is None


def test_gpt_oss_is_the_references_benchmark():
    """gpt-oss-120b as mlcommons/inference sets it (v61-models.md sections 2b, 3b, 3c; loadgen/mlperf.conf;
    the v6.1 checker's constants; language/gpt-oss-120b generation_config.json and README)."""
    g = BENCHMARKS["gpt-oss-120b"]
    assert g.loadgen_name("Offline") == "gpt-oss-120b" and g.loadgen_name("Interactive") == "gpt-oss-120b-interactive"
    assert g.dataset_size == 6396 and g.accuracy_dataset_size == 4395
    assert g.mode_datasets["accuracy"].name == "acc/acc_eval_inputs.parquet"
    assert (g.mode_datasets["TEST07"].name, g.mode_datasets["TEST07"].samples) == (
        "acc/acc_eval_compliance_gpqa.parquet",
        990,
    )
    assert "TEST09" not in g.mode_datasets  # the performance set (perf/perf_eval_ref.parquet)
    # and the audit configs' counts are the sets' sizes
    assert g.mode_datasets["TEST07"].samples == test07.SAMPLES == int(test07.OFFICIAL_SETTINGS["min_query_count"])
    assert g.dataset_size == int(test09.OFFICIAL_SETTINGS["min_query_count"])
    assert g.latency_limits_ms == {"Server": (3000, 80), "Interactive": (2000, 15)}
    assert g.targets() == {"exact_match": (83.13 * 0.99, None), "tokens_per_sample": (0.0, 9999 * 1.1)}
    assert g.compliance_tests == ("TEST07", "TEST09") and not g.test06
    assert g.eos_token_ids == {200002, 199999, 200012}  # <|return|>, <|endoftext|>, <|call|>
    assert g.scorer == "gpt_oss" and g.skip_special_tokens is False
    performance = {"max_tokens": 10240, "min_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    for mode in ("performance", "TEST07", "TEST09"):
        assert g.generation(mode) == performance
    assert g.generation("accuracy") == {**performance, "max_tokens": 32768}
    assert g.speculative_scenarios == ("Interactive",)
    assert (g.speculation.method, g.speculation.head, g.speculation.num_speculative_tokens) == (
        "eagle3",
        "nvidia/gpt-oss-120b-Eagle3-long-context",
        3,
    )


def test_the_llama_benchmarks_stay_greedy_with_one_dataset():
    for name in ("llama3.1-8b", "llama3.1-8b-edge", "llama2-70b-99.9"):
        b = BENCHMARKS[name]
        assert b.generation("accuracy") == b.generation("performance")
        assert b.generation("performance")["temperature"] == 0.0 and b.accuracy_dataset_size == b.dataset_size
        assert b.scorer == "summarization" and not b.mode_datasets and not b.speculative_scenarios


def test_every_entry_is_whole():
    assert len({b.name for b in ENTRIES}) == len(ENTRIES)
    for b in ENTRIES:
        assert b.dataset_size > 0 and 1 <= b.min_new_tokens <= b.max_new_tokens, b.name
        assert b.max_new_tokens <= b.max_tokens("accuracy"), b.name
        assert b.scorer in ("summarization", "gpt_oss", "deepseek_r1"), b.name
        assert set(b.mode_datasets) <= {"accuracy", *b.compliance_tests}, b.name
        assert bool(b.speculative_scenarios) == (b.speculation is not None), b.name
        assert set(b.latency_limits_ms) <= {"Server", "Interactive"} and b.accuracy, b.name
        for required, optional in b.scenarios.values():
            assert required | optional <= set(SCENARIOS), b.name


def test_the_harness_runs_every_registry_scenario():
    from harness.config import SCENARIOS as LOADGEN_SCENARIOS

    assert set(LOADGEN_SCENARIOS) == set(SCENARIOS)


def test_a_rate_for_a_user_conf_is_one_loadgen_reads_and_logs_back_unchanged(tmp_path):
    """LoadGen reads a user.conf's target_qps with strtod and logs it to six significant digits (C++'s
    default stream precision, printf's %g): a rate with more (1006.151) would come back as another."""
    import mlperf_loadgen as lg

    assert float(f"{1006.151:g}") != 1006.151
    for value, decimals in ((1006.151, 3), (1330.7445, 3), (0.73125, 4), (195.3125, 4), (1234567.8, 3)):
        qps = loadgen_double(value, decimals)
        (tmp_path / "user.conf").write_text(f"m.Server.target_qps = {qps}\n")
        settings = lg.TestSettings()
        assert settings.FromConfig(str(tmp_path / "user.conf"), "m", "Server") == 0
        assert settings.server_target_qps == qps == float(f"{qps:g}") == round(qps, decimals), value
